"""
The master-host side of the ``multimaster`` runners: key inventory, key actions, master key
install, served-key checks and reports, run by a master's control minion.

Grant this module to no publisher ACL: only the ``multimaster`` runners call it. It trusts no
caller anyway. Every path (config dir, pki dir, pidfile) comes from this minion's pillar
(``multimaster:masters``, the entry whose ``minion_id`` is this minion), never from arguments.
Every change is authorised by an order or envelope signed by the master this minion trusts
(``minion_master.pub``) and bound to a single-use challenge this minion issued, this master and
its config dir: a copy from a job cache cannot be replayed. Policy is re-checked here: a
rejected or denied key is never accepted, whatever the order says.

The other way round, every function here takes ``answer_nonce``: the runner's nonce for that
one publish (64 hex characters). Given it, the answer (or why the function failed) comes back
signed with this control minion's own key (``minion.pem``) over the function, the master it
speaks for, the nonce and the answer's digest, and the runner uses it only when the signature
verifies with this minion's key as accepted on its master: Salt 3008 takes a return's minion
id on the sender's word (``resource_id``), so any minion could answer under this one's id.
"""

import contextlib
import functools
import hashlib
import inspect
import logging
import os
import time

import salt.channel.client
import salt.payload
import salt.utils.atomicfile
import salt.utils.files
import salt.utils.json
from salt.exceptions import (
    CommandExecutionError,
    SaltException,
    SaltInvocationError,
    SaltReqTimeoutError,
)

try:
    import multimaster_cluster
    import multimaster_daemon
    import multimaster_handshake
    import multimaster_ids
    import multimaster_jobcache
    import multimaster_keys
    import multimaster_keystore
    import multimaster_roots
    import multimaster_safefs
    import multimaster_saltcompat
    import multimaster_seal
    import multimaster_settings
    import multimaster_transport

    HAS_UTILS = True
except ImportError:
    HAS_UTILS = False

log = logging.getLogger(__name__)

__virtualname__ = "multimaster_peer"

# How many ids a return lists; counts are always complete.
SAMPLE = 50
# The largest transfer accepted: key actions for a large fleet, a sealed key pair.
ACTIONS_LIMIT = 256 * 1024 * 1024
ENVELOPE_LIMIT = 1024 * 1024
PULL_TIMEOUT = 60


def __virtual__():
    if not HAS_UTILS:
        return (False, "multimaster_peer: the multimaster_* utils are missing; run sync_all")
    return __virtualname__


# --- local settings --------------------------------------------------------------------------


def _local():
    """
    This host's master entry (``config_dir`` resolved) and the ``multimaster`` pillar section.
    """
    pillar = multimaster_saltcompat.pillar_section(__salt__, "multimaster")
    try:
        section = multimaster_settings.check_section(pillar)
    except SaltInvocationError as exc:
        raise CommandExecutionError(f"{__opts__['id']}: {exc}") from None
    master = multimaster_settings.local_master(
        section, __opts__["id"], os.path.dirname(__opts__["conf_file"])
    )
    if master is None:
        raise CommandExecutionError(
            f"{__opts__['id']} is not the control minion of any master in the pillar "
            "multimaster:masters (target that pillar at the masters' control minions)"
        )
    return master, section


def _mopts():
    master, _ = _local()
    return master, multimaster_keystore.master_opts(master["config_dir"])


def _challenges():
    return multimaster_seal.ChallengeStore(
        os.path.join(__opts__["cachedir"], "multimaster", "challenges")
    )


def _binding(master):
    """
    A fresh challenge and what the runner must bind its next order to.
    """
    return {
        "challenge": _challenges().issue(),
        "target": master["id"],
        "config_dir": master["config_dir"],
    }


def _read_own(name):
    with salt.utils.files.fopen(os.path.join(__opts__["pki_dir"], name)) as handle:
        return handle.read()


def _expect(master):
    return {"target": master["id"], "config_dir": master["config_dir"]}


# --- signed answers --------------------------------------------------------------------------


def _speaks_for():
    """
    The id of the master this control minion serves, or None when its pillar does not say (its
    answer is then the reason).
    """
    try:
        return _local()[0]["id"]
    except CommandExecutionError:
        return None


def _answered(name, call):
    """
    ``(answer, failed)`` of ``call()``: its answer, or why it failed. A refusal keeps its
    sentence; anything else is named by its type, its text going to this minion's log only.
    """
    try:
        return call(), False
    except SaltException as exc:
        return str(exc), True
    except Exception as exc:  # pylint: disable=broad-except
        log.exception("multimaster: %s failed", name)
        return (
            f"{name} failed on {__opts__['id']}: {type(exc).__name__} (its minion log has the "
            "details)",
            True,
        )


