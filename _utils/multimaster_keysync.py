"""
The key plane's runner side: read every master's inventory, plan, guard, apply in order.

A run compares the masters' digests first and fetches entries only for the buckets that differ
(or for the ids asked about); the plan comes from ``multimaster_keys``, the guard against a mass
revocation is checked before anything is sent, and each master then receives its actions, signed
and bound to the challenge it issued, in the configured order (the primary first).

Every function takes a ``Run`` (``multimaster_control``); nothing here reads loader dunders.
"""

import multimaster_control
import multimaster_ids
import multimaster_keys
import multimaster_keystore
import multimaster_seal
from salt.exceptions import SaltInvocationError

# What a report lists of a plan, and which of those fail the run.
_REPORTED = ("conflicts", "pending", "drift", "denied", "spoofed", "invalid", "invalid_keys")
_FAILING = ("conflicts", "invalid", "invalid_keys")


# --- inventories -----------------------------------------------------------------------------


def _inventory_check(kind):
    def check(answer):
        checked = multimaster_keys.check_inventory_return(answer, kind)
        checked["binding"] = answer.get("binding")
        return checked

    return check


def inventories(run, section, timeout, ids=None):
    """
    Entries and pubs of every master, fetched only where digests differ (or for ``ids``).
    Returns ``{"inventories", "pubs", "bindings", "errors", "repair", "totals", "keyless"}``
    (``totals``: each master's key count, when digests were read; ``keyless``: the masters whose
    entries came without their keys).
    """
    masters = multimaster_control.ids(section)
    found = {"bindings": {}, "errors": {}, "repair": [], "totals": None, "keyless": []}
    if ids is None:
        digests = _digests(run, section, masters, timeout, found)
        if len({d["digest"] for d in digests.values()}) <= 1:
            return dict(found, inventories={m: {} for m in digests}, pubs={})
        differing = _differing_buckets(digests)
        # Peers send entries without keys: the keys a sync copies are nearly always this
        # master's, and a key only a peer holds is fetched afterwards (``_missing_pubs``).
        kwarg = {"buckets": differing, "with_pubs": False}
        full = _unasked(run, section, digests, differing)
        masters = [m for m in digests if m not in full]
    else:
        kwarg = {"ids": ids, "with_pubs": True}
        full = {}
    asked, errors = (
        multimaster_control.call(
            run, section, masters, "key_inventory", kwarg, timeout, _inventory_check("entries")
        )
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


def _digests(run, section, masters, timeout, found):
    """
    Every master's digests, keyed by master id; their challenges, the masters that asked for a
    repair, key counts and errors go into ``found``.
    """
    digests, found["errors"] = multimaster_control.call(
        run, section, masters, "key_inventory", {}, timeout, _inventory_check("digests")
    )
    found["bindings"] = {m: d["binding"] for m, d in digests.items()}
    found["repair"] = [m for m, d in digests.items() if d["repair"]]
    found["totals"] = {m: d["count"] for m, d in digests.items()}
    return digests


def _differing_buckets(digests):
    buckets = set()
    for digest in digests.values():
        buckets.update(digest["buckets"])
    return [b for b in sorted(buckets) if len({d["buckets"].get(b) for d in digests.values()}) > 1]


def _unasked(run, section, digests, differing):
    """
    The inventories known without asking a control minion, keyed by master id.
    """
    # This master's own keys are read here, not returned by its control minion (at 10,000 keys
    # that return is megabytes through the job return path); a master with no entry in the
    # differing buckets (a new one) has nothing to return. Both keep the challenge the digest
    # round issued.
    own = multimaster_control.this_master(run, section)
    own = own if own in digests else None
    full = {}
    for master, digest in digests.items():
        if master == own:
            full[master] = _own_inventory(run, differing)
        elif not set(differing) & set(digest["buckets"]):
            full[master] = {"entries": {}, "pubs": {}}
    return full


def _missing_pubs(run, section, plan, found, timeout):
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
    asked, errors = multimaster_control.call(
        run,
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


def _own_inventory(run, buckets):
    """
    The entries and public keys of this master's own store in ``buckets``, read in this process
    (the same store its control minion would read), checked as a peer's answer is.
    """
    chosen = set(buckets)
    entries, pubs = multimaster_keystore.inventory(
        run.opts,
        with_pubs=True,
        ids=lambda minion_id: multimaster_keys.bucket_of(minion_id) in chosen,
    )
    answer = {"alive": True, "entries": entries, "pubs": pubs}
    try:
        return multimaster_keys.check_inventory_return(answer, "entries")
    except multimaster_keys.ReturnError as exc:
        store = multimaster_keystore.store_dir(run.opts)
        raise multimaster_control.Refused(f"this master's key store {store}: {exc}") from None


# --- applying --------------------------------------------------------------------------------


def _apply_one(run, section, master, actions, binding, timeout):
    """
    Send one master its actions, signed and bound to the challenge it issued.
    """
    instruction = {"actions": actions}
    try:
        order = multimaster_seal.order(
            instruction,
            "key_actions",
            multimaster_control.by_id(section)[master]["minion_id"],
            multimaster_control.signer_key(run),
            multimaster_control.bound(
                multimaster_control.binding({"binding": binding}, master, section)
            ),
        )
    except ValueError as exc:
        return {"result": False, "error": str(exc)}
    transfer = multimaster_control.staged(run, section, master, instruction)
    done, error = multimaster_control.call_one(
        run, section, master, "apply_key_actions", {"transfer": transfer, "order": order}, timeout
    )
    if error is not None:
        return {"result": False, "error": error}
    return {
        "result": not done.get("skipped_count"),
        "changes": done.get("changes"),
        "ids": done.get("ids"),
        "skipped": done.get("skipped"),
        "repaired": done.get("repaired"),
        "aes_rotated": done.get("rotated"),
    }


def _apply(run, section, plan, repair, bindings, timeout):
    """
    Apply each master's actions, in the order of ``masters``. Returns per-master reports.
    """
    report = {}
    for master in multimaster_control.ids(section):
        actions = plan["actions"].get(master, [])
        if not actions and master not in repair:
            continue
        run.progress(f"{master}: applying {len(actions)} key action(s)")
        report[master] = _apply_one(run, section, master, actions, bindings.get(master), timeout)
    return report


# --- reconciling -----------------------------------------------------------------------------


def _summary(plan):
    summary = {key: plan[key] for key in _REPORTED if plan.get(key)}
    if plan.get("warnings"):
        summary["warnings"] = plan["warnings"]
    return summary


def _planned(actions):
    shown = [{k: a[k] for k in ("id", "op", "fp")} for a in actions[: multimaster_control.SHOWN]]
    if len(actions) > multimaster_control.SHOWN:
        shown.append(f"... and {len(actions) - multimaster_control.SHOWN} more")
    return shown


def reconcile(run, section, plan_fn, timeout, test, ids=None, force=False):
    """
    Inventory, plan, guard, then apply (unless ``test``). Returns ``(report, failed)``.
    """
    try:
        found = inventories(run, section, timeout, ids)
    except SaltInvocationError as exc:
        return {"comment": f"Refused, nothing changed: {exc}"}, True
    errors = found["errors"]
    plan = plan_fn(found["inventories"])
    _missing_pubs(run, section, plan, found, timeout)
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
    ret["masters"].update(_apply(run, section, plan, found["repair"], found["bindings"], timeout))
    failed = bool(errors) or any(not r.get("result", True) for r in ret["masters"].values())
    return ret, failed or any(plan.get(key) for key in _FAILING)


# --- the runner's functions ------------------------------------------------------------------


def sync_keys(run, minion=None, prune=False, test=False, force=False, masters=None, timeout=60):
    """
    ``multimaster.sync_keys``: reconcile minion key states across all masters.
    """
    try:
        section = multimaster_control.acting(
            run, multimaster_control.configured(run, masters, "sync_keys"), "sync_keys"
        )
        ids = None if minion is None else [multimaster_ids.check_id(minion, "minion")]
        multimaster_control.await_restarts(run, section)
    except SaltInvocationError as exc:
        return multimaster_control.refused(run, exc)
    order = multimaster_control.ids(section)
    ret, failed = reconcile(
        run,
        section,
        lambda inv: multimaster_keys.plan(inv, order, prune=prune),
        timeout,
        test,
        ids,
        force,
    )
    if not test and not failed and not any(r.get("changes") for r in ret["masters"].values()):
        ret["comment"] = "All masters already hold the same keys"
    return multimaster_control.finish(run, ret, failed)


def one_id(
    run,
    op,
    minion_id,
    fingerprint,
    test,
    masters,
    timeout,
    force=False,
    settle=True,
    **plan_options,
):
    """
    ``multimaster.accept``, ``reject`` or ``delete`` (``op``) of one minion id on every master.
    """
    try:
        section = multimaster_control.addressable(
            multimaster_control.configured(run, masters, op), op
        )
        multimaster_ids.check_id(minion_id, "minion id")
        if settle:
            # An operator's command waits out restarts and checks pillar's epoch; a reactor
            # never waits (peers still refuse its orders by epoch: multimaster_seal).
            multimaster_control.fence_by_pillar(run, section)
            multimaster_control.await_restarts(run, section)
    except SaltInvocationError as exc:
        return multimaster_control.refused(run, exc)
    refused = {}

    def plan_fn(held):
        plan = multimaster_keys.one_id_plan(
            op, minion_id, fingerprint, held, multimaster_control.ids(section), **plan_options
        )
        refused["reason"] = plan.pop("refused")
        if refused["reason"]:
            plan["actions"] = {m: [] for m in plan["actions"]}
        return plan

    ret, failed = reconcile(run, section, plan_fn, timeout, test, ids=[minion_id], force=force)
    if refused.get("reason"):
        ret["comment"] = f"Refused, nothing changed: {refused['reason']}"
        failed = True
    return multimaster_control.finish(run, ret, failed)
