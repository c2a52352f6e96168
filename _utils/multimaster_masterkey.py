"""
The master-key plane: one master key pair (or signing pair) served by every master of a set.

The peer side is what a master's control minion answers (the master key or signing key this
master stores), installs (a key pair sealed to it) and checks (that a master serves a key, by a
real sign-in): plain values in, the control minion's opts, this master's entry and opts. The
runner side plans from what each master stores, refuses a recipient whose control minion is not
trusted alone everywhere, seals the primary's pair to each stale master's control minion and has
every master's served key proven by a sign-in from another master's control minion; it takes a
``multimaster_control.Run``. Nothing here reads loader dunders.
"""

import time

import multimaster_control
import multimaster_daemon
import multimaster_handshake
import multimaster_keys
import multimaster_keystore
import multimaster_keysync
import multimaster_masterkeyfiles
import multimaster_pillarcheck
import multimaster_seal
import multimaster_transport
from salt.exceptions import CommandExecutionError, SaltInvocationError

# --- peer side (run by a control minion) ---------------------------------------------------

# The largest sealed key pair accepted.
ENVELOPE_LIMIT = 1024 * 1024
# What a master that does not run reports instead of a sign-in: a new master stays stopped
# until add_master starts it, so that its first listen serves the set's key.
NOT_RUNNING = "salt-master is not running: it serves the stored key from its next start"


def master_key_info(minion_opts, master, mopts, signing=False):
    """
    The public master key (or signing key) ``master`` stores, its ``salt-key -F`` value and a
    fresh challenge for the runner's next envelope (``binding``).
    """
    pub = multimaster_masterkeyfiles.read_master_key(mopts, signing=signing)
    return {
        "name": multimaster_masterkeyfiles.master_key_files(mopts, signing)[1],
        "pub": pub,
        "own_pub": multimaster_masterkeyfiles.read_master_key(mopts) if signing else pub,
        "salt_finger": pub and multimaster_keys.salt_finger(pub),
        "binding": multimaster_seal.binding(minion_opts, master),
        "running": master_running(master, mopts),
    }


def master_running(master, mopts):
    """
    Whether ``master``'s salt-master runs (its verified pidfile names a live salt-master).
    """
    pid = multimaster_daemon.verified_pid(mopts["pidfile"], "salt-master", master["config_dir"])
    return pid is not None


def verify_served(minion_opts, host, port, pub, sign_pub=None, timeout=60):
    """
    ``(served, reason)``: does the master at ``host:port`` serve ``pub`` (signed with
    ``sign_pub``'s pair)? Retried each second until it does or ``timeout`` has passed.
    """
    deadline = time.monotonic() + timeout
    while True:
        ok, reason = multimaster_handshake.serves(minion_opts, host, port, pub, sign_pub, timeout=5)
        if ok or time.monotonic() > deadline:
            return ok, reason
        time.sleep(1)


def served_report(minion_opts, host, port, pub, sign_pub=None, timeout=60):
    """
    ``{"served", "reason"}`` of ``verify_served`` for ``port`` and ``timeout`` as the CLI may
    pass them (strings).
    """
    ok, reason = verify_served(minion_opts, host, int(port), pub, sign_pub, timeout=float(timeout))
    return {"served": ok, "reason": reason}


def served_args(mopts, pub, signing):
    """
    ``(pub, sign_pub)`` a sign-in must prove: the master's own key, and where the master signs
    (the signing pair delivered, or a master key of a set that signs) its signature too. A
    signing pair delivered before its master signs (``enable_signing``) is proven once it does.
    """
    if signing:
        own = multimaster_masterkeyfiles.read_master_key(mopts)
        return own, pub if mopts.get("master_sign_pubkey") else None
    if mopts.get("master_sign_pubkey"):
        return pub, multimaster_masterkeyfiles.read_master_key(mopts, signing=True)
    return pub, None


