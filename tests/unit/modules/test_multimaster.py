"""
The execution module ``_modules/multimaster.py``, loaded under its own name; its dunders come
from ``configure_loader_modules`` (the ``opts`` and ``pillar`` fixtures), patched in for each
test. Files and sockets are real (in tmp_path); nothing is mocked but the pillar and Salt's
``cp`` module.
"""

import os
import pwd
import socket
import time

import multimaster_pillarcheck
import pytest
import salt.utils.yaml
from salt.exceptions import CommandExecutionError, SaltInvocationError

from tests.support.loading import ROOT, read_defaults


def other_user():
    """
    A user that does not own the files this test process creates.
    """
    for entry in pwd.getpwall():
        if entry.pw_uid != os.getuid():
            return entry.pw_name
    pytest.skip("no second user on this system")


@pytest.fixture
def configure_loader_modules(mod, mod_dunders):
    """
    What Salt's loader would inject; pytest-salt-factories patches it in and restores it.
    """
    return {mod: mod_dunders}


def test_virtual(mod):
    assert mod.__virtual__() == "multimaster"


def test_settings_merges_validates_and_resolves_local_paths(mod, tmp_path, defaults):
    settings = mod.settings(defaults)
    assert [m["minion_id"] for m in settings["masters"]] == ["master1", "master2"]
    local = settings["local"]
    assert local["minion_conf_dir"] == str(tmp_path / "conf")
    assert local["minion_pki_dir"] == str(tmp_path / "minion-pki")
    assert local["minion_pidfile"] == str(tmp_path / "minion.pid")
    master = local["master"]
    assert master["id"] == "master2"
    # No config_dir in pillar: the control minion's own config dir, read for the master's paths.
    assert master["config_dir"] == str(tmp_path / "conf")
    assert master["pki_dir"] == str(tmp_path / "master-pki")
    assert master["cachedir"] == str(tmp_path / "master-cache")
    assert master["pidfile"] == str(tmp_path / "master.pid")
    assert settings["config"]["minion"]["master"] == ["10.0.3.61", "10.0.3.230"]
    assert settings["config"]["set"]["multimaster"]["masters"][1]["id"] == "master2"
    assert mod.minion_config(defaults) == settings["config"]["minion"]
    assert mod.master_config(defaults) == settings["config"]["master"]
    assert mod.validate(defaults) is True


@pytest.fixture
def parameters_server(mod):
    """
    ``cp.get_file_str`` serving the formula's parameters files; returns the URLs asked for.
    """
    calls = []

    def get_file_str(url):
        calls.append(url)
        path = ROOT / url.removeprefix("salt://")
        return path.read_text() if path.is_file() else False

    mod.__salt__["cp.get_file_str"] = get_file_str
    return calls


def test_settings_reads_formula_defaults_once(mod, parameters_server):
    mod.settings()
    mod.settings()
    assert parameters_server == [
        "salt://multimaster/parameters/os_family/Debian.yaml",
        "salt://multimaster/parameters/defaults.yaml",
    ]
    assert mod.__context__["multimaster.defaults"] == read_defaults("Debian")


@pytest.mark.parametrize("family", ["Debian", "RedHat", "Suse"])
def test_os_family_parameters_name_the_distro_packages(mod, parameters_server, family):
    mod.__grains__["os_family"] = family
    lookup = mod.settings()["lookup"]["master"]
    assert (lookup["gitfs_pkg"], lookup["job_cache_pkg"]) == ("python3-pygit2", "python3-psycopg2")
    assert lookup == read_defaults(family)["lookup"]["master"]


def test_a_family_without_parameters_asks_for_the_package_name(mod, pillar, parameters_server):
    """
    A distro-packaged Salt on a family the formula has no parameters for: the distro package
    of a wanted dependency has no name, and the error says which key to set.
    """
    mod.__grains__["os_family"] = "Gentoo"
    pillar["multimaster"]["job_cache"] = {"enabled": True, "host": "db", "password": "pw"}
    pillar["multimaster"]["lookup"] = {"master": {"job_cache_install": "pkg"}}
    with pytest.raises(multimaster_pillarcheck.SettingsError, match="lookup:master:job_cache_pkg"):
        mod.settings()


def test_missing_defaults_file_is_an_error(mod):
    mod.__salt__["cp.get_file_str"] = lambda url: False
    with pytest.raises(CommandExecutionError, match="cannot read salt://multimaster/parameters"):
        mod.settings()


