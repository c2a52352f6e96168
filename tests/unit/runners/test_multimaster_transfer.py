"""
``multimaster_transfer.pull``, the one runner a master exposes to its control minions: it serves
a ticket to the minion ``peer_run`` names, and to no caller that reached it another way (an eauth
user whose runner ACL happens to match it, on a master whose own id is its control minion's).
"""

import pytest
import salt.utils.user

from tests.support.transfers import stage_json


@pytest.fixture
def opts(tmp_path):
    # In a peer_run job Salt sets ``id`` to the asking minion; here the master's own id is its
    # control minion's, as in the lab.
    return {"cachedir": str(tmp_path), "minimum_auth_version": 3, "id": "cm1"}


@pytest.fixture
def configure_loader_modules(transfer, opts):
    return {transfer: {"__opts__": opts}}


def test_peer_run_pull_serves_the_recipient(transfer, opts, monkeypatch):
    # peer_run runs the job as the master's own process user.
    monkeypatch.setattr(transfer, "__user__", salt.utils.user.get_specific_user(), raising=False)
    descriptor = stage_json(opts, "cm1", {"bundle": [1, 2]})
    answer = transfer.pull(descriptor["ticket"], 0)
    assert "data" in answer and answer["offset"] == 0


def test_an_eauth_caller_is_refused_and_the_ticket_stays_usable(transfer, opts, monkeypatch):
    descriptor = stage_json(opts, "cm1", {"bundle": [1, 2]})
    monkeypatch.setattr(transfer, "__user__", "fred", raising=False)
    assert "through peer_run only" in transfer.pull(descriptor["ticket"], 0)["error"]
    monkeypatch.setattr(transfer, "__user__", salt.utils.user.get_specific_user())
    assert "data" in transfer.pull(descriptor["ticket"], 0)