def opened_pair(minion_opts, envelope, master, signing):
    """
    Open the envelope (signed by the trusted master, bound to this master and a challenge of
    ours) and check the pair it carries. Returns ``(pem, pub, fp)``.
    """
    purpose = "master_sign" if signing else "master_key"
    body, bound = multimaster_seal.unsealed_for(minion_opts, master, envelope, purpose)
    pub = multimaster_keys.canonical(body.get("pub"), "sealed public key")
    fp = multimaster_keys.fingerprint(pub)
    if bound.get("fp") != fp:
        raise CommandExecutionError(f"sealed key {fp} is not the bound fingerprint {bound['fp']}")
    if multimaster_keys.private_key_fingerprint(body["pem"]) != fp:
        raise CommandExecutionError("sealed key pair: the private key does not match the public")
    return body.pop("pem"), pub, fp


def service(section):
    """
    The service name of the salt-master (``lookup:master:service``).
    """
    return section.get("lookup", {}).get("master", {}).get("service", "salt-master")


def install_master_key(minion_opts, master, section, transfer, pull, signing=False, timeout=90):
    """
    What ``multimaster_peer.install_master_key`` answers: the sealed pair pulled with ``pull``
    stored while the master is stopped (unless it already serves it), the master started
    again and checked by a sign-in. A master that was not running is left stopped: it serves
    the pair from its first start (``served`` None, ``running`` False).
    """
    mopts = multimaster_keystore.master_opts(master["config_dir"])
    host, port = master["host"], int(section["ports"]["ret"])
    envelope = multimaster_transport.pulled_json(transfer, ENVELOPE_LIMIT, "master key", pull)
    pem, pub, fp = opened_pair(minion_opts, envelope, master, signing)
    result = {"fp": fp, "changed": False, "restarted": None}
    current = multimaster_masterkeyfiles.read_master_key(mopts, signing=signing)
    stored = current and multimaster_keys.fingerprint(current) == fp
    if stored and not master_running(master, mopts):
        return dict(result, served=None, running=False, reason=NOT_RUNNING)
    if stored:
        served = served_args(mopts, pub, signing)
        ok, reason = verify_served(minion_opts, host, port, *served, timeout=10)
        if ok:
            return dict(result, served=True, reason=reason)
    # Swap only while the master is stopped: a running master keeps its private key in memory.
    stopped = multimaster_daemon.stop_now(
        mopts["pidfile"], service(section), "salt-master", master["config_dir"]
    )
    try:
        multimaster_masterkeyfiles.install_master_key(mopts, pem, pub, signing=signing)
    finally:
        del pem
        if stopped["was_running"]:
            multimaster_daemon.start_now(stopped, "salt-master", master["config_dir"])
    if not stopped["was_running"]:
        return dict(result, changed=True, served=None, running=False, reason=NOT_RUNNING)
    result.update(changed=True, restarted=stopped["service"] or "daemon")
    if not multimaster_daemon.wait_port(host, port, timeout):
        return dict(result, served=False, reason=f"master did not listen on {host}:{port}")
    served = served_args(mopts, pub, signing)
    ok, reason = verify_served(minion_opts, host, port, *served, timeout=timeout)
    return dict(result, served=ok, reason=reason)


# --- runner side -----------------------------------------------------------------------------


def uses_signing(section):
    """
    Whether the set shares a signing pair (``failover`` with ``signing:enabled``) rather than
    the master key pair itself.
    """
    return section["mode"] == "failover" and section.get("signing", {}).get("enabled", False)


def _local_pair(run, signing):
    """
    ``(private pem, public pem)`` of the pair this master would deliver (never returned).
    """
    return (
        multimaster_masterkeyfiles.read_master_key(run.opts, signing, private=True),
        multimaster_masterkeyfiles.read_master_key(run.opts, signing),
    )


def recipient_problem(run, master, inventories, planning=False):
    """
    Why the control minion of ``master`` must not receive a private key, or None.

    Its key must be accepted on this master, canonical, match the pinned fingerprint if any, and
    be the only key for that id on every master (no pending, rejected, denied or other key).
    ``planning``: a master that does not know the id yet is fine (the run accepts it there first).
    """
    minion_id = master["minion_id"]
    state, pem, denied = multimaster_control.primary_key_entry(run, minion_id)
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