def _signed_answer(function):
    """
    ``function``, taking ``answer_nonce`` too: given it, the answer (or why the function
    failed) is returned signed for that nonce (see the module's docstring); without it, as it
    is (the CLI, and functions here calling each other). Salt's minion matches a publish's
    arguments with the signature it reads from ``__signature__``.
    """
    name = function.__name__

    @functools.wraps(function)
    def answer(*args, answer_nonce=None, **kwargs):
        if answer_nonce is None:
            return function(*args, **kwargs)
        result, failed = _answered(name, lambda: function(*args, **kwargs))
        return multimaster_seal.sign_answer(
            result, name, _speaks_for(), answer_nonce, _read_own("minion.pem"), failed=failed
        )

    # Salt follows ``__wrapped__`` to the inner signature, which lacks the nonce; and Salt 3006
    # passes a publish only the keyword arguments its argspec lists as positional-or-keyword.
    del answer.__wrapped__
    signature = inspect.signature(function)
    nonce = inspect.Parameter("answer_nonce", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)
    answer.__signature__ = signature.replace(parameters=[*signature.parameters.values(), nonce])
    return answer


# --- minion keys -----------------------------------------------------------------------------


@_signed_answer
def key_inventory(buckets=None, ids=None, with_pubs=False):
    """
    This master's minion-key inventory. Without ``buckets``/``ids``: only digests (the total and
    one per bucket), the count and whether an interrupted run needs repair — a few KB whatever
    the number of keys. With ``buckets`` (bucket numbers) or ``ids`` (minion ids): the entries
    ``{id: [state, fp, ...]}`` in them and, with ``with_pubs``, their public keys. Every return
    carries a fresh challenge for the runner's next order (``binding``). Records the accepted
    and pending ids it read in the store's record of held keys (what the key reactor checks a
    delete event against).

    buckets
        List of digest bucket numbers whose entries to return.

    ids
        List of minion ids whose entries to return.

    with_pubs
        Also return the public keys of the returned entries.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster_peer.key_inventory
        salt master2 multimaster_peer.key_inventory ids='[minion1]' with_pubs=True
    """
    master, mopts = _mopts()
    alive = _master_alive(master, mopts)
    wanted = None
    if ids is not None:
        wanted = {multimaster_ids.check_id(i, "minion id") for i in ids}
    elif buckets is not None:
        chosen = {int(b) for b in buckets}
        wanted = lambda minion_id: multimaster_keys.bucket_of(minion_id) in chosen  # noqa: E731
    full_scan = wanted is None
    with _fingerprint_cache(mopts, full_scan) as fp_cache:
        entries, pubs = multimaster_keystore.inventory(
            mopts, with_pubs=with_pubs, ids=wanted, fp_cache=fp_cache
        )
    # What the key reactor on this master checks a delete event against.
    multimaster_keystore.note_held(mopts, entries, wanted)
    ret = {"alive": alive, "binding": _binding(master)}
    if full_scan:
        total, per_bucket = multimaster_keys.digests(entries)
        ret.update(
            digest=total,
            buckets=per_bucket,
            count=len(entries),
            repair=multimaster_keystore.repair_needed(mopts),
        )
        return ret
    ret.update(entries=entries, pubs=pubs)
    return ret


@contextlib.contextmanager
def _fingerprint_cache(mopts, full_scan):
    """
    Fingerprints of this master's key files from the last full scan, kept in this minion's
    cachedir (public data only): a re-run reads only the files that changed.
    """
    name = hashlib.sha256(mopts["pki_dir"].encode()).hexdigest()[:16]
    path = os.path.join(__opts__["cachedir"], "multimaster", f"fingerprints-{name}.p")
    try:
        with salt.utils.files.fopen(path, "rb") as handle:
            known = salt.payload.load(handle)
    except (OSError, ValueError, TypeError):
        known = {}
    cache = multimaster_keystore.FingerprintCache(known if isinstance(known, dict) else {})
    yield cache
    if full_scan and cache.changed:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with salt.utils.atomicfile.atomic_open(path, "wb") as handle:
            salt.payload.dump(cache.seen, handle)


def _master_alive(master, mopts):
    """
    Is this host's salt-master running (a verified pid) and listening on its ret port?
    """
    if multimaster_daemon.verified_pid(mopts["pidfile"], "salt-master", master["config_dir"]):
        host = mopts["interface"]
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return multimaster_daemon.wait_port(host, mopts["ret_port"], timeout=2)
    return False


