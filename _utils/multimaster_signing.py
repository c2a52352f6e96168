"""
Signing turned on in a running hot or failover set (the rotation's prepare step), each daemon
restarted once, every minion without a master only between its own restart and the primary's.

Salt refuses both mismatches at a sign-in: a minion that verifies refuses a master that does
not sign, and a master that signs is refused by a minion that does not verify. A minion signs
in at its start and again when a master it uses restarts; a connection already made is not
checked again. A hot minion of Salt 3008 that is refused when it signs in again to a master
that restarted *exits* (measured on separate hosts), so no master may start to sign while a
minion that does not verify is connected to it. The order:

1. the primary's signing pair is sealed to every peer (the master-key plane) while no master
   signs: each peer restarts, the minions sign in to it again as before;
2. every master's config is written to sign, none restarted;
3. ``multimaster.minion`` on every minion, control minions too: it verifies, holds
   ``master_sign.pub`` and restarts once after its job; every master refuses it for now, and
   it retries (every ``acceptance_wait_time``; a failover minion tries each master in turn);
4. once none of them answers any more, the primary restarts from this runner's own process
   and signs: the minions sign in to it;
5. the peers restart (their control minions reach them through the primary now) and sign;
6. the masters and minions are waited for, and ``sync_master_key`` proves every master's
   signed key by a sign-in.

Step 3 is published from the primary. A hot minion answers every master; a failover minion
answers only the master it is connected to, so in mode failover every minion must answer the
primary.
"""

import time

import multimaster_control
import multimaster_keys
import multimaster_masterkey
import multimaster_masterkeyfiles
import multimaster_pillarcheck
import multimaster_returns
import multimaster_rotation
import multimaster_settle
import salt.client
import salt.key
from salt.exceptions import SaltInvocationError

# With every master's config: none may restart (and sign) before the minions verify.
NO_RESTART = {"multimaster": {"manage_services": False}}
PAIR_MISSING = (
    "this master holds no signing pair: make it with salt-key --gen-keys=master_sign "
    "--gen-keys-dir=<this master's pki_dir>, put its .pub in pillar "
    "multimaster:signing:public_key (docs/rotation.md)"
)


def pillar_problem(settings, signing_pub):
    """
    Why the pillar ``settings`` (the primary control minion's ``multimaster`` section) do not
    turn signing on with this master's signing pair ``signing_pub``, or None.
    """
    if not isinstance(settings, dict):
        return "the pillar of the primary's control minion has no multimaster section that compiles"
    if not isinstance(settings.get("signing"), dict) or not multimaster_pillarcheck.signs(settings):
        return (
            f"pillar multimaster:signing is not enabled in mode {settings['mode']}: set "
            "signing: {enabled: true, public_key: <this master's master_sign.pub>} "
            "(docs/rotation.md)"
        )
    if not signing_pub:
        return PAIR_MISSING
    configured = multimaster_keys.fingerprint(settings["signing"].get("public_key") or "")
    held = multimaster_keys.fingerprint(signing_pub)
    if configured != held:
        return (
            f"multimaster:signing:public_key has fingerprint {configured}, but this master's "
            f"signing pair is {held}: minions would refuse every master"
        )
    return None


def state_problem(ret):
    """
    Why one minion's ``full_return`` of ``state.apply`` is not a success, or None.
    """
    if not isinstance(ret, dict) or "ret" not in ret:
        return "did not answer"
    states = ret["ret"]
    if isinstance(states, list):
        return "could not render: " + "; ".join(str(s) for s in states)[:300]
    if not isinstance(states, dict):
        return f"returned {states!r:.200}"
    failed = [
        f"{name.split('_|-')[1] if '_|-' in name else name}: {state.get('comment')}"
        for name, state in states.items()
        if isinstance(state, dict) and state.get("result") is False
    ]
    if failed or ret.get("retcode"):
        return "failed: " + ("; ".join(failed) or f"retcode {ret.get('retcode')}")[:300]
    return None


def applied(run, targets, sls, timeout, pillar=None):
    """
    ``{minion: problem}`` of ``state.apply sls`` on ``targets`` (minion ids): only the minions
    that did not apply it, each with why.
    """
    if not targets:
        return {}
    kwarg = {"pillar": pillar} if pillar else {}
    with salt.client.get_local_client(run.opts["conf_file"]) as client:
        returns = multimaster_returns.cmd(
            client,
            list(targets),
            "state.apply",
            int(timeout),
            arg=[sls],
            kwarg=kwarg,
            tgt_type="list",
            full_return=True,
        )
    problems = {m: state_problem((returns or {}).get(m)) for m in targets}
    return {m: p for m, p in problems.items() if p}


def primary_pillar(run, section):
    """
    The ``multimaster`` pillar section this master compiles now for the primary's control
    minion (no minion's answer involved), with the formula's default mode; None without one.
    """
    minion = multimaster_control.by_id(section)[multimaster_control.ids(section)[0]]
    found = multimaster_control.pillar_section(run, minion["minion_id"])
    return None if found is None else {"mode": "hot", **found}


