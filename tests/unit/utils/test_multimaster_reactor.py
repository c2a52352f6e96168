"""
``multimaster_reactor``: the record that makes a repeat of a reactor's event cost nothing.
Real files in tmp_path, a fake clock.
"""

import json
import threading

import multimaster_reactor
import pytest


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def opts(tmp_path):
    return {"cachedir": str(tmp_path / "cache")}


@pytest.fixture
def clock():
    return Clock()


def claim(opts, clock, seen="fp1", minion_id="web1", kind="start", window=30):
    with multimaster_reactor.claimed(opts, kind, minion_id, seen, window, clock) as go:
        return go


def test_a_repeat_within_the_window_does_nothing_and_after_it_goes_ahead(opts, clock):
    assert claim(opts, clock) is True
    clock.now += 29
    assert claim(opts, clock) is False
    clock.now += 2
    assert claim(opts, clock) is True


def test_another_state_another_id_or_another_kind_is_not_a_repeat(opts, clock):
    assert claim(opts, clock) is True
    assert claim(opts, clock, seen="fp2") is True
    assert claim(opts, clock, minion_id="web2") is True
    assert claim(opts, clock, kind="key") is True
    assert claim(opts, clock, seen=["delete", None]) is True
    assert claim(opts, clock, seen=("delete", None)) is False


def test_a_running_reaction_holds_repeats_back_until_it_ends_or_goes_stale(opts, clock):
    with multimaster_reactor.claimed(opts, "key", "web1", "s", 30, clock) as first:
        assert first is True
        clock.now += 600
        assert claim(opts, clock, kind="key", seen="s") is False
        clock.now += multimaster_reactor.STALE
        assert claim(opts, clock, kind="key", seen="s") is True


def test_a_reaction_that_raised_is_forgotten(opts, clock):
    with pytest.raises(RuntimeError):
        with multimaster_reactor.claimed(opts, "start", "web1", "fp1", 30, clock):
            raise RuntimeError("publish failed")
    assert claim(opts, clock) is True


def test_the_record_keeps_only_what_still_holds_something_back(opts, clock):
    for index in range(50):
        claim(opts, clock, minion_id=f"web{index}")
    clock.now += 31
    claim(opts, clock, minion_id="last")
    with open(multimaster_reactor.record_path(opts), encoding="utf-8") as handle:
        assert list(json.load(handle)) == ["start/last"]


@pytest.mark.parametrize(
    "content",
    ["{not json", "[1, 2]", '{"start/web1": 5}', '{"start/web1": {"seen": "fp1", "until": "x"}}'],
)
def test_a_record_that_is_not_one_is_started_again(opts, clock, content):
    path = multimaster_reactor.record_path(opts)
    claim(opts, clock, minion_id="other")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(content)
    assert claim(opts, clock) is True
    assert claim(opts, clock) is False


def test_concurrent_events_for_one_id_go_ahead_once(opts):
    """
    The reactor's worker threads take events for the same id at once: one claims it.
    """
    barrier = threading.Barrier(8)
    results = []

    def react():
        barrier.wait()
        with multimaster_reactor.claimed(opts, "start", "web1", "fp1", 30) as go:
            results.append(go)

    threads = [threading.Thread(target=react) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * 7 + [True]
