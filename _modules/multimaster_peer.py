"""
The master-host side of the ``multimaster`` runners, run by a master's control minion: each
function is a few lines over its plane's library in ``_utils`` (keystore, keywrite,
clustersync, masterkey, rotation, status, manifest, roots), which owns both ends of its wire.

Grant this module to no publisher ACL: only the ``multimaster`` runners call it, and it trusts
no caller (``docs/security.md``). Paths come from this minion's own pillar entry, never from
arguments; a change needs an order or envelope signed by the master this minion trusts and
bound to a single-use challenge it issued; given ``answer_nonce`` (every function takes it),
the answer comes back signed with this minion's own key for that one publish.
"""

import functools
import inspect
import logging

from salt.exceptions import CommandExecutionError

try:
    import multimaster_clustersync
    import multimaster_keystore
    import multimaster_keywrite
    import multimaster_masterkey
    import multimaster_roots
    import multimaster_rootsanswer
    import multimaster_rotation
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


def _local():
    """This host's master entry (``config_dir`` resolved) and the ``multimaster`` section."""
    return multimaster_settings.control_master(
        multimaster_saltcompat.pillar_section(__salt__, "multimaster"), __opts__
    )


def _mopts():
    master, _ = _local()
    return master, multimaster_keystore.master_opts(master["config_dir"])


def _speaks_for():
    """The id of the master this control minion serves, or None when its pillar does not say."""
    try:
        return _local()[0]["id"]
    except CommandExecutionError:
        return None


def _signed_answer(function):
    """
    ``function``, taking ``answer_nonce`` too: given it, the answer (or why it failed) is signed
    for that nonce; without it, as it is (the CLI). Salt's minion matches a publish's arguments
    with the signature it reads from ``__signature__``.
    """
    name = function.__name__

    @functools.wraps(function)
    def answer(*args, answer_nonce=None, **kwargs):
        if answer_nonce is None:
            return function(*args, **kwargs)
        call = functools.partial(function, *args, **kwargs)
        return multimaster_seal.answer_signed(name, call, answer_nonce, __opts__, _speaks_for, log)

    # Salt follows ``__wrapped__`` to the inner signature, which lacks the nonce; and Salt 3006
    # passes a publish only the keyword arguments its argspec lists as positional-or-keyword.
    del answer.__wrapped__
    signature = inspect.signature(function)
    nonce = inspect.Parameter("answer_nonce", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)
    answer.__signature__ = signature.replace(parameters=[*signature.parameters.values(), nonce])
    return answer


@_signed_answer
def key_inventory(buckets=None, ids=None, with_pubs=False):
    """
    This master's minion-key inventory and a challenge for the runner's next order: digests
    (total, per bucket), the count and whether a repair is due; with ``buckets``/``ids``, their
    entries ``{id: [state, fp, ...]}``. Records the accepted and pending ids read as held keys.

    buckets, ids
        Lists of digest bucket numbers and of minion ids whose entries to return.

    with_pubs
        Also return the public keys of the returned entries.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster_peer.key_inventory
        salt master2 multimaster_peer.key_inventory ids='[minion1]' with_pubs=True
    """
    return multimaster_keywrite.peer_inventory(__opts__, *_mopts(), buckets, ids, with_pubs)


@_signed_answer
def master_settled():
    """
    Is this host's salt-master up (a verified pid listening on its ret port) with no restart of
    it or of this control minion pending? What ``multimaster.wait_masters`` polls.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster_peer.master_settled
    """
    return multimaster_status.settled(*_mopts(), __opts__["pidfile"])


@_signed_answer
def apply_key_actions(transfer, order):
    """
    Apply the key actions ``{"id", "op", "fp", "pub", "expect"}`` pulled from the sending
    master to this master's key store, all checked first; skips an action whose id changed
    since planned and an accept of a key rejected or denied here. Repairs what an interrupted
    run left; rotates the AES key when an accepted key was removed.

    transfer, order
        The staged actions' descriptor (``{"ticket", "size", "sha256"}``) and the runner's
        signature over them, bound to a challenge from ``key_inventory``.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.sync_keys   # the runner calls this; not meant for the CLI
    """
    with multimaster_transport.content_puller(__opts__, __salt__) as pull:
        return multimaster_keywrite.apply_ordered_actions(
            __opts__, *_mopts(), transfer, order, pull
        )


def _cluster_local():
    """``(master, section, mopts, peers dir)`` of this host's cluster master, else refuses."""
    master, section = _local()
    return (master, section, *multimaster_clustersync.peer_member(master, section))


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
    return multimaster_clustersync.peer_keys_held(__opts__, master, peers_dir)


@_signed_answer
def install_cluster_peer_keys(keys, order):
    """
    Add the peer keys this master lacks to its ``cluster_pki_dir/peers/``: only the other
    configured masters, only strict RSA public keys, all checked before any is written; a key
    that differs from one held here is a conflict, never replaced.

    keys, order
        ``{address: PEM}`` of the peers, and the runner's signature over them bound to a
        challenge from ``cluster_peer_keys``.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.share_peer_keys   # the runner calls this; not meant for the CLI
    """
    master, section, _, peers_dir = _cluster_local()
    return multimaster_clustersync.install_ordered_peer_keys(
        __opts__, master, section, peers_dir, keys, order
    )


