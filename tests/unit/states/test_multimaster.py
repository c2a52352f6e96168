"""
The state module ``_states/multimaster.py``, loaded under its own name; its ``__salt__`` holds
the real execution-module functions (``multimaster`` and ``multimaster_daemons``, loaded the same
way), so only the situation is staged. The dunders of all three come from
``configure_loader_modules``, patched in for each test.
"""

import os
import pwd

import pytest


@pytest.fixture
def opts():
    """
    The state module's ``__opts__``; tests switch on test mode in place.
    """
    return {"test": False}


@pytest.fixture
def mod_opts(tmp_path):
    """
    The execution module's ``__opts__``: a minion with a config file and no running daemon.
    """
    (tmp_path / "minion").write_text("")
    return {
        "id": "minion1",
        "pidfile": str(tmp_path / "minion.pid"),
        "conf_file": str(tmp_path / "minion"),
    }


@pytest.fixture
def configure_loader_modules(mod, daemons, state, mod_opts, opts):
    """
    What Salt's loader would inject into both; pytest-salt-factories patches it in and restores
    it.
    """
    return {
        mod: {
            "__opts__": mod_opts,
            "__salt__": {},
            "__context__": {},
        },
        daemons: {
            "__opts__": mod_opts,
            "__salt__": {"multimaster.settings": mod.settings},
            "__context__": {},
        },
        state: {
            "__opts__": opts,
            "__salt__": {
                "multimaster_daemons.restart_minion": daemons.restart_minion,
                "multimaster_daemons.restart_master": daemons.restart_master,
                "multimaster.key_file_problems": mod.key_file_problems,
            },
            "__context__": {},
        },
    }


def test_virtual_needs_the_execution_module(state):
    assert state.__virtual__() == "multimaster"
    state.__salt__.clear()
    result = state.__virtual__()
    assert result[0] is False and "saltutil.sync_all" in result[1]


def test_minion_restarted_test_mode_changes_nothing(state, opts, tmp_path):
    opts["test"] = True
    calls = []
    state.__salt__["multimaster_daemons.restart_minion"] = lambda **kw: calls.append(kw)
    ret = state.minion_restarted("restart")
    assert ret == {
        "name": "restart",
        "result": None,
        "changes": {},
        "comment": "salt-minion would be restarted after this job returns",
    }
    assert calls == []


def test_minion_restarted_without_a_running_minion(state, tmp_path):
    # salt-call --local in an image build: nothing runs, the state succeeds without changes.
    ret = state.minion_restarted("restart")
    assert ret["result"] is True
    assert ret["changes"] == {}
    assert ret["comment"] == (
        f"salt-minion not restarted: no running daemon recorded in {tmp_path / 'minion.pid'}"
    )


def test_minion_restarted_reports_the_scheduled_restart(state):
    seen = {}

    def restart_minion(service, delay):
        seen.update(service=service, delay=delay)
        return {"scheduled": True, "pid": 42, "how": "systemctl restart salt-minion"}

    state.__salt__["multimaster_daemons.restart_minion"] = restart_minion
    ret = state.minion_restarted("restart", service="salt-minion@x", delay=2)
    assert seen == {"service": "salt-minion@x", "delay": 2}
    assert ret["result"] is True
    assert ret["changes"] == {"restart": "systemctl restart salt-minion"}
    assert ret["comment"] == "salt-minion will restart after this job returns"


def test_master_restarted_not_running(state, tmp_path):
    state.__salt__["multimaster_daemons.restart_master"] = lambda **kw: {
        "scheduled": False,
        "reason": "no running daemon recorded in /run/salt-master.pid",
    }
    ret = state.master_restarted("restart")
    assert ret["result"] is True and ret["changes"] == {}
    assert ret["comment"] == (
        "salt-master not restarted: no running daemon recorded in /run/salt-master.pid"
    )


def test_mod_watch_takes_the_low_chunk(state, opts, tmp_path):
    # Salt passes the whole low chunk to mod_watch: unknown keys must not break it.
    opts["test"] = True
    low = {"__reqs__": {"watch": []}, "__id__": "x", "fun": "mod_watch", "state": "multimaster"}
    assert "salt-master" in state.mod_watch("x", sfun="master_restarted", **low)["comment"]
    assert "salt-minion" in state.mod_watch("x", sfun="minion_restarted", **low)["comment"]


def test_master_key_files_secure(state, tmp_path):
    user = pwd.getpwuid(os.getuid()).pw_name
    pki = tmp_path / "pki"
    pki.mkdir()
    (pki / "master.pem").write_text("k")
    os.chmod(pki / "master.pem", 0o400)
    ret = state.master_key_files_secure("keys", pki_dir=str(pki), user=user)
    assert ret == {
        "name": "keys",
        "result": True,
        "changes": {},
        "comment": f"Master key files in {pki} are secure",
    }
    os.chmod(pki / "master.pem", 0o640)
    ret = state.master_key_files_secure("keys", pki_dir=str(pki), user=user)
    assert ret["result"] is False
    assert ret["changes"] == {}
    assert ret["comment"] == f"{pki / 'master.pem'}: mode 0640; expected 0400"


def test_job_cache_returner_installed_reads_the_minion_s_own_options(state, opts, tmp_path):
    """
    The loaded state hands its ``__opts__`` (this minion's ``extension_modules``, test mode) to
    the library: the returner synced to this minion is what gets installed.
    """
    opts["extension_modules"] = str(tmp_path / "minion-extmods")
    synced = tmp_path / "minion-extmods" / "returners" / "multimaster_pgjsonb.py"
    synced.parent.mkdir(parents=True)
    synced.write_bytes(b"# the formula's returner\n")
    target = tmp_path / "master-cache" / "returners" / "multimaster_pgjsonb.py"
    opts["test"] = True
    ret = state.job_cache_returner_installed(str(target))
    assert ret["result"] is None and not target.exists(), ret
    opts["test"] = False
    ret = state.job_cache_returner_installed(str(target))
    assert ret["result"] is True and ret["changes"] == {"returner": "installed"}, ret
    assert target.read_bytes() == synced.read_bytes()
