"""
What a master's reactors run: a key change made on this master propagated to every master (or
replayed to the peers of Salt's native cluster), and a minion that just started given its one
first highstate. An event is only a hint (any accepted minion can fire one, with any id in it):
each reaction acts on what this master's own key store holds, and claims its id in the
reactions record (``multimaster_reactor.claimed``) so that a repeat of the same event does
nothing.
"""

import logging
import time

import multimaster_control
import multimaster_ids
import multimaster_keystore
import multimaster_keysync
import multimaster_reactor
import salt.client
import salt.utils.event
from salt.exceptions import SaltClientError, SaltInvocationError

log = logging.getLogger(__name__)

# The operations key_event propagates (multimaster/reactor/keys.sls maps the salt/key event's
# act onto them), and the state each leaves on the master where it was made (None: no key).
_LEFT_BY = {"accept": "accepted", "reject": "rejected", "delete": None}
# concurrent reactors (every master reacting at once) may overtake each other's plan
_RACE_ROUNDS = 3


# Salt 3008's cluster copies a key change to every peer from the ``salt/key`` event, but its
# peers apply only the acts accept/reject/pend/deny/delete: salt-key fires accepted/rejected,
# so its accepts and rejects stay on the master where they were made (its deletes travel).
_REPLAYED = ("accept", "reject")
# Set in the events ``key_event`` fires: the key reactor does not react to them again.
REPLAYED_MARK = "multimaster_replayed"
# A replay the bus refuses is retried this many times, this many seconds apart.
REPLAY_ATTEMPTS = 5
REPLAY_INTERVAL = 1.0
# A key event for the same id and change as a reaction of this master that runs, or ended less
# than this many seconds ago, does nothing: a flood of events for one change costs one
# propagation per window (the changes an id can see are few; the events about it are not).
KEY_REPEAT_WINDOW = 60


# --- key events ------------------------------------------------------------------------------


def key_event(run, minion, act, timeout):
    """
    The report on a ``salt/key`` event for ``minion`` with ``act`` (``accept``, ``reject`` or
    ``delete``): the change propagated to every master (``multimaster_keysync.one_id``) when
    this master's store shows it, or replayed to the cluster's peers (``cluster_id`` set).
    """
    try:
        here = _reacting_master(run, minion, act)
    except SaltInvocationError as exc:
        return multimaster_control.refused(run, exc)
    op = act
    # One read of the store: the PEM is what a cluster replay sends.
    entries, pubs = multimaster_keystore.inventory(run.opts, with_pubs=True, ids={minion})
    held = entries.get(minion)
    state = held[0] if held else None
    if state != _LEFT_BY[op]:
        return _not_shown(run, here, minion, act, held)
    if run.opts.get("cluster_id"):
        ret = _replay_to_cluster(run, here, minion, op, act, pubs.get(minion, {}).get("key"))
        ret["event"] = {"master": here, "id": minion, "act": act}
        return ret
    fingerprint = held[1] if held else multimaster_keystore.held_before(run.opts, minion)
    if op == "delete" and fingerprint is None:
        return _never_held(run, here, minion)
    ret = _propagate_once(run, here, minion, op, fingerprint, timeout)
    ret["event"] = {"master": here, "id": minion, "act": act}
    return ret


def _reacting_master(run, minion, act):
    """
    The id of this master's entry in its section; refuses a bad id or act, and a master that
    is not in the set.
    """
    here = run.opts["id"]
    section = multimaster_control.section(run)
    multimaster_ids.check_id(minion, "minion id")
    if act not in _LEFT_BY:
        raise multimaster_control.Refused(
            f"act {act!r}: expected one of {', '.join(sorted(_LEFT_BY))}"
        )
    entry = multimaster_control.this_master(run, section)
    if entry is None:
        raise multimaster_control.Refused(
            f"this master's id {here!r} is not in multimaster:masters "
            f"{multimaster_control.ids(section)}: each entry's id must be its master's id option "
            "(or its host name, where Salt names the master <hostname>_master)"
        )
    return entry


