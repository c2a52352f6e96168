"""
The cluster plane's runner and control-minion sides (mode cluster), over the plain-value
planning and checks of ``multimaster_cluster``.

The runner side gives each master of a cluster with an isolated filesystem what Salt does not
share there: the peer keys it lacks (``share_peer_keys``) and the newest cluster AES key
(``share_cluster_aes``; ``cluster_aes_rotated``, what the cluster AES key reactor runs), and
waits for a restarted master to get ready, proposing the no-op Raft entry (``cluster_ready``);
it takes a ``multimaster_control.Run``. The peer side is what a master's control minion
answers and installs for them (``multimaster_peer``) and what it checks before
``multimaster.forget_cluster_peer`` deletes a removed master's peer key: plain values in, the
control minion's opts. Nothing here reads loader dunders.
"""

import hmac
import logging
import os
import time

import multimaster_cluster
import multimaster_control
import multimaster_keystore
import multimaster_masterkey
import multimaster_pillarcheck
import multimaster_reactions
import multimaster_reactor
import multimaster_seal
import multimaster_settings
import salt.runner
from salt.exceptions import CommandExecutionError, SaltInvocationError

log = logging.getLogger(__name__)


# --- peer side (run by a control minion) ------------------------------------------------------


def peer_member(master, section):
    """
    ``(mopts, peers dir)`` of the cluster master ``master``; refuses any other mode.
    """
    mopts = multimaster_keystore.master_opts(master["config_dir"])
    return mopts, multimaster_cluster.member_peers_dir(master, section, mopts)


def peer_keys_held(minion_opts, master, peers_dir):
    """
    What ``multimaster_peer.cluster_peer_keys`` answers: the peer keys held, by fingerprint,
    and a fresh challenge.
    """
    return {
        "held": multimaster_cluster.held_peer_keys(peers_dir),
        "binding": multimaster_seal.binding(minion_opts, master),
    }


def install_ordered_peer_keys(minion_opts, master, section, peers_dir, keys, order):
    """
    What ``multimaster_peer.install_cluster_peer_keys`` answers:
    ``multimaster_cluster.install_peer_keys`` under a valid ``order`` only.
    """
    multimaster_cluster.check_peer_keys(
        keys,
        order,
        minion_opts["id"],
        multimaster_seal.own_file(minion_opts, "minion_master.pub"),
        multimaster_seal.expected(master),
        multimaster_seal.challenges(minion_opts),
    )
    return multimaster_cluster.install_peer_keys(peers_dir, keys, master, section)


def aes_held(minion_opts, master, mopts):
    """
    What ``multimaster_peer.cluster_aes_info`` answers: the stamp and digest of the key held
    (never the key) and a fresh challenge.
    """
    return {
        "held": multimaster_cluster.held_aes(mopts),
        "cluster_key": multimaster_cluster.held_cluster_key(mopts),
        "binding": multimaster_seal.binding(minion_opts, master),
    }


def install_sealed_aes(minion_opts, master, mopts, envelope):
    """
    What ``multimaster_peer.install_cluster_aes`` answers: the key of a valid envelope
    installed if newer, and re-read by the running master.
    """
    key, stamp, sender = multimaster_cluster.open_aes_envelope(
        envelope,
        minion_opts["id"],
        multimaster_seal.own_file(minion_opts, "minion.pem"),
        multimaster_seal.own_file(minion_opts, "minion_master.pub"),
        multimaster_seal.expected(master),
        multimaster_seal.challenges(minion_opts),
    )
    return multimaster_cluster.install_shared_aes(mopts, key, stamp, sender)


