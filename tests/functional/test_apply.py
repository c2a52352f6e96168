"""
Applying the formula for real on a masterless minion whose config, pki and pidfiles live in tmp,
as ``salt-call --local state.apply`` in an image build would (no salt-minion or salt-master runs):
``test=True`` changes nothing, the first run writes only the config, the second changes nothing,
the clean states remove what was written, and a bad pillar writes nothing at all.
"""

import stat

import pytest
import salt.utils.yaml

from .test_render import MASTERS, SIGN_PUB, pillar

SETTINGS = {"install_packages": False, "manage_services": True}


def state_sls(env, sls, **kwargs):
    """
    ``state.sls`` on ``env``, as one ``salt-call --local state.sls`` would run it.
    """
    with env.loaders() as loaders:
        return loaders.modules.state.sls(sls, **kwargs)


def results(ret):
    assert not ret.failed, f"state run failed: {ret.errors}"
    return {key.split("_|-")[1]: value for key, value in ret.raw.items()}


def changed(ret):
    return sorted(sid for sid, value in results(ret).items() if value["changes"])


def failed(ret):
    return {sid: v["comment"] for sid, v in results(ret).items() if v["result"] is False}


def read_yaml(path):
    with open(path, encoding="utf-8") as handle:
        return salt.utils.yaml.safe_load(handle)


@pytest.fixture(scope="module")
def hot(salt_env):
    """
    The whole sequence on one environment (control minion of master2, mode hot), recorded.
    """
    env = salt_env("master2", pillar(mode="hot", **SETTINGS))
    runs = {}
    runs["dry"] = state_sls(env, "multimaster", test=True)
    runs["dry_written"] = env.written()
    runs["first"] = state_sls(env, "multimaster")
    runs["first_written"] = env.written()
    runs["minion_conf"] = read_yaml(env.conf_dir / "minion.d" / "multimaster.conf")
    runs["master_conf"] = read_yaml(env.conf_dir / "master.d" / "multimaster.conf")
    runs["set_conf"] = read_yaml(env.conf_dir / "master.d" / "multimaster-set.conf")
    runs["modes"] = {
        name: stat.S_IMODE((env.conf_dir / name).stat().st_mode)
        for name in (
            "minion.d/multimaster.conf",
            "master.d/multimaster.conf",
            "master.d/multimaster-set.conf",
        )
    }
    runs["second"] = state_sls(env, "multimaster")
    runs["clean"] = state_sls(env, "multimaster.clean")
    runs["clean_written"] = env.written()
    runs["clean_again"] = state_sls(env, "multimaster.clean")
    return env, runs


def test_dry_run_reports_and_writes_nothing(hot):
    _, runs = hot
    assert not failed(runs["dry"]), runs["dry"]
    dry = results(runs["dry"])
    assert dry["multimaster-minion-config-file-managed"]["result"] is None
    assert dry["multimaster-master-config-file-managed"]["result"] is None
    assert runs["dry_written"] == []


def test_first_run_writes_only_config(hot):
    env, runs = hot
    assert not failed(runs["first"]), runs["first"]
    assert runs["first_written"] == [
        "conf/master.d/multimaster-set.conf",
        "conf/master.d/multimaster.conf",
        "conf/minion.d/multimaster.conf",
        "pki/minion/multimaster_first_highstate",
    ]
    assert changed(runs["first"]) == [
        "multimaster-master-config-file-managed",
        "multimaster-master-config-set-managed",
        "multimaster-minion-config-file-managed",
        # the minion counts as set up: the first-highstate reactor leaves it alone
        "multimaster-minion-config-first-highstate-mark-managed",
    ]
    assert runs["minion_conf"]["master"] == [m["host"] for m in MASTERS]
    assert runs["minion_conf"]["master_type"] == "str"
    assert runs["set_conf"]["multimaster"]["mode"] == "hot"
    assert "multimaster" not in runs["master_conf"]
    assert runs["master_conf"]["ret_port"] == 4506
    assert runs["modes"] == {
        "minion.d/multimaster.conf": 0o644,
        "master.d/multimaster.conf": 0o600,
        "master.d/multimaster-set.conf": 0o600,
    }


def test_restart_without_running_daemons_is_a_no_op(hot):
    env, runs = hot
    first = results(runs["first"])
    minion = first["multimaster-minion-service-restarted"]
    assert minion["result"] is True and minion["changes"] == {}
    assert minion["comment"].startswith("salt-minion not restarted: no running daemon recorded")
    master = first["multimaster-master-service-running-master-restarted"]
    assert master["result"] is True and master["changes"] == {}
    assert str(env.base / "run" / "salt-master.pid") in master["comment"]


