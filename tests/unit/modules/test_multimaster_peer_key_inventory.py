"""
``multimaster_peer.key_inventory`` records what it reads: the accepted and pending ids of its
master's store, which the key reactor on that master checks a delete event against.
"""

import multimaster_daemon
import multimaster_keys
import pytest

from tests.support.keyfactory import pub_pem, rsa_private
from tests.support.loading import HOT_PAIR as SECTION

PEM = pub_pem(rsa_private(tag=5))


@pytest.fixture
def mopts(tmp_path):
    pki = tmp_path / "master-pki"
    for name in ("minions", "minions_pre", "minions_rejected", "minions_denied"):
        (pki / name).mkdir(parents=True)
    return {
        "pki_dir": str(pki),
        "cachedir": str(tmp_path / "master-cache"),
        "keys.cache_driver": "localfs_key",
        "user": None,
    }


@pytest.fixture
def configure_loader_modules(peer, tmp_path):
    pillar = {"multimaster": SECTION}
    return {
        peer: {
            "__opts__": {
                "id": "cm2",
                "conf_file": "/etc/salt/minion",
                "pki_dir": str(tmp_path / "minion-pki"),
                "cachedir": str(tmp_path / "minion-cache"),
            },
            "__salt__": {"pillar.get": lambda key, default=None, **kw: pillar.get(key, default)},
            "__context__": {},
        }
    }


@pytest.fixture(autouse=True)
def this_master(peer, mopts, monkeypatch):
    monkeypatch.setattr(peer.multimaster_keystore, "master_opts", lambda config_dir: mopts)
    monkeypatch.setattr(multimaster_daemon, "master_alive", lambda master, opts: True)


def put(mopts, state_dir, minion_id):
    with open(f"{mopts['pki_dir']}/{state_dir}/{minion_id}", "w", encoding="utf-8") as handle:
        handle.write(PEM)


def test_a_read_records_the_accepted_and_pending_ids_it_saw(peer, mopts):
    keystore = peer.multimaster_keystore
    fp = multimaster_keys.fingerprint(PEM)
    put(mopts, "minions", "web1")
    put(mopts, "minions_pre", "web2")
    put(mopts, "minions_rejected", "web3")
    peer.key_inventory(ids=["web1", "web3"])
    assert keystore.held_before(mopts, "web1") == fp
    assert keystore.held_before(mopts, "web2") is None  # not read yet
    assert keystore.held_before(mopts, "web3") is None
    peer.key_inventory()
    assert keystore.held_before(mopts, "web2") == fp
