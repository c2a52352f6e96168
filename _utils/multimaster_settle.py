"""
The waits an orchestration runs between its steps: every master up with no restart pending
(``wait_masters``), a removed master no longer listening (``wait_master_stopped``), a joining
cluster master a member (``wait_cluster_member``), a removed one no longer a voter
(``wait_voter_removed``), every accepted minion answering (``wait_minions``).
"""

import time

import multimaster_cluster
import multimaster_clustersync
import multimaster_control
import multimaster_daemon
import multimaster_returns
import salt.client
import salt.utils.minions
from salt.exceptions import SaltInvocationError

# --- runner side -----------------------------------------------------------------------------


def wait_masters(run, timeout=180, interval=1, skip=None):
    """
    The runner's ``wait_masters``: poll until every master but ``skip`` is settled; in mode
    cluster propose the no-op Raft entry (``multimaster_clustersync.nudge_raft``)
    every ``NUDGE_INTERVAL`` seconds meanwhile. Returns the report.
    """
    try:
        found = multimaster_control.section(run)
        skipped = set(multimaster_control.id_list(skip, "skip"))
    except SaltInvocationError as exc:
        return multimaster_control.refused(run, exc)
    start = time.monotonic()
    waiting, last = [m for m in multimaster_control.ids(found) if m not in skipped], {}
    next_nudge = multimaster_clustersync.NUDGE_INTERVAL
    while True:
        answers, errors = multimaster_control.poll_settled(run, found, waiting)
        waiting = [m for m in waiting if not (answers.get(m) or {}).get("settled")]
        last = {m: errors.get(m) or answers.get(m) for m in waiting}
        waited = round(time.monotonic() - start, 1)
        if not waiting:
            ret = {"comment": "every master is up", "waited": waited}
            return multimaster_control.finish(run, ret, False)
        if waited > float(timeout):
            ret = {"comment": f"not settled after {timeout}s", "masters": last, "waited": waited}
            return multimaster_control.finish(run, ret, True)
        cluster = found["mode"] == "cluster"
        if (
            cluster
            and waited >= next_nudge
            and multimaster_clustersync.started_master(run) is not None
        ):
            # A restarted master may have won the election: see cluster_ready.
            multimaster_clustersync.nudge_raft(run)
            next_nudge = waited + multimaster_clustersync.NUDGE_INTERVAL
        time.sleep(float(interval))


def _checked_host(host):
    if not isinstance(host, str) or not host or any(c.isspace() for c in host):
        raise multimaster_control.Refused(
            f"host={host!r}: expected the address or host name of a master"
        )
    return host


def wait_master_stopped(run, host, timeout=90, interval=1):
    """
    The runner's ``wait_master_stopped``: poll until ``host`` no longer listens on the set's
    publish and return ports. Returns the report.
    """
    try:
        found = multimaster_control.section(run)
        _checked_host(host)
    except SaltInvocationError as exc:
        return multimaster_control.refused(run, exc)
    ports = {name: found["ports"][name] for name in ("publish", "ret")}
    start = time.monotonic()
    while True:
        listening = [f"{host}:{p}" for p in ports.values() if multimaster_daemon.port_open(host, p)]
        waited = round(time.monotonic() - start, 1)
        if not listening:
            ret = {"comment": f"{host} no longer listens", "waited": waited}
            return multimaster_control.finish(run, ret, False)
        if waited > float(timeout):
            ret = {"comment": f"still listening on {', '.join(listening)} after {timeout}s"}
            return multimaster_control.finish(run, ret, True)
        time.sleep(float(interval))


def _watch_members(run, host, matter, verdict, timeout, interval):
    """
    Refuse outside mode cluster (``matter`` says why) or without an address ``host``, then
    poll ``cluster.members`` on this master until ``verdict(members)``, a ``(done, comment)``,
    is done or ``timeout`` passes. Returns the report.
    """
    try:
        multimaster_cluster.check_mode(multimaster_control.section(run), matter)
        _checked_host(host)
    except SaltInvocationError as exc:
        return multimaster_control.refused(run, exc)
    start = time.monotonic()
    while True:
        members = multimaster_clustersync.members(run.opts)
        done, comment = verdict(members)
        waited = round(time.monotonic() - start, 1)
        if done:
            ret = {"comment": comment, "members": members, "waited": waited}
            return multimaster_control.finish(run, ret, False)
        if waited > float(timeout):
            ret = {"comment": f"{comment} after {timeout}s", "members": members}
            return multimaster_control.finish(run, ret, True)
        run.progress(f"waiting: {comment} ({round(waited)}s)")
        time.sleep(float(interval))


