"""
The plan that reconciles key states across masters, the public keys it carries, and the
mass-revocation guard (_utils/multimaster_keys.py).
"""

import multimaster_keys
import pytest

from tests.support.keyfactory import ec_pub_pem, fp, pub_pem, rsa_private

ORDER = ["m1", "m2", "m3"]
A, B, N, OLD, X, Y = (fp(tag) for tag in ["A", "B", "N", "O", "X", "Y"])


def plan(inv, order=ORDER, **kwargs):
    return multimaster_keys.plan(inv, order, **kwargs)


def ops(result, master):
    return sorted((a["id"], a["op"]) for a in result["actions"][master])


def no_actions(result):
    return all(not actions for actions in result["actions"].values())


def test_primary_accepted_becomes_accepted_everywhere():
    result = plan({"m1": {"web": ["accepted", A]}, "m2": {}, "m3": {"web": ["pending", A]}})
    assert ops(result, "m2") == [("web", "accept")]
    assert ops(result, "m3") == [("web", "accept")]
    assert ops(result, "m1") == []


def test_expect_is_the_entry_as_the_master_reported_it():
    inv = {"m1": {"web": ["accepted", A]}, "m2": {"web": ["denied", None, X]}, "m3": {}}
    result = plan(inv)
    expect = {a["op"]: a["expect"] for a in result["actions"]["m2"]}
    assert expect == {"accept": ["denied", None, X]}
    assert [a["expect"] for a in result["actions"]["m3"]] == [None, None]
    assert all(type(a["expect"]) in (list, type(None)) for a in result["actions"]["m3"])


def test_entries_and_wire_lists_plan_alike():
    inv = {"m1": {"web": ["accepted", A, X]}, "m2": {"web": ["pending", A]}, "m3": {}}
    as_entries = {
        m: {i: multimaster_keys.Entry.from_wire(e) for i, e in held.items()}
        for m, held in inv.items()
    }
    assert plan(as_entries) == plan(inv)


def test_malformed_entries_are_refused():
    with pytest.raises(multimaster_keys.ReturnError, match="m2: entry of 'web'"):
        plan({"m1": {}, "m2": {"web": ["accepted", "A"]}})


def test_conflict_changes_nothing_and_reports_both_fingerprints():
    result = plan({"m1": {"web": ["accepted", A]}, "m2": {"web": ["pending", B]}, "m3": {}})
    assert result["conflicts"] == {"web": {"m1": A, "m2": B}}
    assert no_actions(result)


def test_rejected_anywhere_wins_everywhere():
    result = plan({"m1": {"web": ["accepted", A]}, "m2": {"web": ["rejected", A]}, "m3": {}})
    assert ops(result, "m1") == [("web", "reject")]
    assert ops(result, "m3") == [("web", "reject")]
    assert ops(result, "m2") == []


def test_a_deny_of_the_ids_own_key_wins_everywhere():
    result = plan({"m1": {"web": ["accepted", A]}, "m2": {"web": ["denied", None, A]}, "m3": {}})
    assert result["denied"] == {"web": {"m2": A}}
    assert result["spoofed"] == {}
    assert ops(result, "m1") == [("web", "deny")]
    assert ops(result, "m2") == []
    assert ops(result, "m3") == [("web", "deny")]
    assert all(a["fp"] == A for a in result["actions"]["m3"])


def test_a_denied_key_alone_is_a_denial_and_copied():
    result = plan({"m1": {}, "m2": {"web": ["denied", None, X]}, "m3": {}})
    assert result["denied"] == {"web": {"m2": X}}
    assert ops(result, "m1") == ops(result, "m3") == [("web", "deny")]


def test_a_spoof_record_does_not_freeze_the_accepted_key():
    """
    Salt stores another key offered for an accepted id as denied by itself: reported, copied as
    denied, and the accepted key still reaches every master.
    """
    inv = {"m1": {"web": ["accepted", A]}, "m2": {"web": ["denied", None, X]}, "m3": {}}
    result = plan(inv)
    assert result["spoofed"] == {"web": {"m2": X}}
    assert result["denied"] == {}
    assert ops(result, "m1") == [("web", "deny")]
    assert ops(result, "m2") == [("web", "accept")]
    assert ops(result, "m3") == [("web", "accept"), ("web", "deny")]
    by_op = {a["op"]: a["fp"] for a in result["actions"]["m3"]}
    assert by_op == {"accept": A, "deny": X}


def test_a_spoof_record_beside_the_accepted_key_on_the_primary():
    result = plan({"m1": {"web": ["accepted", A, X]}, "m2": {}, "m3": {"web": ["accepted", A]}})
    assert result["spoofed"] == {"web": {"m1": X}}
    assert ops(result, "m2") == [("web", "accept"), ("web", "deny")]
    assert ops(result, "m3") == [("web", "deny")]


