"""
Operate a set of Salt masters as one: share the master key, keep minion keys identical on every
master, and report whether the set is consistent and alive.

The masters are read from this master's own config (``multimaster:`` in ``master.d``, written by
the ``multimaster.master`` state), never from arguments: the first of them is the primary, whose
keys are the authority, and a runner ACL that allows one function must not let its caller name
another primary or another recipient of a private key (``masters=`` is refused). Each master is
reached through its control minion (the salt-minion on that host, module ``multimaster_peer``),
targeted by exact id list. Every change is sent as an order signed by this master and bound to a
single-use challenge of the recipient; every answer is used only when signed by the control
minion's own key (as accepted here) for the nonce of that publish. Bulk data (key actions,
sealed keys) never rides the publish: it is staged on this master and the recipient pulls it
over its own request channel (``multimaster_transfer.pull``, allowed to the control minions by
``peer_run``); the publish carries a ticket. Work is applied master by master in the configured
order (the first is the primary). Every function takes ``test=True`` (return the plan, change
nothing) and returns ``retcode: 1`` on any failure.
"""

import logging
import os
import time

import salt.client
import salt.config
import salt.runner
import salt.utils.event
import salt.utils.files
import salt.utils.json
import salt.utils.minions
from salt.exceptions import SaltClientError, SaltInvocationError

try:
    import multimaster_cluster
    import multimaster_control
    import multimaster_ids
    import multimaster_keys
    import multimaster_keystore
    import multimaster_reactor
    import multimaster_roots
    import multimaster_seal
    import multimaster_settle
    import multimaster_transport

    HAS_UTILS = True
except ImportError:
    HAS_UTILS = False

log = logging.getLogger(__name__)

__virtualname__ = "multimaster"

# Listed ids in a report are capped; counts are always complete.
SHOWN = 50
PEER = "multimaster_peer"


def __virtual__():
    if not HAS_UTILS:
        return (False, "multimaster: utils missing; run salt-run saltutil.sync_all")
    return __virtualname__


# --- plumbing --------------------------------------------------------------------------------


Refused = multimaster_control.Refused


def _run():
    """
    This call's ``Run``: this master's opts, the runner's context and its progress events.
    """
    return multimaster_control.Run(__opts__, __context__, globals().get("__jid_event__"))


def _section(opts=None):
    return multimaster_control.section(_run(), opts)


def _on_disk():
    return multimaster_control.on_disk(_run())


def _configured(masters, what):
    return multimaster_control.configured(_run(), masters, what)


def _progress(message):
    _run().progress(message)


def _finish(ret, failed):
    return multimaster_control.finish(_run(), ret, failed)


def _refused(exc):
    return multimaster_control.refused(_run(), exc)


def _this_master(section):
    return multimaster_control.this_master(_run(), section)


def _call(section, masters, fun, kwarg, timeout, check=None):
    return multimaster_control.call(_run(), section, masters, fun, kwarg, timeout, check)


def _staged(section, master, document, fileserver=False):
    return multimaster_control.staged(_run(), section, master, document, fileserver)


def _signer_key():
    return multimaster_control.signer_key(_run())


def _primary_key_entry(minion_id):
    return multimaster_control.primary_key_entry(_run(), minion_id)


def _await_restarts(section):
    multimaster_settle.await_restarts(_run(), section)


def _poll_settled(section, masters):
    return multimaster_settle.poll_settled(_run(), section, masters)


_addressable = multimaster_control.addressable
_ids = multimaster_control.ids
_id_list = multimaster_control.id_list
_by_id = multimaster_control.by_id
_binding = multimaster_control.binding
_bound = multimaster_control.bound


# --- minion keys -----------------------------------------------------------------------------


def _inventory_check(kind):
    def check(answer):
        checked = multimaster_keys.check_inventory_return(answer, kind)
        checked["binding"] = answer.get("binding")
        return checked

    return check


def _inventories(section, timeout, ids=None):
    """
    Entries and pubs of every master, fetched only where digests differ (or for ``ids``).
    Returns ``{"inventories", "pubs", "bindings", "errors", "repair", "totals", "keyless"}``
    (``totals``: each master's key count, when digests were read; ``keyless``: the masters whose
    entries came without their keys).
    """
    masters = _ids(section)
    found = {"bindings": {}, "errors": {}, "repair": [], "totals": None, "keyless": []}
    if ids is None:
        digests, found["errors"] = _call(
            section, masters, "key_inventory", {}, timeout, _inventory_check("digests")
        )
        found["bindings"] = {m: d["binding"] for m, d in digests.items()}
        found["repair"] = [m for m, d in digests.items() if d["repair"]]
        found["totals"] = {m: d["count"] for m, d in digests.items()}
        if len({d["digest"] for d in digests.values()}) <= 1:
            return dict(found, inventories={m: {} for m in digests}, pubs={})
        buckets = set()
        for digest in digests.values():
            buckets.update(digest["buckets"])
        differing = [
            b for b in sorted(buckets) if len({d["buckets"].get(b) for d in digests.values()}) > 1
        ]
        # Peers send entries without keys: the keys a sync copies are nearly always this
        # master's, and a key only a peer holds is fetched afterwards (``_missing_pubs``).
        kwarg = {"buckets": differing, "with_pubs": False}
        # This master's own keys are read here, not returned by its control minion (at 10,000
        # keys that return is megabytes through the job return path); a master with no entry
        # in the differing buckets (a new one) has nothing to return. Both keep the challenge
        # the digest round issued.
        own = _this_master(section)
        own = own if own in digests else None
        full = {}
        for master, digest in digests.items():
            if master == own:
                full[master] = _own_inventory(differing)
            elif not set(differing) & set(digest["buckets"]):
                full[master] = {"entries": {}, "pubs": {}}
        masters = [m for m in digests if m not in full]
    else:
        kwarg = {"ids": ids, "with_pubs": True}
        full = {}
    asked, errors = (
        _call(section, masters, "key_inventory", kwarg, timeout, _inventory_check("entries"))
        if masters
        else ({}, {})
    )
    found["errors"].update(errors)
    found["bindings"].update({m: asked[m]["binding"] for m in asked})
    if not kwarg["with_pubs"]:
        found["keyless"] = list(asked)
    full.update(asked)
    return dict(
        found,
        inventories={m: full[m]["entries"] for m in full},
        pubs={m: full[m]["pubs"] for m in full},
    )


def _missing_pubs(section, plan, found, timeout):
    """
    Add to ``found`` the keys ``plan`` copies that no inventory carried (one only a peer holds),
    asked by bucket (a bounded publish) from the masters that list those ids; their new
    challenges replace the earlier ones. A master that fails is a per-master error, and the ids
    whose key nobody reported are refused by ``attach_pubs``; a master that fails gets no
    actions this run (the re-run converges).
    """
    missing = multimaster_keys.ids_without_pubs(plan, found["pubs"])
    holders = [m for m in found["keyless"] if missing & set(found["inventories"][m])]
    if not holders:
        return
    buckets = sorted({multimaster_keys.bucket_of(i) for i in missing})
    asked, errors = _call(
        section,
        holders,
        "key_inventory",
        {"buckets": buckets, "with_pubs": True},
        timeout,
        _inventory_check("entries"),
    )
    found["errors"].update(errors)
    for master in errors:
        plan["actions"].pop(master, None)
    for master, answer in asked.items():
        found["bindings"][master] = answer["binding"]
        found["pubs"][master] = {**found["pubs"].get(master, {}), **answer["pubs"]}