def peer_to_forget(minion_opts, section, peer, rotate_secret):
    """
    ``(peers dir, held)`` of the removed master ``peer`` on the cluster master that the control
    minion of ``minion_opts`` serves: what ``multimaster.forget_cluster_peer`` deletes. Refuses
    outside mode cluster, a peer still in ``multimaster:masters``, and, with ``rotate_secret``,
    a pillar secret that is empty or the one this master runs with while it holds the key.

    minion_opts
        The control minion's opts (its ``id`` and ``conf_file``).

    section
        The ``multimaster`` pillar section, checked.

    peer
        The removed master's cluster address.

    rotate_secret
        Whether the cluster secret must have been rotated.
    """
    master = multimaster_settings.local_master(
        section, minion_opts["id"], os.path.dirname(minion_opts["conf_file"])
    )
    if section.get("mode") != "cluster" or master is None:
        raise CommandExecutionError(
            f"{minion_opts['id']}: not the control minion of a cluster master (mode "
            f"{section.get('mode')!r}); forget_cluster_peer runs on a cluster master's control "
            "minion"
        )
    listed = [multimaster_pillarcheck.cluster_address(m) for m in section["masters"]]
    if peer in listed:
        raise CommandExecutionError(
            f"peer {peer!r} is still a master of multimaster:masters ({', '.join(listed)}): "
            "take it out of pillar first"
        )
    mopts = multimaster_keystore.master_opts(master["config_dir"])
    peers_dir = os.path.join(mopts["cluster_pki_dir"], "peers")
    held = os.path.lexists(os.path.join(peers_dir, f"{peer}.pub"))
    running = (mopts.get("cluster_secret") or "").encode()
    wanted = ((section.get("cluster") or {}).get("secret") or "").encode()
    if rotate_secret and not wanted:
        raise CommandExecutionError(
            f"{master['id']}: pillar multimaster:cluster:secret is empty for {minion_opts['id']}; "
            "expected the new cluster secret (target it at the masters' control minions)"
        )
    if rotate_secret and held and hmac.compare_digest(running, wanted):
        raise CommandExecutionError(
            f"{master['id']}: multimaster:cluster:secret in pillar is the secret this master "
            f"runs with, which {peer} knows: put a new secret in pillar to rotate it"
        )
    return peers_dir, held


# --- runner side -----------------------------------------------------------------------------

# Seconds between two proposals of the no-op Raft entry (``multimaster_cluster.nudge_event``)
# while a master is not ready (``cluster_ready``) or not settled (``multimaster_settle``).
NUDGE_INTERVAL = 5.0

# A rotation of this master's key is shared once: repeats of its event (Salt's own, or any a
# minion fires under its tag) within this many seconds cost one read of the key file.
AES_REPEAT_WINDOW = 60


def cluster_section(run, masters, what="this exists"):
    """
    ``(section, targets)`` in mode cluster: the pillar section and the master ids ``masters``
    names (default all); refuses any other mode (saying ``what`` exists in mode cluster only)
    and an id not in the pillar.
    """
    section = multimaster_control.section(run)
    multimaster_cluster.check_mode(section, f"{what} in mode cluster only")
    return section, multimaster_cluster.targets(
        section, multimaster_control.id_list(masters, "masters")
    )


def _share_one(run, section, master, answer, keys, signer, timeout):
    """
    Give ``master`` the keys it lacks (``answer``: what it holds and its challenge), orders
    signed with ``signer``; with no ``signer`` (test) only report.
    """
    entry = multimaster_control.by_id(section)[master]
    address = multimaster_pillarcheck.cluster_address(entry)
    missing, report = multimaster_cluster.peer_keys_plan(address, answer["held"], keys)
    if signer is None or not missing:
        return dict(report, result=not report["conflicts"], written=[])
    try:
        bound = multimaster_control.bound(multimaster_control.binding(answer, master, section))
        order = multimaster_cluster.peer_keys_order(missing, entry["minion_id"], signer, bound)
    except ValueError as exc:
        return dict(report, result=False, error=str(exc))
    done, error = multimaster_control.call_one(
        run,
        section,
        master,
        "install_cluster_peer_keys",
        {"keys": missing, "order": order},
        timeout,
    )
    if error is not None:
        return dict(report, result=False, error=error)
    return multimaster_cluster.peer_keys_result(report, done)


