"""
The runners' plumbing: a run's progress events.
"""

import multimaster_control
import pytest


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