@_signed_answer
def master_settled():
    """
    Is this host's salt-master up (a verified pid listening on its ret port) with no restart of
    it or of this control minion pending (``multimaster.master_restarted``/``minion_restarted``)?
    What ``multimaster.wait_masters`` polls.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster_peer.master_settled
    """
    master, mopts = _mopts()
    up = bool(_master_alive(master, mopts))
    # This control minion's own restart (multimaster.minion) counts too: until it has happened
    # the runners would lose it mid-call.
    pending = any(
        multimaster_daemon.restart_pending(pidfile)
        for pidfile in (mopts["pidfile"], __opts__["pidfile"])
    )
    return {"up": up, "restart_pending": pending, "settled": up and not pending}


def _checked(action):
    """
    ``(action, canonical pem)`` after checking id, op and that the key is canonical and has the
    planned fingerprint; raises before anything is written.
    """
    if not isinstance(action, dict):
        raise CommandExecutionError(f"key action {action!r} is not a mapping")
    multimaster_ids.check_id(action.get("id"), "minion id")
    if action.get("op") not in multimaster_keystore.TARGET_STATE:
        raise CommandExecutionError(f"unknown key action {action.get('op')!r}")
    if action["op"] == "delete":
        return action, None
    pem = multimaster_keys.canonical(action.get("pub"), f"key of {action['id']!r}")
    if multimaster_keys.fingerprint(pem) != action.get("fp"):
        raise multimaster_keys.InvalidKeyError(
            f"key of {action['id']!r}: fingerprint {multimaster_keys.fingerprint(pem)} "
            f"does not match the planned {action.get('fp')}"
        )
    return action, pem


def _puller():
    """
    ``pull(ticket, offset)``: one chunk of a transfer staged for this minion, from the master
    that sent this job (``peer_run`` on the request channel of the minion connection that
    received it). Made in the job's thread: the transport pulls from a worker thread, where
    Salt 3006/3007 resolve no loader global (``__salt__``), so the function is looked up here.
    """
    runner = __salt__["publish.runner"]

    def pull(ticket, offset):
        return runner(
            multimaster_transport.PULL,
            arg=[f"ticket={ticket}", f"offset={offset}"],
            timeout=PULL_TIMEOUT,
        )

    return pull


class _ContentPull:
    """
    ``pull(ticket, offset)`` for a roots plan or content stream: through the file server of
    the master that sent this job (``_serve_file`` on this minion's request channel to it: no
    runner job there, one key load per ``REQUESTS_PER_CHANNEL`` here), or through its
    ``peer_run`` pull when that file server does not serve transfers (its
    ``fileserver_backend`` does not name ``multimaster`` yet, or it has not been restarted
    since) or refuses a published ticket to a request without an id (Salt before 3008).
    ``via`` says which; ``close`` when the stream is done.
    """

    # Requests per channel: Salt's request channel keeps what it received while it is open
    # (a channel kept for a 200 MB stream grew the minion by 220 MB in bench_sync_roots), and
    # a new channel loads this minion's key again (a channel per 1 MiB chunk: 18 s, not 10 s).
    REQUESTS_PER_CHANNEL = 16

    def __init__(self):
        # Made in the job's thread, called from the transport's worker thread (see _puller).
        self.via = "fileserver"
        self._opts = dict(__opts__)
        self._peer_run = _puller()
        self._channel = None
        self._requests = 0

    def _fileserver_pull(self, ticket, offset):
        if self._requests == self.REQUESTS_PER_CHANNEL:
            self.close()
        if self._channel is None:
            self._channel = salt.channel.client.ReqChannel.factory(self._opts)
            self._requests = 0
        self._requests += 1
        load = {
            "cmd": "_serve_file",
            "path": multimaster_transport.FILESERVER_PREFIX + ticket,
            "loc": offset,
            "saltenv": "base",
        }
        try:
            return self._channel.send(load, timeout=PULL_TIMEOUT)
        except SaltReqTimeoutError:
            return {"error": f"the file server did not answer within {PULL_TIMEOUT} s"}

    def __call__(self, ticket, offset):
        if self.via == "fileserver":
            answer = self._fileserver_pull(ticket, offset)
            if (
                isinstance(answer, dict)
                and answer.get("error") != multimaster_transport.NEEDS_ID
                and {"error", "offset", "done"} & set(answer)
            ):
                return answer
            if offset:
                return {"error": f"the file server stopped serving the transfer at {offset}"}
            # Salt's answer for a path no backend has, or a Salt that signs no id into the
            # request for a ticket that needs one: pull the same ticket by peer_run.
            self.via = "peer_run"
        return self._peer_run(ticket, offset)

    def close(self):
        """
        Close the request channel, if one was opened.
        """
        if self._channel is not None:
            self._channel.close()
            self._channel = None


def _pulled(transfer, limit, pull=None):
    return multimaster_transport.fetch(transfer, pull or _puller(), limit)


def _pulled_json(transfer, limit, what, pull=None):
    try:
        return salt.utils.json.loads(_pulled(transfer, limit, pull))
    except ValueError:
        raise CommandExecutionError(f"{what}: the pulled transfer is not JSON") from None


