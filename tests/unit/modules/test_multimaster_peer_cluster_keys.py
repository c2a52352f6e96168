"""
``multimaster_peer.install_cluster_peer_keys`` on a joined cluster master's control minion:
it adds the peer keys the master lacks only on an order signed with the cluster key and bound
to a challenge it issued, only for the other configured masters, and never replaces a key it
holds. Attacks first: a foreign signer, a replayed order, a key for an id that is not a master,
a forged key for a peer it already knows.
"""

import os
import pathlib
import stat

import multimaster_cluster as mc
import pytest

from tests.support.keyfactory import priv_pem, pub_pem, rsa_private
from tests.support.loading import cluster_section

ADDRESSES = ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4")
OWN = ADDRESSES[3]
CLUSTER_KEY = rsa_private(tag=1)
PEER_KEYS = {a: pub_pem(rsa_private(tag=10 + i)) for i, a in enumerate(ADDRESSES)}
SECTION = cluster_section(ADDRESSES)


@pytest.fixture
def dirs(tmp_path):
    pki = tmp_path / "pki"
    pki.mkdir()
    # A minion behind a cluster trusts the cluster's key as its master's.
    (pki / "minion_master.pub").write_text(pub_pem(CLUSTER_KEY))
    peers = tmp_path / "cluster" / "peers"
    peers.mkdir(parents=True)
    # What Salt gave the joined master: its own key and the one peer it joined through.
    for address in (OWN, ADDRESSES[0]):
        (peers / f"{address}.pub").write_text(PEER_KEYS[address])
    return {"pki": pki, "peers": peers, "cache": tmp_path / "cache"}


@pytest.fixture
def configure_loader_modules(peer, dirs):
    pillar = {"multimaster": SECTION}
    return {
        peer: {
            "__opts__": {
                "id": "cm4",
                "conf_file": "/srv/cm4/minion",
                "pki_dir": str(dirs["pki"]),
                "cachedir": str(dirs["cache"]),
            },
            "__salt__": {"pillar.get": lambda key, default=None, **kw: pillar.get(key, default)},
            "__context__": {},
        }
    }


@pytest.fixture(autouse=True)
def cluster_master(peer, dirs, monkeypatch):
    cluster_pki = str(dirs["peers"].parent)
    monkeypatch.setattr(
        peer.multimaster_keystore,
        "master_opts",
        lambda config_dir: {"cluster_id": "prod", "cluster_pki_dir": cluster_pki},
    )


def signed(peer, keys, signer=CLUSTER_KEY):
    """The runner's side: ask for a challenge, sign ``keys`` bound to it."""
    binding = peer.cluster_peer_keys()["binding"]
    bound = peer.multimaster_seal.bind(
        binding["challenge"], binding["target"], binding["config_dir"]
    )
    return mc.peer_keys_order(keys, "cm4", priv_pem(signer), bound)


def held(dirs):
    return {p.stem: p.read_text() for p in pathlib.Path(dirs["peers"]).glob("*.pub")}


def test_it_reports_what_it_holds_by_fingerprint(peer):
    ret = peer.cluster_peer_keys()
    fingerprint = mc.multimaster_keys.fingerprint
    assert ret["held"] == {a: fingerprint(PEER_KEYS[a]) for a in (OWN, ADDRESSES[0])}
    assert ret["binding"]["target"] == OWN


def test_a_signed_order_adds_only_the_missing_keys_world_readable(peer, dirs):
    missing = {a: PEER_KEYS[a] for a in ADDRESSES[1:3]}
    ret = peer.install_cluster_peer_keys(missing, signed(peer, missing))
    assert sorted(ret["written"]) == list(ADDRESSES[1:3]) and ret["conflicts"] == {}
    assert held(dirs) == PEER_KEYS
    mode = stat.S_IMODE(os.stat(dirs["peers"] / f"{ADDRESSES[1]}.pub").st_mode)
    assert mode == 0o644
    again = peer.install_cluster_peer_keys(missing, signed(peer, missing))
    assert again["written"] == [] and sorted(again["unchanged"]) == list(ADDRESSES[1:3])


