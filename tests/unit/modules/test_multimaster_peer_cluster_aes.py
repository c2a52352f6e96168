"""
The cluster's AES key handed from the master that rotated it to its peers
(``multimaster_cluster``, ``multimaster_peer.cluster_aes_info``/``install_cluster_aes``): only
a newer key replaces the one held, whatever order copies arrive in; only on an envelope sealed
to this control minion, signed with the cluster key and bound to a challenge it issued; the key
is never in a return. Attacks first: a foreign signer, a replayed envelope, an older key, a
key that is not one.
"""

import base64
import os
import stat

import multimaster_cluster as mc
import pytest

from tests.support.keyfactory import priv_pem, pub_pem, rsa_private
from tests.support.loading import cluster_section

CLUSTER_KEY = rsa_private(tag=1)
CONTROL_KEY = rsa_private(tag=5)
ADDRESSES = ("10.0.0.1", "10.0.0.2")
SECTION = cluster_section(ADDRESSES)


def new_key():
    return base64.b64encode(os.urandom(mc.AES_KEY_BYTES)).decode()


def put(mopts, key, stamp):
    path = mc.aes_path(mopts)
    with open(path, "w") as handle:
        handle.write(key)
    os.utime(path, (stamp, stamp))


@pytest.fixture
def mopts(tmp_path):
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    return {"cluster_id": "prod", "cluster_pki_dir": str(cluster), "sock_dir": str(tmp_path)}


def test_the_later_rotation_wins_and_a_tie_goes_to_the_greater_digest():
    old, new = {"stamp": 100.0, "digest": "ff"}, {"stamp": 200.0, "digest": "00"}
    assert mc.newer(new, old) and not mc.newer(old, new)
    assert mc.newer(old, None)
    a, b = {"stamp": 100.0, "digest": "aa"}, {"stamp": 100.0, "digest": "bb"}
    assert mc.newer(b, a) and not mc.newer(a, b) and not mc.newer(a, a)


def test_masters_that_rotate_at_once_end_with_one_key_whatever_the_order(tmp_path):
    keys = [(new_key(), 1000.0 + i) for i in range(3)]
    stores = []
    for i in range(3):
        store = {"cluster_pki_dir": str(tmp_path / f"m{i}")}
        os.mkdir(store["cluster_pki_dir"])
        put(store, *keys[i])
        stores.append(store)
    # Every master hands its own key to the others, in an order where the newest goes first.
    for sender in (2, 0, 1):
        for receiver in range(3):
            if receiver != sender:
                mc.install_aes(stores[receiver], *keys[sender])
    assert {mc.read_aes(s)[0] for s in stores} == {keys[2][0]}


def test_an_installed_key_keeps_its_stamp_and_is_private(mopts):
    put(mopts, new_key(), 1000.0)
    key = new_key()
    assert mc.install_aes(mopts, key, 2000.0) is True
    held_key, held = mc.read_aes(mopts)
    assert held_key == key and held["stamp"] == 2000.0
    assert stat.S_IMODE(os.stat(mc.aes_path(mopts)).st_mode) == 0o600
    assert sorted(os.listdir(mopts["cluster_pki_dir"])) == [".aes"]
    # An older key (a replay of a previous rotation) changes nothing.
    assert mc.install_aes(mopts, new_key(), 1500.0) is False
    assert mc.read_aes(mopts)[0] == key


@pytest.mark.parametrize("bad", ["", "not base64!", base64.b64encode(b"short").decode(), None])
def test_what_is_not_a_salt_aes_key_is_refused_without_quoting_it(mopts, bad):
    put(mopts, new_key(), 1000.0)
    before = mc.read_aes(mopts)
    with pytest.raises(mc.CommandExecutionError) as err:
        mc.install_aes(mopts, bad, 5000.0)
    assert not bad or bad not in str(err.value)
    assert mc.read_aes(mopts) == before


@pytest.fixture
def control(peer, mopts, tmp_path, monkeypatch):
    pki = tmp_path / "pki"
    pki.mkdir()
    (pki / "minion_master.pub").write_text(pub_pem(CLUSTER_KEY))
    (pki / "minion.pem").write_text(priv_pem(CONTROL_KEY))
    pillar = {"multimaster": SECTION}
    opts = {
        "id": "cm2",
        "conf_file": "/srv/cm2/minion",
        "pki_dir": str(pki),
        "cachedir": str(tmp_path / "cache"),
    }
    monkeypatch.setattr(peer, "__opts__", opts, raising=False)
    monkeypatch.setattr(
        peer,
        "__salt__",
        {"pillar.get": lambda key, default=None, **kw: pillar.get(key, default)},
        raising=False,
    )
    monkeypatch.setattr(peer, "__context__", {}, raising=False)
    monkeypatch.setattr(peer.multimaster_keystore, "master_opts", lambda config_dir: mopts)
    reloads = []
    monkeypatch.setattr(mc, "reload", lambda m, sender: reloads.append(sender) or True)
    return reloads