@_signed_answer
def apply_key_actions(transfer, order):
    """
    Apply planned key actions to this master's key store: each ``{"id", "op"
    (accept|pend|reject|deny|delete), "fp", "pub", "expect"}``, pulled from the sending master
    (``transfer``). ``order`` is the runner's signature over the actions, bound to a challenge
    from ``key_inventory``; without a valid one nothing happens. Every id and key is checked
    before anything is written (a bad one refuses the whole batch); an action whose id changed
    since it was planned (``expect``) is skipped, and so is an accept of a key rejected or
    denied here (deny wins). Repairs what an interrupted run left, and rotates the AES key when
    an accepted key was removed.

    transfer
        The descriptor of the staged actions (``{"ticket", "size", "sha256"}``).

    order
        The signed order from the runner.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.sync_keys   # the runner calls this; not meant for the CLI
    """
    master, mopts = _mopts()
    instruction = _pulled_json(transfer, ACTIONS_LIMIT, "key actions")
    actions = instruction.get("actions") if isinstance(instruction, dict) else None
    if not isinstance(actions, list):
        raise CommandExecutionError("key actions: the pulled transfer holds no action list")
    multimaster_seal.check_order(
        order,
        {"actions": actions},
        "key_actions",
        __opts__["id"],
        _read_own("minion_master.pub"),
        _expect(master),
        _challenges(),
    )
    checked = [_checked(action) for action in actions]
    start = time.monotonic()
    done = multimaster_keystore.apply_actions(mopts, checked)
    log.info("multimaster: %d key change(s) in %.2fs", len(done["done"]), time.monotonic() - start)
    counts = {}
    for item in done["done"]:
        counts[item["op"]] = counts.get(item["op"], 0) + 1
    # Counts and a sample: a 10,000-key return would cost more on the wire than the work itself.
    return {
        "changes": counts,
        "ids": sorted(item["id"] for item in done["done"])[:SAMPLE],
        "skipped": done["skipped"][:SAMPLE],
        "skipped_count": len(done["skipped"]),
        "repaired": done["repaired"][:SAMPLE],
        "rotated": done["rotated"],
    }


# --- cluster peer keys -----------------------------------------------------------------------


def _cluster_local():
    """
    ``(master, section, mopts, peers dir)`` of this host's cluster master; refuses any other mode.
    """
    master, section = _local()
    mopts = multimaster_keystore.master_opts(master["config_dir"])
    return master, section, mopts, multimaster_cluster.member_peers_dir(master, section, mopts)


@_signed_answer
def cluster_peer_keys():
    """
    The cluster peer public keys this master holds (``cluster_pki_dir/peers/<id>.pub``, by
    fingerprint) and a challenge for the runner's next order. Public data only.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.share_peer_keys   # the runner calls this
    """
    master, _, _, peers_dir = _cluster_local()
    return {"held": multimaster_cluster.held_peer_keys(peers_dir), "binding": _binding(master)}


@_signed_answer
def install_cluster_peer_keys(keys, order):
    """
    Add the cluster peer public keys ``keys`` (``{master address: PEM}``) this master lacks to
    its ``cluster_pki_dir/peers/``. ``order`` is the runner's signature over them, bound to a
    challenge from ``cluster_peer_keys``; without a valid one nothing happens. Only the other
    configured masters of the pillar, only a strict RSA public key; a key that differs from one
    held here is never replaced (a conflict: a forged key would let its holder read the peers'
    AES keys). Every key is checked before any is written.

    keys
        ``{address: PEM}`` of the peers.

    order
        The signed order from the runner.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.share_peer_keys   # the runner calls this; not meant for the CLI
    """
    master, section, _, peers_dir = _cluster_local()
    multimaster_cluster.check_peer_keys(
        keys, order, __opts__["id"], _read_own("minion_master.pub"), _expect(master), _challenges()
    )
    return multimaster_cluster.install_peer_keys(peers_dir, keys, master, section)


@_signed_answer
def cluster_aes_info():
    """
    The stamp and digest of the cluster's AES key this master holds (``cluster_pki_dir/.aes``;
    None before its first start) and a challenge for the runner's next envelope. Never the key.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.share_cluster_aes   # the runner calls this
    """
    master, _, mopts, _ = _cluster_local()
    return {"held": multimaster_cluster.held_aes(mopts), "binding": _binding(master)}


