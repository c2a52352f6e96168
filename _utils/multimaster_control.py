"""
The runners' end of reaching the masters of a set: this master's own section, a call to the
control minions and the check of every answer, staging a transfer, the key that signs orders,
waiting out masters' restarts, and the shape of every runner's report.

Every function takes a ``Run``: this master's opts, the runner's context (where a failed run
leaves ``retcode``) and its progress events. Nothing here reads loader dunders.
"""

import logging
import os
import time

import multimaster_keys
import multimaster_keystore
import multimaster_masterkeyfiles
import multimaster_pillarcheck
import multimaster_returns
import multimaster_seal
import multimaster_transport
import salt.client
import salt.config
import salt.pillar
import salt.utils.files
import salt.utils.json
import salt.utils.minions
from salt.exceptions import SaltClientError, SaltInvocationError

log = logging.getLogger(__name__)

# Listed ids in a report are capped; counts are always complete.
SHOWN = 50
PEER = "multimaster_peer"


class Refused(SaltInvocationError):
    """
    Bad input or an unsafe situation: nothing was changed.
    """


class Run:
    """
    One runner call: this master's opts, the runner's ``__context__`` and its job's event
    (``__jid_event__``, absent outside ``salt-run``).
    """

    def __init__(self, opts, context=None, jid_event=None):
        self.opts = opts
        self.context = {} if context is None else context
        self.jid_event = jid_event

    def progress(self, message):
        log.info("multimaster: %s", message)
        if self.jid_event is not None:
            try:
                self.jid_event.fire_event({"message": message}, "progress")
            except (AttributeError, ReferenceError):
                # The reactor's runner threads share one module: the event injected for
                # another job may be gone (a weak reference). Progress is only a courtesy.
                pass


# --- reports ---------------------------------------------------------------------------------


def finish(run, ret, failed):
    ret["retcode"] = 1 if failed else 0
    if failed:
        run.context["retcode"] = 1
    return ret


def refused(run, exc):
    # Salt's runner client turns a SaltInvocationError (a TypeError) into a "Passed invalid
    # arguments" string and salt-run exits 0: refuse bad input with a report and retcode 1.
    return finish(run, {"comment": f"Refused, nothing changed: {exc}"}, True)


# --- this master's section -------------------------------------------------------------------


def on_disk(run):
    """
    This master's options as its config on disk says now: an orchestration re-renders
    ``master.d`` (``multimaster.master``) between its runner steps, and the opts this process
    started with would still hold the old set and roots.
    """
    conf_file = run.opts.get("conf_file")
    if conf_file and os.path.isfile(conf_file):
        return salt.config.master_config(conf_file)
    return run.opts


def section(run, opts=None):
    """
    The ``multimaster`` section of ``opts`` (by default this master's config on disk), checked.
    """
    if not multimaster_transport.ids_signed(run.opts):
        # Every control minion's answer and pull is trusted by its minion id.
        raise Refused(
            multimaster_transport.UNSIGNED_IDS.format(run.opts.get("minimum_auth_version"))
        )
    found = dict((opts or on_disk(run)).get("multimaster") or {})
    if not found.get("masters"):
        raise Refused(
            "multimaster:masters is not in this master's config: apply the multimaster.master "
            "state to this master's control minion"
        )
    return multimaster_pillarcheck.check_section(found)


def configured(run, masters, what):
    """
    This master's own section, refusing ``masters=``: the set, its order and so its primary (the
    first entry, whose keys are the authority) come only from this master's config.
    """
    if masters is not None:
        raise Refused(
            f"masters= is not accepted by {what}: got {multimaster_keys.shown(masters)}; the "
            "masters, their order and the primary (the first) come only from multimaster:masters "
            "in this master's own config: change them in pillar and apply multimaster.master"
        )
    return section(run)


def addressable(found, what):
    """
    ``found`` (a section), unless its masters are a cluster: there a control minion's pull
    reaches whichever master the balancer picks, not the one that staged the transfer.
    """
    if found["mode"] == "cluster":
        raise Refused(
            f"{what} is for hot and failover sets: in mode cluster no single master can be "
            "addressed behind the balancer, and Salt's cluster shares keys itself (see "
            "docs/cluster.md in the formula)"
        )
    return found


def acting(run, found, what):
    """
    ``found``, addressable (``addressable``) and not fenced by a newer epoch in pillar
    (``fence_by_pillar``): the section a runner acting as the primary plans from.
    """
    addressable(found, what)
    fence_by_pillar(run, found)
    return found