def key_plan(run, section, signing, timeout):
    """
    What each master stores now; refuse what must not go ahead. Returns ``(plan, errors)``.
    """
    order = multimaster_control.ids(section)
    # A master whose restart began after the run's settle check (the job that scheduled it
    # had just returned) answers nothing, or stops this master's publishes: wait it out, ask
    # again.
    info, errors = multimaster_control.settled_round(
        run,
        section,
        lambda: multimaster_control.call(
            run, section, order, "master_key_info", {"signing": signing}, 60
        ),
        lambda result: result,
    )
    primary = order[0]
    if primary not in info or not info[primary].get("pub"):
        raise multimaster_control.Refused(f"primary {primary} did not report its key")
    private, public = _local_pair(run, signing)
    intended = multimaster_keys.fingerprint(info[primary]["pub"])
    if not private or multimaster_keys.private_key_fingerprint(private) != intended:
        raise multimaster_control.Refused(
            f"this master does not hold the primary's key {intended}: run sync_master_key on "
            f"{primary}"
        )
    if signing:
        check_signing_key(run, section)
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


def _deliver(run, section, master, plan, signing, timeout):
    """
    Seal the pair to ``master``'s control minion, bound to its challenge, and install it.
    """
    entry = multimaster_control.by_id(section)[master]
    private, public = _local_pair(run, signing)
    envelope = multimaster_seal.seal(
        {"pem": private, "pub": public},
        "master_sign" if signing else "master_key",
        entry["minion_id"],
        multimaster_control.primary_key_entry(run, entry["minion_id"])[1],
        multimaster_control.signer_key(run),
        multimaster_control.bound(
            multimaster_control.binding(plan["info"][master], master, section),
            fp=plan["intended"],
        ),
    )
    del private
    transfer = multimaster_control.staged(run, section, master, envelope)
    done, error = multimaster_control.call_one(
        run,
        section,
        master,
        "install_master_key",
        {"transfer": transfer, "signing": signing},
        timeout,
    )
    if error is not None:
        return {"result": False, "error": error}
    return {
        "result": done.get("served") is True or done.get("running") is False,
        "changed": done.get("changed"),
        "restarted": done.get("restarted"),
        "served": done.get("served"),
        "reason": done.get("reason"),
    }


