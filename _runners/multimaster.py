"""
Operate a set of Salt masters as one: share the master key, keep minion keys identical on every
master, and report whether the set is consistent and alive.

The masters are read from this master's own config (``multimaster:`` in ``master.d``, written by
the ``multimaster.master`` state); ``masters=`` overrides it. Each master is reached through its
control minion (the salt-minion on that host), targeted by exact id list. Work is applied master
by master in the order of ``masters`` (the first is the primary). Every function takes
``test=True`` (return the plan, change nothing) and returns ``retcode: 1`` on any failure.
"""

import logging
import time

import salt.cache
import salt.client
from salt.exceptions import SaltInvocationError

try:
    import multimaster_ids
    import multimaster_keys
    import multimaster_keystore
    import multimaster_seal
    import multimaster_settings

    HAS_UTILS = True
except ImportError:
    HAS_UTILS = False

log = logging.getLogger(__name__)

__virtualname__ = "multimaster"

# Listed ids in a report are capped; counts are always complete.
SHOWN = 50


def __virtual__():
    if not HAS_UTILS:
        return (False, "multimaster: utils missing; run salt-run saltutil.sync_all")
    return __virtualname__


# --- plumbing --------------------------------------------------------------------------------


def _section(masters=None):
    section = dict(__opts__.get("multimaster") or {})
    if masters is not None:
        section["masters"] = masters
    if not section.get("masters"):
        raise SaltInvocationError(
            "multimaster:masters is not in this master's config: apply the multimaster.master "
            "state to this master's control minion, or pass masters=[...]"
        )
    return multimaster_settings.check_section(section)


def _progress(message):
    log.info("multimaster: %s", message)
    try:
        __jid_event__.fire_event({"message": message}, "progress")
    except (NameError, AttributeError):
        pass


def _finish(ret, failed):
    ret["retcode"] = 1 if failed else 0
    if failed:
        __context__["retcode"] = 1
    return ret


def _refused(exc):
    # Salt's runner client turns a SaltInvocationError (a TypeError) into a "Passed invalid
    # arguments" string and salt-run exits 0: refuse bad input with a report and retcode 1.
    return _finish({"comment": f"Refused, nothing changed: {exc}"}, True)


def _config_dirs(section):
    return {m["minion_id"]: m.get("config_dir") for m in section["masters"]}


def _call(section, masters, fun, kwarg, timeout):
    """
    Run ``fun`` on the control minions of ``masters``; ``(answers, errors)`` keyed by master id.
    """
    by_minion = {m["minion_id"]: m["id"] for m in section["masters"] if m["id"] in masters}
    start = time.monotonic()
    with salt.client.get_local_client(__opts__["conf_file"]) as client:
        returns = client.cmd(
            list(by_minion),
            fun,
            kwarg=kwarg,
            tgt_type="list",
            timeout=timeout,
            full_return=True,
        )
    log.info("multimaster: %s on %s: %.2fs", fun, sorted(masters), time.monotonic() - start)
    answers, errors = {}, {}
    for minion_id, master_id in by_minion.items():
        ret = returns.get(minion_id)
        if not isinstance(ret, dict) or "ret" not in ret:
            errors[master_id] = f"control minion {minion_id} did not answer"
        elif ret.get("retcode", 0) != 0 or isinstance(ret["ret"], str):
            errors[master_id] = str(ret["ret"])
        elif isinstance(ret["ret"], dict) and ret["ret"].get("alive") is False:
            errors[master_id] = f"salt-master on {master_id} is not running; left untouched"
        else:
            answers[master_id] = ret["ret"]
    return answers, errors


def _ids(section):
    return [m["id"] for m in section["masters"]]


# --- minion keys -----------------------------------------------------------------------------


