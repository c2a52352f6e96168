"""
The publish helper: the publish request waits the master's ``publish_timeout``, only the wait
for answers is the caller's. The return collector: a return the event stream never delivers
(Salt 3007's event client can leave it in its read buffer) is read from the master's job cache;
returns the events deliver are taken as they come; the publish's subscriptions are cleaned up.
"""

import multimaster_returns as returns
import pytest


class Client:
    """
    A LocalClient whose event stream delivers ``events`` then stays idle; its job cache holds
    ``cache``.
    """

    def __init__(self, events, cache, minions=("cm1", "cm2")):
        self.opts = {"master_job_cache": "local_cache", "publish_timeout": 30}
        self.events, self.cache, self.minions = events, cache, list(minions)
        self.cache_reads = 0
        self.cleaned = []
        self.iter_kwargs = {}
        self.returners = {"local_cache.get_jid": self._get_jid}

    def _get_jid(self, jid):
        assert jid == "j1"
        self.cache_reads += 1
        return self.cache

    def run_job(self, tgt, fun, kwarg=None, tgt_type=None, timeout=None, listen=False):
        # No timeout: the publish gets the master's publish_timeout, whatever the wait.
        assert tgt_type == "list" and listen and timeout is None
        return {"jid": "j1", "minions": self.minions}

    def gather_job_info(self, jid, tgt, tgt_type, listen=True, **kwargs):
        return {}

    def get_iter_returns(self, jid, minions, **kwargs):
        assert kwargs["block"] is False
        self.iter_kwargs = kwargs
        # As Salt's does for minions still missing at the timeout: the find_job publish.
        named = ("timeout", "tgt", "tgt_type", "block")
        extra = {k: v for k, v in kwargs.items() if k not in named}
        self.find_job = self.gather_job_info(jid, list(minions), "list", **extra)
        yield from self.events
        for _ in range(200):
            yield None

    def _clean_up_subscriptions(self, jid):
        self.cleaned.append(jid)


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(returns, "CACHE_LOOK_INTERVAL", 0.05)


def test_a_return_missing_from_the_events_is_read_from_the_job_cache():
    client = Client(
        [{"cm1": {"ret": {"a": 1}, "retcode": 0, "jid": "j1"}}],
        {
            "cm1": {"return": {"a": 1}, "retcode": 0},
            "cm2": {"return": {"b": 2}, "retcode": 0, "success": True},
        },
    )
    got = returns.cmd_returns(client, ["cm1", "cm2"], "multimaster_peer.roots_manifest")
    assert got == {
        "cm1": {"ret": {"a": 1}, "retcode": 0, "jid": "j1"},
        "cm2": {"ret": {"b": 2}, "retcode": 0, "jid": "j1"},
    }
    assert client.cleaned == ["j1"]


def test_returns_from_the_events_need_no_cache_read():
    client = Client(
        [
            {"cm1": {"ret": True, "retcode": 0, "jid": "j1"}},
            {"cm2": {"ret": "boom", "retcode": 1, "jid": "j1"}},
        ],
        {},
    )
    got = returns.cmd_returns(client, ["cm1", "cm2"], "test.ping")
    assert got["cm2"] == {"ret": "boom", "retcode": 1, "jid": "j1"}
    assert client.cache_reads == 0


def test_a_minion_that_never_answers_is_absent_and_failed_markers_are_dropped():
    client = Client([None, {"cm2": {"failed": True}}], {})
    got = returns.cmd_returns(client, ["cm1", "cm2"], "test.ping")
    assert got == {} and client.cache_reads >= 1 and client.cleaned == ["j1"]


def test_a_publish_that_reached_no_one_returns_nothing():
    client = Client([], {})
    client.run_job = lambda *a, **k: {}
    assert returns.cmd_returns(client, ["cm1"], "test.ping") == {}


def test_a_job_cache_that_is_down_does_not_fail_the_job(monkeypatch):
    client = Client([None, None, {"cm2": {"ret": True, "retcode": 0, "jid": "j1"}}], {})

    def down(jid):
        raise OSError("connection refused")

    client.returners["local_cache.get_jid"] = down
    monkeypatch.setattr(returns, "CACHE_LOOK_INTERVAL", 0)
    got = returns.cmd_returns(client, ["cm2"], "test.ping")
    assert got == {"cm2": {"ret": True, "retcode": 0, "jid": "j1"}}


