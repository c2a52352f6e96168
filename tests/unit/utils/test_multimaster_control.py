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