def test_a_deny_wins_over_spoof_records_of_other_keys():
    inv = {"m1": {"web": ["accepted", A, X]}, "m2": {"web": ["denied", None, A]}, "m3": {}}
    result = plan(inv)
    assert result["denied"] == {"web": {"m2": A}}
    assert result["spoofed"] == {"web": {"m1": X}}
    assert ops(result, "m3") == [("web", "deny")]
    assert result["actions"]["m3"][0]["fp"] == A
    assert ops(result, "m2") == []


def test_different_denied_keys_are_listed_not_copied():
    inv = {"m1": {"web": ["accepted", A, X]}, "m2": {"web": ["accepted", A, Y]}, "m3": {}}
    result = plan(inv)
    assert result["spoofed"] == {"web": {"m1": X, "m2": Y}}
    assert ops(result, "m3") == [("web", "accept")]
    assert "web" in result["warnings"]


def test_pending_is_listed_and_copied_as_pending_never_accepted():
    result = plan({"m1": {}, "m2": {"new": ["pending", N]}, "m3": {}})
    assert result["pending"] == {"new": ["m2"]}
    assert ops(result, "m1") == [("new", "pend")]
    assert ops(result, "m3") == [("new", "pend")]


def test_peer_only_acceptance_is_drift_and_pruned_only_on_request():
    inv = {"m1": {}, "m2": {"old": ["accepted", OLD]}, "m3": {}}
    result = plan(inv)
    assert result["drift"] == {"old": ["m2"]}
    assert no_actions(result)
    assert ops(plan(inv, prune=True), "m2") == [("old", "delete")]


def test_without_the_primary_there_is_no_drift():
    result = plan({"m2": {"old": ["accepted", OLD]}, "m3": {}}, prune=True)
    assert result["drift"] == {}
    assert no_actions(result)


def test_an_unreachable_master_is_left_out_of_the_plan():
    result = plan({"m1": {"web": ["accepted", A]}, "m3": {}})
    assert set(result["actions"]) == {"m1", "m3"}
    assert ops(result, "m3") == [("web", "accept")]


def test_invalid_ids_accepted_somewhere_are_failures_not_propagated():
    inv = {"m1": {"-rf": ["accepted", A], "ok": ["accepted", B]}, "m2": {"m*": ["rejected", N]}}
    result = plan(inv, ["m1", "m2"])
    assert set(result["invalid"]) == {"-rf", "m*"}
    assert "not starting with" in result["invalid"]["-rf"]
    assert ops(result, "m2") == [("ok", "accept")]
    assert result["warnings"] == {}


def test_an_invalid_id_settled_on_every_master_is_still_reported():
    result = plan({"m1": {"a,b": ["accepted", A]}, "m2": {"a,b": ["accepted", A]}}, ["m1", "m2"])
    assert set(result["invalid"]) == {"a,b"}


def test_settled_ids_are_not_reported():
    inv = {m: {"web": ["accepted", A], "old": ["rejected", B]} for m in ORDER}
    result = plan(inv)
    assert no_actions(result)
    assert not any(value for key, value in result.items() if key != "actions")


def test_invalid_ids_only_pending_are_warnings():
    result = plan({"m1": {"a,b": ["pending", A]}, "m2": {"a,b": ["pending", B]}}, ["m1", "m2"])
    assert result["invalid"] == {}
    assert "never copied" in result["warnings"]["a,b"]
    assert no_actions(result)


def test_a_file_that_is_not_a_key_only_pending_is_a_warning():
    result = plan({"m1": {"junk": ["pending", None]}, "m2": {}}, ["m1", "m2"])
    assert set(result["warnings"]) == {"junk"}
    assert result["invalid"] == result["invalid_keys"] == {}
    assert no_actions(result)


def test_a_file_that_is_not_a_key_accepted_is_an_invalid_key():
    result = plan({"m1": {"junk": ["accepted", None]}, "m2": {}}, ["m1", "m2"])
    assert "m1" in result["invalid_keys"]["junk"]
    assert no_actions(result)


def test_a_file_that_is_not_a_key_beside_a_real_key_is_a_conflict():
    result = plan({"m1": {"web": ["accepted", A]}, "m2": {"web": ["pending", None]}}, ["m1", "m2"])
    assert result["conflicts"] == {"web": {"m1": A, "m2": None}}
    assert no_actions(result)


# --- attach_pubs -----------------------------------------------------------------------------

GOOD = pub_pem(rsa_private())
SPOOF = pub_pem(rsa_private(tag=1))
WEAK = pub_pem(rsa_private(bits=1024))
EC = ec_pub_pem()
G, S, W, E = (multimaster_keys.fingerprint(p) for p in (GOOD, SPOOF, WEAK, EC))


def test_attach_pubs_gives_each_action_its_canonical_pem():
    inv = {"m1": {"web": ["accepted", G, S]}, "m2": {}, "m3": {"old": ["pending", None]}}
    result = plan(inv)
    pubs = {"m1": {"web": {"key": GOOD.replace("\n", "\r\n"), "denied": SPOOF}}}
    attached = multimaster_keys.attach_pubs(result, pubs)
    by_op = {a["op"]: a["pub"] for a in attached["actions"]["m2"]}
    assert by_op == {"accept": GOOD, "deny": SPOOF}
    assert attached["invalid_keys"] == {}
    assert "pub" not in result["actions"]["m2"][0]  # the plan given is left as it was


