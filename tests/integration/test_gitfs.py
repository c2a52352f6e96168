"""
Delivery through gitfs, as users add the formula: a bare git repository made from the project
is the master's only file server; ``saltutil.sync_all`` brings in the formula's modules and
``multimaster.minion`` applies from it.
"""

import pathlib
import shutil
import subprocess

import pygit2  # gitfs_provider pygit2: a missing pygit2 must fail, not skip
import pytest
import salt.version
import yaml

from .harness import (
    MASTER_HOSTS,
    REPO_ROOT,
    Ports,
    assert_states_ok,
    devkit,
    master_entry,
    multimaster_pillar,
)

pytestmark = pytest.mark.integration

PREFIX = "git"
PORTS = Ports(publish=30140, ret=30141)
MINION = "git-minion"
FORMULA_DIRS = ("multimaster", "_modules", "_runners", "_states", "_utils")


def git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def pygit2_usable_by_gitfs(tmp_path_factory):
    """
    Salt's gitfs adds the repository's own config file to ``repo.config``; pygit2 1.21 made
    that raise. Fail with that diagnosis rather than with a master that will not start.
    """
    repo = pygit2.init_repository(str(tmp_path_factory.mktemp("pygit2-check")))
    try:
        repo.config.add_file(str(pathlib.Path(repo.path) / "config"))
    except TypeError as exc:
        pytest.fail(
            f"pygit2 {pygit2.__version__} cannot serve Salt {salt.version.__version__} gitfs "
            f"({exc}); install a pygit2 that can (1.20.1 works)"
        )


@pytest.fixture(scope="module")
def bare_repo(tmp_path_factory, pygit2_usable_by_gitfs):
    """
    A bare repository (branch ``master``, gitfs's base) holding the formula as it is on disk.
    """
    assert shutil.which("git"), "git is required: the project's setup installs it"
    root = tmp_path_factory.mktemp("gitfs")
    work = root / "work"
    work.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in FORMULA_DIRS:
        if (REPO_ROOT / name).is_dir():
            shutil.copytree(REPO_ROOT / name, work / name, ignore=ignore)
    git("init", "-q", cwd=work)
    git("symbolic-ref", "HEAD", "refs/heads/master", cwd=work)
    git("add", "-A", cwd=work)
    git(
        "-c",
        "user.name=multimaster tests",
        "-c",
        "user.email=tests@multimaster.invalid",
        "commit",
        "-q",
        "-m",
        "formula",
        cwd=work,
    )
    bare = root / "formula.git"
    git("clone", "-q", "--bare", str(work), str(bare), cwd=root)
    return bare


@pytest.fixture(scope="module")
def master1_factory(daemons, ports, pillar_tree, key_acceptor, bare_repo):
    """
    master1 whose only file server backend is gitfs (pygit2) on the bare repository.
    """
    factory = daemons.master(
        f"{PREFIX}-master1",
        MASTER_HOSTS[0],
        ports,
        pillar_tree.root,
        auth=key_acceptor,
        serve_repo=False,
        gitfs_provider="pygit2",
        gitfs_remotes=[bare_repo.as_uri()],
    )
    # The factory merges lists into its default [roots]; master.d replaces the key outright.
    conf_d = pathlib.Path(factory.config_dir) / "master.d"
    conf_d.mkdir(exist_ok=True)
    (conf_d / "fileserver.conf").write_text(yaml.safe_dump({"fileserver_backend": ["gitfs"]}))
    # What multimaster.master renders for the runners: this master alone, MINION its control.
    section = multimaster_pillar([master_entry(factory, MASTER_HOSTS[0], minion_id=MINION)], ports)[
        "multimaster"
    ]
    (conf_d / "multimaster.conf").write_text(
        yaml.safe_dump(devkit.multimaster_master_options(section, backends=["gitfs"]))
    )
    return factory


@pytest.fixture(scope="module")
def minion(master1, start_minion, pillar_tree, ports):
    pillar_tree.set(
        MINION,
        multimaster_pillar(
            [master_entry(master1, MASTER_HOSTS[0], minion_id=MINION)],
            ports,
            manage_services=False,
        ),
    )
    return start_minion(master1, MINION)