def _own_inventory(buckets):
    """
    The entries and public keys of this master's own store in ``buckets``, read in this process
    (the same store its control minion would read), checked as a peer's answer is.
    """
    chosen = set(buckets)
    entries, pubs = multimaster_keystore.inventory(
        __opts__,
        with_pubs=True,
        ids=lambda minion_id: multimaster_keys.bucket_of(minion_id) in chosen,
    )
    answer = {"alive": True, "entries": entries, "pubs": pubs}
    return multimaster_keys.check_inventory_return(answer, "entries")


def _apply_one(section, master, actions, binding, timeout):
    """
    Send one master its actions, signed and bound to the challenge it issued.
    """
    instruction = {"actions": actions}
    try:
        order = multimaster_seal.order(
            instruction,
            "key_actions",
            _by_id(section)[master]["minion_id"],
            _signer_key(),
            _bound(_binding({"binding": binding}, master)),
        )
    except ValueError as exc:
        return {"result": False, "error": str(exc)}
    transfer = _staged(section, master, instruction)
    answers, errors = _call(
        section, [master], "apply_key_actions", {"transfer": transfer, "order": order}, timeout
    )
    if master in errors:
        return {"result": False, "error": errors[master]}
    done = answers[master]
    return {
        "result": not done.get("skipped_count"),
        "changes": done.get("changes"),
        "ids": done.get("ids"),
        "skipped": done.get("skipped"),
        "repaired": done.get("repaired"),
        "aes_rotated": done.get("rotated"),
    }


def _apply(section, plan, repair, bindings, timeout):
    """
    Apply each master's actions, in the order of ``masters``. Returns per-master reports.
    """
    report = {}
    for master in _ids(section):
        actions = plan["actions"].get(master, [])
        if not actions and master not in repair:
            continue
        _progress(f"{master}: applying {len(actions)} key action(s)")
        report[master] = _apply_one(section, master, actions, bindings.get(master), timeout)
    return report


_REPORTED = ("conflicts", "pending", "drift", "denied", "spoofed", "invalid", "invalid_keys")
_FAILING = ("conflicts", "invalid", "invalid_keys")


def _summary(plan):
    summary = {key: plan[key] for key in _REPORTED if plan.get(key)}
    if plan.get("warnings"):
        summary["warnings"] = plan["warnings"]
    return summary


def _planned(actions):
    shown = [{k: a[k] for k in ("id", "op", "fp")} for a in actions[:SHOWN]]
    if len(actions) > SHOWN:
        shown.append(f"... and {len(actions) - SHOWN} more")
    return shown


def _reconcile(section, plan_fn, timeout, test, ids=None, force=False):
    """
    Inventory, plan, guard, then apply (unless ``test``). Returns ``(report, failed)``.
    """
    found = _inventories(section, timeout, ids)
    errors = found["errors"]
    plan = plan_fn(found["inventories"])
    _missing_pubs(section, plan, found, timeout)
    plan = multimaster_keys.attach_pubs(plan, found["pubs"])
    ret = {"masters": {}, **_summary(plan)}
    for master, error in errors.items():
        ret["masters"][master] = {"result": False, "error": error}
    refusal = multimaster_keys.revoke_refusal(
        plan,
        found["inventories"],
        max_share=section.get("max_revoke_share", 0.1),
        force=force,
        totals=found["totals"],
    )
    if refusal:
        ret["comment"] = f"Refused, nothing changed: {refusal} (force=True to proceed)"
        return ret, True
    if test:
        for master, actions in plan["actions"].items():
            ret["masters"].setdefault(master, {"result": None})["planned"] = _planned(actions)
        return ret, bool(errors)
    ret["masters"].update(_apply(section, plan, found["repair"], found["bindings"], timeout))
    failed = bool(errors) or any(not r.get("result", True) for r in ret["masters"].values())
    return ret, failed or any(plan.get(key) for key in _FAILING)


def sync_keys(minion=None, prune=False, test=False, force=False, masters=None, timeout=60):
    """
    Reconcile minion key states across all masters. The primary's accepted keys become accepted
    everywhere; rejected or denied anywhere wins everywhere; pending keys are listed, never
    accepted; keys accepted only on peers are drift (removed with ``prune=True``); one id with two
    different keys is a conflict: both fingerprints are reported and nothing changes for it. A
    denied key that differs from the id's accepted key is a spoof record (Salt stores a different
    key offered for an accepted id as denied): reported and copied, the accepted key still
    propagates. Compares digests first, so a run with nothing to do moves a few KB.

    minion
        Only this minion id.

    prune
        Delete keys accepted on peers but unknown to the primary.

    test
        Return the plan; change nothing.

    force
        Allow revoking more than ``multimaster:max_revoke_share`` of a master's accepted keys in
        one run (a compromised peer reporting every id as rejected must not revoke the fleet).

    masters
        Refused: the masters, and the primary whose keys are the authority, come only from
        multimaster:masters in this master's own config.

    timeout
        Seconds to wait for each control-minion call.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.sync_keys
        salt-run multimaster.sync_keys minion=web1 test=True
        salt-run multimaster.sync_keys prune=True
    """
    try:
        section = _addressable(_configured(masters, "sync_keys"), "sync_keys")
        ids = None if minion is None else [multimaster_ids.check_id(minion, "minion")]
        _await_restarts(section)
    except SaltInvocationError as exc:
        return _refused(exc)
    order = _ids(section)
    ret, failed = _reconcile(
        section,
        lambda inv: multimaster_keys.plan(inv, order, prune=prune),
        timeout,
        test,
        ids,
        force,
    )
    if not test and not failed and not any(r.get("changes") for r in ret["masters"].values()):
        ret["comment"] = "All masters already hold the same keys"
    return _finish(ret, failed)


def _one_id(
    op, minion_id, fingerprint, test, masters, timeout, force=False, settle=True, **plan_options
):
    try:
        section = _addressable(_configured(masters, op), op)
        multimaster_ids.check_id(minion_id, "minion id")
        if settle:
            # An operator's command waits out restarts; a reactor never waits on a minion.
            _await_restarts(section)
    except SaltInvocationError as exc:
        return _refused(exc)
    refused = {}

    def plan_fn(inventories):
        plan = multimaster_keys.one_id_plan(
            op, minion_id, fingerprint, inventories, _ids(section), **plan_options
        )
        refused["reason"] = plan.pop("refused")
        if refused["reason"]:
            plan["actions"] = {m: [] for m in plan["actions"]}
        return plan

    ret, failed = _reconcile(section, plan_fn, timeout, test, ids=[minion_id], force=force)
    if refused.get("reason"):
        ret["comment"] = f"Refused, nothing changed: {refused['reason']}"
        failed = True
    return _finish(ret, failed)


