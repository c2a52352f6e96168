"""
The master-host side of the ``multimaster`` runners: key inventory, key actions, master key
install, served-key checks and reports, run by a master's control minion. Each function is a
few lines over its plane's library in ``_utils`` (``multimaster_keystore``,
``multimaster_cluster``, ``multimaster_masterkey``, ``multimaster_status``,
``multimaster_roots``), which owns both ends of that plane's wire contract.

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

import functools
import inspect
import logging
import os

from salt.exceptions import CommandExecutionError, SaltException, SaltInvocationError

try:
    import multimaster_cluster
    import multimaster_keystore
    import multimaster_masterkey
    import multimaster_roots
    import multimaster_saltcompat
    import multimaster_seal
    import multimaster_settings
    import multimaster_status
    import multimaster_transport

    HAS_UTILS = True
except ImportError:
    HAS_UTILS = False

log = logging.getLogger(__name__)

__virtualname__ = "multimaster_peer"


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


def _puller():
    """
    ``pull(ticket, offset)`` of a transfer staged for this minion, by ``peer_run`` on the master
    that sent this job (made here, in the job's thread: see ``multimaster_transport.puller``).
    """
    return multimaster_transport.puller(__salt__)


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
            result,
            name,
            _speaks_for(),
            answer_nonce,
            multimaster_seal.own_file(__opts__, "minion.pem"),
            failed=failed,
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
    return multimaster_keystore.peer_inventory(__opts__, master, mopts, buckets, ids, with_pubs)


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
    return multimaster_status.settled(master, mopts, __opts__["pidfile"])


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
    return multimaster_keystore.apply_ordered_actions(
        __opts__, master, mopts, transfer, order, _puller()
    )


# --- cluster peer keys -----------------------------------------------------------------------


def _cluster_local():
    """
    ``(master, section, mopts, peers dir)`` of this host's cluster master; refuses any other mode.
    """
    master, section = _local()
    return (master, section, *multimaster_cluster.peer_member(master, section))


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
    return multimaster_cluster.peer_keys_held(__opts__, master, peers_dir)


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
    return multimaster_cluster.install_ordered_peer_keys(
        __opts__, master, section, peers_dir, keys, order
    )


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
    return multimaster_cluster.aes_held(__opts__, master, mopts)


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
    return multimaster_cluster.install_sealed_aes(__opts__, master, mopts, envelope)


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
    return multimaster_masterkey.master_key_info(__opts__, master, mopts, signing)


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
    return multimaster_masterkey.install_master_key(
        __opts__, master, section, transfer, _puller(), signing, timeout
    )


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
    ok, reason = multimaster_masterkey.verify_served(
        __opts__, host, int(port), pub, sign_pub, timeout=float(timeout)
    )
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
    master, mopts = _mopts()
    return multimaster_status.master_report(__opts__, master, mopts, signing, ping_timeout)


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
    master, _ = _local()
    return multimaster_status.ping_minions(master["config_dir"], timeout)


# --- roots -----------------------------------------------------------------------------------


# The default of ``roots_manifest`` (multimaster_roots.ROOT_KINDS), here so that this module
# loads, to say the utils are missing, without them.
ROOT_KINDS = ("file_roots", "pillar_roots")


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
    return multimaster_roots.peer_manifest(
        __opts__, master, mopts, kinds, full, nonce, unless, dirs
    )


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
    return multimaster_roots.apply_plan(__opts__, __salt__, master, mopts, plan)