def test_second_run_changes_nothing(hot):
    _, runs = hot
    assert not failed(runs["second"]), runs["second"]
    assert changed(runs["second"]) == []


def test_clean_removes_what_was_written(hot):
    _, runs = hot
    assert not failed(runs["clean"]), runs["clean"]
    assert changed(runs["clean"]) == [
        "multimaster-master-clean-config-file-absent",
        "multimaster-master-clean-set-config-file-absent",
        "multimaster-minion-clean-config-file-absent",
        "multimaster-minion-clean-first-highstate-mark-absent",
    ]
    assert runs["clean_written"] == []
    assert changed(runs["clean_again"]) == []


def test_signing_pubkey_delivered_and_cleaned(salt_env):
    env = salt_env(
        "web1",
        pillar(mode="failover", signing={"enabled": True, "public_key": SIGN_PUB}, **SETTINGS),
    )
    ret = state_sls(env, "multimaster.minion")
    assert not failed(ret), ret
    assert env.written() == [
        "conf/minion.d/multimaster.conf",
        "pki/minion/master_sign.pub",
        "pki/minion/multimaster_first_highstate",
    ]
    assert (env.minion_pki / "master_sign.pub").read_text() == SIGN_PUB
    conf = read_yaml(env.conf_dir / "minion.d" / "multimaster.conf")
    assert conf["verify_master_pubkey_sign"] is True
    assert conf["master_type"] == "failover"
    ret = state_sls(env, "multimaster.minion.clean")
    assert not failed(ret), ret
    assert env.written() == []


@pytest.mark.parametrize("sls", ["multimaster", "multimaster.minion", "multimaster.master"])
def test_bad_pillar_writes_nothing(salt_env, sls):
    env = salt_env("master2", pillar(mode="hot", failover={"alive_interval": 5}, **SETTINGS))
    ret = state_sls(env, sls)
    assert ret.failed, f"a bad pillar was applied: {ret.raw}"
    message = "multimaster:failover: got {\"alive_interval\": 5}; expected no 'failover' section"
    assert any(message in error for error in ret.errors), ret.errors
    assert env.written() == []


@pytest.mark.parametrize("sls", ["multimaster", "multimaster.minion"])
def test_a_master_name_the_minion_cannot_resolve_writes_nothing(salt_env, sls):
    """
    A hot minion that lists a name it cannot resolve answers none of its masters (Salt's
    resolve_dns waits for it): the master list is refused before anything is written.
    """
    masters = [MASTERS[0], {"id": "master3", "host": "master3.invalid"}]
    env = salt_env("web1", pillar(mode="hot", masters=masters, **SETTINGS))
    ret = state_sls(env, sls)
    assert ret.failed, f"an unresolvable master name was applied: {ret.raw}"
    message = "'master3.invalid' does not resolve on web1"
    assert any(message in error for error in ret.errors), ret.errors
    assert not any("Traceback" in error for error in ret.errors), ret.errors
    assert env.written() == []


def holders(env, marker):
    """
    The files under ``env`` that hold ``marker``, relative to its base.
    """
    return {
        str(path.relative_to(env.base))
        for path in env.base.rglob("*")
        if path.is_file() and marker.encode() in path.read_bytes()
    }


def test_master_config_secrets_reach_the_master_config_only(salt_env):
    """
    ``master:config`` values and gitfs credentials are written to ``master.d`` at run time:
    not in the rendered states (``state.show_sls`` returns them; Salt caches them), not in the
    state return, in no file but that one and the pillar they came from.
    """
    token, credential = "ext-pillar-token-marker-4b2d", "gitfs-credential-marker-8c1f"
    remote = f"https://deploy:{credential}@git.example.com/formula.git"
    master = {"config": {"ext_pillar_token": token}, "gitfs": {"remotes": [remote]}}
    env = salt_env("master2", pillar(master=master, **SETTINGS))
    shown = env.render(["multimaster.master"])
    ret = state_sls(env, "multimaster.master.config")
    assert not failed(ret), ret
    path = env.conf_dir / "master.d" / "multimaster.conf"
    conf = read_yaml(path)
    assert (conf["ext_pillar_token"], conf["gitfs_remotes"]) == (token, [remote])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for marker in (token, credential):
        assert marker not in repr(shown) and marker not in repr(ret.raw)
        # Syncing the reactors' runners from the master's own file server fetches its gitfs
        # remotes into the master's own gitfs cache, as the master itself does when it serves.
        held = {p for p in holders(env, marker) if not p.startswith("cache/master/gitfs/")}
        assert held == {"conf/master.d/multimaster.conf", "pillar/multimaster.sls"}
