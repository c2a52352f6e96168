"""
Turning signing on in a running set: what pillar must say before anything changes, and how a
minion's state run is judged.
"""

import multimaster_rotation
import multimaster_signing
import pytest


@pytest.fixture(scope="module")
def signing_pub():
    return multimaster_rotation.new_pair(2048)[1]


def _settings(mode="hot", enabled=True, public_key=None):
    return {"mode": mode, "signing": {"enabled": enabled, "public_key": public_key}}


def test_pillar_that_turns_signing_on_with_this_masters_pair_is_ready(signing_pub):
    hot = _settings(public_key=signing_pub)
    assert multimaster_signing.pillar_problem(hot, signing_pub) is None
    failover = _settings("failover", public_key=signing_pub)
    assert multimaster_signing.pillar_problem(failover, signing_pub) is None


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        (_settings(enabled=False), "pillar multimaster:signing is not enabled in mode hot"),
        (_settings("cluster"), "not enabled in mode cluster"),
        (None, "has no multimaster section that compiles"),
        ({"mode": "hot", "signing": "yes"}, "not enabled in mode hot"),
    ],
)
def test_pillar_that_does_not_turn_signing_on_is_named(settings, says, signing_pub):
    assert says in multimaster_signing.pillar_problem(settings, signing_pub)


def test_a_public_key_in_pillar_that_is_not_this_masters_pair_is_refused(signing_pub):
    other = multimaster_rotation.new_pair(2048)[1]
    problem = multimaster_signing.pillar_problem(_settings(public_key=other), signing_pub)
    assert "minions would refuse every master" in problem


def test_a_master_without_a_signing_pair_is_told_how_to_make_one(signing_pub):
    problem = multimaster_signing.pillar_problem(_settings(public_key=signing_pub), None)
    assert "salt-key --gen-keys=master_sign" in problem


def _state(result, comment="done"):
    return {"result": result, "comment": comment}


def test_a_state_run_with_every_state_true_is_a_success():
    ret = {"ret": {"file_|-conf_|-/etc/salt/minion.d_|-serialize": _state(True)}, "retcode": 0}
    assert multimaster_signing.state_problem(ret) is None


@pytest.mark.parametrize(
    ("ret", "says"),
    [
        (None, "did not answer"),
        (False, "did not answer"),
        ({"ret": ["Rendering SLS 'base:x' failed"]}, "could not render: Rendering SLS"),
        ({"ret": "'state.apply' is not available."}, "returned \"'state.apply' is not"),
        (
            {"ret": {"file_|-conf_|-/x_|-managed": _state(False, "no disk")}, "retcode": 2},
            "failed: conf: no disk",
        ),
        ({"ret": {}, "retcode": 1}, "failed: retcode 1"),
    ],
)
def test_a_state_run_that_failed_says_why(ret, says):
    assert says in multimaster_signing.state_problem(ret)


def test_a_peer_restart_that_failed_says_what_its_control_minion_said():
    done = multimaster_signing.peer_restart_report("master2", {"ret": "daemon", "retcode": 0})
    assert done == {"result": True, "restarted": "daemon"}
    said = {"ret": "ERROR: salt-master did not listen", "retcode": 1}
    failed = multimaster_signing.peer_restart_report("master2", said)
    assert failed["result"] is False
    assert failed["error"] == "master2: ERROR: salt-master did not listen"
    silent = multimaster_signing.peer_restart_report("master2", None)
    assert silent["error"] == "master2: no answer"


def test_the_minions_that_answer_only_a_peer_are_named():
    answers = {
        "master1": {"minions": {"web1": False, "master2": False}},
        "master2": {"minions": {"web1": False, "web2": False, "web3": True}},
    }
    assert multimaster_signing.off_primary(answers, "master1") == ["web2", "web3"]
    only_primary = {"master1": {"minions": {"web1": True}}}
    assert multimaster_signing.off_primary(only_primary, "master1") == []