@pytest.fixture(scope="module")
def synced(master1, minion):
    ret = master1.salt_cli(timeout=120).run("saltutil.sync_all", minion_tgt=MINION)
    assert ret.returncode == 0, ret
    return ret.data


def test_file_server_is_the_git_repository(master1, minion):
    """
    The minion sees the formula, and only the formula: nothing from the checkout around it.
    """
    ret = master1.salt_cli(timeout=60).run("cp.list_master", minion_tgt=MINION)
    assert ret.returncode == 0, ret
    assert "multimaster/minion/init.sls" in ret.data
    assert "pyproject.toml" not in ret.data
    assert {path.split("/")[0] for path in ret.data} <= set(FORMULA_DIRS)


def test_sync_all_brings_in_the_formula_modules(master1, minion, synced):
    """
    ``saltutil.sync_all`` on a minion syncs the execution module, state module and utils from
    gitfs, and the loaders then list them; on the master, the runners are synced the same way.
    """
    assert "modules.multimaster" in synced["modules"]
    assert "states.multimaster" in synced["states"]
    assert "utils.multimaster_settings" in synced["utils"]
    listed = master1.salt_cli(timeout=60).run(
        "sys.list_modules,sys.list_state_modules", ",", minion_tgt=MINION
    )
    assert "multimaster" in listed.data["sys.list_modules"]
    assert "multimaster" in listed.data["sys.list_state_modules"]

    ret = master1.salt_run_cli(timeout=60).run("saltutil.sync_all")
    assert ret.returncode == 0, ret
    runners = {f"runners.{path.stem}" for path in (REPO_ROOT / "_runners").glob("*.py")}
    assert runners <= set(ret.data["runners"])


def test_minion_state_applies_from_gitfs(master1, minion, synced):
    """
    ``state.apply multimaster.minion`` renders from the gitfs copy and writes the config.
    """
    ret = master1.salt_cli(timeout=120).run("state.apply", "multimaster.minion", minion_tgt=MINION)
    assert_states_ok(ret)
    conf = pathlib.Path(minion.config_dir) / "minion.d" / "multimaster.conf"
    assert yaml.safe_load(conf.read_text())["master"] == [MASTER_HOSTS[0]]


def test_roots_from_git_are_not_copied_and_status_shows_the_served_commit(
    master1, minion, synced, bare_repo
):
    """
    With gitfs the only file server, ``sync_roots roots=file`` has nothing to copy and says so;
    ``status`` reports the commit master1 serves for the remote, and follows it when the remote
    moves and the master fetches.
    """
    ret = master1.salt_run_cli(timeout=120).run("multimaster.sync_roots", "roots=file")
    assert ret.returncode == 0, ret
    assert "file_roots: masters serve files from ['gitfs']: nothing to sync" in ret.data["comment"]

    def served():
        ret = master1.salt_cli(timeout=60).run("multimaster_peer.master_report", minion_tgt=MINION)
        assert ret.returncode == 0, ret
        return ret.data["git"]["gitfs"][bare_repo.as_uri()]

    def head():
        out = subprocess.run(
            ["git", "rev-parse", "master"], cwd=bare_repo, check=True, capture_output=True
        )
        return out.stdout.decode().strip()

    assert served() == {"master": head()}
    ret = master1.salt_run_cli(timeout=120).run("multimaster.status")
    assert ret.data["git_equal"] is True, ret
    assert ret.data["git"] == {f"gitfs {bare_repo.as_uri()}": "same commits"}, ret

    work = bare_repo.parent / "work"
    (work / "multimaster" / "moved.sls").write_text("moved: {}\n")
    git("add", "-A", cwd=work)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "moved", cwd=work)
    git("push", "-q", str(bare_repo), "HEAD:master", cwd=work)
    ret = master1.salt_run_cli(timeout=120).run("fileserver.update")
    assert ret.returncode == 0, ret
    assert served() == {"master": head()}