@_signed_answer
def install_cluster_aes(envelope):
    """
    Install the cluster's AES key sealed to this control minion by ``share_cluster_aes``, if it
    is newer than the one this master holds (``multimaster_cluster.newer``), and make the
    running salt-master re-read it (no restart). The envelope must be signed with the cluster's
    key and bound to a challenge from ``cluster_aes_info``, this master and its config dir.
    Never returns or logs the key.

    envelope
        The sealed key: small, and sealed to this minion's key, so it travels in the publish
        (no pull channel crosses the masters of a cluster).

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.share_cluster_aes   # the runner calls this; not meant for the CLI
    """
    master, _, mopts, _ = _cluster_local()
    key, stamp, sender = multimaster_cluster.open_aes_envelope(
        envelope,
        __opts__["id"],
        _read_own("minion.pem"),
        _read_own("minion_master.pub"),
        _expect(master),
        _challenges(),
    )
    return multimaster_cluster.install_shared_aes(mopts, key, stamp, sender)


# --- master key ------------------------------------------------------------------------------


@_signed_answer
def master_key_info(signing=False):
    """
    The public master key this master stores (or, with ``signing``, its signing key), Salt's
    ``salt-key -F`` value for it, and a challenge for the runner's next envelope. Public data
    only; the runner computes the fingerprint itself.

    signing
        Report the signing pair (``master_sign.pub``) instead of the master key.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster_peer.master_key_info
    """
    master, mopts = _mopts()
    pub = multimaster_keystore.read_master_key(mopts, signing=signing)
    return {
        "name": multimaster_keystore.master_key_files(mopts, signing)[1],
        "pub": pub,
        "own_pub": multimaster_keystore.read_master_key(mopts) if signing else pub,
        "salt_finger": pub and multimaster_keys.salt_finger(pub),
        "binding": _binding(master),
    }