def accepted_minions(run):
    return sorted(salt.key.get_key(run.opts).list_status("acc").get("minions", []))


def off_primary(answers, primary):
    """
    The minions that answer a master but not ``primary``, sorted (``answers``: each master's
    ``minions_verifying`` answer).
    """
    answering = {m for answer in answers.values() for m in answer["minions"]}
    return sorted(answering - set(answers.get(primary, {}).get("minions", {})))


def check_ready(run, section, skip_unanswered):
    """
    The pillar settings, or ``Refused`` when signing cannot be turned on now: pillar does not
    say so with this master's signing pair, or a master or an accepted minion does not answer
    (one left out would come back to masters that all refuse it).
    """
    signing_pub = multimaster_masterkeyfiles.read_master_key(run.opts, signing=True)
    settings = primary_pillar(run, section)
    problem = pillar_problem(settings, signing_pub)
    if problem:
        raise multimaster_control.Refused(problem)
    order = multimaster_control.ids(section)
    answers, errors = multimaster_control.call(
        run,
        section,
        order,
        "minions_verifying",
        {},
        60,
        check=multimaster_rotation.check_verifying,
    )
    if errors:
        raise multimaster_control.Refused(
            "every master must answer before signing is turned on (after a run that stopped "
            "before the primary's restart, restart its salt-master first): "
            + "; ".join(f"{m}: {e}" for m, e in sorted(errors.items()))
        )
    answering = {m for answer in answers.values() for m in answer["minions"]}
    elsewhere = off_primary(answers, order[0])
    if elsewhere and section["mode"] == "failover":
        raise multimaster_control.Refused(
            f"minions {multimaster_keys.shown(elsewhere)} answer another master than the "
            f"primary {order[0]}: the step that makes each minion verify is published from the "
            "primary and would miss them; once they are back on it (failback, or a restart of "
            "each), run again"
        )
    silent = sorted(set(accepted_minions(run)) - answering)
    if silent and not skip_unanswered:
        raise multimaster_control.Refused(
            f"minions {multimaster_keys.shown(silent)} answered no master: each would come back "
            "to masters that all refuse it; start them and run again (or pass "
            "skip_unanswered=True and apply multimaster.minion to them by hand before they "
            "start again)"
        )
    return settings


def configure_masters(run, section, timeout):
    """
    Step 2: ``multimaster.master`` on every master, none restarted. ``{master: problem}`` of
    those that failed.
    """
    by_minion = {m["minion_id"]: m["id"] for m in section["masters"]}
    run.progress("every master: writing the config that signs (restarted later)")
    failed = applied(run, list(by_minion), "multimaster.master", timeout, pillar=NO_RESTART)
    return {by_minion[minion]: problem for minion, problem in failed.items()}


def deliver_signing_pair(run, section, timeout):
    """
    Step 1: the primary's signing pair to every peer that does not hold it; the report of
    ``multimaster_masterkey`` per peer, and whether one failed.
    """
    multimaster_control.await_restarts(run, section)
    plan, errors = multimaster_masterkey.key_plan(run, section, True, 60)
    ret = {"masters": {m: {"result": False, "error": e} for m, e in errors.items()}}
    multimaster_masterkey.deliver_stale(run, section, ret, plan, True, timeout)
    return ret, any(r.get("result") is False for r in ret["masters"].values())


def signs_now(run, section, master):
    """
    Whether ``master`` serves its key signed by the primary's signing pair now: a sign-in from
    the next master's control minion (a re-run has nothing to restart for).
    """
    order = multimaster_control.ids(section)
    verifier = order[(order.index(master) + 1) % len(order)]
    info, _ = multimaster_control.call(run, section, [master], "master_key_info", {}, 30)
    pub = (info.get(master) or {}).get("pub")
    if not pub:
        return False
    kwarg = {
        "host": multimaster_control.by_id(section)[master]["host"],
        "port": section["ports"]["ret"],
        "pub": pub,
        "sign_pub": multimaster_masterkeyfiles.read_master_key(run.opts, signing=True),
        "timeout": 3,
    }
    found, _ = multimaster_control.call(run, section, [verifier], "verify_master_key", kwarg, 30)
    return (found.get(verifier) or {}).get("served") is True


def gone_quiet(run, minions, timeout=60):
    """
    Wait until none of ``minions`` answers this master (each restarted to verify, and is
    refused here until this master signs); the ones that still answer after ``timeout``.
    """
    deadline = time.monotonic() + timeout
    answering = list(minions)
    while answering and time.monotonic() < deadline:
        with salt.client.get_local_client(run.opts["conf_file"]) as client:
            returns = multimaster_returns.cmd(client, answering, "test.ping", 3, tgt_type="list")
        answering = sorted(m for m, ret in (returns or {}).items() if ret is True)
        if answering:
            time.sleep(1)
    return answering


