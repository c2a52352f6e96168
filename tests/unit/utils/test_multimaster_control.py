"""
The runners' plumbing: a run's progress events.
"""

import multimaster_control
import pytest

from tests.support import loading


class GoneEvent:
    """
    A job event whose job has ended: the reactor's threads share one runner module, and the
    weak reference Salt injected for another job is dead by the time this one reports.
    """

    def fire_event(self, data, tag):
        raise ReferenceError("weakly-referenced object no longer exists")


class Recorder:
    def __init__(self):
        self.fired = []

    def fire_event(self, data, tag):
        self.fired.append((tag, data))


def test_progress_fires_on_the_job_event():
    event = Recorder()
    multimaster_control.Run({}, {}, event).progress("m2: applying 3 key action(s)")
    assert event.fired == [("progress", {"message": "m2: applying 3 key action(s)"})]


@pytest.mark.parametrize("event", [None, GoneEvent(), object()])
def test_progress_without_a_live_job_event_is_only_logged(event, caplog):
    with caplog.at_level("INFO"):
        multimaster_control.Run({}, {}, event).progress("waiting for m2")
    assert "multimaster: waiting for m2" in caplog.text


def test_a_failed_run_leaves_retcode_in_the_runner_context():
    context = {}
    ret = multimaster_control.finish(multimaster_control.Run({}, context), {"x": 1}, True)
    assert ret["retcode"] == 1 and context["retcode"] == 1


def test_the_masters_are_planned_primary_first():
    masters = [{"id": "master1"}, {"id": "master2"}, {"id": "master3"}]
    assert multimaster_control.ids({"masters": masters}) == ["master1", "master2", "master3"]
    promoted = {"masters": masters, "primary": "master2"}
    assert multimaster_control.ids(promoted) == ["master2", "master1", "master3"]


def _answer(epoch):
    return {"binding": {"challenge": "ab" * 32, "target": "master2", "config_dir": "/c"} | epoch}


def test_an_order_carries_this_master_s_epoch_not_the_peer_s():
    challenge = multimaster_control.binding(_answer({"epoch": 1}), "master2", {"epoch": 3})
    assert multimaster_control.bound(challenge)["epoch"] == 3


def test_a_peer_of_a_newer_epoch_fences_this_master():
    section = {"epoch": 1}
    multimaster_control.fence(section, {"master2": _answer({"epoch": 1}), "master3": _answer({})})
    with pytest.raises(multimaster_control.Refused) as err:
        multimaster_control.fence(
            section, {"master2": _answer({"epoch": 2}), "master3": _answer({"epoch": 3})}
        )
    message = str(err.value)
    assert message.startswith("master3 is at epoch 3, newer than this master's epoch 1")
    assert "multimaster.orch.add_master" in message
    # A section written before epochs existed is the first generation.
    with pytest.raises(multimaster_control.Refused, match="epoch 2, newer than .* epoch 1"):
        multimaster_control.fence({}, {"master2": _answer({"epoch": 2})})


def _pillar_run(tmp_path, section_yaml):
    roots = tmp_path / "pillar"
    roots.mkdir()
    (roots / "top.sls").write_text("base:\n  '*': [multimaster]\n")
    (roots / "multimaster.sls").write_text(section_yaml)
    opts = loading.master_opts(
        tmp_path, id="master1_master", pillar_roots={"base": [str(roots)]}, file_roots={}
    )
    return multimaster_control.Run(opts)


OLD_SECTION = {
    "epoch": 1,
    "masters": [{"id": "master1", "minion_id": "master1"}, {"id": "master2", "minion_id": "m2"}],
}


def test_a_newer_epoch_in_pillar_fences_the_returning_primary(tmp_path):
    run = _pillar_run(tmp_path, "multimaster:\n  epoch: 2\n  masters: [{id: master2}]\n")
    with pytest.raises(multimaster_control.Refused) as err:
        multimaster_control.fence_by_pillar(run, OLD_SECTION)
    message = str(err.value)
    assert message.startswith("pillar multimaster:epoch is 2, newer than this master's epoch 1")
    assert "multimaster.orch.add_master" in message