def test_a_poll_s_find_job_round_is_short_and_other_calls_keep_the_master_s():
    polled = Client([{"cm1": {"ret": True, "retcode": 0, "jid": "j1"}}], {}, minions=["cm1"])
    returns.cmd_returns(
        polled, ["cm1"], "test.ping", timeout=3, find_job_timeout=returns.QUICK_FIND_JOB
    )
    assert polled.iter_kwargs["gather_job_timeout"] == returns.QUICK_FIND_JOB
    called = Client([{"cm1": {"ret": True, "retcode": 0, "jid": "j1"}}], {}, minions=["cm1"])
    returns.cmd_returns(called, ["cm1"], "multimaster_peer.apply_roots", timeout=300)
    assert "gather_job_timeout" not in called.iter_kwargs


class PollClient:
    """
    A LocalClient for ``returns.cmd``: the publish targets ``minions``; ``answers`` come on the
    event stream; records how it was called.
    """

    def __init__(self, minions, answers):
        self.minions, self.answers = minions, answers
        self.event = type("Event", (), {"cpub": False, "close_pub": lambda self: None})()
        self.opts = {"publish_timeout": 30}
        self.calls = {}

    def gather_job_info(self, jid, tgt, tgt_type, listen=True, **kwargs):
        # Salt's: publishes saltutil.find_job with timeout=gather_job_timeout.
        self.calls["find_job"] = {"tgt": tgt, "timeout": kwargs.get("gather_job_timeout")}
        return {"jid": "j2"}

    def run_job(self, tgt, fun, arg=(), tgt_type="glob", ret="", timeout=None, **kwargs):
        self.calls["run_job"] = {"tgt": tgt, "fun": fun, "arg": arg, "timeout": timeout, **kwargs}
        return {"jid": "j1", "minions": self.minions}

    def get_cli_event_returns(self, jid, minions, timeout, tgt, tgt_type, **kwargs):
        self.calls["wait"] = {"timeout": timeout, **kwargs}
        yield from ({minion: ret} for minion, ret in self.answers.items())
        silent = sorted(set(minions) - set(self.answers))
        if silent:
            self.gather_job_info(jid, silent, "list", **kwargs)


def test_a_poll_publishes_with_the_master_s_publish_timeout_and_waits_its_own():
    client = PollClient(["web1", "web2"], {"web1": {"ret": True, "retcode": 0}})
    got = returns.cmd(client, "*", "test.ping", 3)
    assert got == {"web1": True, "web2": False}
    # The publish request: no timeout of its own, so LocalClient.pub takes publish_timeout.
    assert client.calls["run_job"]["timeout"] is None and client.calls["run_job"]["listen"]
    assert client.calls["wait"] == {"timeout": 3, "gather_job_timeout": returns.QUICK_FIND_JOB}


def test_a_poll_s_full_returns_and_arguments_are_passed_through():
    client = PollClient(["web1"], {"web1": {"ret": "x", "retcode": 0}})
    got = returns.cmd(
        client, ["web1"], "config.get", 5, arg=["k"], tgt_type="list", full_return=True
    )
    assert got == {"web1": {"ret": "x", "retcode": 0}}
    assert client.calls["run_job"]["arg"] == ["k"]


def test_the_find_job_publish_waits_the_master_s_publish_timeout_and_the_poll_stays_short():
    client = PollClient(["web1", "web2"], {"web1": {"ret": True, "retcode": 0}})
    assert returns.cmd(client, "*", "test.ping", 3) == {"web1": True, "web2": False}
    # The find_job for the silent web2: its publish request may take publish_timeout (a busy
    # master is not a master that is down), the wait for its answers stays QUICK_FIND_JOB.
    assert client.calls["find_job"] == {"tgt": ["web2"], "timeout": 30}
    assert client.calls["wait"]["gather_job_timeout"] == returns.QUICK_FIND_JOB
    # The client is left as it was.
    assert "gather_job_info" not in vars(client)
