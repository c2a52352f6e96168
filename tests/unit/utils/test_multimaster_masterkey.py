"""
The master-key plane's planning: which pairs a set shares, and what ``sync_master_key`` reports
when a pass fails.
"""

import multimaster_control
import multimaster_masterkey
import pytest


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