def share_peer_keys(run, masters=None, test=False, timeout=60):
    """
    The runner's ``share_peer_keys``: give each master of ``masters`` (default all) the peer
    keys it lacks; returns the report.
    """
    try:
        section, chosen = cluster_section(run, masters, "peer keys exist")
    except SaltInvocationError as exc:
        return multimaster_control.refused(run, exc)
    keys, not_here = multimaster_cluster.own_peer_keys(section, run.opts["cluster_pki_dir"])
    answers, errors = multimaster_control.call(
        run, section, chosen, "cluster_peer_keys", {}, timeout, multimaster_cluster.peer_keys_check
    )
    report = {m: {"result": False, "error": errors[m]} for m in chosen if m in errors}
    signer = None if test or not answers else multimaster_control.signer_key(run)
    for master in chosen:
        if master in answers:
            run.progress(f"{master}: peer keys")
            report[master] = _share_one(
                run, section, master, answers[master], keys, signer, timeout
            )
    ret = {"masters": report, "not_held_here": not_here}
    if test:
        ret["test"] = True
    failed = bool(not_here) or not all(r["result"] for r in report.values())
    return multimaster_control.finish(run, ret, failed)


def _share_aes_one(run, section, master, answer, key, own, test, timeout):
    """
    Give ``master`` this master's cluster AES key (``key``, described by ``own``) unless it
    holds it or a newer one; with ``test`` only report.
    """
    report = multimaster_cluster.aes_plan(answer["held"], own, test)
    if report:
        return report
    entry = multimaster_control.by_id(section)[master]
    problem = multimaster_masterkey.recipient_problem(run, entry, {}, planning=True)
    if problem:
        return {"result": False, "error": problem}
    try:
        envelope = multimaster_cluster.aes_envelope(
            key,
            own,
            entry["minion_id"],
            multimaster_control.primary_key_entry(run, entry["minion_id"])[1],
            multimaster_control.signer_key(run),
            multimaster_control.bound(
                multimaster_control.binding(answer, master, section), sender=run.opts["id"]
            ),
        )
    except ValueError as exc:
        return {"result": False, "error": str(exc)}
    done, error = multimaster_control.call_one(
        run, section, master, "install_cluster_aes", {"envelope": envelope}, timeout
    )
    if error is not None:
        return {"result": False, "error": error}
    return multimaster_cluster.aes_result(done)


def share_cluster_aes(run, masters=None, test=False, timeout=60):
    """
    The runner's ``share_cluster_aes``: give each other master of ``masters`` (default all)
    this master's cluster AES key when it is newer than theirs, never to a control minion that
    must not receive a secret (``multimaster_masterkey.recipient_problem``); returns the report.
    """
    try:
        section, chosen = cluster_section(run, masters, "the cluster AES key exists")
        key, own = multimaster_cluster.own_aes(run.opts)
    except SaltInvocationError as exc:
        return multimaster_control.refused(run, exc)
    peers = [m for m in chosen if m != multimaster_control.this_master(run, section)]
    answers, errors = multimaster_control.call(
        run, section, peers, "cluster_aes_info", {}, timeout, multimaster_cluster.aes_info_check
    )
    report = {m: {"result": False, "error": errors[m]} for m in peers if m in errors}
    for master in peers:
        if master in answers:
            report[master] = _share_aes_one(
                run, section, master, answers[master], key, own, test, timeout
            )
    del key
    ret = {"masters": report}
    if test:
        ret["test"] = True
    return multimaster_control.finish(run, ret, not all(r["result"] for r in report.values()))


def key_agreement(run, section, timeout):
    """
    ``(aes report, aes differ, key pair report, pair differs)``: ``multimaster_cluster.
    aes_agreement`` and ``cluster_key_agreement`` over every master of ``section``, this
    master's keys read here, each other's asked of its control minion (``cluster_aes_info``).
    """
    here = multimaster_control.this_master(run, section)
    held = {here: multimaster_cluster.held_aes(run.opts)} if here else {}
    pairs = {here: multimaster_cluster.held_cluster_key(run.opts)} if here else {}
    peers = [m for m in multimaster_control.ids(section) if m != here]
    answers, errors = multimaster_control.call(
        run, section, peers, "cluster_aes_info", {}, timeout, multimaster_cluster.aes_info_check
    )
    held.update({m: answer["held"] for m, answer in answers.items()})
    pairs.update({m: answer.get("cluster_key") for m, answer in answers.items()})
    return (
        *multimaster_cluster.aes_agreement(held, errors),
        *multimaster_cluster.cluster_key_agreement(pairs, errors),
    )