@_signed_answer
def cluster_aes_info():
    """
    The stamp and digest of the cluster's AES key this master holds (``cluster_pki_dir/.aes``;
    None before its first start), the fingerprint of its cluster key pair (``cluster.pub``, and
    whether ``cluster.pem`` is its private half) and a challenge for the runner's next
    envelope. Never a key.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.share_cluster_aes   # the runner calls this
    """
    master, _, mopts, _ = _cluster_local()
    return multimaster_clustersync.aes_held(__opts__, master, mopts)


@_signed_answer
def install_cluster_aes(envelope):
    """
    Install the cluster's AES key if it is newer than this master's (``multimaster_cluster.
    newer``) and make the running salt-master re-read it. Never returns or logs the key.

    envelope
        The key sealed to this minion by ``share_cluster_aes`` (see ``docs/security.md``).

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.share_cluster_aes   # the runner calls this; not meant for the CLI
    """
    master, _, mopts, _ = _cluster_local()
    return multimaster_clustersync.install_sealed_aes(__opts__, master, mopts, envelope)


@_signed_answer
def master_key_info(signing=False):
    """
    The public master key this master stores, Salt's ``salt-key -F`` value for it, and a
    challenge for the runner's next envelope. Public data only.

    signing
        Report the signing pair (``master_sign.pub``) instead of the master key.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster_peer.master_key_info
    """
    return multimaster_masterkey.master_key_info(__opts__, *_mopts(), signing)


@_signed_answer
def install_master_key(transfer, signing=False, timeout=90):
    """
    Install the master key pair from ``sync_master_key``'s envelope: stop this host's master,
    store the pair, start it again as it ran (also when storing failed), wait for it, verify by
    a real sign-in that it serves the new key. Never returns or logs the key.

    transfer, signing, timeout
        The staged envelope's descriptor (``{"ticket", "size", "sha256"}``); whether it carries
        the signing pair instead of the master key; seconds to wait for the restarted master.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.sync_master_key   # the runner calls this; not meant for the CLI
    """
    with multimaster_transport.content_puller(__opts__, __salt__) as pull:
        return multimaster_masterkey.install_master_key(
            __opts__, *_local(), transfer, pull, signing, timeout
        )


@_signed_answer
def verify_master_key(host, port, pub, sign_pub=None, timeout=30):
    """
    Does the master at ``host:port`` serve ``pub`` (signed with ``sign_pub``'s pair), trying
    ``timeout`` seconds? Checked by a real sign-in with this minion's own key. Changes nothing.

    host, port
        The master's address and ret port.

    pub, sign_pub
        The public key the master should serve (PEM) and, in signing mode, the signing public
        key (PEM) its signature must verify with.

    CLI Example:

    .. code-block:: bash

        salt master1 multimaster_peer.verify_master_key 127.0.0.3 4506 "$(cat master.pub)"
    """
    return multimaster_masterkey.served_report(__opts__, host, port, pub, sign_pub, timeout)


@_signed_answer
def master_report(signing=False, ping_timeout=5):
    """
    What ``salt-run multimaster.status`` needs from this host: key inventory digests, the master
    key, key store problems, root digests, gitfs commits, whether the job cache database
    answers, and the minions that answer ``test.ping`` from this master.

    signing
        Report the signing key instead of the master key.

    ping_timeout
        Seconds the ``test.ping`` waits for minions.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster_peer.master_report
    """
    return multimaster_status.master_report(__opts__, *_mopts(), signing, ping_timeout)


@_signed_answer
def ping_minions(timeout=5):
    """
    The minions that answer ``test.ping`` published by this host's master within ``timeout``
    seconds.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster_peer.ping_minions
    """
    master, _ = _local()
    return multimaster_status.ping_minions(master["config_dir"], timeout)


@_signed_answer
def minions_verifying(timeout=5):
    """
    ``{"minions": {id: verifies}}``: the minions that answer this host's master, and whether
    each verifies a signed master key (``rotate_master_key`` refuses to cut one off).

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster_peer.minions_verifying
    """
    master, _ = _local()
    return {"minions": multimaster_rotation.minions_verifying(master["config_dir"], timeout)}


@_signed_answer
def roots_manifest(
    kinds=("file_roots", "pillar_roots"), full=False, nonce=None, unless=None, dirs=None
):
    """
    This host's master's roots: per kind, env and position ``{"path", "digest", "count",
    "skipped_count", "real"}`` (and ``skipped`` for ``file_roots``), and a challenge.

    kinds
        Which roots: a list of ``file_roots``/``pillar_roots``.

    full
        Also return the file manifests and directory modes, sealed to the master that asked.

    nonce
        The runner's nonce (64 hex characters) the sealed manifests are bound to.

    unless, dirs
        The primary's digests and per-directory digests: with ``full``, a kind equal to
        ``unless`` is left out and each manifest holds only the directories that differ
        (``dirs`` too large to publish comes as ``{"staged": {master id: descriptor}}``).

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.sync_roots test=True   # the runner calls this
    """
    asked = (kinds, full, nonce, unless, dirs, multimaster_transport.puller(__salt__))
    return multimaster_rootsanswer.peer_manifest(__opts__, *_mopts(), *asked)


@_signed_answer
def apply_roots(plan):
    """
    Make this master's roots equal to the primary's, as ``docs/roots.md`` describes, under its
    roots lock. Returns counts, bytes, the path the content came by (``via``) and per-file
    failures; never the content.

    plan
        The descriptor of the plan sealed to this minion by ``sync_roots``, bound to a
        challenge from ``roots_manifest`` (``{"ticket", "size", "sha256"}``).

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.sync_roots   # the runner calls this; not meant for the CLI
    """
    return multimaster_roots.apply_plan(__opts__, __salt__, *_mopts(), plan)