def _inventories(section, timeout, ids=None):
    """
    Entries and pubs of every master, fetched only where digests differ (or for ``ids``).
    Returns ``(inventories, pubs, errors, repair)``.
    """
    config_dir = _config_dirs(section)
    masters = _ids(section)
    repair = []
    if ids is None:
        digests, errors = _call(
            section, masters, "multimaster.key_inventory", {"config_dir": config_dir}, timeout
        )
        repair = [m for m, d in digests.items() if d["repair"]]
        if len({d["digest"] for d in digests.values()}) <= 1:
            return {m: {} for m in digests}, {}, errors, repair
        buckets = set()
        for digest in digests.values():
            buckets.update(digest["buckets"])
        differing = [
            b for b in sorted(buckets) if len({d["buckets"].get(b) for d in digests.values()}) > 1
        ]
        kwarg = {"config_dir": config_dir, "buckets": differing, "with_pubs": True}
        masters = list(digests)
    else:
        kwarg = {"config_dir": config_dir, "ids": ids, "with_pubs": True}
        errors = {}
    full, more_errors = _call(section, masters, "multimaster.key_inventory", kwarg, timeout)
    errors.update(more_errors)
    inventories = {m: full[m]["entries"] for m in full}
    pubs = {m: full[m]["pubs"] for m in full}
    return inventories, pubs, errors, repair


def _attach_pubs(plan, pubs):
    """
    Give every action the canonical PEM it needs; an id whose key is not canonical is refused
    everywhere (``plan["invalid_keys"]``).
    """
    invalid = {}
    for master, actions in plan["actions"].items():
        kept = []
        for action in actions:
            if action["op"] == "delete":
                kept.append(action)
                continue
            kind = "denied" if action["op"] == "deny" else "key"
            pem = next(
                (
                    p[action["id"]][kind]
                    for p in pubs.values()
                    if kind in p.get(action["id"], {})
                    and multimaster_keys.fingerprint(p[action["id"]][kind]) == action["fp"]
                ),
                None,
            )
            try:
                action["pub"] = multimaster_keys.canonical(pem, f"key of {action['id']!r}")
            except SaltInvocationError as exc:
                invalid[action["id"]] = str(exc)
                continue
            kept.append(action)
        plan["actions"][master] = [a for a in kept if a["id"] not in invalid]
    plan["invalid_keys"] = invalid
    return plan


def _apply(section, plan, repair, timeout):
    """
    Apply each master's actions, in the order of ``masters``. Returns per-master reports.
    """
    config_dir = _config_dirs(section)
    report = {}
    for master in _ids(section):
        actions = plan["actions"].get(master, [])
        if not actions and master not in repair:
            continue
        _progress(f"{master}: applying {len(actions)} key action(s)")
        answers, errors = _call(
            section,
            [master],
            "multimaster.apply_key_actions",
            {"actions": actions, "config_dir": config_dir},
            timeout,
        )
        if master in errors:
            report[master] = {"result": False, "error": errors[master]}
            continue
        done = answers[master]
        report[master] = {
            "result": not done["skipped_count"],
            "changes": done["changes"],
            "ids": done["ids"],
            "skipped": done["skipped"],
            "repaired": done["repaired"],
            "aes_rotated": done["rotated"],
        }
    return report


def _summary(plan):
    return {
        key: plan[key]
        for key in ("conflicts", "pending", "drift", "denied", "invalid", "invalid_keys")
        if plan.get(key)
    }


def _reconcile(section, plan_fn, timeout, test, ids=None):
    inventories, pubs, errors, repair = _inventories(section, timeout, ids)
    plan = _attach_pubs(plan_fn(inventories), pubs)
    ret = {"masters": {}, **_summary(plan)}
    for master, error in errors.items():
        ret["masters"][master] = {"result": False, "error": error}
    if test:
        for master, actions in plan["actions"].items():
            ret["masters"].setdefault(master, {"result": None})["planned"] = [
                {k: a[k] for k in ("id", "op", "fp")} for a in actions[:SHOWN]
            ] + ([f"... and {len(actions) - SHOWN} more"] if len(actions) > SHOWN else [])
        return ret, bool(errors)
    ret["masters"].update(_apply(section, plan, repair, timeout))
    failed = bool(errors) or any(not r.get("result", True) for r in ret["masters"].values())
    failed = failed or bool(plan["conflicts"] or plan["invalid"] or plan["invalid_keys"])
    return ret, failed