def test_attach_pubs_leaves_deletes_alone():
    result = plan({"m1": {}, "m2": {"old": ["accepted", OLD]}}, ["m1", "m2"], prune=True)
    attached = multimaster_keys.attach_pubs(result, {})
    assert [a["op"] for a in attached["actions"]["m2"]] == ["delete"]
    assert "pub" not in attached["actions"]["m2"][0]


def test_a_key_that_is_not_canonical_is_refused_on_every_master():
    inv = {"m1": {"weak": ["accepted", W, S]}, "m2": {}, "m3": {"weak": ["pending", W]}}
    pubs = {"m1": {"weak": {"key": WEAK, "denied": SPOOF}}, "m3": {"weak": {"key": WEAK}}}
    attached = multimaster_keys.attach_pubs(plan(inv), pubs)
    assert "1024 bits" in attached["invalid_keys"]["weak"]
    assert no_actions(attached)


def test_a_pending_key_that_is_not_canonical_is_a_warning():
    inv = {"m1": {"weak": ["pending", W]}, "m2": {"ec": ["pending", E]}, "m3": {}}
    pubs = {"m1": {"weak": {"key": WEAK}}, "m2": {"ec": {"key": EC}}}
    attached = multimaster_keys.attach_pubs(plan(inv), pubs)
    assert attached["invalid_keys"] == {}
    assert set(attached["warnings"]) == {"weak", "ec"}
    assert "1024 bits" in attached["warnings"]["weak"]
    assert no_actions(attached)


def test_a_spoof_record_that_is_not_canonical_is_not_copied_but_does_not_block():
    inv = {"m1": {"web": ["accepted", G]}, "m2": {"web": ["denied", None, W]}, "m3": {}}
    pubs = {"m1": {"web": {"key": GOOD}}, "m2": {"web": {"denied": WEAK}}}
    attached = multimaster_keys.attach_pubs(plan(inv), pubs)
    assert ops(attached, "m2") == ops(attached, "m3") == [("web", "accept")]
    assert ops(attached, "m1") == []
    assert "1024 bits" in attached["warnings"]["web"]
    assert attached["invalid_keys"] == {}


def test_a_key_no_master_reported_is_refused():
    result = plan({"m1": {"web": ["accepted", G]}, "m2": {}}, ["m1", "m2"])
    attached = multimaster_keys.attach_pubs(result, {"m1": {"web": {"key": SPOOF}}})
    assert G in attached["invalid_keys"]["web"]
    assert no_actions(attached)


# --- mass revocation guard -------------------------------------------------------------------


def fleet(count, state="accepted"):
    return {f"web{i}": [state, fp(str(i))] for i in range(count)}


def test_a_peer_reporting_every_id_rejected_does_not_revoke_the_fleet():
    inv = {"m1": fleet(100), "m2": fleet(100), "m3": fleet(100, "rejected")}
    result = plan(inv)
    assert multimaster_keys.revocations(result, inv) == {"m1": 100, "m2": 100, "m3": 0}
    refusal = multimaster_keys.revoke_refusal(result, inv)
    assert "m1" in refusal and "100 of the 100" in refusal and "100%" in refusal
    assert multimaster_keys.revoke_refusal(result, inv, force=True) is None


def test_a_few_revocations_go_ahead():
    inv = {"m1": fleet(100), "m2": fleet(100)}
    inv["m2"].update(fleet(8, "rejected"))
    result = plan(inv, ["m1", "m2"])
    assert multimaster_keys.revocations(result, inv) == {"m1": 8, "m2": 0}
    assert multimaster_keys.revoke_refusal(result, inv) is None
    assert "8 of the 100" in multimaster_keys.revoke_refusal(result, inv, max_share=0.05)


def test_a_small_lab_is_below_the_floor():
    inv = {"m1": fleet(4), "m2": fleet(4, "rejected")}
    result = plan(inv, ["m1", "m2"])
    assert multimaster_keys.revocations(result, inv)["m1"] == 4
    assert multimaster_keys.revoke_refusal(result, inv) is None


def test_known_totals_count_keys_outside_the_fetched_buckets():
    inv = {"m1": fleet(10), "m2": fleet(10, "rejected")}
    result = plan(inv, ["m1", "m2"])
    assert multimaster_keys.revoke_refusal(result, inv)
    assert multimaster_keys.revoke_refusal(result, inv, totals={"m1": 1000}) is None


def test_pruning_drift_counts_as_revocation():
    inv = {"m1": {}, "m2": fleet(20)}
    result = plan(inv, ["m1", "m2"], prune=True)
    assert multimaster_keys.revocations(result, inv) == {"m1": 0, "m2": 20}
    assert "m2" in multimaster_keys.revoke_refusal(result, inv)
