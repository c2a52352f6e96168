"""
Collect a job's returns on the master: what ``LocalClient.cmd(..., full_return=True)`` gives,
without losing a return that reached the job cache but not the runner's event stream.

Salt 3007's master event client (``salt.transport.tcp.PublishClient.recv(timeout=0)``) peeks at
the kernel socket before reading, and Tornado may already hold the next event in its own read
buffer: when two large returns arrive together, the second one waits there until some other
event wakes the socket, and ``cmd`` waits out its whole timeout for a minion that answered in
milliseconds (Salt 3008 reads the buffer instead). The master stores every return in its job
cache right after it fires the event, so while the event stream is idle the missing returns are
read from the job cache, first after 0.1 s, then at intervals growing by half up to a second
(``local_cache`` retries a return file it finds half written; ``multimaster_pgjsonb`` writes
each return in one transaction). Salt 3008 still loses a large return from the stream at times
(the sealed manifests of 5,000 files, about 1 MB): found in the cache, it costs 0.1 s, not a
second.

A return's minion id is not proof of its sender: Salt 3008 takes it from the load's unchecked
``resource_id``, and every minion sees each publish's jid. ``signed_answer`` takes a control
minion's answer only when it is signed with that minion's key for the runner's nonce
(``multimaster_seal.sign_answer``); Salt's return stream stops at the first return for each
id, so a forgery that came first is refused, not replaced by the genuine answer.
"""

import contextlib
import logging
import time

import multimaster_seal
from salt.exceptions import CommandExecutionError

log = logging.getLogger(__name__)

# How long the event stream may stay idle before the job cache is read for missing returns:
# the first interval, grown by half after each look up to the last.
CACHE_LOOK_FIRST = 0.1
CACHE_LOOK_INTERVAL = 1.0
# Salt's ``gather_job_timeout`` for polls of functions that answer at once (``test.ping``, the
# settle checks): a minion that did not answer within the poll's own timeout is not running
# the job, and a silent one (restarting, or its host down) then costs the timeout plus this, not
# the master's ``gather_job_timeout`` (10 s by default) on every round of a wait loop.
QUICK_FIND_JOB = 2


@contextlib.contextmanager
def patient_find_job(client):
    """
    While in the block, ``client`` (a ``LocalClient``) publishes the ``saltutil.find_job`` of a
    wait with the master's ``publish_timeout``; the wait for its answers keeps its own
    ``gather_job_timeout``. Salt gives that publish request the ``gather_job_timeout`` too (2 s
    in a poll): a master busy for 2 s, as with a find_job to 2,000 silent minions on a loaded
    host, fails the whole wait with "The master is not responding" although it took the job.
    Used by ``cmd`` (polls and pings). ``cmd_returns`` keeps Salt's way: the reactions run it
    in floods, where one request waiting 30 s would hold back every reaction behind it.
    """
    original = client.gather_job_info
    publish_timeout = client.opts.get("publish_timeout", 30)

    def gather_job_info(jid, tgt, tgt_type, listen=True, **kwargs):
        kwargs["gather_job_timeout"] = publish_timeout
        return original(jid, tgt, tgt_type, listen=listen, **kwargs)

    client.gather_job_info = gather_job_info
    try:
        yield client
    finally:
        del client.gather_job_info


def cmd(client, tgt, fun, timeout, arg=(), kwarg=None, tgt_type="glob", full_return=False):
    """
    ``client.cmd(tgt, fun, ...)`` of a ``LocalClient`` with the publish given the master's
    ``publish_timeout`` and only the wait for answers ``timeout`` seconds (a minion still running
    the job is asked with ``QUICK_FIND_JOB``, published as ``patient_find_job`` says).
    ``LocalClient.cmd`` gives its own publish request the job's timeout too: a master busy with
    other requests for a few seconds then fails a 3 s poll with "The master is not responding".
    Minions that did not answer map to False, as ``cmd`` gives them.
    """
    was_listening = client.event.cpub
    try:
        pub = client.run_job(tgt, fun, arg, tgt_type, kwarg=kwarg, listen=True)
        if not pub:
            return {}
        ret = {}
        wait = (pub["jid"], pub["minions"], timeout, tgt, tgt_type)
        with patient_find_job(client):
            for item in client.get_cli_event_returns(*wait, gather_job_timeout=QUICK_FIND_JOB):
                for minion, data in (item or {}).items():
                    ret[minion] = data if full_return else data.get("ret", {})
        ret.update({minion: False for minion in set(pub["minions"]) - set(ret)})
        return ret
    finally:
        if not was_listening:
            client.event.close_pub()