@pytest.mark.parametrize(
    "section_yaml",
    [
        "multimaster:\n  epoch: 1\n",
        "multimaster:\n  masters: []\n",  # no epoch: the first generation
        "other: {}\n",  # no multimaster section for this master's control minion
        "multimaster: {epoch: [\n",  # does not render: the peers' fence decides
    ],
)
def test_pillar_at_this_epoch_or_without_one_lets_the_primary_act(tmp_path, section_yaml):
    run = _pillar_run(tmp_path, section_yaml)
    multimaster_control.fence_by_pillar(run, OLD_SECTION)


def test_a_master_not_in_its_own_section_is_not_fenced_by_pillar(tmp_path):
    run = _pillar_run(tmp_path, "multimaster:\n  epoch: 9\n")
    multimaster_control.fence_by_pillar(run, {"epoch": 1, "masters": [{"id": "master7"}]})


def test_a_pillar_that_does_not_render_is_not_quoted_in_our_log(tmp_path, caplog):
    run = _pillar_run(tmp_path, "multimaster:\n  epoch: [\n  password: s3cret-in-pillar\n")
    with caplog.at_level("WARNING"):
        multimaster_control.fence_by_pillar(run, OLD_SECTION)
    ours = [r.getMessage() for r in caplog.records if r.name == multimaster_control.log.name]
    assert ours and "render errors" in ours[0], ours
    assert not any("s3cret" in message for message in ours), ours


class Rounds:
    """
    A round asked of every master: each call answers with the next of ``rounds``
    (``(answers, errors)`` or an exception to raise).
    """

    def __init__(self, *rounds):
        self.rounds, self.asked = list(rounds), 0

    def __call__(self):
        self.asked += 1
        answer = self.rounds.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


CLEAN = ({"m1": {"restart_pending": False}, "m2": {"restart_pending": False}}, {})


class Waits(list):
    """
    The masters each settle wait was for, and who answers there (None: each it waited for).
    """

    answering = None


@pytest.fixture
def settle_waits(monkeypatch):
    """
    The masters each settle wait was for; a wait finds ``settle_waits.answering`` answering
    (default: every master it waited for).
    """
    seen = Waits()

    def await_restarts(run, found, masters=None):
        seen.append(masters)
        return list(masters or []) if seen.answering is None else seen.answering

    monkeypatch.setattr(multimaster_control, "await_restarts", await_restarts)
    return seen


def settled_round(ask):
    return multimaster_control.settled_round(None, None, ask, lambda result: result)


def test_a_clean_round_is_kept_with_no_wait(settle_waits):
    ask = Rounds(CLEAN)
    assert settled_round(ask) == CLEAN
    assert ask.asked == 1 and settle_waits == []


def test_a_pending_restart_is_waited_for_and_the_round_asked_again(settle_waits):
    pending = ({"m1": {"restart_pending": False}, "m2": {"restart_pending": True}}, {})
    ask = Rounds(pending, CLEAN)
    assert settled_round(ask) == CLEAN
    assert settle_waits == [["m2"]]


def test_a_silent_master_that_answers_after_the_wait_is_asked_again(settle_waits):
    silent = ({"m1": {"restart_pending": False}}, {"m2": "no answer"})
    ask = Rounds(silent, CLEAN)
    assert settled_round(ask) == CLEAN
    assert settle_waits == [["m2"]]


def test_a_master_that_stays_silent_is_left_for_the_run_to_report(settle_waits):
    silent = ({"m1": {"restart_pending": False}}, {"m2": "no answer"})
    settle_waits.answering = []
    ask = Rounds(silent)
    assert settled_round(ask) == silent
    assert ask.asked == 1


def test_this_master_restarting_is_waited_out_for_every_master(settle_waits):
    from salt.exceptions import SaltClientError

    ask = Rounds(SaltClientError("no master"), CLEAN)
    assert settled_round(ask) == CLEAN
    assert settle_waits == [None]