def _verify_served(host, port, pub, sign_pub=None, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        ok, reason = multimaster_handshake.serves(__opts__, host, port, pub, sign_pub, timeout=5)
        if ok or time.monotonic() > deadline:
            return ok, reason
        time.sleep(1)


def _served_args(mopts, pub, signing):
    # What a sign-in must prove: the master's own key, and in signing mode the signing pair too.
    if signing:
        return multimaster_keystore.read_master_key(mopts), pub
    return pub, None


def _opened_pair(envelope, master, signing):
    """
    Open the envelope (signed by the trusted master, bound to this master and a challenge of
    ours) and check the pair it carries. Returns ``(pem, pub, fp)``.
    """
    purpose = "master_sign" if signing else "master_key"
    body, bound = multimaster_seal.unseal(
        envelope,
        purpose,
        __opts__["id"],
        _read_own("minion.pem"),
        _read_own("minion_master.pub"),
        _expect(master),
        _challenges(),
    )
    pub = multimaster_keys.canonical(body.get("pub"), "sealed public key")
    fp = multimaster_keys.fingerprint(pub)
    if bound.get("fp") != fp:
        raise CommandExecutionError(f"sealed key {fp} is not the bound fingerprint {bound['fp']}")
    if multimaster_keys.private_key_fingerprint(body["pem"]) != fp:
        raise CommandExecutionError("sealed key pair: the private key does not match the public")
    return body.pop("pem"), pub, fp


@_signed_answer
def install_master_key(transfer, signing=False, timeout=90):
    """
    Install the master key pair (or signing pair) sealed to this control minion by the
    ``sync_master_key`` runner: open and verify the envelope, stop this host's master, store the
    pair through the key store, start the master again the way it ran (also when the store
    failed), wait until it answers, and verify by a real sign-in that it serves the new key.
    Never returns or logs the key.

    transfer
        The descriptor of the sealed envelope the runner staged (``{"ticket", "size",
        "sha256"}``).

    signing
        The envelope carries the signing pair (failover with signing) instead of the master key.

    timeout
        Seconds to wait for the restarted master.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.sync_master_key   # the runner calls this; not meant for the CLI
    """
    master, section = _local()
    mopts = multimaster_keystore.master_opts(master["config_dir"])
    host, port = master["host"], int(section["ports"]["ret"])
    envelope = _pulled_json(transfer, ENVELOPE_LIMIT, "master key")
    pem, pub, fp = _opened_pair(envelope, master, signing)
    result = {"fp": fp, "changed": False, "restarted": None}
    current = multimaster_keystore.read_master_key(mopts, signing=signing)
    if current and multimaster_keys.fingerprint(current) == fp:
        ok, reason = _verify_served(host, port, *_served_args(mopts, pub, signing), timeout=10)
        if ok:
            return dict(result, served=True, reason=reason)
    service = _service(section)
    # Swap only while the master is stopped: a running master keeps its private key in memory.
    stopped = multimaster_daemon.stop_now(
        mopts["pidfile"], service, "salt-master", master["config_dir"]
    )
    try:
        multimaster_keystore.install_master_key(mopts, pem, pub, signing=signing)
    finally:
        del pem
        multimaster_daemon.start_now(stopped, "salt-master", master["config_dir"])
    result.update(changed=True, restarted=stopped["service"] or "daemon")
    if not multimaster_daemon.wait_port(host, port, timeout):
        return dict(result, served=False, reason=f"master did not listen on {host}:{port}")
    ok, reason = _verify_served(host, port, *_served_args(mopts, pub, signing), timeout=timeout)
    return dict(result, served=ok, reason=reason)


def _service(section):
    return section.get("lookup", {}).get("master", {}).get("service", "salt-master")


@_signed_answer
def verify_master_key(host, port, pub, sign_pub=None, timeout=30):
    """
    Does the master at ``host:port`` serve ``pub`` (and sign it with ``sign_pub``'s pair)?
    Checked by a real sign-in with this minion's own key, which must be accepted there. Changes
    nothing.

    host, port
        The master's address and ret port.

    pub
        The public key the master should serve (PEM).

    sign_pub
        The signing public key (PEM) the master's signature must verify with, in signing mode.

    timeout
        Seconds to keep trying.

    CLI Example:

    .. code-block:: bash

        salt master1 multimaster_peer.verify_master_key 127.0.0.3 4506 "$(cat master.pub)"
    """
    ok, reason = _verify_served(host, int(port), pub, sign_pub, timeout=float(timeout))
    return {"served": ok, "reason": reason}


# --- reports ---------------------------------------------------------------------------------


@_signed_answer
def master_report(signing=False, ping_timeout=5):
    """
    What ``salt-run multimaster.status`` needs from this host in one call: the key inventory
    digests, the stored master key (or signing key), problems of the key store, the digest of
    each root this master serves from disk, the commits it serves per git remote, whether its
    job cache database answers, and the minions that answer ``test.ping`` from this master.

    signing
        Report the signing key instead of the master key.

    ping_timeout
        Seconds the ``test.ping`` waits for minions.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster_peer.master_report
    """
    report = {
        "keys": key_inventory(),
        "master_key": master_key_info(signing=signing),
        "store_problems": _store_problems(signing),
        "answering": [],
    }
    for part in ("keys", "master_key"):
        report[part].pop("binding")
    _, mopts = _mopts()
    report["roots"] = _manifests(mopts, multimaster_roots.synced_kinds(mopts)[0])[0]
    report["git"] = multimaster_roots.served_commits(mopts)
    report["job_cache"] = multimaster_jobcache.check(mopts)
    report["alive"] = report["keys"]["alive"]
    if report["alive"]:
        report["answering"] = ping_minions(timeout=ping_timeout)
    return report


def _store_problems(signing):
    _, mopts = _mopts()
    problems = multimaster_keystore.store_problems(mopts)
    problems += multimaster_keystore.master_key_pair_problems(mopts)
    if signing:
        problems += multimaster_keystore.master_key_pair_problems(mopts, signing=True)
    return problems


@_signed_answer
def ping_minions(timeout=5):
    """
    The minions that answer ``test.ping`` published by this host's master.

    timeout
        Seconds to wait for returns.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster_peer.ping_minions
    """
    import salt.client

    master, _ = _local()
    with salt.client.get_local_client(os.path.join(master["config_dir"], "master")) as client:
        returns = client.cmd("*", "test.ping", timeout=int(timeout))
    return sorted(minion for minion, ret in returns.items() if ret is True)


# --- roots -----------------------------------------------------------------------------------

ROOT_KINDS = ("file_roots", "pillar_roots")
PLAN_LIMIT = 64 * 1024 * 1024


def _roots_of(mopts, kind):
    """
    ``{env: [path, ...]}`` of this master's ``kind`` (its own config; never an argument).
    """
    roots = mopts.get(kind) or {}
    return {env: [str(path) for path in paths] for env, paths in roots.items()}


def _manifests(mopts, kinds):
    """
    ``(roots, files, modes)`` of this master's ``kinds``: per kind, env and position the root's
    path, digest, file count and skipped entries (``_summary``); and the file manifests and
    directory modes in the same shape.
    """
    found = multimaster_roots.manifests(mopts, kinds)
    roots = {
        kind: {env: [_summary(kind, r) for r in rs] for env, rs in envs.items()}
        for kind, envs in found.items()
    }
    files, modes = (
        {
            kind: {env: [r[part] for r in rs] for env, rs in envs.items()}
            for kind, envs in found.items()
        }
        for part in ("files", "dirs")
    )
    return roots, files, modes


def _summary(kind, root):
    """
    What a return may say of one root's manifest: its path, digest, file count and how many
    entries were skipped, with a sample of those (path and why) for ``file_roots`` only: the
    names of pillar files are for sealed manifests.
    """
    summary = {
        "path": root["path"],
        "digest": root["digest"],
        "count": len(root["files"]),
        "skipped_count": len(root["skipped"]),
    }
    if kind != "pillar_roots":
        summary["skipped"] = dict(list(root["skipped"].items())[:SAMPLE])
    return summary


def _narrowed(files, modes, dirs):
    """
    ``(files, modes, partial)`` in the shape of ``files``: each root's manifest and directory
    modes cut down to the directories whose digests differ from the primary's ``dirs`` (the
    directories themselves in ``partial``), or whole (``None`` in ``partial``) where ``dirs``
    says nothing usable.
    """
    narrowed, cut_modes, partial = {}, {}, {}
    for kind, envs in files.items():
        for env, roots in envs.items():
            theirs = dirs.get(kind, {}).get(env) if isinstance(dirs, dict) else None
            for index, manifest in enumerate(roots):
                mine = modes[kind][env][index]
                digests = (
                    theirs[index] if isinstance(theirs, list) and index < len(theirs) else None
                )
                if not isinstance(digests, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in digests.items()
                ):
                    cut, where = manifest, None
                else:
                    where = multimaster_roots.differing_dirs(manifest, digests, mine)
                    cut = multimaster_roots.within(manifest, where)
                    mine = multimaster_roots.modes_within(mine, where)
                narrowed.setdefault(kind, {}).setdefault(env, []).append(cut)
                cut_modes.setdefault(kind, {}).setdefault(env, []).append(mine)
                partial.setdefault(kind, {}).setdefault(env, []).append(where)
    return narrowed, cut_modes, partial


@_signed_answer
def roots_manifest(kinds=ROOT_KINDS, full=False, nonce=None, unless=None, dirs=None):
    """
    The roots of this host's master (``file_roots``/``pillar_roots`` of its own config): per
    kind, per environment, per position ``{"path", "digest", "count", "skipped_count"}`` (and
    ``skipped``, a sample, for ``file_roots``), and every
    root's real path (``real``, both kinds: how they overlap). With ``full`` the file
    manifests and directory modes too, sealed to the master that asked (names and hashes of
    pillar files are not for the job cache) and bound to its ``nonce``. Always returns a fresh
    ``binding`` challenge for the ``apply_roots`` order that may follow.

    kinds
        Which roots: a list of ``file_roots``/``pillar_roots``.

    full
        Also return the manifests (sealed).

    nonce
        The runner's nonce (64 hex characters) the sealed manifests are bound to.

    unless
        The primary's digests (``{kind: {env: [digest, ...]}}``): with ``full``, the manifests
        of a kind are left out when this master's digests of that kind equal them (nothing to
        sync: one round). The runner never publishes those of ``pillar_roots``.

    dirs
        The primary's per-directory digests (``{kind: {env: [{dir: digest}, ...]}}``): with
        ``full``, each manifest holds only the directories where the trees differ (whole
        where a kind has none: ``pillar_roots``).

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.sync_roots test=True   # the runner calls this
    """
    master, mopts = _mopts()
    roots, files, modes = _manifests(mopts, [kind for kind in kinds if kind in ROOT_KINDS])
    ret = {
        "roots": roots,
        "real": multimaster_roots.real_layout(mopts),
        "binding": _binding(master),
    }
    mine, theirs = multimaster_roots.digests(roots), unless if isinstance(unless, dict) else {}
    differing = {kind: envs for kind, envs in files.items() if mine[kind] != theirs.get(kind)}
    if full and differing:
        files, modes, partial = _narrowed(differing, modes, dirs)
        ret["sealed"] = multimaster_seal.seal(
            {"files": files, "dir_modes": modes, "dirs": partial},
            "roots_manifest",
            master["id"],
            _read_own("minion_master.pub"),
            _read_own("minion.pem"),
            multimaster_seal.bind(nonce, master["id"], master["config_dir"]),
        )
    return ret


def _paired_root(mopts, pair):
    """
    This master's root for ``pair`` (kind, env, position), from its own config.
    """
    kind, env, index = pair.get("kind"), pair.get("env"), pair.get("index")
    paths = _roots_of(mopts, kind).get(env) if kind in ROOT_KINDS else None
    if not paths or not isinstance(index, int) or not 0 <= index < len(paths):
        raise CommandExecutionError(f"no {kind} root at position {index!r} of env {env!r} here")
    return paths[index]


def _failure(root, pair, what, exc):
    """
    One line of the apply report: the root, and for ``file_roots`` ``what`` failed (a quoted
    path, or what the step was) and the error; for ``pillar_roots`` only why, without a path
    (the names of pillar files never leave the sealed manifests and plan: a return lands in
    job caches).
    """
    if pair.get("kind") == "pillar_roots":
        reason = getattr(exc, "reason", None) or exc.strerror or "refused"
        return f"{root}: a pillar file or directory: {reason}"
    return f"{root}: {what}: {exc}"


def _write_all(reader, root, pair, report):
    synced_dirs = set()
    for entry in pair.get("write") or []:
        blocks = reader.blocks(entry["size"])
        try:
            multimaster_safefs.write_file(
                root, entry["path"], blocks, entry["mode"], entry["sha256"], synced_dirs
            )
            report["written"] += 1
            report["bytes"] += entry["size"]
        except OSError as exc:
            report["failed"].append(_failure(root, pair, repr(entry["path"]), exc))
        # Keep the stream aligned: what a refused write did not read belongs to this file.
        for _ in blocks:
            pass
    try:
        multimaster_safefs.sync_dirs(root, synced_dirs)
    except OSError as exc:
        report["failed"].append(_failure(root, pair, "syncing the directories written", exc))


def _set_dir_modes(root, pair, report):
    """
    Give the directories of ``pair`` their planned modes (those that exist: the writes make
    the others, private until the next call).
    """
    for directory, mode in pair.get("dirs") or []:
        try:
            report["dir_modes"] += multimaster_safefs.set_dir_mode(root, directory, mode)
        except OSError as exc:
            report["failed"].append(_failure(root, pair, repr(directory), exc))


def _clear_temps(root, pair, report):
    try:
        multimaster_safefs.clear_temps(root)
    except OSError as exc:
        report["failed"].append(_failure(root, pair, "leftover temporary files", exc))


def _clear_file_list_cache(mopts):
    # What ``salt-run fileserver.clear_file_list_cache backend=roots`` does: the master sees
    # new files at once instead of after fileserver_list_cache_time.
    cache = os.path.join(mopts["cachedir"], "file_lists", "roots")
    with contextlib.suppress(OSError):
        for name in os.listdir(cache):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(cache, name))