def _not_shown(run, here, minion, act, held):
    """
    The report on an event whose change this master's store does not show (it holds ``held``):
    a stale or forged event, which changes nothing.
    """
    state = held[0] if held else None
    log.warning("multimaster: %s %s on %s: the store holds %s; ignored", act, minion, here, held)
    ret = {
        "comment": f"{minion} is {state or 'unknown'} on {here}, not what {act!r} leaves: "
        "a stale or forged event; nothing changed",
    }
    return multimaster_control.finish(run, ret, False)


def _never_held(run, here, minion):
    """
    The report on a delete event for an id this master has no key for and no run found it
    holding before: a forged (or stale) event, which must not delete the id elsewhere.
    """
    log.warning("multimaster: delete %s on %s: never held here; ignored", minion, here)
    ret = {
        "comment": f"{minion} has no key on {here}, and no run found {here} holding it "
        "(accepted or pending) before: a stale or forged event; nothing changed (salt-run "
        f"multimaster.delete {minion} deletes it everywhere)",
    }
    return multimaster_control.finish(run, ret, False)


def _propagate_once(run, here, minion, op, fingerprint, timeout):
    """
    ``op`` of ``minion``'s key ``fingerprint`` on every master, re-planned when a concurrent
    reaction overtook it; nothing when a reaction of this master to the same change runs or
    ended within ``KEY_REPEAT_WINDOW``. A delete removes only accepted and pending keys.
    """
    with multimaster_reactor.claimed(
        run.opts, "key", minion, [op, fingerprint], KEY_REPEAT_WINDOW
    ) as claimed:
        if not claimed:
            ret = {
                "comment": f"{op} {minion}: a reaction of {here} to the same change runs or "
                f"ended less than {KEY_REPEAT_WINDOW} s ago; nothing to do"
            }
            return multimaster_control.finish(run, ret, False)
        for _ in range(_RACE_ROUNDS):
            # A reactor never waits on a restart, as it never waits on a minion.
            ret = multimaster_keysync.one_id(
                run,
                op,
                minion,
                fingerprint,
                False,
                None,
                timeout,
                settle=False,
                keep_revocations=op == "delete",
            )
            if not _raced(ret):
                break
    return ret


def _raced(ret):
    return any(r.get("skipped") for r in ret.get("masters", {}).values() if isinstance(r, dict))


# --- cluster replays -------------------------------------------------------------------------


def _replay_to_cluster(run, here, minion, op, act, pem):
    """
    Re-fire a change this master's store shows under the act Salt's cluster applies: the
    cluster publisher forwards it to every peer (over the cluster channel, encrypted with the
    cluster's AES key), and each peer stores ``pem``, the exact key this master holds, in that
    state.
    """
    if op not in _REPLAYED:
        return multimaster_control.finish(
            run, {"comment": f"Salt's cluster replicates {act} to the peers itself"}, False
        )
    if pem is None:
        # inventory never returns a file that is not one public key PEM
        return multimaster_control.finish(
            run,
            {"comment": f"{minion} on {here} is not a valid public key; nothing replayed"},
            True,
        )
    data = {"act": op, "id": minion, "pub": pem, "result": True, REPLAYED_MARK: here}
    if not fire_on_own_bus(run, data, "salt/key"):
        return multimaster_control.finish(
            run, {"comment": f"{op} {minion}: {here}'s event bus refused the replay"}, True
        )
    log.info("multimaster: %s %s replayed to the cluster peers of %s", op, minion, here)
    return multimaster_control.finish(
        run, {"comment": f"{op} {minion} replayed to the cluster's peers"}, False
    )