def accept(minion, fingerprint=None, test=False, masters=None, timeout=60):
    """
    Accept one minion key on every master, in order. Works when the key is pending on only one
    master (a failover minion that reached just that one). Refused when the id's key is rejected
    or denied anywhere, when masters hold different keys for it, or when ``fingerprint`` is given
    and does not match.

    minion
        The minion id.

    fingerprint
        The expected key fingerprint (ours: SHA-256 of the DER public key, colon hex).

    test, masters, timeout
        As for ``sync_keys``.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.accept web1
        salt-run multimaster.accept web1 fingerprint=ab:cd:...
    """
    return _one_id("accept", minion, fingerprint, test, masters, timeout)


def reject(minion, fingerprint=None, test=False, masters=None, timeout=60):
    """
    Reject one minion key on every master (also where it was unknown), rotating the AES key of
    every master that had it accepted.

    minion
        The minion id.

    fingerprint
        Only if the held key has this fingerprint.

    test, masters, timeout
        As for ``sync_keys``.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.reject web1
    """
    return _one_id("reject", minion, fingerprint, test, masters, timeout)


def delete(minion, fingerprint=None, test=False, masters=None, timeout=60):
    """
    Delete one minion's keys (every state) on every master, rotating the AES key of every master
    that had it accepted.

    minion
        The minion id.

    fingerprint
        Only if the held key has this fingerprint.

    test, masters, timeout
        As for ``sync_keys``.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.delete web1
    """
    return _one_id("delete", minion, fingerprint, test, masters, timeout)


# --- orchestration ---------------------------------------------------------------------------


def wait_masters(timeout=180, interval=1, skip=None):
    """
    Wait until every master is up with no restart pending: what the orchestrations run after a
    step that may restart masters (``multimaster.master`` restarts a master once the job that
    changed its config has returned). Rides out a restart of this master itself. In mode
    cluster it proposes a no-op Raft entry every 5 s while it waits (see ``cluster_ready``).

    skip
        Ids of masters not to wait for (a comma-separated string or a list): the one being
        removed, whose control minion no longer finds itself in pillar. Ids this master's
        section does not list are ignored, so a re-run after the section dropped it still works.

    timeout
        Seconds to wait in all.

    interval
        Seconds between polls.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.wait_masters timeout=120
        salt-run multimaster.wait_masters skip=master3
    """
    return multimaster_settle.wait_masters(
        _run(), timeout=timeout, interval=interval, skip=skip, fire=_fire_on_own_bus
    )


def wait_master_stopped(host, timeout=90, interval=1):
    """
    Wait until the master at ``host`` no longer accepts connections on the set's publish and
    return ports: what ``multimaster.orch.remove_master`` runs after a removed cluster master's
    control minion scheduled its stop (``multimaster.stop_master after_return=True``). Changes
    nothing. (This master's own section may still list it: the orchestration rewrites the
    remaining masters' sections after the stop.)

    host
        The removed master's address (in mode cluster its id).

    timeout
        Seconds to wait in all.

    interval
        Seconds between polls.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.wait_master_stopped 10.0.3.64
    """
    return multimaster_settle.wait_master_stopped(_run(), host, timeout=timeout, interval=interval)


def wait_minions(tgt="*", timeout=180, interval=2):
    """
    Wait until every minion whose key this master has accepted and that ``tgt`` matches
    answers ``test.ping`` here: what to run after ``multimaster.minion`` restarted minions (or
    after a failover) before ``status``. Progress names the minions still silent.

    tgt
        A glob of minion ids.

    timeout
        Seconds to wait in all.

    interval
        Seconds between rounds.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.wait_minions
        salt-run multimaster.wait_minions tgt='web*' timeout=60
    """
    return multimaster_settle.wait_minions(_run(), tgt=tgt, timeout=timeout, interval=interval)


# --- reactors --------------------------------------------------------------------------------

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


def _fire_on_own_bus(data, tag, attempts=REPLAY_ATTEMPTS):
    """
    Fire ``data`` on this master's event bus, a fresh connection per attempt: a ``salt-key -r``
    makes Salt rotate this master's AES key at the same moment, and its publisher has been seen
    to close the connection mid-rotation (``StreamClosedError``). True once it was taken.
    """
    for attempt in range(attempts):
        if attempt:
            time.sleep(REPLAY_INTERVAL)
        try:
            with salt.utils.event.get_master_event(
                __opts__, __opts__["sock_dir"], listen=False
            ) as bus:
                if bus.fire_event(data, tag):
                    return True
        except Exception as exc:  # pylint: disable=broad-except
            log.warning("multimaster: firing %s on this master's bus failed: %s", tag, exc)
    return False


def _replay_to_cluster(here, minion, op, act, pem):
    """
    Re-fire a change this master's store shows under the act Salt's cluster applies: the
    cluster publisher forwards it to every peer (over the cluster channel, encrypted with the
    cluster's AES key), and each peer stores ``pem``, the exact key this master holds, in that
    state.
    """
    if op not in _REPLAYED:
        return _finish({"comment": f"Salt's cluster replicates {act} to the peers itself"}, False)
    if pem is None:
        # inventory never returns a file that is not one public key PEM
        return _finish(
            {"comment": f"{minion} on {here} is not a valid public key; nothing replayed"}, True
        )
    data = {"act": op, "id": minion, "pub": pem, "result": True, REPLAYED_MARK: here}
    if not _fire_on_own_bus(data, "salt/key"):
        return _finish({"comment": f"{op} {minion}: {here}'s event bus refused the replay"}, True)
    log.info("multimaster: %s %s replayed to the cluster peers of %s", op, minion, here)
    return _finish({"comment": f"{op} {minion} replayed to the cluster's peers"}, False)


def _raced(ret):
    return any(r.get("skipped") for r in ret.get("masters", {}).values() if isinstance(r, dict))


