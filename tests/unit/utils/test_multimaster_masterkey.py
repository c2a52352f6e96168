"""
The master-key plane's planning: which pairs a set shares, and what ``sync_master_key`` reports
when a pass fails.
"""

import multimaster_control
import multimaster_masterkey
import pytest

from tests.support.keyfactory import priv_pem, pub_pem, rsa_private


@pytest.fixture
def run(tmp_path):
    return multimaster_control.Run({"pki_dir": str(tmp_path)}, {})


@pytest.mark.parametrize(
    "mode, enabled, pairs",
    [
        ("failover", True, [True]),
        ("hot", True, [True, False]),
        ("hot", False, [False]),
        ("failover", False, [False]),
        ("cluster", False, [False]),
    ],
)
def test_the_pairs_a_set_shares_are_delivered_signing_pair_first(mode, enabled, pairs):
    section = {"mode": mode, "signing": {"enabled": enabled}}
    assert multimaster_masterkey.shared_pairs(section) == pairs


def test_a_hot_set_whose_signing_pass_fails_says_so_at_the_top(run, monkeypatch):
    section = {"mode": "hot", "signing": {"enabled": True}}
    monkeypatch.setattr(multimaster_control, "configured", lambda *a: section)
    monkeypatch.setattr(multimaster_control, "acting", lambda run, section, name: section)
    monkeypatch.setattr(multimaster_control, "await_restarts", lambda *a: None)
    monkeypatch.setattr(multimaster_masterkey, "check_signing_key", lambda *a: None)
    passes = []

    def sync_pair(run, section, signing, test, timeout):
        passes.append(signing)
        return {"comment": "Refused, nothing changed: master2 did not answer"}, True

    monkeypatch.setattr(multimaster_masterkey, "_sync_pair", sync_pair)
    ret = multimaster_masterkey.sync_master_key(run)
    assert passes == [True]  # the master key is not delivered after a failed signing pass
    assert ret["retcode"] == 1 and run.context["retcode"] == 1
    assert ret["comment"] == (
        "signing pair: Refused, nothing changed: master2 did not answer; the master key was "
        "not delivered"
    )
    assert ret["signing_pair"]["comment"].endswith("master2 did not answer")


def test_a_master_that_does_not_run_is_reported_not_signed_in_to(run, monkeypatch):
    section = {
        "ports": {"ret": 4506},
        "masters": [
            {"id": "m1", "host": "10.0.0.1"},
            {"id": "m2", "host": "10.0.0.2"},
            {"id": "m3", "host": "10.0.0.3"},
        ],
    }
    plan = {"pub": "PUB", "info": {"m1": {"running": True}, "m2": {"running": True}}}
    plan["info"]["m3"] = {"running": False}
    asked = []

    def call(run, section, masters, fun, kwarg, timeout):
        asked.append(kwarg["host"])
        return {masters[0]: {"served": True}}, {}

    monkeypatch.setattr(multimaster_control, "call", call)
    ret = {"masters": {}}
    multimaster_masterkey.verify_all(run, section, ret, plan, False, 10)
    assert asked == ["10.0.0.1", "10.0.0.2"]
    assert ret["masters"]["m3"] == {
        "result": True,
        "served": None,
        "reason": multimaster_masterkey.NOT_RUNNING,
    }
    assert ret["masters"]["m1"]["served"] is True and ret["masters"]["m1"]["verified_by"] == "m2"


def test_a_primary_that_began_restarting_after_the_settle_check_is_waited_for(run, monkeypatch):
    # The job that scheduled the restart had just returned: the settle check saw none pending,
    # then the primary's control minion went silent with its master's restart.
    key = rsa_private(tag=31)
    section = {"masters": [{"id": "m1"}, {"id": "m2"}]}
    info = {"pub": pub_pem(key)}
    rounds = [({"m2": info}, {"m1": "no answer"}), ({"m1": info, "m2": info}, {})]
    waited = []
    monkeypatch.setattr(multimaster_control, "call", lambda *a, **k: rounds.pop(0))
    monkeypatch.setattr(
        multimaster_control,
        "await_restarts",
        lambda run, found, masters: waited.append(masters) or masters,
    )
    monkeypatch.setattr(
        multimaster_masterkey, "_local_pair", lambda *a: (priv_pem(key), info["pub"])
    )
    plan, errors = multimaster_masterkey.key_plan(run, section, False, 60)
    assert waited == [["m1"]] and rounds == []
    assert errors == {} and sorted(plan["info"]) == ["m1", "m2"] and plan["stale"] == []