def ids(found):
    """
    The master ids of section ``found``, its primary first, then the others in pillar order.
    """
    order = [m["id"] for m in found["masters"]]
    primary = found.get("primary")
    if primary in order[1:]:
        order.remove(primary)
        order.insert(0, primary)
    return order


def by_id(found):
    return {m["id"]: m for m in found["masters"]}


def id_list(value, name):
    """
    ``value`` (None, a comma-separated string or a list of strings) as a list of ids.
    """
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise Refused(f"{name}: got {value!r}; expected a master id or a list of master ids")


def this_master(run, found):
    """
    The id of this master's entry in ``found``, or None. Salt names a master
    ``<hostname>_master`` unless its config sets ``id``, so that name matches entry ``<hostname>``.
    """
    here = run.opts.get("id") or ""
    for candidate in (here, here.removesuffix("_master")):
        if candidate in ids(found):
            return candidate
    return None


# --- calling control minions -----------------------------------------------------------------


def call(run, found, masters, fun, kwarg, timeout, check=None, find_job_timeout=None):
    """
    Run ``multimaster_peer.<fun>`` on the control minions of ``masters``; ``(answers, errors)``
    keyed by master id. Each answer must be signed by its control minion for a nonce fresh to
    this publish (a return's minion id proves nothing: see ``multimaster_returns``);
    ``check(answer)`` then validates (and may normalise) it: a peer's return is never trusted
    as it comes. Raises ``Refused`` when a peer is of a newer epoch (``fence``).
    ``find_job_timeout``: see ``multimaster_returns.cmd_returns`` (polls pass it).
    """
    by_minion = {m["minion_id"]: m["id"] for m in found["masters"] if m["id"] in masters}
    nonce = os.urandom(32).hex()
    start = time.monotonic()
    with salt.client.get_local_client(run.opts["conf_file"]) as client:
        returns = multimaster_returns.cmd_returns(
            client,
            list(by_minion),
            f"{PEER}.{fun}",
            kwarg={**(kwarg or {}), "answer_nonce": nonce},
            timeout=timeout,
            find_job_timeout=find_job_timeout,
        )
    # A recipient that pulled a transfer during this call has returned: its last pull's job
    # (the last chunk) leaves the job cache.
    multimaster_transport.settle(run.opts)
    log.info("multimaster: %s on %s: %.2fs", fun, sorted(masters), time.monotonic() - start)
    answers, errors = {}, {}
    for minion_id, master_id in by_minion.items():
        try:
            answers[master_id] = _answer(
                run, returns.get(minion_id), fun, master_id, minion_id, nonce, check
            )
        except multimaster_returns.AnswerRefused as exc:
            errors[master_id] = str(exc)
    fence(found, answers)
    return answers, errors


def call_one(run, found, master, fun, kwarg, timeout, check=None):
    """
    ``call`` for one master: ``(answer, None)``, or ``(None, error)`` when its control minion's
    answer was refused or missing.
    """
    answers, errors = call(run, found, [master], fun, kwarg, timeout, check)
    return answers.get(master), errors.get(master)


def _answer(run, ret, fun, master_id, minion_id, nonce, check):
    """
    The answer of ``minion_id`` (the control minion of ``master_id``) in its return ``ret``,
    signed by it for ``nonce`` and passed through ``check``; raises ``AnswerRefused``.
    """
    if not isinstance(ret, dict) or "ret" not in ret:
        raise multimaster_returns.AnswerRefused(f"control minion {minion_id} did not answer")
    answer, failed = multimaster_returns.signed_answer(
        ret, fun, master_id, minion_id, nonce, control_key(run, master_id, minion_id)
    )
    if failed:
        raise multimaster_returns.AnswerRefused(_peer_error(fun, minion_id, str(answer)))
    if not isinstance(answer, dict):
        raise multimaster_returns.AnswerRefused(
            f"{fun} on {minion_id}: malformed return ({type(answer)})"
        )
    if answer.get("alive") is False:
        raise multimaster_returns.AnswerRefused(
            f"salt-master on {master_id} is not running; left untouched"
        )
    try:
        return check(answer) if check else answer
    except (ValueError, TypeError, KeyError) as exc:
        raise multimaster_returns.AnswerRefused(
            f"{fun} on {minion_id}: malformed return ({_reason(exc)})"
        ) from None


def primary_key_entry(run, minion_id):
    """
    ``(state, pem, denied)`` of ``minion_id`` in this master's own key store.
    """
    return multimaster_keystore.key_entry(run.opts, minion_id)