def verify_all(run, section, ret, plan, signing, timeout):
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
        if plan["info"].get(master["id"], {}).get("running") is False:
            report.update(served=None, reason=NOT_RUNNING)
            continue
        verifier = masters[(index + 1) % len(masters)]["id"]
        if signing:
            # Each master keeps its own key in signing mode: the one it reported before.
            pub, sign_pub = plan["info"].get(master["id"], {}).get("own_pub"), plan["pub"]
        else:
            # A set that signs (hot): the shared key, signed by the shared signing pair.
            pub, sign_pub = plan["pub"], plan.get("sign_pub")
        answers, errors = multimaster_control.call(
            run,
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


def shared_pairs(section):
    """
    The pairs the masters of ``section`` share, in the order they are delivered (``True`` for
    the signing pair): failover with signing shares the signing pair only (each master keeps
    its own key), hot with signing the signing pair and the master key, else the master key.
    """
    if uses_signing(section):
        return [True]
    if multimaster_pillarcheck.signs(section):
        # The signing pair first: a master key is then proven with the shared signature.
        return [True, False]
    return [False]


def check_signing_key(run, section):
    """
    Refuse when ``multimaster:signing:public_key`` is not the public half of the signing pair
    this master holds: every minion would refuse every master.
    """
    _, public = _local_pair(run, True)
    intended = multimaster_keys.fingerprint(public or "")
    configured = multimaster_keys.fingerprint(section["signing"].get("public_key", ""))
    if configured != intended:
        raise multimaster_control.Refused(
            f"multimaster:signing:public_key has fingerprint {configured}, but the "
            f"primary's signing pair is {intended}: minions would refuse every master"
        )


def sync_master_key(run, test=False, masters=None, timeout=180):
    """
    The ``sync_master_key`` runner: plan, then (unless ``test``) deliver the primary's pair (or
    pairs: ``shared_pairs``) to every stale master and verify what every master serves.
    """
    try:
        section = multimaster_control.acting(
            run,
            multimaster_control.configured(run, masters, "sync_master_key"),
            "sync_master_key",
        )
        pairs = shared_pairs(section)
        if True in pairs:
            check_signing_key(run, section)
        multimaster_control.await_restarts(run, section)
    except SaltInvocationError as exc:
        return multimaster_control.refused(run, exc)
    if len(pairs) > 1:
        # Hot with signing: the signing pair, then the master key (reported at the top).
        signing_pair, failed = _sync_pair(run, section, True, test, timeout)
        if failed:
            said = signing_pair.get("comment") or "failed on a master (see signing_pair)"
            ret = {"comment": f"signing pair: {said}; the master key was not delivered"}
            return multimaster_control.finish(run, {**ret, "signing_pair": signing_pair}, True)
    ret, failed = _sync_pair(run, section, pairs[-1], test, timeout)
    if len(pairs) > 1:
        ret["signing_pair"] = signing_pair
    return multimaster_control.finish(run, ret, failed)


def _sync_pair(run, section, signing, test, timeout):
    """
    ``(report, failed)`` of delivering one shared pair (the signing pair with ``signing``).
    """
    try:
        plan, errors = key_plan(run, section, signing, timeout)
    except SaltInvocationError as exc:
        return {"comment": f"Refused, nothing changed: {exc}"}, True
    if not signing and multimaster_pillarcheck.signs(section):
        plan["sign_pub"] = _local_pair(run, True)[1]
    ret = {"masters": {}, "signing": signing, "fingerprint": plan["intended"]}
    ret["salt_finger"] = plan["salt_finger"]
    for master, error in errors.items():
        ret["masters"][master] = {"result": False, "error": error}
    for master in multimaster_control.ids(section)[1:]:
        if master in plan["info"] and master not in plan["stale"]:
            ret["masters"][master] = {"result": True, "changed": False}
    if test:
        _plan_stale(run, section, ret, plan)
        return ret, bool(errors)
    deliver_stale(run, section, ret, plan, signing, timeout)
    verify_all(run, section, ret, plan, signing, timeout)
    return ret, any(r.get("result") is False for r in ret["masters"].values())


def _plan_stale(run, section, ret, plan):
    """
    Report, for ``test``, what a run would do to each stale master: install, or refuse its
    control minion as a recipient.
    """
    control = [m["minion_id"] for m in section["masters"]]
    held = multimaster_keysync.inventories(run, section, 60, ids=control)["inventories"]
    for master in plan["stale"]:
        entry = multimaster_control.by_id(section)[master]
        problem = recipient_problem(run, entry, held, planning=True)
        ret["masters"][master] = {
            "result": None,
            "planned": f"refuse: {problem}" if problem else "install, restart, verify",
            "old": plan["stored"][master],
            "new": plan["intended"],
        }


def deliver_stale(run, section, ret, plan, signing, timeout):
    """
    Accept the control minions everywhere (a sign-in needs it), re-check each recipient, and
    deliver to every master whose stored key is not the intended one.
    """
    control = [m["minion_id"] for m in section["masters"]]
    order = multimaster_control.ids(section)
    multimaster_keysync.reconcile(
        run, section, lambda inv: multimaster_keys.plan(inv, order), 60, False, ids=control
    )
    found = multimaster_keysync.inventories(run, section, 60, ids=control)
    held, bindings = found["inventories"], found["bindings"]
    for master in plan["stale"]:
        entry = {"old": plan["stored"][master], "new": plan["intended"]}
        problem = recipient_problem(run, multimaster_control.by_id(section)[master], held)
        if problem:
            ret["masters"][master] = {"result": False, "error": f"refused: {problem}", **entry}
            continue
        run.progress(f"{master}: installing the shared key, restarting, verifying")
        # A fresh challenge from the inventory just read (the earlier one is still valid too).
        plan["info"][master]["binding"] = bindings.get(master) or plan["info"][master]["binding"]
        delivered = _deliver(run, section, master, plan, signing, timeout)
        ret["masters"][master] = {**delivered, **entry}