def sync_keys(minion=None, prune=False, test=False, masters=None, timeout=60):
    """
    Reconcile minion key states across all masters. The primary's accepted keys become accepted
    everywhere; rejected or denied anywhere wins everywhere; pending keys are listed, never
    accepted; keys accepted only on peers are drift (removed with ``prune=True``); one id with two
    different keys is a conflict: both fingerprints are reported and nothing changes for it.
    Compares digests first, so a run with nothing to do moves a few KB.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.sync_keys
        salt-run multimaster.sync_keys minion=web1 test=True
        salt-run multimaster.sync_keys prune=True
    """
    try:
        section = _section(masters)
        ids = None
        if minion is not None:
            ids = [multimaster_ids.check_id(minion, "minion")]
    except SaltInvocationError as exc:
        return _refused(exc)
    order = _ids(section)
    ret, failed = _reconcile(
        section,
        lambda inv: multimaster_keys.plan(inv, order, prune=prune),
        timeout,
        test,
        ids,
    )
    if not test and not failed and not any(r.get("changes") for r in ret["masters"].values()):
        ret["comment"] = "All masters already hold the same keys"
    return _finish(ret, failed)


def _one_id_plan(op, minion_id, fingerprint, order):
    def plan(inventories):
        held = {m: inv.get(minion_id) for m, inv in inventories.items()}
        keys = {m: e[1] for m, e in held.items() if e and e[0] != "denied"}
        result = {
            "actions": {m: [] for m in inventories},
            "conflicts": {},
            "invalid": [],
            "refused": None,
        }
        fps = set(keys.values())
        if fingerprint and fps - {fingerprint}:
            result["refused"] = f"{minion_id}: held keys {sorted(fps)} do not match {fingerprint}"
            return result
        if op == "delete":
            for master, entry in held.items():
                if entry:
                    _action(result, master, minion_id, "delete", None, entry)
            return result
        if len(fps) > 1:
            result["conflicts"][minion_id] = keys
            return result
        fp = next(iter(fps), None)
        if fp is None:
            result["refused"] = f"{minion_id}: no key for this id on any reachable master"
            return result
        if op == "accept":
            bad = {m: e[0] for m, e in held.items() if e and (e[0] in ("rejected", "denied"))}
            bad.update({m: "denied" for m, e in held.items() if e and len(e) > 2})
            if bad:
                result["refused"] = f"{minion_id}: rejected or denied on {bad}; deny wins"
                return result
        state = "accepted" if op == "accept" else "rejected"
        for master, entry in held.items():
            if not entry or entry[0] != state:
                _action(result, master, minion_id, op, fp, entry)
        return result

    return plan


def _action(result, master, minion_id, op, fp, entry):
    result["actions"][master].append({"id": minion_id, "op": op, "fp": fp, "expect": entry})


def _one_id(op, minion_id, fingerprint, test, masters, timeout):
    try:
        section = _section(masters)
        multimaster_ids.check_id(minion_id, "minion id")
    except SaltInvocationError as exc:
        return _refused(exc)
    refused = {}

    def plan_fn(inventories):
        plan = _one_id_plan(op, minion_id, fingerprint, _ids(section))(inventories)
        refused["reason"] = plan.pop("refused")
        if refused["reason"]:
            plan["actions"] = {m: [] for m in plan["actions"]}
        return plan

    ret, failed = _reconcile(section, plan_fn, timeout, test, ids=[minion_id])
    if refused["reason"]:
        ret["comment"] = f"Refused, nothing changed: {refused['reason']}"
        failed = True
    return _finish(ret, failed)


def accept(minion, fingerprint=None, test=False, masters=None, timeout=60):
    """
    Accept one minion key on every master, in order. Works when the key is pending on only one
    master (a failover minion that reached just that one). Refused when the id is rejected or
    denied anywhere, when masters hold different keys for it, or when ``fingerprint`` (ours:
    SHA-256 of the DER public key) is given and does not match.

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

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.reject web1
    """
    return _one_id("reject", minion, fingerprint, test, masters, timeout)


def delete(minion, fingerprint=None, test=False, masters=None, timeout=60):
    """
    Delete one minion's keys (every state) on every master, rotating the AES key of every master
    that had it accepted.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.delete web1
    """
    return _one_id("delete", minion, fingerprint, test, masters, timeout)


# --- master key ------------------------------------------------------------------------------