def fire_on_own_bus(run, data, tag, attempts=None):
    """
    Fire ``data`` on this master's event bus, a fresh connection per attempt: a ``salt-key -r``
    makes Salt rotate this master's AES key at the same moment, and its publisher has been seen
    to close the connection mid-rotation (``StreamClosedError``). True once it was taken.

    attempts
        How many times to try (default ``REPLAY_ATTEMPTS``).
    """
    for attempt in range(REPLAY_ATTEMPTS if attempts is None else attempts):
        if attempt:
            time.sleep(REPLAY_INTERVAL)
        try:
            with salt.utils.event.get_master_event(
                run.opts, run.opts["sock_dir"], listen=False
            ) as bus:
                if bus.fire_event(data, tag):
                    return True
        except Exception as exc:  # pylint: disable=broad-except
            log.warning("multimaster: firing %s on this master's bus failed: %s", tag, exc)
    return False


# --- first highstate -------------------------------------------------------------------------

# A start event for a minion (and key) this master reacted to less than this many seconds ago
# is not reacted to again: a minion starts once, and a flood of start events, forged or not,
# costs one publish per minion and window.
START_REPEAT_WINDOW = 30
# What a minion that started gets: one job, so that it runs in this order, with the custom
# modules synced first (a new minion has none): this SLS, whose one state calls
# multimaster.claim_first_highstate. (A job of two functions would do the same, but Salt 3008's
# saltutil.is_running fails on one, and with it every state run on that minion meanwhile.)
FIRST_HIGHSTATE_SLS = "multimaster.minion.first_highstate"
FIRST_HIGHSTATE_KWARG = {"sync_mods": "all", "queue": True}


def first_highstate(run, minion):
    """
    The report on a start event for ``minion``: the jid of the first-highstate job published to
    it, or why nothing was (not accepted in this master's store, a repeat within
    ``START_REPEAT_WINDOW``).
    """
    here = run.opts["id"]
    try:
        multimaster_ids.check_id(minion, "minion id")
    except SaltInvocationError as exc:
        return multimaster_control.refused(run, exc)
    state, fingerprint = _own_entry(run, minion)[:2]
    if state != "accepted":
        ret = {
            "comment": f"{minion} is {state} on {here}, not accepted: a start event it did not "
            "send; nothing done"
        }
        return multimaster_control.finish(run, ret, False)
    try:
        jid = _first_highstate_once(run, minion, fingerprint)
    except SaltClientError as exc:
        return multimaster_control.finish(
            run, {"error": f"{minion}: publishing state.sls {FIRST_HIGHSTATE_SLS}: {exc}"}, True
        )
    if jid is None:
        ret = {
            "comment": f"a start of {minion} with this key was reacted to less than "
            f"{START_REPEAT_WINDOW} s ago: a repeated start event; nothing done"
        }
        return multimaster_control.finish(run, ret, False)
    return multimaster_control.finish(run, {"minion": minion, "jid": jid, "master": here}, False)


def _own_entry(run, minion):
    """
    ``[state, fingerprint, ...]`` of ``minion`` in this master's own key store;
    ``["unknown", None]`` when it holds no key for it.
    """
    entries, _ = multimaster_keystore.inventory(run.opts, ids={minion})
    return entries.get(minion) or ["unknown", None]


def _first_highstate_once(run, minion, fingerprint):
    """
    Publish ``FIRST_HIGHSTATE_SLS`` to ``minion`` and return its jid; None, publishing nothing,
    when a start of it with the key ``fingerprint`` was reacted to within the window.
    """
    with multimaster_reactor.claimed(
        run.opts, "start", minion, fingerprint, START_REPEAT_WINDOW
    ) as claimed:
        return _publish_first_highstate(run, minion) if claimed else None


def _publish_first_highstate(run, minion):
    """
    Publish ``FIRST_HIGHSTATE_SLS`` to ``minion`` and return its jid, waiting for nothing: a
    minion that holds its jobs (or answers ``saltutil.find_job`` for ever) must not hold a
    reactor worker, which the key reactor shares.
    """
    with salt.client.get_local_client(run.opts["conf_file"]) as client:
        jid = client.cmd_async(
            [minion],
            "state.sls",
            [FIRST_HIGHSTATE_SLS],
            tgt_type="list",
            kwarg=dict(FIRST_HIGHSTATE_KWARG),
        )
    if not jid:
        raise SaltClientError("the master published no job")
    return jid