def control_key(run, master_id, minion_id):
    """
    The public key (PEM) of ``minion_id`` as accepted on this master: what its answers must be
    signed with. Raises ``AnswerRefused`` when it is not accepted here.
    """
    state, pem, _ = primary_key_entry(run, minion_id)
    if state != "accepted" or not pem:
        raise multimaster_returns.AnswerRefused(
            f"{master_id}: {minion_id} is not accepted on this master (its key is "
            f"{state or 'unknown'} here), so its answer cannot be checked: nothing of it was "
            f"used; accept it with 'salt-key -a {minion_id}' after checking its fingerprint"
        )
    return pem


def _peer_error(fun, minion_id, text):
    """
    A control minion's refusal as it said it; a Python traceback instead becomes a sentence
    saying where to read it.
    """
    if "Traceback" in text or "caused an exception" in text:
        return (
            f"{fun} failed on {minion_id} with an unexpected error (its traceback is in that "
            f"host's minion log); run 'salt {minion_id} saltutil.sync_all' if the formula there "
            "is older than on this master"
        )
    return text[:2000]


def _reason(exc):
    """
    A check's own message (a ValueError names what is wrong); for a missing field or a wrong
    type, a sentence instead of Python's exception text.
    """
    if isinstance(exc, ValueError):
        return str(exc)
    return "a field is missing or of the wrong type; sync the formula on both ends"


# --- orders and transfers --------------------------------------------------------------------


def binding(answer, master, found):
    """
    The challenge a peer issued, checked to name the master we asked, with the epoch of this
    master's section ``found`` (an order carries the sender's epoch, never the peer's).
    """
    challenge = answer.get("binding")
    if not isinstance(challenge, dict) or challenge.get("target") != master:
        raise ValueError(f"no challenge bound to {master}")
    return dict(challenge, epoch=found.get("epoch", 1))


def bound(challenge, **extra):
    return multimaster_seal.bind(
        challenge["challenge"],
        challenge["target"],
        challenge["config_dir"],
        epoch=challenge["epoch"],
        **extra,
    )


def fence(found, answers):
    """
    Refuse to act when a peer's challenge names a newer epoch than this master's section
    ``found``: another master was promoted primary since this one's section was written (it
    was down, or its config was restored), and its orders would be refused anyway. Raises
    ``Refused`` naming the newest epoch and the command that brings this master back.
    """
    own = found.get("epoch", 1)
    newer = {
        master: answer["binding"]["epoch"]
        for master, answer in answers.items()
        if isinstance(answer, dict)
        and isinstance(answer.get("binding"), dict)
        and _is_epoch(answer["binding"].get("epoch"))
        and answer["binding"]["epoch"] > own
    }
    if newer:
        master = max(newer, key=newer.get)
        raise Refused(_fenced(f"{master} is at epoch {newer[master]}", own))


def fence_by_pillar(run, found):
    """
    Refuse to act as the primary when the pillar this master's control minion gets now names a
    newer ``multimaster:epoch`` than this master's section ``found``: the set was promoted while
    this master was away, and its peers may no longer even reach it (their control minions were
    re-pointed), so their challenges cannot say so. A pillar without a ``multimaster`` section
    for it, or one that does not compile, leaves the peers' own fence (``fence``) to decide.
    """
    here = this_master(run, found)
    if here is None:
        return
    epoch = pillar_epoch(run, by_id(found)[here].get("minion_id", here))
    own = found.get("epoch", 1)
    if epoch is not None and epoch > own:
        raise Refused(_fenced(f"pillar multimaster:epoch is {epoch}", own))


def pillar_epoch(run, minion_id):
    """
    The ``multimaster:epoch`` of the pillar compiled now for ``minion_id`` (with its cached
    grains, as ``salt-run pillar.show_pillar`` does): 1 when the section names none, None when
    there is no section or the pillar does not compile.
    """
    section = pillar_section(run, minion_id)
    if section is None:
        return None
    epoch = section.get("epoch", 1)
    return epoch if _is_epoch(epoch) else None


def pillar_section(run, minion_id):
    """
    The ``multimaster`` section of the pillar this master compiles now for ``minion_id`` (no
    minion's answer involved), or None when there is none or the pillar does not compile.
    """
    id_, grains, _ = salt.utils.minions.get_minion_data(minion_id, run.opts)
    try:
        pillar = salt.pillar.get_pillar(
            run.opts, grains or {"fqdn": minion_id}, id_ or minion_id, saltenv="base"
        ).compile_pillar()
    except Exception as exc:  # pylint: disable=broad-except
        # Any renderer's error: the fence then rests on the peers' challenges alone. Only the
        # error's type is logged: a render error can quote pillar source, secrets included.
        log.warning(
            "multimaster: the pillar of %s did not compile (%s)", minion_id, type(exc).__name__
        )
        return None
    if pillar.get("_errors"):
        log.warning(
            "multimaster: the pillar of %s has %d render errors (Salt's log names them)",
            minion_id,
            len(pillar["_errors"]),
        )
        return None
    section = pillar.get("multimaster")
    return section if isinstance(section, dict) else None


