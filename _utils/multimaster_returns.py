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
"""

import logging
import time

log = logging.getLogger(__name__)

# How long the event stream may stay idle before the job cache is read for missing returns:
# the first interval, grown by half after each look up to the last.
CACHE_LOOK_FIRST = 0.1
CACHE_LOOK_INTERVAL = 1.0


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


def cmd_returns(client, minions, fun, kwarg=None, timeout=None):
    """
    Run ``fun`` on the listed ``minions`` through ``client`` (a ``LocalClient``) and return
    ``{minion id: {"ret", "retcode", "jid"}}`` for each minion that answered within Salt's own
    timeout rules (``timeout``, extended while ``saltutil.find_job`` finds the job running).
    """
    pub = client.run_job(
        list(minions), fun, kwarg=kwarg or {}, tgt_type="list", timeout=timeout, listen=True
    )
    if not pub or not pub.get("jid"):
        return {}
    jid, expected = pub["jid"], set(pub.get("minions") or [])
    returns = {}
    events = client.get_iter_returns(
        jid, list(expected), timeout=timeout, tgt=list(minions), tgt_type="list", block=False
    )
    interval = CACHE_LOOK_FIRST
    next_look = time.monotonic() + interval
    try:
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
    finally:
        events.close()
        client._clean_up_subscriptions(jid)  # noqa: SLF001  (what cmd_iter does on its way out)
    return returns