def key_event(minion, act, timeout=60):
    """
    Propagate a key change made on this master (``salt-key -a/-r/-d``) to every master: what the
    key reactor (``multimaster/reactor/keys.sls``) runs for each ``salt/key`` event. Any accepted
    minion can put a ``salt/key`` event on a master's bus, with any id in it, so the event is
    only a hint: this master's own key store must show the change (the id accepted, rejected,
    or gone), and what propagates is what the store holds: the exact accepted key (refused,
    nothing changed, when another master holds a different key for the id or has it rejected
    or denied), or a reject everywhere with the AES key rotated. A delete propagates only for
    an id this master held before, as the last run that read its store recorded it
    (``multimaster_keystore.note_held``), and removes only that key, where it is accepted or
    pending: never a rejected or denied one. A repeat of the same change within
    ``KEY_REPEAT_WINDOW`` seconds does nothing, so a flood of events costs reads of this
    master's store. Idempotent and safe when several masters react at once (store locks,
    compare-and-set, re-planned when overtaken); writes fire no ``salt/key`` event, so nothing
    loops.

    In Salt's native cluster (``cluster_id`` set) the peers copy a key change from the event
    itself, but Salt 3008 applies only ``accept``/``reject`` acts while salt-key says
    ``accepted``/``rejected`` (deletes do travel): the change is re-fired once under the act the
    peers apply, with the exact key this master holds and a mark the reactor skips. No control
    minion is involved (they sit behind the balancer, where no single master can be addressed).

    minion
        The minion id of the event.

    act
        ``accept``, ``reject`` or ``delete``: the reactor maps the event's act onto these
        (``accepted``/``accept``, ``rejected``/``reject``, ``delete``; ``pend`` and ``denied``
        are not propagated).

    timeout
        Seconds to wait for each control-minion call.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.key_event web1 accept
    """
    here = __opts__["id"]
    try:
        section = _section()
        multimaster_ids.check_id(minion, "minion id")
        if act not in _LEFT_BY:
            raise Refused(f"act {act!r}: expected one of {', '.join(sorted(_LEFT_BY))}")
        op = act
        if _this_master(section) is None:
            raise Refused(
                f"this master's id {here!r} is not in multimaster:masters {_ids(section)}: "
                "each entry's id must be its master's id option (or its host name, where Salt "
                "names the master <hostname>_master)"
            )
        here = _this_master(section)
    except SaltInvocationError as exc:
        return _refused(exc)
    # One read of the store: the PEM is what a cluster replay sends.
    entries, pubs = multimaster_keystore.inventory(__opts__, with_pubs=True, ids={minion})
    held = entries.get(minion)
    state = held[0] if held else None
    if state != _LEFT_BY[op]:
        log.warning(
            "multimaster: %s %s on %s: the store holds %s; ignored", act, minion, here, held
        )
        ret = {
            "comment": f"{minion} is {state or 'unknown'} on {here}, not what {act!r} leaves: "
            "a stale or forged event; nothing changed",
        }
        return _finish(ret, False)
    if __opts__.get("cluster_id"):
        ret = _replay_to_cluster(here, minion, op, act, pubs.get(minion, {}).get("key"))
        ret["event"] = {"master": here, "id": minion, "act": act}
        return ret
    fingerprint = held[1] if held else multimaster_keystore.held_before(__opts__, minion)
    if op == "delete" and fingerprint is None:
        return _never_held(here, minion)
    ret = _propagate_once(here, minion, op, fingerprint, timeout)
    ret["event"] = {"master": here, "id": minion, "act": act}
    return ret


def _never_held(here, minion):
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
    return _finish(ret, False)