def _signing(section):
    return section["mode"] == "failover" and section.get("signing", {}).get("enabled", False)


def _local_master_key(signing):
    name_pem, _ = multimaster_keystore.master_key_files(__opts__, signing)
    cache = salt.cache.Cache(__opts__, driver=__opts__["keys.cache_driver"])
    return cache.fetch("master_keys", name_pem)


def _recipient_pub(minion_id):
    cache = salt.cache.Cache(__opts__, driver=__opts__["keys.cache_driver"])
    entry = cache.fetch("keys", minion_id)
    if not entry or entry.get("state") != "accepted":
        return None
    return entry["pub"]


def sync_master_key(test=False, masters=None, timeout=180):
    """
    Give every peer master the primary's master key pair (mode ``hot``, or ``failover`` with a
    shared key) or signing pair (``failover`` with ``signing:enabled``). The pair travels sealed to
    the peer's control minion and signed by this master; the peer's master is stopped for the
    swap, restarted the way it runs and waited for. Then every master's served key is checked by
    a real sign-in. Must run on the primary, or on a master that already shares its key.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.sync_master_key
        salt-run multimaster.sync_master_key test=True
    """
    try:
        section = _section(masters)
    except SaltInvocationError as exc:
        return _refused(exc)
    signing = _signing(section)
    order = _ids(section)
    primary = order[0]
    port = section["ports"]["ret"]
    config_dir = _config_dirs(section)
    by_id = {m["id"]: m for m in section["masters"]}
    ret = {"masters": {}, "signing": signing}

    info, errors = _call(
        section,
        order,
        "multimaster.master_key_info",
        {"config_dir": config_dir, "signing": signing},
        timeout=60,
    )
    for master, error in errors.items():
        ret["masters"][master] = {"result": False, "error": error}
    if primary not in info or not info[primary]["fp"]:
        ret["comment"] = f"primary {primary} did not report its key; nothing changed"
        return _finish(ret, True)
    intended_pub = info[primary]["pub"]
    intended = info[primary]["fp"]
    ret["fingerprint"] = intended
    ret["salt_finger"] = info[primary]["salt_finger"]
    private = _local_master_key(signing)
    if not private or multimaster_keys.private_key_fingerprint(private) != intended:
        ret["comment"] = (
            f"this master does not hold the primary's key {intended}: run sync_master_key on "
            f"{primary}; nothing changed"
        )
        return _finish(ret, True)

    # Control minions must be accepted everywhere before a sign-in can verify a master.
    control = [m["minion_id"] for m in section["masters"]]
    if not test:
        _reconcile(section, lambda inv: multimaster_keys.plan(inv, order), 60, False, ids=control)

    for master in order[1:]:
        if master not in info:
            continue
        if info[master]["fp"] == intended:
            ret["masters"][master] = {"result": True, "changed": False, "fp": intended}
            continue
        entry = {"old": info[master]["fp"], "new": intended}
        if test:
            ret["masters"][master] = {
                "result": None,
                "planned": "install, restart, verify",
                **entry,
            }
            continue
        minion_id = by_id[master]["minion_id"]
        recipient = _recipient_pub(minion_id)
        if recipient is None:
            ret["masters"][master] = {
                "result": False,
                "error": f"control minion {minion_id} is not accepted on this master",
            }
            continue
        _progress(f"{master}: installing the shared key, restarting, verifying")
        envelope = multimaster_seal.seal(
            {"pem": private, "pub": intended_pub},
            "master_sign" if signing else "master_key",
            minion_id,
            recipient,
            _local_master_key(False),
        )
        answers, call_errors = _call(
            section,
            [master],
            "multimaster.install_master_key",
            {
                "envelope": envelope,
                "host": by_id[master]["host"],
                "port": port,
                "config_dir": config_dir,
                "signing": signing,
            },
            timeout,
        )
        del envelope
        if master in call_errors:
            ret["masters"][master] = {"result": False, "error": call_errors[master], **entry}
            continue
        done = answers[master]
        ret["masters"][master] = {
            "result": bool(done["served"]),
            "changed": done["changed"],
            "restarted": done["restarted"],
            "served": done["served"],
            "reason": done["reason"],
            **entry,
        }
    del private

    if not test:
        _verify_all(section, ret, intended_pub if not signing else None, signing, info, timeout)
    failed = any(r.get("result") is False for r in ret["masters"].values())
    return _finish(ret, failed)


