"""
``multimaster_peer.install_master_key`` swaps the key only while the master is stopped, and
starts the master again even when storing the key fails: a failed install must not leave the
master down. The daemon and key store calls are recorded, not run; this host's master entry comes
from the pillar and minion id that ``configure_loader_modules`` gives the module.
"""

import multimaster_daemon
import multimaster_masterkeyfiles
import pytest

from tests.support.transfers import master_serving, stage_json

MASTER = {"id": "m2", "host": "10.0.0.2", "config_dir": "/etc/salt", "minion_id": "cm2"}
SECTION = {"ports": {"publish": 4505, "ret": 4506}, "masters": [MASTER]}


@pytest.fixture
def sender(tmp_path):
    """
    The sending master's opts: its outbox holds what the runner staged.
    """
    return {"cachedir": str(tmp_path / "sender"), "minimum_auth_version": 3}


@pytest.fixture
def configure_loader_modules(peer, sender):
    """
    What Salt's loader would inject on m2's control minion; patched in and restored for each test.
    """
    pillar = {"multimaster": SECTION}
    return {
        peer: {
            "__opts__": {"id": "cm2", "conf_file": "/etc/salt/minion"},
            "__salt__": {
                "pillar.get": lambda key, default=None, **kw: pillar.get(key, default),
                "publish.runner": master_serving(sender, "cm2"),
            },
            "__context__": {},
        }
    }


@pytest.fixture
def calls(peer, monkeypatch):
    """
    The daemon and key store calls, recorded in order; the envelope opens to a fixed pair.
    """
    calls = []
    # No file server here: the pull falls back to peer_run (``publish.runner`` above).
    monkeypatch.setattr(peer.multimaster_transport.ContentPull, "_fileserver_pull", lambda *a: {})
    monkeypatch.setattr(peer.multimaster_masterkey, "opened_pair", lambda *a: ("PEM", "PUB", "ab"))
    keystore, daemon = peer.multimaster_keystore, multimaster_daemon
    monkeypatch.setattr(keystore, "master_opts", lambda d: {"pidfile": "/run/m.pid"})
    monkeypatch.setattr(multimaster_masterkeyfiles, "read_master_key", lambda *a, **k: None)
    monkeypatch.setattr(
        daemon,
        "stop_now",
        lambda *a: calls.append("stop") or {"was_running": True, "service": None},
    )
    monkeypatch.setattr(daemon, "start_now", lambda *a: calls.append("start"))
    monkeypatch.setattr(daemon, "wait_port", lambda *a: calls.append("wait") or False)
    return calls


def test_the_master_is_started_again_when_the_store_fails(peer, calls, sender, monkeypatch):
    def broken(*args, **kwargs):
        calls.append("store")
        raise OSError("disk full")

    monkeypatch.setattr(multimaster_masterkeyfiles, "install_master_key", broken)
    with pytest.raises(OSError, match="disk full"):
        peer.install_master_key(stage_json(sender, "cm2", {"envelope": "sealed"}))
    assert calls == ["stop", "store", "start"]


def test_the_key_is_stored_only_while_the_master_is_stopped(peer, calls, sender, monkeypatch):
    monkeypatch.setattr(
        multimaster_masterkeyfiles,
        "install_master_key",
        lambda *a, **k: calls.append("store"),
    )
    ret = peer.install_master_key(stage_json(sender, "cm2", {"envelope": "sealed"}))
    assert calls[:3] == ["stop", "store", "start"]
    assert ret["changed"] is True and ret["served"] is False


def test_a_used_transfer_is_refused_before_anything_stops(peer, calls, sender):
    transfer = stage_json(sender, "cm2", {"envelope": "sealed"})
    peer.multimaster_transport.fetch(
        transfer, lambda t, o: peer.multimaster_transport.serve(sender, "cm2", t, o)
    )
    with pytest.raises(peer.multimaster_transport.TransferError, match="replay"):
        peer.install_master_key(transfer)
    assert calls == []


def test_a_master_not_running_gets_the_key_and_stays_stopped(peer, calls, sender, monkeypatch):
    # A new master: add_master starts it later, so that it first listens with the set's key.
    monkeypatch.setattr(
        multimaster_daemon,
        "stop_now",
        lambda *a: calls.append("stop") or {"was_running": False, "service": None},
    )
    monkeypatch.setattr(
        multimaster_masterkeyfiles, "install_master_key", lambda *a, **k: calls.append("store")
    )
    ret = peer.install_master_key(stage_json(sender, "cm2", {"envelope": "sealed"}))
    assert calls == ["stop", "store"]
    assert ret["changed"] is True and ret["served"] is None and ret["restarted"] is None
    assert ret["running"] is False and "not running" in ret["reason"]


def test_a_stopped_master_holding_the_key_is_left_alone(peer, calls, sender, monkeypatch):
    monkeypatch.setattr(multimaster_masterkeyfiles, "read_master_key", lambda *a, **k: "PUB")
    monkeypatch.setattr(peer.multimaster_masterkey.multimaster_keys, "fingerprint", lambda p: "ab")
    monkeypatch.setattr(multimaster_daemon, "verified_pid", lambda *a: None)
    ret = peer.install_master_key(stage_json(sender, "cm2", {"envelope": "sealed"}))
    assert calls == []
    assert ret["changed"] is False and ret["served"] is None and ret["running"] is False