def test_bad_pillar_raises_naming_the_key(mod, pillar, defaults):
    pillar["multimaster"]["mode"] = "standby"
    with pytest.raises(
        multimaster_pillarcheck.SettingsError, match=r'^multimaster:mode: got "standby"'
    ):
        mod.validate(defaults)
    with pytest.raises(multimaster_pillarcheck.SettingsError):
        mod.minion_config(defaults)


def test_master_config_refused_off_a_control_minion(mod, opts, defaults):
    opts["id"] = "web1"
    settings = mod.settings(defaults)
    assert settings["local"]["master"] is None
    assert settings["config"]["master"] is None
    # A plain minion still gets its minion config.
    assert settings["config"]["minion"]["master_type"] == "str"
    with pytest.raises(CommandExecutionError) as err:
        mod.master_config(defaults)
    assert "multimaster:masters: no entry has minion_id 'web1'" in str(err.value)


def test_explicit_config_dir_is_used(mod, opts, pillar, tmp_path, defaults):
    opts["id"] = "master1"
    other = tmp_path / "other"
    other.mkdir()
    (other / "master").write_text(f"pki_dir: {tmp_path / 'other-pki'}\n")
    pillar["multimaster"]["masters"][0]["config_dir"] = str(other)
    master = mod.settings(defaults)["local"]["master"]
    assert master["config_dir"] == str(other)
    assert master["pki_dir"] == str(tmp_path / "other-pki")


# --- key_file_problems ---------------------------------------------------------------------


@pytest.fixture
def pki(tmp_path):
    pki = tmp_path / "pki"
    pki.mkdir()
    for name, mode in (("master1.pem", 0o400), ("master1.pub", 0o644)):
        (pki / name).write_text(name)
        os.chmod(pki / name, mode)
    # Salt 3008 makes master.pem/master.pub compatibility symlinks to the id-named files.
    os.symlink("master1.pem", pki / "master.pem")
    os.symlink("master1.pub", pki / "master.pub")
    (pki / "minions").mkdir()
    return pki


def me():
    return pwd.getpwuid(os.getuid()).pw_name


def test_key_files_ok(mod, pki):
    assert mod.key_file_problems(str(pki), me()) == []


def test_world_readable_private_key_is_reported(mod, pki):
    os.chmod(pki / "master1.pem", 0o644)
    problems = mod.key_file_problems(str(pki), me())
    # Reported once, although master.pem links to it.
    assert problems == [f"{pki / 'master1.pem'}: mode 0644; expected 0400"]


def test_symlink_is_followed_to_its_target(mod, pki, tmp_path):
    outside = tmp_path / "elsewhere.pem"
    outside.write_text("key")
    os.chmod(outside, 0o640)
    os.unlink(pki / "master.pem")
    os.symlink(outside, pki / "master.pem")
    assert mod.key_file_problems(str(pki), me()) == [f"{outside}: mode 0640; expected 0400"]


@pytest.mark.parametrize("mode", [0o604, 0o440, 0o640, 0o500])
def test_a_private_key_others_can_use_or_anyone_can_run_is_reported(mod, pki, mode):
    os.chmod(pki / "master1.pem", mode)
    assert mod.key_file_problems(str(pki), me()) == [
        f"{pki / 'master1.pem'}: mode {mode:04o}; expected 0400"
    ]


def test_a_key_salt_left_at_0200_reveals_nothing_and_is_not_reported(mod, pki):
    # Salt 3008's flush of the master.pem link: chmod 0200 (following the link), remove link.
    os.chmod(pki / "master1.pem", 0o200)
    os.unlink(pki / "master.pem")
    assert mod.key_file_problems(str(pki), me()) == []


def test_a_link_loop_is_not_a_regular_file(mod, pki):
    os.unlink(pki / "master.pem")
    os.symlink("master.pem", pki / "master.pem")
    assert mod.key_file_problems(str(pki), me()) == [f"{pki / 'master.pem'}: not a regular file"]


def test_a_key_removed_since_the_listing_is_not_reported(mod, pki, monkeypatch):
    (pki / "master_sign.pem").write_text("key")
    listdir = os.listdir

    def listed_then_removed(path):
        names = listdir(path)
        os.unlink(pki / "master_sign.pem")
        return names

    monkeypatch.setattr(mod.os, "listdir", listed_then_removed)
    assert mod.key_file_problems(str(pki), me()) == []


