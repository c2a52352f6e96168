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
sealed keys, roots) never rides the publish: staged here, it is pulled by its recipient through
this master's file server (``peer_run`` the fallback). Work is applied master by master in the
configured order (the first is the primary). Every function takes ``test=True`` (return the
plan, change nothing) and returns ``retcode: 1`` on any failure.
"""

import sys

try:
    import multimaster_clustersync
    import multimaster_control
    import multimaster_jobcache
    import multimaster_keysync
    import multimaster_masterkey
    import multimaster_reactions
    import multimaster_rootsync
    import multimaster_rotation
    import multimaster_settle
    import multimaster_signing
    import multimaster_status

    HAS_UTILS = True
except ImportError:
    HAS_UTILS = False


__virtualname__ = "multimaster"


def __virtual__():
    if not HAS_UTILS:
        return (False, "multimaster: utils missing; run salt-run saltutil.sync_all")
    return __virtualname__


# --- plumbing --------------------------------------------------------------------------------


def _run():
    """
    This call's ``Run``: this master's opts, the runner's context and its progress events. The
    runner job's load is stored first (``multimaster_jobcache.record_runner_load``): Salt would
    glob every accepted key to store it.
    """
    # The caller is the public function Salt runs as this job.
    fun = f"runner.{__virtualname__}.{sys._getframe(1).f_code.co_name}"
    jid, user = globals().get("__jid__"), globals().get("__user__")
    multimaster_jobcache.record_runner_load(__opts__, jid, fun, __opts__.get("id"), user)
    return multimaster_control.Run(__opts__, __context__, globals().get("__jid_event__"))


# --- minion keys -----------------------------------------------------------------------------


# Shims for the master key and status planes, and the reactors (``key_event``).


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
    return multimaster_keysync.sync_keys(
        _run(), minion=minion, prune=prune, test=test, force=force, masters=masters, timeout=timeout
    )


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
    return multimaster_keysync.one_id(_run(), "accept", minion, fingerprint, test, masters, timeout)


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
    return multimaster_keysync.one_id(_run(), "reject", minion, fingerprint, test, masters, timeout)


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
    return multimaster_keysync.one_id(_run(), "delete", minion, fingerprint, test, masters, timeout)


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
    return multimaster_settle.wait_masters(_run(), timeout=timeout, interval=interval, skip=skip)


def wait_master_stopped(host, timeout=90, interval=1):
    """
    Wait until the master at ``host`` no longer accepts connections on the set's publish and
    return ports: what ``multimaster.orch.remove_master`` runs after a removed cluster master's
    control minion scheduled its stop (``multimaster_daemons.stop_master after_return=True``).
    Changes nothing. (This master's own section may still list it: the orchestration rewrites the
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


def wait_cluster_member(host, timeout=180, interval=2):
    """
    Mode cluster: wait until the master at ``host`` (its address) is a voter or learner in the
    Raft membership this master has applied (``cluster.members``), as the orchestration
    ``add_master`` does after the new master started with the leader as its one peer.

    timeout
        Seconds to wait in all.

    interval
        Seconds between polls.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.wait_cluster_member 10.0.3.24
    """
    return multimaster_settle.wait_cluster_member(_run(), host, timeout=timeout, interval=interval)


def wait_voter_removed(host, timeout=120, interval=2):
    """
    Mode cluster: wait until the stopped master at ``host`` (its address) is no longer a voter
    in the Raft membership this master has applied, as the orchestration ``remove_master``
    does: the leader demotes a voter silent for ``cluster_voter_timeout`` (10 s) to a learner
    (``multimaster:cluster:auto_replace_voters``). Returns at once, saying so, where Salt
    keeps it a voter (that option off, or ``cluster_min_voters`` voters left).

    timeout
        Seconds to wait in all.

    interval
        Seconds between polls.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.wait_voter_removed 10.0.3.24
    """
    return multimaster_settle.wait_voter_removed(_run(), host, timeout=timeout, interval=interval)


def wait_minions(tgt="*", timeout=180, interval=2):
    """
    Wait until every minion whose key this master has accepted and that ``tgt`` matches
    answers here with no restart pending (``multimaster_daemons.minion_settled``; a minion
    without the formula's modules counts once it answers): what to run after ``multimaster.minion``
    restarted minions (or after a failover) before ``status``. Progress names the minions
    still silent.

    tgt
        A glob of minion ids.

    timeout
        Seconds to wait in all.

    interval
        Seconds between rounds (a silent minion costs a round 5 s, then 2 s of ``find_job``).

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.wait_minions
        salt-run multimaster.wait_minions tgt='web*' timeout=60
    """
    return multimaster_settle.wait_minions(_run(), tgt=tgt, timeout=timeout, interval=interval)


# --- reactors --------------------------------------------------------------------------------


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
    return multimaster_reactions.key_event(_run(), minion, act, timeout)


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
    return multimaster_reactions.first_highstate(_run(), minion)


# --- master key ------------------------------------------------------------------------------


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
    return multimaster_masterkey.sync_master_key(
        _run(), test=test, masters=masters, timeout=timeout
    )


def enable_signing(test=False, skip_unanswered=False, timeout=180):
    """
    Turn signing on in a running hot or failover set whose pillar names this master's signing
    pair (``signing:``), each daemon restarted once (docs/rotation.md gives the order and the
    minions' short outage); ``sync_master_key`` then proves every master. Refused before any
    change when pillar does not match, a master or accepted minion does not answer, a failover
    minion answers another master than this one, or the mode is cluster. Safe to run again.

    test
        Return what would be done; change nothing.

    skip_unanswered
        Go ahead although accepted minions answer no master: apply ``multimaster.minion`` to
        each by hand before it starts again, or every master refuses it.

    timeout
        Seconds to wait for each step's jobs and restarts.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.enable_signing test=True
        salt-run multimaster.enable_signing
    """
    return multimaster_signing.enable_signing(
        _run(), test=test, skip_unanswered=skip_unanswered, timeout=timeout
    )


def rotate_master_key(generation=None, test=False, skip_unanswered=False, timeout=180):
    """
    Give every master a new master key with no minion restarted, in a set that signs
    (``signing:enabled``): mode ``failover`` gives each master its own new key, mode ``hot``
    one new key to all, which every minion takes ahead (``multimaster.take_master_key``,
    checked against the signing key it trusts) before any master serves it.
    Refused before any change when a minion does not verify signed keys or answers no master.
    The primary makes each pair and seals it to that master's control minion; each master is
    stopped for the swap and started again once, the primary last. Then every master's new key
    is proven by a signature-verifying sign-in from another master's control minion. The
    generation is recorded (public fingerprints only): a re-run resumes, or changes nothing.

    generation
        The number of this rotation: 1 for the first, one more for each later one.

    test
        Return the masters that would get a new key; change nothing.

    skip_unanswered
        Go ahead although accepted minions answer no master (down or gone): each must verify
        signed keys, or it refuses every master when it comes back.

    timeout
        Seconds to wait for each master's install (stop, store, restart, sign-in).

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.rotate_master_key generation=1 test=True
        salt-run multimaster.rotate_master_key generation=1
    """
    return multimaster_rotation.rotate_master_key(
        _run(), generation, test=test, skip_unanswered=skip_unanswered, timeout=timeout
    )


# --- roots -----------------------------------------------------------------------------------


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
    return multimaster_rootsync.sync_roots(_run(), roots=roots, test=test, timeout=timeout)


# --- status ----------------------------------------------------------------------------------


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
    return multimaster_clustersync.share_peer_keys(
        _run(), masters=masters, test=test, timeout=timeout
    )


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
    return multimaster_clustersync.share_cluster_aes(
        _run(), masters=masters, test=test, timeout=timeout
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
    return multimaster_clustersync.cluster_aes_rotated(_run(), timeout=timeout)


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
    return multimaster_clustersync.cluster_ready(_run(), timeout=timeout, interval=interval)


def status(masters=None, timeout=30, ping_timeout=5, test=False):
    """
    One report: which masters answer, whether they store and serve the same master key, whether
    their minion-key sets are equal (digests, and the differing ids), problems of their key
    stores, whether their roots are equal (a digest per master per root, and the differing
    paths), which commits they serve per git remote, whether the job cache database they share
    answers (``job_cache``), and which masters each minion answers. Each "equal" is ``True``
    only when every master answered: ``None`` when those that answered agree but one did not.
    In mode cluster: the Raft members as this master sees them (voters, learners, leader,
    configured masters missing), the balancer's frontends and every master's ports up, and
    whether every master holds one cluster AES key (``cluster_aes``: each key's stamp and a
    digest prefix, asked of the control minions) and one cluster key pair (``cluster_key``:
    each ``cluster.pub`` fingerprint; ``comment`` names a master on another pair and the fix).
    Read-only: ``test=True`` (accepted like every runner here) changes nothing either.

    masters
        Refused, as for ``sync_keys``.

    timeout
        Seconds to wait for each control minion.

    ping_timeout
        Seconds each master's ``test.ping`` waits for minions (then 2 s for Salt's
        ``find_job``, not the master's ``gather_job_timeout``).

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.status
    """
    return multimaster_status.status(
        _run(), masters=masters, timeout=timeout, ping_timeout=ping_timeout, test=test
    )