def _from_cache(client, jid, missing):
    getter = client.returners[f"{client.opts['master_job_cache']}.get_jid"]
    try:
        cached = getter(jid) or {}
    except Exception as exc:  # pylint: disable=broad-except
        # A shared job cache that is down must not fail the job: the events still count.
        log.debug("multimaster: job cache unreadable for job %s: %s", jid, exc)
        return {}
    found = {}
    for minion_id, data in cached.items():
        if minion_id in missing and isinstance(data, dict) and "return" in data:
            found[minion_id] = {
                "ret": data["return"],
                "retcode": data.get("retcode", 0),
                "jid": jid,
            }
    if found:
        log.info(
            "multimaster: returns of %s for job %s read from the job cache", sorted(found), jid
        )
    return found


def cmd_returns(client, minions, fun, kwarg=None, timeout=None, find_job_timeout=None):
    """
    Run ``fun`` on the listed ``minions`` through ``client`` (a ``LocalClient``) and return
    ``{minion id: {"ret", "retcode", "jid"}}`` for each minion that answered within Salt's own
    timeout rules (``timeout``, extended while ``saltutil.find_job`` finds the job running;
    ``find_job_timeout`` overrides the master's ``gather_job_timeout`` for that check).
    """
    # The publish may take the master's ``publish_timeout`` (see ``cmd``).
    pub = client.run_job(list(minions), fun, kwarg=kwarg or {}, tgt_type="list", listen=True)
    if not pub or not pub.get("jid"):
        return {}
    jid, expected = pub["jid"], set(pub.get("minions") or [])
    find_job = {"gather_job_timeout": find_job_timeout} if find_job_timeout else {}
    events = client.get_iter_returns(
        jid,
        list(expected),
        timeout=timeout,
        tgt=list(minions),
        tgt_type="list",
        block=False,
        **find_job,
    )
    try:
        return _collected(client, events, jid, expected)
    finally:
        events.close()
        client._clean_up_subscriptions(jid)  # noqa: SLF001  (what cmd_iter does on its way out)


def _collected(client, events, jid, expected):
    """
    ``{minion id: return}`` from ``events`` until every ``expected`` minion answered or they
    end, the job cache read for the missing ones whenever the stream stays idle.
    """
    returns = {}
    interval = CACHE_LOOK_FIRST
    next_look = time.monotonic() + interval
    for item in events:
        if item:
            returns.update({k: v for k, v in item.items() if "ret" in v})
        elif time.monotonic() >= next_look:
            returns.update(_from_cache(client, jid, expected - set(returns)))
            interval = min(interval * 1.5, CACHE_LOOK_INTERVAL)
            next_look = time.monotonic() + interval
        else:
            # ``block=False`` yields at once when nothing came: pace the loop as ``cmd`` does.
            time.sleep(0.01)
        if expected <= set(returns):
            break
    return returns


class AnswerRefused(CommandExecutionError):
    """
    A control minion's return that is not a usable answer; the message says why and what to
    run.
    """


def _unsigned(master, minion, function):
    return (
        f"{master}: the answer to {function} is not signed by {minion}, its control minion (a "
        f"return another minion sent under its id, or {minion} runs an older formula): nothing "
        f"of it was used; run 'salt {minion} saltutil.sync_all', then this command again"
    )


def signed_answer(ret, function, master, minion, nonce, minion_pub):
    """
    ``(answer, failed)`` of ``minion``'s return ``ret`` (as ``cmd_returns`` gives it) to
    ``multimaster_peer.<function>`` for ``nonce``, once its signature verifies with
    ``minion_pub`` (the minion's public key PEM, accepted on this master) and it speaks for
    ``master``; ``failed``: the answer is the reason the function failed. Raises
    ``AnswerRefused`` naming the master, the minion and what to run.
    """
    try:
        speaks_for, failed, answer = multimaster_seal.open_answer(
            ret.get("ret"), function, nonce, minion_pub
        )
    except multimaster_seal.SealError as exc:
        log.warning(
            "multimaster: %s of %s (jid %s) refused: %s", function, minion, ret.get("jid"), exc
        )
        if str(exc) == "not a signed answer":
            raise AnswerRefused(_unsigned(master, minion, function)) from None
        raise AnswerRefused(
            f"{master}: the answer to {function} under {minion}'s id does not verify with "
            f"{minion}'s key accepted on this master (a return another minion sent under its "
            "id, or one made for another call): nothing of it was used"
        ) from None
    if failed:
        return answer if isinstance(answer, str) else str(answer)[:2000], True
    if speaks_for != master:
        raise AnswerRefused(
            f"{master}: {minion} answered {function} as the control minion of "
            f"{speaks_for!r} (it speaks for {speaks_for}, not {master}): nothing of it was "
            f"used; check the minion_id of {master} in multimaster:masters, in this master's "
            f"config and in {minion}'s pillar"
        )
    return answer, False