def test_dangling_symlink_and_directory_are_not_regular_files(mod, pki):
    os.unlink(pki / "master.pem")
    os.symlink("gone.pem", pki / "master.pem")
    (pki / "odd.pub").mkdir()
    assert mod.key_file_problems(str(pki), me()) == [
        f"{pki / 'master.pem'}: not a regular file",
        f"{pki / 'odd.pub'}: not a regular file",
    ]


def test_writable_public_key_is_reported(mod, pki):
    os.chmod(pki / "master1.pub", 0o666)
    problems = mod.key_file_problems(str(pki), me())
    assert f"{pki / 'master1.pub'}: mode 0666; expected not group/world-writable" in problems


def test_wrong_owner_is_reported(mod, pki):
    user = other_user()
    uid = pwd.getpwnam(user).pw_uid
    problems = mod.key_file_problems(str(pki), user)
    assert f"{pki / 'master1.pem'}: owner uid {os.getuid()}; expected {user} ({uid})" in problems
    assert len(problems) == 2  # both files, once each (master.pem/.pub link to them)


def test_unknown_user_and_missing_dir(mod, pki, tmp_path):
    assert mod.key_file_problems(str(pki), "no-such-user-xyz") == [
        "user 'no-such-user-xyz' does not exist"
    ]
    assert mod.key_file_problems(str(tmp_path / "missing"), me()) == []


# --- secrets, active master, reachability -------------------------------------------------


SECRETS = {
    "cluster": "cluster-secret-marker-" + "5" * 20,
    "job_cache": "job-cache-password-marker-2f7a",
    "config": "ext-pillar-token-marker-91c3",
    "gitfs": "gitfs-credential-marker-0e6d",
}


def plant_secrets(section, mode):
    """
    Every secret the pillar may hold, planted in ``section`` (mode ``hot`` or ``cluster``).
    """
    section["job_cache"] = {"enabled": True, "host": "db", "password": SECRETS["job_cache"]}
    section["master"] = {
        "config": {"ext_pillar_token": SECRETS["config"]},
        "gitfs": {"remotes": [f"https://deploy:{SECRETS['gitfs']}@git.example.com/f.git"]},
    }
    if mode == "cluster":
        section["mode"] = "cluster"
        section["masters"] = [
            {"id": "10.0.3.61", "host": "10.0.3.61", "minion_id": "master1"},
            {"id": "10.0.3.230", "host": "10.0.3.230", "minion_id": "master2"},
        ]
        section["cluster"] = {"id": "c1", "balancer": "10.0.3.10", "secret": SECRETS["cluster"]}


def answer(call):
    """
    What a publish of ``call`` would return: its value, or the message of its refusal.
    """
    try:
        return repr(call())
    except (CommandExecutionError, SaltInvocationError) as exc:
        return str(exc)


@pytest.mark.parametrize("mode", ["hot", "cluster"])
def test_no_public_function_returns_a_secret(mod, pillar, defaults, mode):
    # Any execution function can be published and its return lands in the job cache: the
    # secrets go to their files from the states at run time, never through a return.
    plant_secrets(pillar["multimaster"], mode)
    calls = {
        "settings": lambda: mod.settings(defaults),
        "settings redact=False": lambda: mod.settings(defaults, redact=False),
        "master_config": lambda: mod.master_config(defaults),
        "minion_config": lambda: mod.minion_config(defaults),
        "validate": lambda: mod.validate(defaults),
    }
    if mode == "cluster":
        calls["haproxy_config"] = lambda: mod.haproxy_config(defaults)
    answers = {name: answer(call) for name, call in calls.items()}
    leaked = {name: [s for s in SECRETS.values() if s in text] for name, text in answers.items()}
    assert not any(leaked.values()), leaked
    assert answers["settings redact=False"].startswith("redact=False is not accepted"), answers


def test_active_master(mod, opts):
    opts.update(master="10.0.3.61", master_list=["10.0.3.61", "10.0.3.230"])
    opts["master_type"] = "failover"
    assert mod.active_master() == {
        "master": "10.0.3.61",
        "master_list": ["10.0.3.61", "10.0.3.230"],
        "master_type": "failover",
    }
    del opts["master_list"]
    assert mod.active_master()["master_list"] == "10.0.3.61"


