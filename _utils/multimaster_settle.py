"""
The waits an orchestration runs between its steps: every master up with no restart pending
(``wait_masters``), a removed master no longer listening (``wait_master_stopped``), a joining
cluster master a member (``wait_cluster_member``), every accepted minion answering
(``wait_minions``).
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


def wait_cluster_member(run, host, timeout=180, interval=2):
    """
    The runner's ``wait_cluster_member``: poll ``cluster.members`` on this master until ``host``
    is a voter or learner. Returns the report.
    """
    try:
        multimaster_cluster.check_mode(
            multimaster_control.section(run), "membership is a cluster matter"
        )
        _checked_host(host)
    except SaltInvocationError as exc:
        return multimaster_control.refused(run, exc)
    start = time.monotonic()
    while True:
        members = multimaster_clustersync.members(run.opts)
        known = set(members.get("voters", [])) | set(members.get("learners", []))
        waited = round(time.monotonic() - start, 1)
        if host in known:
            ret = {"comment": f"{host} is a member", "members": members, "waited": waited}
            return multimaster_control.finish(run, ret, False)
        if waited > float(timeout):
            ret = {"comment": f"{host} is no member after {timeout}s", "members": members}
            return multimaster_control.finish(run, ret, True)
        run.progress(f"waiting for {host} to join the cluster ({round(waited)}s)")
        time.sleep(float(interval))


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
