"""
The one-id plans behind the runner's accept/reject/delete (``multimaster_keys.one_id_plan``).
"""

import multimaster_keys
import pytest

from tests.support.keyfactory import fp

ORDER = ["m1", "m2", "m3"]
A, B, X = fp("A"), fp("B"), fp("X")


def plan(op, inv, fingerprint=None, minion_id="web", **options):
    return multimaster_keys.one_id_plan(op, minion_id, fingerprint, inv, ORDER, **options)


def ops(result):
    return {m: [a["op"] for a in actions] for m, actions in result["actions"].items() if actions}


def test_accept_works_when_pending_on_one_master_only():
    result = plan("accept", {"m1": {}, "m2": {"web": ["pending", A]}, "m3": {}})
    assert result["refused"] is None
    assert ops(result) == {"m1": ["accept"], "m2": ["accept"], "m3": ["accept"]}
    assert [a["expect"] for a in result["actions"]["m2"]] == [["pending", A]]
    assert {a["fp"] for actions in result["actions"].values() for a in actions} == {A}


def test_masters_follow_the_configured_order():
    result = plan("reject", {"m3": {}, "m1": {"web": ["accepted", A]}, "m2": {}})
    assert list(result["actions"]) == ORDER


def test_accept_is_refused_where_rejected():
    result = plan("accept", {"m1": {"web": ["pending", A]}, "m2": {"web": ["rejected", A]}})
    assert "deny wins" in result["refused"] and not ops(result)


@pytest.mark.parametrize(
    "inv",
    [
        {"m1": {"web": ["pending", A, A]}, "m2": {}},
        {"m1": {"web": ["pending", A]}, "m2": {"web": ["denied", None, A]}},
    ],
    ids=["beside", "elsewhere"],
)
def test_accept_is_refused_where_that_very_key_is_denied(inv):
    result = plan("accept", inv)
    assert "deny wins" in result["refused"] and not ops(result)
    assert list(result["denied"]["web"].values()) == [A]


def test_a_spoof_record_does_not_block_accept_of_the_accepted_key():
    inv = {"m1": {"web": ["accepted", A]}, "m2": {"web": ["denied", None, X]}, "m3": {}}
    result = plan("accept", inv, fingerprint=A)
    assert result["refused"] is None
    assert ops(result) == {"m2": ["accept"], "m3": ["accept"]}
    assert result["spoofed"] == {"web": {"m2": X}}
    assert result["denied"] == {}


def test_accept_with_a_wrong_fingerprint_is_refused():
    result = plan("accept", {"m1": {"web": ["pending", A]}}, fingerprint=B)
    assert "do not match" in result["refused"] and not ops(result)
    assert A in result["refused"] and B in result["refused"]


def test_a_fingerprint_is_compared_in_any_case():
    result = plan("accept", {"m1": {"web": ["pending", A]}}, fingerprint=A.upper())
    assert result["refused"] is None and ops(result) == {"m1": ["accept"]}


def test_a_fingerprint_that_is_not_one_is_refused():
    result = plan("delete", {"m1": {"web": ["pending", A]}}, fingerprint="web")
    assert "not a fingerprint" in result["refused"] and not ops(result)


def test_two_keys_are_a_conflict():
    result = plan("accept", {"m1": {"web": ["pending", A]}, "m2": {"web": ["pending", B]}})
    assert result["conflicts"] == {"web": {"m1": A, "m2": B}} and not ops(result)


def test_reject_reaches_masters_that_never_saw_the_key():
    result = plan("reject", {"m1": {"web": ["accepted", A]}, "m2": {}, "m3": {}})
    assert ops(result) == {"m1": ["reject"], "m2": ["reject"], "m3": ["reject"]}


def test_delete_removes_every_state_everywhere():
    inv = {"m1": {"web": ["accepted", A]}, "m2": {"web": ["denied", None, X]}, "m3": {}}
    assert ops(plan("delete", inv)) == {"m1": ["delete"], "m2": ["delete"]}


def test_a_delete_that_keeps_revocations_removes_only_accepted_and_pending_keys():
    """
    What the key reactor sends for a ``salt-key -d`` on one master: a rejected key, a denied one
    or a key beside a denial on another master stays, and is reported.
    """
    inv = {
        "m1": {"web": ["accepted", A], "db": ["rejected", A], "app": ["pending", A, A]},
        "m2": {"web": ["pending", A], "db": ["accepted", A], "app": ["denied", None, A]},
        "m3": {"web": ["rejected", A], "db": ["denied", None, A], "app": ["accepted", A]},
    }
    result = plan("delete", inv, keep_revocations=True)
    assert ops(result) == {"m1": ["delete"], "m2": ["delete"]}
    assert "m3" in result["warnings"]["web"] and "kept" in result["warnings"]["web"]
    assert ops(plan("delete", inv, minion_id="db", keep_revocations=True)) == {"m2": ["delete"]}
    assert ops(plan("delete", inv, minion_id="app", keep_revocations=True)) == {"m3": ["delete"]}


def test_unknown_id_is_refused():
    assert "no key" in plan("reject", {"m1": {}, "m2": {}})["refused"]


def test_a_file_that_is_not_a_key_is_refused_but_can_be_deleted():
    inv = {"m1": {"web": ["pending", None]}, "m2": {}}
    for op in ("accept", "reject"):
        result = plan(op, inv)
        assert "not a public key" in result["refused"] and not ops(result)
    assert ops(plan("delete", inv)) == {"m1": ["delete"]}


def test_an_invalid_id_is_refused():
    result = plan("delete", {"m1": {"m*": ["accepted", A]}}, minion_id="m*")
    assert "not a valid id" in result["refused"] and not ops(result)


def test_malformed_entries_are_refused():
    with pytest.raises(multimaster_keys.ReturnError, match="entry of 'web'"):
        plan("accept", {"m1": {"web": ["accepted"]}})