def _verify_all(section, ret, shared_pub, signing, info, timeout):
    """
    Every master proves, by a sign-in from its own control minion, that it serves the intended
    key (the shared one, or in signing mode its own key signed by the shared signing pair).
    """
    port = section["ports"]["ret"]
    sign_pub = info[section["masters"][0]["id"]]["pub"] if signing else None
    for master in section["masters"]:
        report = ret["masters"].setdefault(master["id"], {"result": True})
        if report.get("result") is False:
            continue
        pub = shared_pub
        if signing:
            own, _ = _call(
                section,
                [master["id"]],
                "multimaster.master_key_info",
                {"config_dir": _config_dirs(section)},
                timeout=60,
            )
            pub = own.get(master["id"], {}).get("pub")
        answers, errors = _call(
            section,
            [master["id"]],
            "multimaster.verify_master_key",
            {"host": master["host"], "port": port, "pub": pub, "sign_pub": sign_pub},
            timeout,
        )
        verified = answers.get(master["id"], {})
        report["served"] = bool(verified.get("served"))
        if not report["served"]:
            report["result"] = False
            report["reason"] = verified.get("reason") or errors.get(master["id"])


# --- status ----------------------------------------------------------------------------------


def status(masters=None, timeout=30, ping_timeout=5, test=False):
    """
    One report: which masters answer, whether they store and serve the same master key, whether
    their minion-key sets are equal (digests, and the differing ids), and which masters each
    minion answers. Read-only: ``test=True`` (accepted like every runner here) changes nothing
    either.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.status
    """
    try:
        section = _section(masters)
    except SaltInvocationError as exc:
        return _refused(exc)
    order = _ids(section)
    config_dir = _config_dirs(section)
    signing = _signing(section)
    ret = {"masters": {}}
    # One round trip: each control minion reports digests, its master's key and who answers.
    reports, errors = _call(
        section,
        order,
        "multimaster.master_report",
        {"config_dir": config_dir, "signing": signing, "ping_timeout": ping_timeout},
        timeout + ping_timeout,
    )
    digests = {m: r["keys"] for m, r in reports.items()}
    keyinfo = {m: r["master_key"] for m, r in reports.items()}
    pings = {m: r["answering"] for m, r in reports.items()}
    for master in order:
        if master in errors:
            ret["masters"][master] = {"reachable": False, "error": errors[master]}
            continue
        ret["masters"][master] = {
            "reachable": True,
            "signing_key" if signing else "master_key": keyinfo.get(master, {}).get("fp"),
            "salt_finger": keyinfo.get(master, {}).get("salt_finger"),
            "keys": digests[master]["count"],
            "keys_digest": digests[master]["digest"][:16],
        }
    reachable = [m for m in order if m in digests]
    fps = {keyinfo.get(m, {}).get("fp") for m in reachable}
    # Signing mode: each master keeps its own key; what must be shared is the signing pair.
    ret["same_signing_key" if signing else "same_master_key"] = len(fps) == 1
    ret["keys_equal"] = len({digests[m]["digest"] for m in reachable}) <= 1
    if not ret["keys_equal"]:
        inventories, _, _, _ = _inventories(section, timeout)
        differing = {}
        ids = set().union(*(inv.keys() for inv in inventories.values()))
        for minion_id in ids:
            seen = {m: inventories[m].get(minion_id) for m in inventories}
            if len({tuple(e) if e else None for e in seen.values()}) > 1:
                differing[minion_id] = {m: (e[0] if e else None) for m, e in seen.items()}
        ret["keys_differ"] = dict(sorted(differing.items())[:SHOWN])
    matrix = {}
    for master in order:
        for minion_id in pings.get(master, []):
            matrix.setdefault(minion_id, {m: False for m in order})[master] = True
    ret["minions"] = dict(sorted(matrix.items()))
    failed = bool(errors) or not ret["keys_equal"] or len(fps) != 1
    return _finish(ret, failed)