def sealed(peer, body, signer=CLUSTER_KEY):
    """The runner's side: ask for a challenge, seal ``body`` to cm2 bound to it."""
    binding = peer.cluster_aes_info()["binding"]
    bound = peer.multimaster_seal.bind(
        binding["challenge"], binding["target"], binding["config_dir"], sender=ADDRESSES[0]
    )
    key, own = body.get("key"), {"stamp": body.get("stamp")}
    return mc.aes_envelope(key, own, "cm2", pub_pem(CONTROL_KEY), priv_pem(signer), bound)


def test_a_sealed_newer_key_is_installed_and_the_master_reloads_it(peer, mopts, control):
    put(mopts, new_key(), 1000.0)
    key = new_key()
    info = peer.cluster_aes_info()
    assert info["held"]["stamp"] == 1000.0 and info["binding"]["target"] == ADDRESSES[1]
    ret = peer.install_cluster_aes(sealed(peer, {"key": key, "stamp": 2000.0}))
    assert ret == {"installed": True, "reloaded": True}
    assert control == [ADDRESSES[0]]
    assert mc.read_aes(mopts)[0] == key
    assert key not in repr(ret) and key not in repr(peer.cluster_aes_info())


def test_an_older_key_is_not_installed_and_nothing_reloads(peer, mopts, control):
    current = new_key()
    put(mopts, current, 3000.0)
    ret = peer.install_cluster_aes(sealed(peer, {"key": new_key(), "stamp": 2000.0}))
    assert ret == {"installed": False, "reloaded": False} and control == []
    assert mc.read_aes(mopts)[0] == current


def test_an_envelope_signed_by_another_key_changes_nothing(peer, mopts, control):
    current = new_key()
    put(mopts, current, 1000.0)
    envelope = sealed(peer, {"key": new_key(), "stamp": 2000.0}, signer=rsa_private(tag=2))
    with pytest.raises(peer.multimaster_seal.SealError):
        peer.install_cluster_aes(envelope)
    assert mc.read_aes(mopts)[0] == current and control == []


def test_a_replayed_envelope_is_refused(peer, mopts, control):
    put(mopts, new_key(), 1000.0)
    envelope = sealed(peer, {"key": new_key(), "stamp": 2000.0})
    peer.install_cluster_aes(envelope)
    put(mopts, new_key(), 1500.0)
    with pytest.raises(peer.multimaster_seal.SealError):
        peer.install_cluster_aes(envelope)
    assert mc.read_aes(mopts)[1]["stamp"] == 1500.0


@pytest.mark.parametrize("stamp", [None, "2000", True])
def test_a_stamp_that_is_not_a_time_is_refused(peer, mopts, control, stamp):
    put(mopts, new_key(), 1000.0)
    with pytest.raises(peer.CommandExecutionError, match="is not a time"):
        peer.install_cluster_aes(sealed(peer, {"key": new_key(), "stamp": stamp}))
    assert mc.read_aes(mopts)[1]["stamp"] == 1000.0


def test_a_peer_gets_this_master_s_key_only_when_it_holds_an_older_one():
    own = {"stamp": 200.0, "digest": "bb"}
    assert mc.aes_plan(dict(own), own, test=False) == {"result": True, "current": True}
    later = {"stamp": 300.0, "digest": "aa"}
    assert mc.aes_plan(later, own, test=False)["newer_there"] is True
    for held in (None, {"stamp": 100.0, "digest": "ff"}):
        assert mc.aes_plan(held, own, test=False) is None
        assert mc.aes_plan(held, own, test=True)["would_install"] is True


@pytest.mark.parametrize(
    "done, result",
    [
        ({"installed": True, "reloaded": True}, True),
        ({"installed": False, "reloaded": False}, True),
        ({"installed": True, "reloaded": False}, False),
    ],
)
def test_a_key_installed_but_not_reloaded_fails(done, result):
    assert mc.aes_result(done) == dict(done, result=result, current=False)


@pytest.mark.parametrize("held", [{"stamp": "1", "digest": "aa"}, {"stamp": 1.0}, {}])
def test_a_peer_s_aes_answer_that_is_not_a_stamp_and_digest_is_refused(held):
    assert mc.aes_info_check({"held": None})["held"] is None
    with pytest.raises(ValueError, match="not a stamp and a digest"):
        mc.aes_info_check({"held": held})


def test_this_master_without_a_key_refuses_to_share(mopts):
    with pytest.raises(mc.ClusterRefused, match="has not started as a cluster master yet"):
        mc.own_aes(mopts)
