"""
The daemons execution module ``_modules/multimaster_daemons.py``, loaded under its own name, as the
control minion of master2 (the ``opts`` and ``pillar`` fixtures); its ``multimaster.settings``
is the real one, loaded the same way. No daemon runs: the pidfiles are files in tmp_path.
"""

import pytest


@pytest.fixture
def configure_loader_modules(mod, daemons, mod_dunders, opts):
    """
    What Salt's loader would inject; pytest-salt-factories patches it in and restores it.
    """
    return {
        mod: mod_dunders,
        daemons: {"__opts__": opts, "__salt__": {"multimaster.settings": mod.settings}},
    }


def test_virtual(daemons):
    assert daemons.__virtual__() == "multimaster_daemons"


def test_restart_minion_without_a_running_minion_does_nothing(daemons, tmp_path):
    result = daemons.restart_minion()
    assert result == {
        "scheduled": False,
        "reason": f"no running daemon recorded in {tmp_path / 'minion.pid'}",
    }


def test_restart_master_not_running(mod, daemons, tmp_path, defaults):
    # The pidfile comes from this master's own config (the pillar entry), not an argument.
    (tmp_path / "master.pid").write_text("not a pid\n")
    mod.__context__["multimaster.defaults"] = defaults
    mod.__opts__["cachedir"] = str(tmp_path / "cache")
    ret = daemons.restart_master()
    assert ret["scheduled"] is False and str(tmp_path / "master.pid") in ret["reason"]


def test_restart_master_takes_no_pidfile_argument(daemons):
    with pytest.raises(TypeError):
        daemons.restart_master(pidfile="/tmp/attacker.pid")


def test_start_master_starts_this_master_and_says_when_it_does_not_listen(
    mod, daemons, tmp_path, defaults, monkeypatch
):
    mod.__context__["multimaster.defaults"] = defaults
    mod.__opts__["cachedir"] = str(tmp_path / "cache")
    started = []
    monkeypatch.setattr(
        daemons.multimaster_daemon, "start_if_stopped", lambda *a: started.append(a) or "daemon"
    )
    monkeypatch.setattr(daemons.multimaster_daemon, "wait_port", lambda *a: True)
    assert daemons.start_master() == {"started": True, "how": "daemon"}
    # The pidfile and config dir come from this master's own pillar entry.
    assert started[0][0] == str(tmp_path / "master.pid") and started[0][2] == "salt-master"
    monkeypatch.setattr(daemons.multimaster_daemon, "wait_port", lambda *a: False)
    with pytest.raises(daemons.CommandExecutionError, match="did not listen on .* after its start"):
        daemons.start_master(timeout=1)