def wait_cluster_member(run, host, timeout=180, interval=2):
    """
    The runner's ``wait_cluster_member``: poll ``cluster.members`` on this master until ``host``
    is a voter or learner. Returns the report.
    """

    def verdict(members):
        known = set(members.get("voters", [])) | set(members.get("learners", []))
        return (True, f"{host} is a member") if host in known else (False, f"{host} is no member")

    matter = "membership is a cluster matter"
    return _watch_members(run, host, matter, verdict, timeout, interval)


def vote_withdrawn(members, host, opts):
    """
    ``(done, comment)`` for ``wait_voter_removed``: done when ``host`` is not a voter of
    ``members`` (``cluster.members``), or when Salt will not demote it: the master of ``opts``
    replaces no silent voter, or the voters would fall below ``cluster_min_voters``.
    """
    voters = members.get("voters") or []
    floor = opts.get("cluster_min_voters", 3)
    if "error" in members:
        return False, members["error"]
    if host not in voters:
        return True, f"{host} is not a voter"
    if not opts.get("cluster_auto_replace_voters"):
        return True, (
            f"{host} stays a voter: cluster_auto_replace_voters is off "
            f"(multimaster:cluster:auto_replace_voters), so every majority counts it"
        )
    if len(voters) - 1 < floor:
        return True, (
            f"{host} stays a voter: {len(voters) - 1} voters would be fewer than "
            f"cluster_min_voters ({floor}), so every majority counts it"
        )
    return False, f"{host} is still a voter"


def wait_voter_removed(run, host, timeout=120, interval=2):
    """
    The runner's ``wait_voter_removed``: poll ``cluster.members`` on this master until
    ``vote_withdrawn``. Returns the report.
    """
    matter = "the Raft vote is a cluster matter"
    return _watch_members(
        run,
        host,
        matter,
        lambda members: vote_withdrawn(members, host, run.opts),
        timeout,
        interval,
    )


# A minion about to restart (after multimaster.minion's job) still answers a ping: ask this.
SETTLED = "multimaster_daemons.minion_settled"


def _settled(ret):
    # A minion without the formula's modules answers that the function is not available: it
    # answered, and no restart of ours is pending there.
    return ret is True or (isinstance(ret, str) and f"'{SETTLED}' is not available" in ret)


def wait_minions(run, tgt="*", timeout=180, interval=2):
    """
    The runner's ``wait_minions``: ask the accepted minions ``tgt`` matches until all answer
    with no restart pending (``multimaster_daemons.minion_settled``), with progress naming the
    silent ones. Returns the report.
    """
    if not isinstance(tgt, str) or not tgt:
        return multimaster_control.refused(
            run, multimaster_control.Refused(f"tgt: got {tgt!r}; expected a glob of minion ids")
        )
    expected = set(salt.utils.minions.CkMinions(run.opts).check_minions(tgt)["minions"])
    if not expected:
        return multimaster_control.refused(
            run,
            multimaster_control.Refused(
                f"tgt: no minion key accepted on this master matches {tgt!r}: accept the "
                "minion first (salt-key -a <id>), then wait for it"
            ),
        )
    start, silent = time.monotonic(), set(expected)
    with salt.client.get_local_client(run.opts["conf_file"]) as client:
        while True:
            answered = multimaster_returns.cmd(client, sorted(silent), SETTLED, 5, tgt_type="list")
            silent -= {m for m, ret in (answered or {}).items() if _settled(ret)}
            waited = round(time.monotonic() - start, 1)
            if not silent:
                ret = {"comment": f"{len(expected)} minions answer", "waited": waited}
                return multimaster_control.finish(run, ret, False)
            if waited > float(timeout):
                ret = {
                    "comment": f"not answering after {timeout}s",
                    "silent": sorted(silent)[: multimaster_control.SHOWN],
                }
                return multimaster_control.finish(run, ret, True)
            shown = ", ".join(sorted(silent)[:10])
            run.progress(f"{len(silent)} minions not answering yet: {shown}")
            time.sleep(float(interval))