def cluster_aes_rotated(run, timeout=60):
    """
    The runner's ``cluster_aes_rotated``: share the cluster AES key this master holds, once per
    key within ``AES_REPEAT_WINDOW`` seconds; returns the report.
    """
    own = multimaster_cluster.held_aes(run.opts) if run.opts.get("cluster_id") else None
    if own is None:
        return multimaster_control.finish(
            run, {"comment": "this master holds no cluster AES key; nothing shared"}, False
        )
    with multimaster_reactor.claimed(
        run.opts, "cluster_aes", "cluster", own["digest"], AES_REPEAT_WINDOW
    ) as claim:
        if not claim:
            return multimaster_control.finish(
                run, {"comment": "this key was shared moments ago; nothing to do"}, False
            )
        return share_cluster_aes(run, timeout=timeout)


MEMBERS_FAILED = "cluster.members failed on this master (its log has why)"


def members(opts):
    """
    What ``cluster.members`` returns on the master of ``opts`` (Salt's Raft membership as it
    has applied it: voters, learners, ``leader_id``); ``{"error": MEMBERS_FAILED}`` when the
    runner fails. Salt returns a runner's traceback as its text: logged, never returned.
    """
    try:
        found = salt.runner.RunnerClient(opts).cmd("cluster.members", print_event=False)
    except Exception as exc:  # pylint: disable=broad-except
        found = exc
    if not isinstance(found, dict):
        log.warning("multimaster: cluster.members failed: %s", found)
        return {"error": MEMBERS_FAILED}
    return found


def started_master(run):
    """
    When this master's running salt-master started, if it wrote Salt's ``startup`` sentinel
    since (``multimaster_cluster.started``), else None.
    """
    config_dir = os.path.dirname(run.opts.get("conf_file") or "")
    return multimaster_cluster.started(run.opts["pidfile"], config_dir, run.opts["cachedir"])


def nudge_raft(run):
    """
    Propose the no-op Raft entry (fired on this master's bus, carried to the leader), once. 1
    when the bus took it, else 0.
    """
    if multimaster_reactions.fire_on_own_bus(run, *multimaster_cluster.nudge_event(), 1):
        log.info("multimaster: proposed a no-op Raft entry so that restarted masters get ready")
        return 1
    return 0


def cluster_ready(run, timeout=120, interval=1):
    """
    The runner's ``cluster_ready``: propose the no-op Raft entry (``nudge_raft``)
    every ``NUDGE_INTERVAL`` seconds until this master is ready; returns the report.
    """
    try:
        multimaster_cluster.check_mode(
            multimaster_control.section(run), "readiness is a cluster matter"
        )
    except SaltInvocationError as exc:
        return multimaster_control.refused(run, exc)
    start, nudges, next_nudge = time.monotonic(), 0, 0.0
    while True:
        waited = time.monotonic() - start
        since = started_master(run)
        # Proposed even when this master is ready: a restarted peer that won may need it.
        if since is not None and waited >= next_nudge:
            nudges += nudge_raft(run)
            next_nudge = waited + NUDGE_INTERVAL
        if since is not None and multimaster_cluster.ready(run.opts["cachedir"], since):
            ret = {"ready": True, "waited": round(waited, 1), "nudges": nudges}
            return multimaster_control.finish(run, ret, False)
        if waited > float(timeout):
            ret = {"ready": False, "comment": f"not ready after {timeout}s", "nudges": nudges}
            return multimaster_control.finish(run, ret, True)
        time.sleep(float(interval))