def test_check_masters_reports_each_port(mod, pillar, defaults):
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    try:
        publish, ret = (s.getsockname()[1] for s in listeners)
        pillar["multimaster"] = {
            "ports": {"publish": publish, "ret": ret},
            "masters": [
                {"id": "up", "host": "127.0.0.1"},
                # Loopback, but nothing listens on 127.0.0.2: refused at once.
                {"id": "down", "host": "127.0.0.2"},
            ],
        }
        report = mod.check_masters(timeout=2, defaults=defaults)
    finally:
        for listener in listeners:
            listener.close()
    assert report == {
        "up": {"host": "127.0.0.1", "publish": True, "ret": True},
        "down": {"host": "127.0.0.2", "publish": False, "ret": False},
    }


OLD_SECRET, NEW_SECRET = "o" * 40, "n" * 40


@pytest.fixture
def cluster_peer(pillar, conf_dir, tmp_path, defaults, mod):
    """
    master2 (10.0.3.62) in a cluster that dropped 10.0.3.63: its master runs with OLD_SECRET
    and holds the removed peer's key; pillar holds NEW_SECRET. Returns the peer key path.
    """
    pillar["multimaster"] = {
        "mode": "cluster",
        "masters": [
            {"id": "10.0.3.61", "host": "10.0.3.61", "minion_id": "master1"},
            {"id": "10.0.3.62", "host": "10.0.3.62", "minion_id": "master2"},
        ],
        "cluster": {"balancer": "10.0.3.10", "id": "prod", "secret": NEW_SECRET},
    }
    config = salt.utils.yaml.safe_load((conf_dir / "master").read_text())
    config.update(
        cluster_id="prod",
        cluster_peers=["10.0.3.61", "10.0.3.63"],
        cluster_pki_dir=str(tmp_path / "cluster"),
        cluster_secret=OLD_SECRET,
    )
    (conf_dir / "master").write_text(salt.utils.yaml.safe_dump(config))
    peers = tmp_path / "cluster" / "peers"
    peers.mkdir(parents=True)
    for peer in ("10.0.3.61", "10.0.3.63"):
        (peers / f"{peer}.pub").write_text("public key\n")
    mod.__context__["multimaster.defaults"] = defaults
    return peers / "10.0.3.63.pub"


def test_forget_cluster_peer_deletes_only_its_key(mod, cluster_peer):
    assert mod.forget_cluster_peer("10.0.3.63", test=True)["deleted"] is False
    assert cluster_peer.exists()
    ret = mod.forget_cluster_peer("10.0.3.63", rotate_secret=True)
    assert ret["deleted"] is True and not cluster_peer.exists()
    assert (cluster_peer.parent / "10.0.3.61.pub").exists()
    # Re-run: nothing left to delete, and the rotation check is satisfied by the missing key.
    assert mod.forget_cluster_peer("10.0.3.63", rotate_secret=True)["deleted"] is False
    assert NEW_SECRET not in str(ret) and OLD_SECRET not in str(ret)


def test_forget_cluster_peer_refuses_to_rotate_to_the_secret_it_runs_with(
    mod, pillar, cluster_peer
):
    pillar["multimaster"]["cluster"]["secret"] = OLD_SECRET
    for test in (True, False):
        with pytest.raises(CommandExecutionError, match="put a new secret in pillar") as err:
            mod.forget_cluster_peer("10.0.3.63", rotate_secret=True, test=test)
        assert OLD_SECRET not in str(err.value)
    assert cluster_peer.exists()
    # A pillar without the secret is no rotation either.
    del pillar["multimaster"]["cluster"]["secret"]
    with pytest.raises(CommandExecutionError, match="secret is empty"):
        mod.forget_cluster_peer("10.0.3.63", rotate_secret=True)
    assert cluster_peer.exists()
    # Not asked to rotate: the key goes.
    assert mod.forget_cluster_peer("10.0.3.63")["deleted"] is True


@pytest.mark.parametrize(
    "peer, message",
    [
        ("10.0.3.61", "still a master of multimaster:masters"),
        ("../../etc/passwd", "not a valid id"),
        ("10.0.3.62", "still a master of multimaster:masters"),
    ],
)
def test_forget_cluster_peer_refuses_a_listed_or_unsafe_peer(mod, cluster_peer, peer, message):
    with pytest.raises(Exception, match=message):
        mod.forget_cluster_peer(peer)
    assert sorted(p.name for p in cluster_peer.parent.iterdir()) == [
        "10.0.3.61.pub",
        "10.0.3.63.pub",
    ]