def _propagate_once(here, minion, op, fingerprint, timeout):
    """
    ``op`` of ``minion``'s key ``fingerprint`` on every master, re-planned when a concurrent
    reaction overtook it; nothing when a reaction of this master to the same change runs or
    ended within ``KEY_REPEAT_WINDOW``. A delete removes only accepted and pending keys.
    """
    with multimaster_reactor.claimed(
        __opts__, "key", minion, [op, fingerprint], KEY_REPEAT_WINDOW
    ) as claimed:
        if not claimed:
            ret = {
                "comment": f"{op} {minion}: a reaction of {here} to the same change runs or "
                f"ended less than {KEY_REPEAT_WINDOW} s ago; nothing to do"
            }
            return _finish(ret, False)
        for _ in range(_RACE_ROUNDS):
            # A reactor never waits on a restart, as it never waits on a minion.
            ret = _one_id(
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


def first_highstate(minion):
    """
    Give a minion that just started its one first highstate: what the first-highstate reactor
    (``multimaster/reactor/first_highstate.sls``) runs on every master that sees the minion
    start. Any accepted minion can fire a start event with any id in it, so the event is only a
    hint: the id must be accepted in this master's own key store, a repeat for the same id and
    key within ``START_REPEAT_WINDOW`` seconds does nothing, and nothing waits on the minion.
    One job is published to it: ``state.sls multimaster.minion.first_highstate sync_mods=all
    queue=True``, which syncs the custom modules and calls
    ``multimaster.claim_first_highstate``: the minion claims its mark atomically and runs
    ``state.highstate`` only if it was first and its salt-minion started moments ago (a restart,
    a failover, a second master or a forged event finds the mark or an old process and does
    nothing).

    minion
        The id of the minion that started (the event's).

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.first_highstate web1
    """
    here = __opts__["id"]
    try:
        multimaster_ids.check_id(minion, "minion id")
    except SaltInvocationError as exc:
        return _refused(exc)
    state, fingerprint = _own_entry(minion)[:2]
    if state != "accepted":
        ret = {
            "comment": f"{minion} is {state} on {here}, not accepted: a start event it did not "
            "send; nothing done"
        }
        return _finish(ret, False)
    try:
        jid = _first_highstate_once(minion, fingerprint)
    except SaltClientError as exc:
        return _finish(
            {"error": f"{minion}: publishing state.sls {FIRST_HIGHSTATE_SLS}: {exc}"}, True
        )
    if jid is None:
        ret = {
            "comment": f"a start of {minion} with this key was reacted to less than "
            f"{START_REPEAT_WINDOW} s ago: a repeated start event; nothing done"
        }
        return _finish(ret, False)
    return _finish({"minion": minion, "jid": jid, "master": here}, False)


def _own_entry(minion):
    """
    ``[state, fingerprint, ...]`` of ``minion`` in this master's own key store;
    ``["unknown", None]`` when it holds no key for it.
    """
    entries, _ = multimaster_keystore.inventory(__opts__, ids={minion})
    return entries.get(minion) or ["unknown", None]


def _first_highstate_once(minion, fingerprint):
    """
    Publish ``FIRST_HIGHSTATE_SLS`` to ``minion`` and return its jid; None, publishing nothing,
    when a start of it with the key ``fingerprint`` was reacted to within the window.
    """
    with multimaster_reactor.claimed(
        __opts__, "start", minion, fingerprint, START_REPEAT_WINDOW
    ) as claimed:
        return _publish_first_highstate(minion) if claimed else None


def _publish_first_highstate(minion):
    """
    Publish ``FIRST_HIGHSTATE_SLS`` to ``minion`` and return its jid, waiting for nothing: a
    minion that holds its jobs (or answers ``saltutil.find_job`` for ever) must not hold a
    reactor worker, which the key reactor shares.
    """
    with salt.client.get_local_client(__opts__["conf_file"]) as client:
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


# --- master key ------------------------------------------------------------------------------


def _signing(section):
    return section["mode"] == "failover" and section.get("signing", {}).get("enabled", False)


def _local_pair(signing):
    """
    ``(private pem, public pem)`` of the pair this master would deliver (never returned).
    """
    return (
        multimaster_keystore.read_master_key(__opts__, signing, private=True),
        multimaster_keystore.read_master_key(__opts__, signing),
    )


def _recipient_problem(master, inventories, planning=False):
    """
    Why the control minion of ``master`` must not receive a private key, or None.

    Its key must be accepted on this master, canonical, match the pinned fingerprint if any, and
    be the only key for that id on every master (no pending, rejected, denied or other key).
    ``planning``: a master that does not know the id yet is fine (the run accepts it there first).
    """
    minion_id = master["minion_id"]
    state, pem, denied = _primary_key_entry(minion_id)
    if state != "accepted" or denied:
        return f"control minion {minion_id} is not accepted (alone) on this master"
    try:
        fp = multimaster_keys.fingerprint(multimaster_keys.canonical(pem, f"key of {minion_id}"))
    except SaltInvocationError as exc:
        return str(exc)
    pinned = master.get("minion_fingerprint")
    if pinned and pinned != fp:
        return f"control minion {minion_id} has key {fp}, not the pinned {pinned}"
    for other, entries in inventories.items():
        held = entries.get(minion_id)
        if held is None and planning:
            continue
        if held is None:
            return f"control minion {minion_id} is not accepted on {other}"
        if held.state != "accepted" or held.fp != fp or held.denied_fp:
            return f"control minion {minion_id} holds another key or state on {other}: {held}"
    return None


def _key_plan(section, signing, timeout):
    """
    What each master stores now; refuse what must not go ahead. Returns ``(plan, errors)``.
    """
    order = _ids(section)
    info, errors = _call(section, order, "master_key_info", {"signing": signing}, 60)
    primary = order[0]
    if primary not in info or not info[primary].get("pub"):
        raise Refused(f"primary {primary} did not report its key")
    private, public = _local_pair(signing)
    intended = multimaster_keys.fingerprint(info[primary]["pub"])
    if not private or multimaster_keys.private_key_fingerprint(private) != intended:
        raise Refused(
            f"this master does not hold the primary's key {intended}: run sync_master_key on "
            f"{primary}"
        )
    if signing:
        configured = multimaster_keys.fingerprint(section["signing"].get("public_key", ""))
        if configured != intended:
            raise Refused(
                f"multimaster:signing:public_key has fingerprint {configured}, but the "
                f"primary's signing pair is {intended}: minions would refuse every master"
            )
    stored = {m: multimaster_keys.fingerprint(i.get("pub") or "") for m, i in info.items()}
    plan = {
        "intended": intended,
        "pub": public,
        "salt_finger": multimaster_keys.salt_finger(public),
        "info": info,
        "stale": [m for m in order[1:] if m in info and stored[m] != intended],
        "stored": stored,
    }
    return plan, errors


def _deliver(section, master, plan, signing, timeout):
    """
    Seal the pair to ``master``'s control minion, bound to its challenge, and install it.
    """
    entry = _by_id(section)[master]
    private, public = _local_pair(signing)
    envelope = multimaster_seal.seal(
        {"pem": private, "pub": public},
        "master_sign" if signing else "master_key",
        entry["minion_id"],
        _primary_key_entry(entry["minion_id"])[1],
        _signer_key(),
        _bound(_binding(plan["info"][master], master), fp=plan["intended"]),
    )
    del private
    answers, errors = _call(
        section,
        [master],
        "install_master_key",
        {"transfer": _staged(section, master, envelope), "signing": signing},
        timeout,
    )
    if master in errors:
        return {"result": False, "error": errors[master]}
    done = answers[master]
    return {
        "result": bool(done.get("served")),
        "changed": done.get("changed"),
        "restarted": done.get("restarted"),
        "served": done.get("served"),
        "reason": done.get("reason"),
    }


def _verify_all(section, ret, plan, signing, timeout):
    """
    Every master proves, by a sign-in, that it serves the intended key (the shared one, or in
    signing mode its own key signed by the shared signing pair). The sign-in comes from the
    control minion of the *next* master: a compromised host cannot vouch for its own master.
    """
    port = section["ports"]["ret"]
    masters = section["masters"]
    for index, master in enumerate(masters):
        report = ret["masters"].setdefault(master["id"], {"result": True})
        if report.get("result") is False:
            continue
        verifier = masters[(index + 1) % len(masters)]["id"]
        if signing:
            # Each master keeps its own key in signing mode: the one it reported before.
            pub, sign_pub = plan["info"].get(master["id"], {}).get("own_pub"), plan["pub"]
        else:
            pub, sign_pub = plan["pub"], None
        answers, errors = _call(
            section,
            [verifier],
            "verify_master_key",
            {"host": master["host"], "port": port, "pub": pub, "sign_pub": sign_pub},
            timeout,
        )
        verified = answers.get(verifier, {})
        report["served"] = verified.get("served") is True
        report["verified_by"] = verifier
        if not report["served"]:
            report["result"] = False
            report["reason"] = verified.get("reason") or errors.get(verifier)


def sync_master_key(test=False, masters=None, timeout=180):
    """
    Give every peer master the primary's master key pair (mode ``hot``, or ``failover`` with a
    shared key) or signing pair (``failover`` with ``signing:enabled``). The pair travels sealed to
    the peer's control minion (named in this master's own config, accepted here with no other
    key for its id anywhere, matching ``minion_fingerprint`` where pinned) and signed by this
    master, bound to a challenge of the recipient, the peer and an expiry; the peer's master is
    stopped for the swap, restarted the way it runs and waited for. Then every master's served
    key is checked by a real sign-in from another master's control minion. Must run on the
    primary, or on a master that already shares its key.

    test
        Return the plan; change nothing.

    masters
        Refused: the recipients of a private key come only from this master's config.

    timeout
        Seconds to wait for each install (stop, store, restart, sign-in).

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.sync_master_key
        salt-run multimaster.sync_master_key test=True
    """
    try:
        section = _addressable(_configured(masters, "sync_master_key"), "sync_master_key")
        signing = _signing(section)
        _await_restarts(section)
        plan, errors = _key_plan(section, signing, timeout)
    except SaltInvocationError as exc:
        return _refused(exc)
    ret = {"masters": {}, "signing": signing, "fingerprint": plan["intended"]}
    ret["salt_finger"] = plan["salt_finger"]
    for master, error in errors.items():
        ret["masters"][master] = {"result": False, "error": error}
    for master in _ids(section)[1:]:
        if master in plan["info"] and master not in plan["stale"]:
            ret["masters"][master] = {"result": True, "changed": False}
    if test:
        control = [m["minion_id"] for m in section["masters"]]
        inventories = _inventories(section, 60, ids=control)["inventories"]
        for master in plan["stale"]:
            problem = _recipient_problem(_by_id(section)[master], inventories, planning=True)
            ret["masters"][master] = {
                "result": None,
                "planned": f"refuse: {problem}" if problem else "install, restart, verify",
                "old": plan["stored"][master],
                "new": plan["intended"],
            }
        return _finish(ret, bool(errors))
    _deliver_stale(section, ret, plan, signing, timeout)
    _verify_all(section, ret, plan, signing, timeout)
    return _finish(ret, any(r.get("result") is False for r in ret["masters"].values()))


def _deliver_stale(section, ret, plan, signing, timeout):
    """
    Accept the control minions everywhere (a sign-in needs it), re-check each recipient, and
    deliver to every master whose stored key is not the intended one.
    """
    control = [m["minion_id"] for m in section["masters"]]
    order = _ids(section)
    _reconcile(section, lambda inv: multimaster_keys.plan(inv, order), 60, False, ids=control)
    found = _inventories(section, 60, ids=control)
    inventories, bindings = found["inventories"], found["bindings"]
    for master in plan["stale"]:
        entry = {"old": plan["stored"][master], "new": plan["intended"]}
        problem = _recipient_problem(_by_id(section)[master], inventories)
        if problem:
            ret["masters"][master] = {"result": False, "error": f"refused: {problem}", **entry}
            continue
        _progress(f"{master}: installing the shared key, restarting, verifying")
        # A fresh challenge from the inventory just read (the earlier one is still valid too).
        plan["info"][master]["binding"] = bindings.get(master) or plan["info"][master]["binding"]
        ret["masters"][master] = {**_deliver(section, master, plan, signing, timeout), **entry}


# --- roots -----------------------------------------------------------------------------------

_ROOT_CHOICES = {
    "file": ("file_roots",),
    "pillar": ("pillar_roots",),
    "both": ("file_roots", "pillar_roots"),
}


class _Nonce:
    """
    The one nonce of this run that a sealed manifest must be bound to (used once per master).
    """

    def __init__(self, value):
        self.value = value

    def consume(self, challenge):
        if challenge != self.value:
            raise multimaster_seal.SealError("manifest is not bound to this run")
        self.value = None


def _opened_manifest(section, master, answer, nonce):
    """
    ``(files, modes, partial)``: the peer's file manifests and directory modes, unsealed with
    this master's key and checked to be signed by the peer's control minion (its key accepted
    here) and bound to this run; and per root the directories a manifest covers (``None``: the
    whole root).
    """
    entry = _by_id(section)[master]
    problem = _recipient_problem(entry, {})
    if problem:
        raise Refused(problem)
    body, _ = multimaster_seal.unseal(
        answer.get("sealed"),
        "roots_manifest",
        master,
        _signer_key(),
        _primary_key_entry(entry["minion_id"])[1],
        _expected_binding(master, entry),
        _Nonce(nonce),
    )
    files = body["files"]
    return (
        files,
        multimaster_roots.modes_check(body.get("dir_modes"), files),
        multimaster_roots.partial_check(body.get("dirs"), files),
    )


def _expected_binding(master, entry):
    """
    What a peer's answer must be bound to: the master, and its ``config_dir`` where pillar
    names one (else the peer binds the config dir it resolved itself, which only it knows).
    """
    expect = {"target": master}
    if entry.get("config_dir"):
        expect["config_dir"] = entry["config_dir"]
    return expect


def _deliver_roots(section, master, pairs, members, binding):
    """
    Stage the content (encrypted with a fresh key) and the plan (sealed to the peer's control
    minion, carrying that key and the content's descriptor: its ticket, which this master's
    file server serves, reaches no one else), then have the peer pull and apply both.
    """
    entry = _by_id(section)[master]
    key = os.urandom(32)
    content = multimaster_transport.stage_files(
        __opts__, entry["minion_id"], members, key, fileserver=True
    )
    plan = multimaster_seal.seal(
        {
            "key": key.hex(),
            "content": content,
            "pairs": [{k: v for k, v in p.items() if k != "added"} for p in pairs],
        },
        "roots",
        entry["minion_id"],
        _primary_key_entry(entry["minion_id"])[1],
        _signer_key(),
        _bound(_binding({"binding": binding}, master)),
    )
    # Sealed to the peer: its file server may hand it over, to that minion only.
    return _staged(section, master, plan, fileserver=True)


def sync_roots(roots="both", test=False, timeout=300):
    """
    Make every peer's ``file_roots`` and ``pillar_roots`` (those of its own master config) equal
    to the primary's, pairing them by environment and position. Manifests first, then only what
    differs moves: added and changed files are written atomically with their modes, files the
    primary no longer has are deleted (with the directories they leave empty). Symlinks are
    never followed on either side (one on the primary is skipped and reported), VCS directories
    are skipped, nothing is written outside a paired root. The content is staged on this master
    and pulled by each peer's control minion, encrypted with a key sealed to it: pillar content
    never appears in a publish, a job cache, an event or a log. Must run on the primary.

    roots
        ``file``, ``pillar`` or ``both`` (default).

    test
        Return the plan per master; change nothing.

    timeout
        Seconds to wait for each peer's manifest and apply.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.sync_roots
        salt-run multimaster.sync_roots roots=pillar test=True
    """
    try:
        if roots not in _ROOT_CHOICES:
            raise Refused(f"roots={roots!r}: expected one of file, pillar, both")
        current = _on_disk()
        section = _addressable(_section(opts=current), "sync_roots")
        _await_restarts(section)
        kinds, notes = multimaster_roots.synced_kinds(current, _ROOT_CHOICES[roots])
        if not kinds:
            return _finish({"masters": {}, "comment": "; ".join(notes)}, False)
        # One round: each master compares its digests with this master's and returns its
        # manifests, sealed, only where they differ (pillar ones always: see
        # multimaster_roots.published).
        opts = {key: current.get(key) for key in multimaster_roots.MANIFEST_OPTS}
        local = multimaster_roots.manifests(opts, kinds)
        digests = multimaster_roots.digests(local)
        nonce = os.urandom(32).hex()
        summary, errors = _call(
            section,
            _ids(section),
            "roots_manifest",
            {
                "kinds": kinds,
                "full": True,
                "nonce": nonce,
                "unless": multimaster_roots.published(digests),
                "dirs": multimaster_roots.published_dir_digests(local),
            },
            timeout,
            multimaster_roots.manifest_answer_check,
        )
        multimaster_roots.check_layouts(_ids(section)[0], local, summary)
    except SaltInvocationError as exc:
        return _refused(exc)
    ret = {"masters": {}, "roots": digests}
    if notes:
        ret["comment"] = "; ".join(notes)
    for master, error in errors.items():
        ret["masters"][master] = {"result": False, "error": error}
    for master in [m for m in _ids(section)[1:] if m in summary]:
        if multimaster_roots.digests(summary[master]["roots"]) == digests:
            ret["masters"][master] = {"result": True, "changed": False}
        else:
            ret["masters"][master] = _sync_one_root_set(
                section, master, local, summary[master], nonce, test, timeout
            )
    return _finish(ret, any(r.get("result") is False for r in ret["masters"].values()))


def _malformed_manifest(master):
    return (
        f"manifest of {master}: its answer lacks fields this runner needs; run "
        f"'salt-run saltutil.sync_all' and 'salt <its control minion> saltutil.sync_all' so "
        "both ends run the same formula version"
    )


def _sync_one_root_set(section, master, local, answer, nonce, test, timeout):
    try:
        files, modes, partial = _opened_manifest(section, master, answer, nonce)
        pairs, members = multimaster_roots.sync_plan(local, files, modes, partial)
    except (SaltInvocationError, multimaster_seal.SealError) as exc:
        return {"result": False, "error": f"manifest of {master}: {exc}"}
    except (KeyError, IndexError, TypeError):
        return {"result": False, "error": _malformed_manifest(master)}
    report = multimaster_roots.plan_report(pairs, local, SHOWN)
    if test:
        return {"result": None, "planned": report}
    _progress(f"{master}: {report['counts']} ({report['bytes']} bytes)")
    plan = _deliver_roots(section, master, pairs, members, answer.get("binding"))
    done, errors = _call(section, [master], "apply_roots", {"plan": plan}, timeout)
    if master in errors:
        return {"result": False, "error": errors[master], "planned": report}
    applied = done[master]
    failed = applied.get("failed") or []
    _progress(f"{master}: {applied.get('bytes')} bytes moved, {len(failed)} failed")
    return {
        "result": not failed,
        "changes": report,
        "moved_bytes": applied.get("bytes"),
        "via": applied.get("via"),
        "failed": failed,
    }


# --- status ----------------------------------------------------------------------------------


def _report_check(answer):
    answer["keys"] = multimaster_keys.check_inventory_return(answer["keys"], "digests")
    pub = answer["master_key"].get("pub")
    answer["master_key"]["fp"] = multimaster_keys.fingerprint(pub) if pub else None
    if not isinstance(answer.get("answering"), list):
        raise ValueError("answering is not a list")
    multimaster_roots.git_check(answer.get("git"))
    return multimaster_roots.roots_check(answer)


def _root_digests(report):
    """
    ``{(kind, env, position): (path, digest)}`` of one master's report.
    """
    return {
        (kind, env, index): (root["path"], root["digest"])
        for kind, envs in report["roots"].items()
        for env, rs in envs.items()
        for index, root in enumerate(rs)
    }


def _roots_status(section, reports, timeout):
    """
    ``(part, equal)``: each root's digest per master (the roots a master serves from disk,
    paired by kind, environment and position) and, where they differ, which paths differ from
    the first reachable master in order (the primary when it answers); the commits every master
    serves per git remote.
    """
    reachable = [m for m in _ids(section) if m in reports]
    digests = {m: _root_digests(reports[m]) for m in reachable}
    slots = sorted(set().union(*(d.keys() for d in digests.values())), key=str)
    part = {"roots": {}}
    differing = []
    for slot in slots:
        seen = {m: digests[m].get(slot) for m in reachable}
        kind, env, index = slot
        part["roots"].setdefault(kind, {}).setdefault(env, {})[index] = {
            m: (f"{v[1][:16]} {v[0]}" if v else None) for m, v in seen.items()
        }
        if len({v[1] if v else None for v in seen.values()}) > 1:
            differing.append(slot)
    part["roots_equal"] = not differing
    if differing:
        part["roots_differ"] = _roots_paths_differ(section, reachable, differing, timeout)
    served = {m: reports[m]["git"] for m in reachable}
    remotes = {(role, url) for git in served.values() for role, rs in git.items() for url in rs}
    equal = True
    if remotes:
        part["git"] = {}
        for role, url in sorted(remotes):
            commits = {m: served[m].get(role, {}).get(url) for m in reachable}
            same = len({salt.utils.json.dumps(c, sort_keys=True) for c in commits.values()}) == 1
            equal = equal and same
            part["git"][f"{role} {url}"] = (
                "same commits"
                if same
                else {
                    m: ({b: sha[:12] for b, sha in c.items()} if c else None)
                    for m, c in commits.items()
                }
            )
        part["git_equal"] = equal
    return part, not differing and equal


def _roots_paths_differ(section, reachable, slots, timeout):
    """
    Per differing root, per master: the paths missing, changed, re-moded or extra and the
    directories of another mode (how many of each for ``pillar_roots``) compared with the first
    reachable master (manifests sealed to this master, as ``sync_roots`` reads them).
    """
    nonce = os.urandom(32).hex()
    kinds = sorted({kind for kind, _, _ in slots})
    answers, errors = _call(
        section,
        reachable,
        "roots_manifest",
        {"kinds": kinds, "full": True, "nonce": nonce},
        timeout,
        multimaster_roots.roots_check,
    )
    opened = {}
    for master, answer in answers.items():
        try:
            # No directory digests were sent: whole manifests.
            opened[master] = _opened_manifest(section, master, answer, nonce)[:2]
        except (SaltInvocationError, multimaster_seal.SealError) as exc:
            errors[master] = f"manifest of {master}: {exc}"
        except (KeyError, IndexError, TypeError):
            errors[master] = _malformed_manifest(master)
    reference = reachable[0]
    out = {}
    for kind, env, index in slots:
        name = f"{kind} {env} {index}"
        out[name] = {}
        for master in reachable[1:]:
            if master in errors or reference in errors:
                out[name][master] = errors.get(master) or errors[reference]
                continue
            try:
                source = [part[kind][env][index] for part in opened[reference]]
                target = [part[kind][env][index] for part in opened[master]]
            except (KeyError, IndexError):
                out[name][master] = f"{master} has no such root"
                continue
            out[name][master] = multimaster_roots.differences(
                *source, *target, shown=SHOWN, named=kind != "pillar_roots"
            )
    return out


def _keys_differ(section, timeout):
    inventories = _inventories(section, timeout)["inventories"]
    differing = {}
    ids = set().union(*(inv.keys() for inv in inventories.values()))
    for minion_id in ids:
        seen = {m: inventories[m].get(minion_id) for m in inventories}
        if len({tuple(e) if e else None for e in seen.values()}) > 1:
            differing[minion_id] = {m: (e.state if e else None) for m, e in seen.items()}
    return dict(sorted(differing.items())[:SHOWN])


def share_peer_keys(masters=None, test=False, timeout=60):
    """
    Mode cluster: give every master (or ``masters``) the public keys of its peers that it lacks,
    from this master's ``cluster_pki_dir/peers/``. Salt 3008.3 hands a joining master only the
    key of the peer it joined through; without the others it cannot exchange AES keys with them,
    and its jobs reach no minion served by them. A key that differs from one a master holds is
    reported as a conflict and never replaced. Public keys only: they travel in the publish,
    signed with the cluster key and bound to a challenge the receiving control minion issued.

    masters
        Master ids (a list or comma-separated); default all.

    test
        Report what is missing, change nothing.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.share_peer_keys
        salt-run multimaster.share_peer_keys masters=10.0.3.64 test=True
    """
    return multimaster_cluster.share_peer_keys(_run(), masters=masters, test=test, timeout=timeout)


def share_cluster_aes(masters=None, test=False, timeout=60):
    """
    Mode cluster with an isolated filesystem: give every other master (or ``masters``) this
    master's cluster AES key (``cluster_pki_dir/.aes``) when it is newer than theirs, and make
    each running salt-master re-read it (no restart). Salt 3008.3 makes a new key on one master
    (a ``salt-key -d``/``-r`` there, or every ``publish_session`` seconds) and tells its peers
    only to re-read their own file: without this, a minion that signed in to one master cannot
    read what another publishes. Newer means the later rotation (ties: the greater digest), so
    masters that rotate at once converge on one key. The cluster AES key reactor runs this on
    the master that rotated (``cluster_aes_rotated``).

    The key goes sealed to each control minion's key, signed with the cluster key and bound to
    a challenge that control minion issued; it is never returned or logged, only its digest's
    agreement is reported.

    masters
        Master ids (a list or comma-separated); default all (this one is skipped).

    test
        Report which masters hold another key, change nothing.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.share_cluster_aes
        salt-run multimaster.share_cluster_aes test=True
    """
    return multimaster_cluster.share_cluster_aes(
        _run(), masters=masters, test=test, timeout=timeout, recipient_problem=_recipient_problem
    )


def cluster_aes_rotated(timeout=60):
    """
    What the cluster AES key reactor (``multimaster/reactor/cluster_aes.sls``) runs when this
    master made a new cluster AES key (Salt's ``rotate_cluster_aes_key`` event): hand it to the
    peers (``share_cluster_aes``). Any minion can fire that tag, so the event is only a hint:
    what is shared is the key this master holds, once per key within ``AES_REPEAT_WINDOW``
    seconds, and a peer installs it only when it is newer than its own.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.cluster_aes_rotated
    """
    return multimaster_cluster.cluster_aes_rotated(
        _run(), timeout=timeout, recipient_problem=_recipient_problem
    )


def cluster_ready(timeout=120, interval=1):
    """
    Mode cluster: propose a no-op Raft entry (``cluster.route_clear data_type=multimaster``),
    then every 5 s until this master is ready to serve (Salt's readiness sentinel
    ``<cachedir>/health/ready``, written since it started: its Raft has applied the entry naming
    it a voter). A Raft leader elected after a restart commits nothing of its own otherwise, and
    the restarted masters never open their request gate. Run it on any master after restarting
    masters of a cluster; ``wait_masters`` (what the orchestrations run after restarting
    masters) proposes the same entry while masters are not settled.

    timeout
        Seconds to wait in all.

    interval
        Seconds between looks at the sentinel.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.cluster_ready
    """
    return multimaster_cluster.cluster_ready(
        _run(), timeout=timeout, interval=interval, fire=_fire_on_own_bus
    )


def _job_cache_status(reports, reachable):
    """
    Each master's job cache as its control minion found it (returner, database, answering,
    what of the schema is missing), and whether all is well: either no master uses a shared
    database, or every master uses the same one and it answers with its whole schema.
    """
    caches = {m: reports[m]["job_cache"] for m in reachable if "job_cache" in reports[m]}
    if not any(cache["shared"] for cache in caches.values()):
        return {}, True
    ok = len({cache.get("database") for cache in caches.values()}) == 1 and all(
        cache.get("reachable") and not cache.get("missing") for cache in caches.values()
    )
    return {"job_cache": caches, "job_cache_ok": ok}, ok


def _cluster_status(section):
    """
    Mode cluster: Salt's Raft membership as this master sees it (``cluster.members``) and the
    ports up (``multimaster_cluster.status_report``).
    """
    try:
        members = salt.runner.RunnerClient(__opts__).cmd("cluster.members", print_event=False)
    except Exception as exc:  # pylint: disable=broad-except
        log.warning("multimaster: cluster.members failed: %s", exc)
        members = {"error": "cluster.members failed on this master (its log has why)"}
    return _finish(*multimaster_cluster.status_report(section, members))


def status(masters=None, timeout=30, ping_timeout=5, test=False):
    """
    One report: which masters answer, whether they store and serve the same master key, whether
    their minion-key sets are equal (digests, and the differing ids), problems of their key
    stores, whether their roots are equal (a digest per master per root, and the differing
    paths), which commits they serve per git remote, whether the job cache database they share
    answers (``job_cache``), and which masters each minion answers.
    In mode cluster: the Raft members as this master sees them (voters, learners, leader,
    configured masters missing), the balancer's frontends and every master's ports up.
    Read-only: ``test=True`` (accepted like every runner here) changes nothing either.

    masters
        Refused, as for ``sync_keys``.

    timeout
        Seconds to wait for each control minion.

    ping_timeout
        Seconds each master's ``test.ping`` waits for minions.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.status
    """
    try:
        section = _configured(masters, "status")
    except SaltInvocationError as exc:
        return _refused(exc)
    if section["mode"] == "cluster":
        return _cluster_status(section)
    order = _ids(section)
    signing = _signing(section)
    ret = {"masters": {}}
    # One round trip: each control minion reports digests, its master's key and who answers.
    reports, errors = _call(
        section,
        order,
        "master_report",
        {"signing": signing, "ping_timeout": ping_timeout},
        timeout + ping_timeout,
        _report_check,
    )
    for master in order:
        if master in errors:
            ret["masters"][master] = {"reachable": False, "error": errors[master]}
            continue
        report = reports[master]
        ret["masters"][master] = {
            "reachable": True,
            "signing_key" if signing else "master_key": report["master_key"]["fp"],
            "salt_finger": report["master_key"].get("salt_finger"),
            "keys": report["keys"]["count"],
            "keys_digest": report["keys"]["digest"][:16],
        }
        if report.get("store_problems"):
            ret["masters"][master]["store_problems"] = report["store_problems"][:SHOWN]
    reachable = [m for m in order if m in reports]
    fps = {reports[m]["master_key"]["fp"] for m in reachable}
    # Signing mode: each master keeps its own key; what must be shared is the signing pair.
    ret["same_signing_key" if signing else "same_master_key"] = len(fps) == 1
    if signing:
        configured = multimaster_keys.fingerprint(section["signing"].get("public_key", ""))
        ret["signing_public_key_matches"] = fps == {configured}
    ret["keys_equal"] = len({reports[m]["keys"]["digest"] for m in reachable}) <= 1
    if not ret["keys_equal"]:
        ret["keys_differ"] = _keys_differ(section, timeout)
    matrix = {}
    for master in order:
        for minion_id in reports.get(master, {}).get("answering", []):
            matrix.setdefault(minion_id, {m: False for m in order})[master] = True
    ret["minions"] = dict(sorted(matrix.items()))
    roots, roots_equal = _roots_status(section, reports, timeout) if reachable else ({}, True)
    ret.update(roots)
    job_cache, job_cache_ok = _job_cache_status(reports, reachable)
    ret.update(job_cache)
    failed = bool(errors) or not ret["keys_equal"] or len(fps) != 1 or not roots_equal
    failed = failed or not job_cache_ok
    failed = failed or ret.get("signing_public_key_matches") is False
    return _finish(ret, failed)
