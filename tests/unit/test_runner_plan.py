"""
The one-id plans of the runner's accept/reject/delete (_runners/multimaster.py).
"""

import pytest

from .helpers import load_module


@pytest.fixture(scope="module")
def runner():
    return load_module("multimaster_runner", "_runners/multimaster.py")


ORDER = ["m1", "m2", "m3"]


def plan(runner, op, inv, fingerprint=None):
    return runner._one_id_plan(op, "web", fingerprint, ORDER)(inv)


def ops(result):
    return {m: [a["op"] for a in actions] for m, actions in result["actions"].items() if actions}


def test_accept_works_when_pending_on_one_master_only(runner):
    result = plan(runner, "accept", {"m1": {}, "m2": {"web": ["pending", "A"]}, "m3": {}})
    assert result["refused"] is None
    assert ops(result) == {"m1": ["accept"], "m2": ["accept"], "m3": ["accept"]}


def test_accept_is_refused_where_rejected_or_denied(runner):
    rejected = plan(
        runner, "accept", {"m1": {"web": ["pending", "A"]}, "m2": {"web": ["rejected", "A"]}}
    )
    assert "deny wins" in rejected["refused"] and not ops(rejected)
    denied = plan(runner, "accept", {"m1": {"web": ["pending", "A", "X"]}, "m2": {}})
    assert "deny wins" in denied["refused"]


def test_accept_with_a_wrong_fingerprint_is_refused(runner):
    result = plan(runner, "accept", {"m1": {"web": ["pending", "A"]}}, fingerprint="B")
    assert "do not match" in result["refused"] and not ops(result)


def test_two_keys_are_a_conflict(runner):
    result = plan(
        runner, "accept", {"m1": {"web": ["pending", "A"]}, "m2": {"web": ["pending", "B"]}}
    )
    assert result["conflicts"] == {"web": {"m1": "A", "m2": "B"}} and not ops(result)


def test_reject_reaches_masters_that_never_saw_the_key(runner):
    result = plan(runner, "reject", {"m1": {"web": ["accepted", "A"]}, "m2": {}, "m3": {}})
    assert ops(result) == {"m1": ["reject"], "m2": ["reject"], "m3": ["reject"]}


def test_delete_removes_every_state_everywhere(runner):
    inv = {"m1": {"web": ["accepted", "A"]}, "m2": {"web": ["denied", None, "X"]}, "m3": {}}
    assert ops(plan(runner, "delete", inv)) == {"m1": ["delete"], "m2": ["delete"]}


def test_unknown_id_is_refused(runner):
    assert "no key" in plan(runner, "reject", {"m1": {}, "m2": {}})["refused"]