@_signed_answer
def apply_roots(plan):
    """
    Make this master's roots equal to the primary's: open the plan (sealed to this control
    minion by the ``sync_roots`` runner, signed by its master, bound to a challenge from
    ``roots_manifest``), pull the content stream it names (encrypted with the plan's key; from
    the primary's file server, else by ``peer_run``): delete what the primary no longer has
    (and temporary files an interrupted sync left), give existing directories their modes (a
    directory wider than the primary's is narrowed before any file goes in), write each file
    atomically into the paired root of this master's own config (a directory it makes is 0700
    until then), then set modes. Holds this master's roots lock throughout. Returns counts,
    bytes, the path the content came by (``via``) and per-file failures; never the content.

    plan
        The descriptor of the sealed plan (``{"ticket", "size", "sha256"}``).

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.sync_roots   # the runner calls this; not meant for the CLI
    """
    master, mopts = _mopts()
    with contextlib.closing(_ContentPull()) as pull:
        envelope = _pulled_json(plan, PLAN_LIMIT, "roots plan", pull)
    body, _ = multimaster_seal.unseal(
        envelope,
        "roots",
        __opts__["id"],
        _read_own("minion.pem"),
        _read_own("minion_master.pub"),
        _expect(master),
        _challenges(),
    )
    pairs = body.get("pairs") or []
    resolved = [(_paired_root(mopts, pair), pair) for pair in pairs]
    key = bytes.fromhex(body["key"])
    report = {"written": 0, "bytes": 0, "modes": 0, "dir_modes": 0, "deleted": 0, "failed": []}
    pull = _ContentPull()
    stream = multimaster_transport.chunks(
        multimaster_transport.check_descriptor(body.get("content")), pull, key
    )
    reader = multimaster_transport.Reader(stream)
    with contextlib.closing(pull), contextlib.closing(stream), multimaster_roots.locked(mopts):
        # Deletions first: a file the primary turned into a directory (or the reverse) is out
        # of the way before its replacement is written.
        for root, pair in resolved:
            _clear_temps(root, pair, report)
            for path in pair.get("delete") or []:
                try:
                    multimaster_safefs.delete_file(root, path)
                    report["deleted"] += 1
                except OSError as exc:
                    report["failed"].append(_failure(root, pair, repr(path), exc))
            _set_dir_modes(root, pair, report)
        for root, pair in resolved:
            _write_all(reader, root, pair, report)
        for root, pair in resolved:
            _set_dir_modes(root, pair, report)
            for path, mode in pair.get("mode") or []:
                try:
                    multimaster_safefs.set_mode(root, path, mode)
                    report["modes"] += 1
                except OSError as exc:
                    report["failed"].append(_failure(root, pair, repr(path), exc))
        if reader.read(1):
            report["failed"].append("the content stream is longer than the plan")
    _clear_file_list_cache(mopts)
    report["failed"] = report["failed"][:SAMPLE]
    report["via"] = pull.via
    return report