def test_forget_cluster_peer_refused_outside_cluster_mode(mod, defaults):
    mod.__context__["multimaster.defaults"] = defaults
    with pytest.raises(CommandExecutionError, match="not the control minion of a cluster master"):
        mod.forget_cluster_peer("10.0.3.63")


def test_id_problems_takes_a_mapping_only(mod):
    assert mod.id_problems({"pillar multimaster_new": "master3"}) == []
    (problem,) = mod.id_problems({"pillar multimaster_new": "web*"})
    assert problem.startswith("pillar multimaster_new: 'web*' is not a valid id; expected")
    with pytest.raises(CommandExecutionError, match=r"^ids: got 'web\*'; expected a mapping"):
        mod.id_problems("web*")


# --- first highstate --------------------------------------------------------------------------


@pytest.fixture
def first_start(mod, opts, tmp_path, monkeypatch):
    """
    ``first_start(seconds_ago, window=None)``: this salt-minion (verified from its pidfile)
    started that long ago (None: none runs) and ``config.get`` gives ``window`` for
    ``multimaster:reactor:first_highstate_window`` (None: unset). Returns the highstates run and
    the ``running_since`` calls.
    """
    opts["pki_dir"] = str(tmp_path / "minion-pki")
    os.makedirs(opts["pki_dir"])
    runs = {"highstates": [], "since": []}

    def first_start(seconds_ago, window=None):
        def running_since(*args):
            runs["since"].append(args)
            return None if seconds_ago is None else time.time() - seconds_ago

        def config_get(key, default=None, **kwargs):
            assert key == "multimaster:reactor:first_highstate_window"
            return default if window is None else window

        monkeypatch.setattr(mod.multimaster_daemon, "running_since", running_since)
        monkeypatch.setitem(mod.__salt__, "config.get", config_get)
        monkeypatch.setitem(
            mod.__salt__, "state.highstate", lambda **kw: runs["highstates"].append(kw) or {}
        )
        return runs

    return first_start


def mark(opts):
    return os.path.join(opts["pki_dir"], "multimaster_first_highstate")


def test_first_highstate_runs_once_just_after_the_minion_started(mod, opts, first_start):
    runs = first_start(20)
    assert mod.claim_first_highstate(__pub_jid="1")["highstate"] is True
    again = mod.claim_first_highstate(__pub_jid="2")
    assert again["highstate"] is False and "already claimed" in again["comment"], again
    assert runs["highstates"] == [{"queue": True}]
    assert runs["since"][0] == (opts["pidfile"], "salt-minion", os.path.dirname(opts["conf_file"]))


@pytest.mark.parametrize("seconds_ago", [3600, None], ids=["long-ago", "not-running"])
def test_first_highstate_is_not_claimed_by_a_minion_that_did_not_just_start(
    mod, opts, first_start, seconds_ago
):
    """
    A start event can be forged for any id: a minion whose salt-minion has run for longer than
    the window (or that cannot tell when it started) runs nothing and leaves its mark unset, so
    its next real start still gets the highstate.
    """
    runs = first_start(seconds_ago)
    ret = mod.claim_first_highstate()
    assert ret["highstate"] is False, ret
    assert "multimaster:reactor:first_highstate_window" in ret["comment"] or (
        seconds_ago is None and opts["pidfile"] in ret["comment"]
    ), ret
    assert runs["highstates"] == [] and not os.path.exists(mark(opts))


def test_first_highstate_window_comes_from_config(mod, opts, first_start):
    runs = first_start(3600, window=7200)
    assert mod.claim_first_highstate()["highstate"] is True
    assert len(runs["highstates"]) == 1
    runs = first_start(30, window=10)
    os.unlink(mark(opts))
    ret = mod.claim_first_highstate()
    assert ret["highstate"] is False and "(10 s)" in ret["comment"], ret


@pytest.mark.parametrize("window", ["soon", 0, True, -5])
def test_first_highstate_window_that_is_not_seconds_is_an_error_naming_it(
    mod, opts, first_start, window
):
    first_start(20, window=window)
    with pytest.raises(CommandExecutionError) as err:
        mod.claim_first_highstate()
    assert "multimaster:reactor:first_highstate_window" in str(err.value)
    assert "an integer number of seconds >= 1" in str(err.value)
    assert not os.path.exists(mark(opts))


def test_first_highstate_window_default_is_the_formulas(mod, defaults):
    assert mod.FIRST_HIGHSTATE_WINDOW == defaults["reactor"]["first_highstate_window"]