def _is_epoch(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _fenced(newer, own):
    return (
        f"{newer}, newer than this master's epoch {own}: another master was promoted primary "
        "since this master's multimaster section was written, so this master acts for nobody. "
        "Bring it back from the primary: list it in pillar multimaster:masters and run salt-run "
        'state.orch multimaster.orch.add_master pillar=\'{"multimaster_new": "<its id>"}\''
    )


def staged(run, found, master, document):
    """
    Stage ``document`` (JSON, sealed or signed) for ``master``'s control minion to pull from
    this master: the publish carries only the descriptor. Served through this master's file
    server to that minion's authenticated id only, which needs no ``peer_run`` entry: a
    control minion added to the set since this master started pulls there.
    """
    return multimaster_transport.stage(
        run.opts,
        by_id(found)[master]["minion_id"],
        salt.utils.json.dumps(document).encode(),
        fileserver=True,
    )


def signer_key(run):
    """
    This master's own private key (signs orders and envelopes; never leaves this process). In
    a cluster the minions trust the cluster's key (``cluster.pub``), so that one signs.
    """
    if run.opts.get("cluster_id"):
        path = os.path.join(run.opts["cluster_pki_dir"], "cluster.pem")
        with salt.utils.files.fopen(path, "r") as handle:
            return handle.read()
    return multimaster_masterkeyfiles.read_master_key(run.opts, private=True)


# --- waiting out restarts --------------------------------------------------------------------

# master_settled answers in well under a second; a control minion that is restarting does not
# answer at all, and each poll that meets one waits this long (plus a short find_job round).
SETTLED_POLL_TIMEOUT = 3
# How long a runner waits for a pending restart before it refuses.
SETTLE_TIMEOUT = 120
# A control minion that does not answer may be restarting, or its host may be down: wait this
# long for it, then go on (the run then reports that master unreachable).
SILENT_GRACE = 15


def poll_settled(run, found, masters):
    """
    ``(answers, errors)`` of ``master_settled`` on ``masters``; while this master itself is
    restarting nothing can be published and every master is an error.
    """
    try:
        return call(
            run,
            found,
            masters,
            "master_settled",
            {},
            SETTLED_POLL_TIMEOUT,
            find_job_timeout=multimaster_returns.QUICK_FIND_JOB,
        )
    except SaltClientError:
        return {}, {m: "this master is restarting: nothing can be published yet" for m in masters}


def await_restarts(run, found, masters=None):
    """
    Wait, with progress, while a restart of a master (of ``masters``, default all) is pending
    or this master is restarting; masters that are down are left for the run to report.
    Returns the masters that answered. Raises ``Refused`` naming the masters still restarting
    after ``SETTLE_TIMEOUT`` seconds.
    """
    start = time.monotonic()
    waiting, answered = list(masters if masters is not None else ids(found)), set()
    while True:
        answers, errors = poll_settled(run, found, waiting)
        answered.update(answers)
        waited = time.monotonic() - start
        pending = [m for m, a in answers.items() if (a or {}).get("restart_pending")]
        silent = [m for m in waiting if m not in answers and waited < SILENT_GRACE]
        waiting = pending + silent
        if not waiting:
            return sorted(answered)
        if waited > SETTLE_TIMEOUT:
            raise Refused(
                f"a restart of {', '.join(waiting)} is still pending after {SETTLE_TIMEOUT}s "
                f"({'; '.join(str(errors.get(m) or answers.get(m)) for m in waiting)}): "
                "run 'salt-run multimaster.wait_masters', then run this command again"
            )
        run.progress(f"waiting for {', '.join(waiting)} to finish restarting ({round(waited)}s)")
        time.sleep(1)


def settled_round(run, found, ask, parts):
    """
    ``ask()`` for a round to every master whose answers say ``restart_pending``, so that a run
    pays no settle round of its own when nothing is restarting: only when the round shows a
    restart pending, a master silent (or refused) or this master restarting does it wait as
    ``await_restarts`` does and ask again (not when the silent masters stayed silent).
    ``parts(result)`` gives a round's ``(answers, errors)``.
    """
    try:
        result = ask()
    except SaltClientError:
        await_restarts(run, found)
        return ask()
    answers, errors = parts(result)
    pending = [m for m, a in answers.items() if (a or {}).get("restart_pending")]
    if not pending and not errors:
        return result
    if await_restarts(run, found, pending + sorted(errors)) or pending:
        return ask()
    return result