def restart_peers(run, section, timeout):
    """
    Step 5: each peer that does not sign yet restarts (``multimaster_daemons.restart_master_now``
    through its control minion) and signs. ``{peer: report}``.
    """
    reports = {}
    for master in multimaster_control.ids(section)[1:]:
        if signs_now(run, section, master):
            reports[master] = {"result": True, "restarted": None, "comment": "signs already"}
            continue
        run.progress(f"{master}: restarting to sign")
        minion = multimaster_control.by_id(section)[master]["minion_id"]
        with salt.client.get_local_client(run.opts["conf_file"]) as client:
            returns = multimaster_returns.cmd(
                client,
                minion,
                "multimaster_daemons.restart_master_now",
                int(timeout),
                full_return=True,
            )
        reports[master] = peer_restart_report(minion, (returns or {}).get(minion))
    return reports


def peer_restart_report(minion, ret):
    """
    ``{"result", "restarted"}`` (and ``error``) of a control minion's ``full_return`` of
    ``restart_master_now``.
    """
    if isinstance(ret, dict) and ret.get("retcode") == 0:
        return {"result": True, "restarted": ret.get("ret")}
    said = ret.get("ret") if isinstance(ret, dict) else None
    reason = said[:200] if isinstance(said, str) else "no answer"
    return {"result": False, "restarted": None, "error": f"{minion}: {reason}"}


def switch_minions(run, section, ret, timeout):
    """
    Steps 3 and 4: every minion verifies (restarted once), then the primary signs. Returns
    whether a step failed.
    """
    primary = multimaster_control.ids(section)[0]
    signs = signs_now(run, section, primary)
    minions = accepted_minions(run)
    run.progress(f"{len(minions)} minions: verifying signed master keys, restarting once")
    failed = applied(run, minions, "multimaster.minion", timeout)
    ret["minions"] = {"prepared": len(minions) - len(failed), "failed": failed}
    if failed:
        ret["comment"] = "some minions were not prepared: no master was restarted; run again"
        return True
    if signs:
        ret["primary"] = {"result": True, "restarted": None, "comment": "signs already"}
        return False
    still = gone_quiet(run, minions)
    if still:
        ret["minions"]["not_restarted"] = still
    run.progress(f"{primary}: restarting to sign")
    ret["primary"] = multimaster_rotation.restart_here(run, section, timeout)
    return ret["primary"]["result"] is False


def finished(run, section, ret, timeout):
    """
    Steps 5 and 6: the peers sign, then everything is waited for and proven.
    """
    ret["answering_primary"] = multimaster_settle.wait_minions(run, timeout=timeout)
    ret["peers"] = restart_peers(run, section, timeout)
    ret["settled"] = multimaster_settle.wait_masters(run, timeout=timeout)
    ret["answering"] = multimaster_settle.wait_minions(run, timeout=timeout)
    ret["proof"] = multimaster_masterkey.sync_master_key(run, timeout=timeout)
    failed = any(r["result"] is False for r in ret["peers"].values())
    return failed or any(ret[k].get("retcode") for k in ("settled", "answering", "proof"))


def enable_signing(run, test=False, skip_unanswered=False, timeout=180):
    """
    The ``enable_signing`` runner: refuse what would cut a minion off, then (unless ``test``)
    turn signing on, step by step (the module's docstring).
    """
    try:
        section = multimaster_control.acting(
            run, multimaster_control.section(run), "enable_signing"
        )
        if section["mode"] not in ("hot", "failover"):
            raise multimaster_control.Refused(
                f"mode {section['mode']}: enable_signing turns signing on in mode hot or "
                "failover only (docs/rotation.md)"
            )
        settings = check_ready(run, section, skip_unanswered)
    except SaltInvocationError as exc:
        return multimaster_control.refused(run, exc)
    order = multimaster_control.ids(section)
    if test:
        ret = {"masters": order, "minions": len(accepted_minions(run))}
        ret["comment"] = (
            "would give the peers the signing pair, write every master's config, make every "
            f"minion verify (restarted once), then make {order[0]} and then the peers sign"
        )
        return multimaster_control.finish(run, ret, False)
    signing_section = {**section, "signing": settings["signing"]}
    ret = {}
    ret["signing_pair"], failed = deliver_signing_pair(run, signing_section, timeout)
    if failed:
        ret["comment"] = "a peer did not take the signing pair: nothing signs yet; run again"
        return multimaster_control.finish(run, ret, True)
    problems = configure_masters(run, section, timeout)
    if problems:
        ret.update(masters=problems, comment="a master's config failed: run again")
        return multimaster_control.finish(run, ret, True)
    section = multimaster_control.section(run)
    failed = switch_minions(run, section, ret, timeout) or finished(run, section, ret, timeout)
    ret.setdefault("comment", "every master signs" if not failed else "see the failed step")
    return multimaster_control.finish(run, ret, failed)
