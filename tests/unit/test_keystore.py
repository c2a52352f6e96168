"""
Crash-safe key store writes for the localfs_key layout (_utils/multimaster_keystore.py).
"""

import os

import pytest
from salt.exceptions import SaltInvocationError

from . import helpers  # noqa: F401  (puts _utils on sys.path)
from .keyfactory import pub_pem, rsa_private

import multimaster_keystore as ks  # noqa: E402  isort: skip

PEM = pub_pem(rsa_private())


@pytest.fixture
def mopts(tmp_path):
    pki = tmp_path / "pki"
    for name in ("minions", "minions_pre", "minions_rejected", "minions_denied"):
        (pki / name).mkdir(parents=True)
    return {"pki_dir": str(pki), "keys.cache_driver": "localfs_key", "user": None}


def where(mopts, minion_id):
    return sorted(
        name
        for name in ("minions", "minions_pre", "minions_rejected", "minions_denied")
        if os.path.isfile(os.path.join(mopts["pki_dir"], name, minion_id))
    )


def test_write_leaves_one_state_and_no_temp_files(mopts):
    ks.write(mopts, [("web1", "pending", PEM)])
    ks.write(mopts, [("web1", "accepted", PEM)])
    assert where(mopts, "web1") == ["minions"]
    with open(os.path.join(mopts["pki_dir"], "minions", "web1"), encoding="utf-8") as fh:
        assert fh.read() == PEM
    assert os.listdir(os.path.join(mopts["pki_dir"], ks.TMP_DIR)) == []
    assert not ks.repair_needed(mopts)


def test_deny_sits_beside_the_key_and_delete_removes_everything(mopts):
    ks.write(mopts, [("web1", "accepted", PEM), ("web1", "denied", PEM)])
    assert where(mopts, "web1") == ["minions", "minions_denied"]
    entries, _ = ks.inventory(mopts)
    assert entries["web1"][0] == "accepted" and len(entries["web1"]) == 3
    ks.write(mopts, [("web1", None, None)])
    assert where(mopts, "web1") == []


def test_inventory_follows_salts_priority_for_an_id_in_two_dirs(mopts):
    for name in ("minions", "minions_rejected"):
        with open(os.path.join(mopts["pki_dir"], name, "web1"), "w", encoding="utf-8") as fh:
            fh.write(PEM)
    entries, _ = ks.inventory(mopts)
    assert entries["web1"][0] == "rejected"


def test_repair_finishes_what_an_interrupted_run_left(mopts):
    pki = mopts["pki_dir"]
    os.makedirs(os.path.join(pki, ks.TMP_DIR))
    with open(os.path.join(pki, ks.TMP_DIR, "tmpabc123"), "w", encoding="utf-8") as fh:
        fh.write(PEM)
    for name in ("minions", "minions_pre"):
        with open(os.path.join(pki, name, "web1"), "w", encoding="utf-8") as fh:
            fh.write(PEM)
    assert ks.repair_needed(mopts)
    assert ks.repair(mopts) == ["web1"]
    assert where(mopts, "web1") == ["minions_pre"]
    assert os.listdir(os.path.join(pki, ks.TMP_DIR)) == []
    assert not ks.repair_needed(mopts)


@pytest.mark.parametrize("bad", ["../x", ".hidden", "-rf", "m*", "a,b", "a\nb", "x" * 300])
def test_bad_ids_are_refused_before_anything_is_written(mopts, bad):
    with pytest.raises(SaltInvocationError, match="not a valid id"):
        ks.write(mopts, [("good", "accepted", PEM), (bad, "accepted", PEM)])
    assert where(mopts, "good") == []


def test_fingerprint_cache_rereads_only_replaced_files(mopts):
    other = pub_pem(rsa_private(tag=3))
    ks.write(mopts, [("web1", "accepted", PEM), ("web2", "accepted", PEM)])
    first = ks.FingerprintCache()
    entries, _ = ks.inventory(mopts, fp_cache=first)
    assert first.reads == 2 and first.changed
    again = ks.FingerprintCache(first.seen)
    assert ks.inventory(mopts, fp_cache=again)[0] == entries
    assert again.reads == 0 and not again.changed
    ks.write(mopts, [("web2", "accepted", other)])  # a rename: new inode
    third = ks.FingerprintCache(again.seen)
    entries, _ = ks.inventory(mopts, fp_cache=third)
    assert third.reads == 1
    assert entries["web2"][1] == ks.multimaster_keys.fingerprint(other)