def test_an_order_signed_by_another_key_changes_nothing(peer, dirs):
    before = held(dirs)
    missing = {ADDRESSES[1]: PEER_KEYS[ADDRESSES[1]]}
    order = signed(peer, missing, signer=rsa_private(tag=2))
    with pytest.raises(peer.multimaster_seal.SealError):
        peer.install_cluster_peer_keys(missing, order)
    assert held(dirs) == before


def test_a_replayed_order_is_refused(peer, dirs):
    missing = {ADDRESSES[1]: PEER_KEYS[ADDRESSES[1]]}
    order = signed(peer, missing)
    peer.install_cluster_peer_keys(missing, order)
    (dirs["peers"] / f"{ADDRESSES[1]}.pub").unlink()
    with pytest.raises(peer.multimaster_seal.SealError):
        peer.install_cluster_peer_keys(missing, order)
    assert ADDRESSES[1] not in held(dirs)


@pytest.mark.parametrize("stranger", ["10.9.9.9", "../../etc/evil", OWN])
def test_a_key_for_anything_but_another_master_refuses_the_whole_batch(peer, dirs, stranger):
    before = held(dirs)
    keys = {ADDRESSES[1]: PEER_KEYS[ADDRESSES[1]], stranger: pub_pem(rsa_private(tag=3))}
    with pytest.raises(peer.CommandExecutionError, match="not another master"):
        peer.install_cluster_peer_keys(keys, signed(peer, keys))
    assert held(dirs) == before


def test_a_forged_key_for_a_known_peer_is_a_conflict_and_never_replaces_it(peer, dirs):
    forged = {ADDRESSES[0]: pub_pem(rsa_private(tag=4))}
    ret = peer.install_cluster_peer_keys(forged, signed(peer, forged))
    assert ret["written"] == [] and list(ret["conflicts"]) == [ADDRESSES[0]]
    assert held(dirs)[ADDRESSES[0]] == PEER_KEYS[ADDRESSES[0]]


def test_a_master_outside_cluster_mode_refuses(peer, monkeypatch):
    monkeypatch.setattr(
        peer.multimaster_keystore, "master_opts", lambda config_dir: {"cluster_id": None}
    )
    with pytest.raises(peer.CommandExecutionError, match="not a cluster master"):
        peer.cluster_peer_keys()


def test_the_runner_sends_only_missing_keys_and_names_conflicts_it_never_replaces():
    keys = {a: PEER_KEYS[a] for a in ADDRESSES[:3]}
    held = {OWN: "fp-own", ADDRESSES[0]: "forged-fp"}
    missing, report = mc.peer_keys_plan(ADDRESSES[2], held, keys)
    assert missing == {ADDRESSES[1]: PEER_KEYS[ADDRESSES[1]]}
    assert report == {"missing": [ADDRESSES[1]], "conflicts": [ADDRESSES[0]]}
    done = {"written": [ADDRESSES[1]], "conflicts": {ADDRESSES[3]: {}}}
    assert mc.peer_keys_result(report, done) == {
        "missing": [ADDRESSES[1]],
        "conflicts": [ADDRESSES[0], ADDRESSES[3]],
        "written": [ADDRESSES[1]],
        "result": False,
    }


def test_keys_missing_or_invalid_on_this_master_are_named(tmp_path):
    peers = tmp_path / "peers"
    peers.mkdir()
    (peers / f"{ADDRESSES[0]}.pub").write_text(PEER_KEYS[ADDRESSES[0]])
    (peers / f"{ADDRESSES[1]}.pub").write_text("not a key")
    keys, missing = mc.own_peer_keys(SECTION, str(tmp_path))
    assert keys == {ADDRESSES[0]: PEER_KEYS[ADDRESSES[0]]}
    assert missing == list(ADDRESSES[1:])


def test_targets_are_masters_of_a_cluster_set_only():
    assert mc.targets(SECTION, []) == [m["id"] for m in SECTION["masters"]]
    with pytest.raises(mc.ClusterRefused, match=r"masters=\['nope'\]: not in multimaster:masters"):
        mc.targets(SECTION, [ADDRESSES[0], "nope"])
    with pytest.raises(mc.ClusterRefused, match="mode is 'hot': peer keys"):
        mc.check_mode(dict(SECTION, mode="hot"), "peer keys exist in mode cluster only")
