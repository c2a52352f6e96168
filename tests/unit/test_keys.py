"""
Minion key hygiene and the reconciliation plan (_utils/multimaster_keys.py).
"""

import pytest

from . import helpers  # noqa: F401  (puts _utils on sys.path)
from .keyfactory import ec_pub_pem, pkcs1_pub_pem, priv_pem, pub_pem, rsa_private

import multimaster_keys  # noqa: E402  isort: skip

GOOD = pub_pem(rsa_private())
OTHER = pub_pem(rsa_private(tag=1))


def test_canonical_accepts_one_rsa_spki_and_keeps_its_fingerprint():
    out = multimaster_keys.canonical(GOOD)
    assert out == GOOD
    assert multimaster_keys.fingerprint(out) == multimaster_keys.fingerprint(GOOD)
    assert multimaster_keys.fingerprint(GOOD) == multimaster_keys.private_key_fingerprint(
        priv_pem(rsa_private())
    )


@pytest.mark.parametrize(
    "bad, words",
    [
        (GOOD + "junk\n", "exactly one"),
        (GOOD + GOOD, "exactly one"),
        (pub_pem(rsa_private(bits=1024)), "1024 bits"),
        (ec_pub_pem(), "not an RSA"),
        (pkcs1_pub_pem(rsa_private()), "exactly one"),
        (priv_pem(rsa_private()), "exactly one"),
        (pub_pem(rsa_private(exponent=3)), "exponent 3"),
        ("", "exactly one"),
        (None, "exactly one"),
    ],
    ids=["trailing-junk", "two-pems", "1024-bit", "ec", "pkcs1", "private", "e3", "empty", "none"],
)
def test_canonical_refuses_anything_else_with_a_clear_message(bad, words):
    with pytest.raises(multimaster_keys.InvalidKeyError, match=words):
        multimaster_keys.canonical(bad, "key of 'web1'")


def test_fingerprint_is_sha256_of_der_and_differs_from_salt_finger():
    fp = multimaster_keys.fingerprint(GOOD)
    assert len(fp.split(":")) == 32
    assert multimaster_keys.salt_finger(GOOD) != fp
    assert multimaster_keys.fingerprint("not a key") is None


def test_digests_are_equal_for_equal_inventories_and_bounded():
    a = {f"m{i}": ["accepted", f"fp{i}"] for i in range(5000)}
    b = dict(a)
    total_a, buckets_a = multimaster_keys.digests(a)
    total_b, _ = multimaster_keys.digests(b)
    assert total_a == total_b
    assert len(buckets_a) <= multimaster_keys.BUCKETS
    b["m7"] = ["rejected", "fp7"]
    total_c, buckets_c = multimaster_keys.digests(b)
    assert total_c != total_a
    changed = [k for k in buckets_a if buckets_a[k] != buckets_c.get(k)]
    assert changed == [multimaster_keys.bucket_of("m7")]


ORDER = ["m1", "m2", "m3"]


def ops(plan, master):
    return sorted((a["id"], a["op"]) for a in plan["actions"][master])


def test_primary_accepted_becomes_accepted_everywhere():
    inv = {"m1": {"web": ["accepted", "A"]}, "m2": {}, "m3": {"web": ["pending", "A"]}}
    plan = multimaster_keys.plan(inv, ORDER)
    assert ops(plan, "m2") == [("web", "accept")]
    assert ops(plan, "m3") == [("web", "accept")]
    assert plan["actions"]["m3"][0]["expect"] == ["pending", "A"]
    assert ops(plan, "m1") == []


def test_conflict_changes_nothing_and_reports_both_fingerprints():
    inv = {"m1": {"web": ["accepted", "A"]}, "m2": {"web": ["pending", "B"]}, "m3": {}}
    plan = multimaster_keys.plan(inv, ORDER)
    assert plan["conflicts"] == {"web": {"m1": "A", "m2": "B"}}
    assert all(not actions for actions in plan["actions"].values())


def test_rejected_anywhere_wins_everywhere():
    inv = {"m1": {"web": ["accepted", "A"]}, "m2": {"web": ["rejected", "A"]}, "m3": {}}
    plan = multimaster_keys.plan(inv, ORDER)
    assert ops(plan, "m1") == [("web", "reject")]
    assert ops(plan, "m3") == [("web", "reject")]
    assert ops(plan, "m2") == []


def test_denied_is_propagated_and_never_accepted():
    inv = {
        "m1": {"web": ["accepted", "A", "X"]},
        "m2": {},
        "m3": {},
    }
    plan = multimaster_keys.plan(inv, ORDER)
    assert ops(plan, "m2") == [("web", "deny")]
    assert plan["actions"]["m2"][0]["fp"] == "X"
    assert plan["denied"] == {"web": {"m1": "X"}}


def test_pending_is_listed_and_copied_as_pending_never_accepted():
    inv = {"m1": {}, "m2": {"new": ["pending", "N"]}, "m3": {}}
    plan = multimaster_keys.plan(inv, ORDER)
    assert plan["pending"] == {"new": ["m2"]}
    assert ops(plan, "m1") == [("new", "pend")]
    assert ops(plan, "m3") == [("new", "pend")]


def test_peer_only_acceptance_is_drift_and_pruned_only_on_request():
    inv = {"m1": {}, "m2": {"old": ["accepted", "O"]}, "m3": {}}
    plan = multimaster_keys.plan(inv, ORDER)
    assert plan["drift"] == {"old": ["m2"]}
    assert all(not actions for actions in plan["actions"].values())
    pruned = multimaster_keys.plan(inv, ORDER, prune=True)
    assert ops(pruned, "m2") == [("old", "delete")]


def test_invalid_ids_in_a_store_are_reported_not_propagated():
    inv = {"m1": {"-rf": ["accepted", "A"], "ok": ["accepted", "B"]}, "m2": {}}
    plan = multimaster_keys.plan(inv, ["m1", "m2"])
    assert plan["invalid"] == ["-rf"]
    assert ops(plan, "m2") == [("ok", "accept")]


def test_an_unreachable_master_is_left_out_of_the_plan():
    inv = {"m1": {"web": ["accepted", "A"]}, "m3": {}}
    plan = multimaster_keys.plan(inv, ORDER)
    assert set(plan["actions"]) == {"m1", "m3"}
    assert ops(plan, "m3") == [("web", "accept")]
