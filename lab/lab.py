#!/usr/bin/env python3
"""
The multimaster demo lab: salt-masters, their control minions and plain minions on separate
namespace hosts (``toolkit/hosts.py``), each with its own address on a private bridge, hostname
and ``/etc/salt``, Salt on its default paths and ports, configured by the formula's own states
and driven with the real ``salt``, ``salt-run`` and ``salt-key`` run on the hosts.

Commands:

  demo   (default) build the lab, show test.ping answered from each master, the key reactor,
         a new minion's one first highstate, add_master bringing in master3, then stop master1
         and time how long the failover minion takes to answer from another master; print a
         report with timings, then remove the hosts.
  up     the same without the failover, leaving the hosts running for exploration.
  sh     run a command on a host (a shell there without one), e.g.
             lab.py sh master1 salt '*' test.ping
             lab.py sh master3 salt '*' multimaster.active_master
             lab.py sh master2 salt-key -L
             lab.py sh minion1
  down   stop every daemon and remove the hosts: namespaces, bridge, mounts, directories.

The lab:

  host      daemons                          address     role
  master1   salt-master + control minion     10.0.3.201  primary master
  master2   salt-master + control minion     10.0.3.202  second master, added by the formula
  master3   salt-master + control minion     10.0.3.203  third master, added by add_master
  minion1   salt-minion                      10.0.3.211  hot: connected to every master
  minion2   salt-minion                      10.0.3.212  failover: one master at a time
  minion3   salt-minion                      10.0.3.213  hot, new: its one first highstate

Every host gets Salt as a bootstrap leaves it (``toolkit.hosts.bootstrap``) and every minion
starts knowing only master1; master1 serves the formula (copied from this checkout to
/srv/formulas/multimaster-formula), the lab's states (lab/salt/ to /srv/salt) and the lab pillar
(/srv/pillar). ``saltutil.sync_all`` and ``state.apply multimaster.master`` configure both
masters; master2 has a key of its own until ``salt-run multimaster.sync_master_key`` gives it
master1's (sealed, restart, verified), ``sync_keys`` the accepted minion keys and
``sync_roots`` master1's roots; ``multimaster.status`` is shown before and after; then the
formula re-points every minion at both masters. A key accepted with ``salt-key -a`` on master2
reaches master1 through master2's key reactor (``multimaster:reactor:keys``), timed. minion3
starts knowing both masters, is accepted on master1 only, and runs exactly one highstate
(``multimaster:reactor:first_highstate``), none after a restart. master3's address is a
reserved slot the minions list from the start: master3 joins with ``salt-run state.orch
multimaster.orch.add_master`` while master1 pings minion1 once a second; its salt-master first
starts with the set's key, no master of the set and no minion restarts, and no ping is missed.

Run it as root with the virtualenv's Python (``make demo`` / ``make down``): the hosts' PATH
starts with the directory of that interpreter.
"""

import argparse
import concurrent.futures
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The toolkit shared with the bench and the tests.
sys.path.insert(0, str(REPO))

from toolkit import devkit  # noqa: E402
from toolkit import hosts as nshosts  # noqa: E402

# The lab's own prefix and addresses: the tests' host sets (prefix mm, 10.0.3.6x-2xx below .200)
# may exist at the same time on their own bridge.
PREFIX = "mmlab"
# Where a failed run leaves the hosts' logs (the hosts themselves are removed).
LOGS = REPO / "lab" / "run" / "logs"
MASTERS = {"master1": "10.0.3.201", "master2": "10.0.3.202", "master3": "10.0.3.203"}
PLAIN_MINIONS = {"minion1": "10.0.3.211", "minion2": "10.0.3.212", "minion3": "10.0.3.213"}
HOSTS = nshosts.HostSet(
    [nshosts.Host(name, address) for name, address in {**MASTERS, **PLAIN_MINIONS}.items()],
    prefix=PREFIX,
)
PORTS = (4505, 4506)
# The set the lab builds first; master3 joins it later through multimaster.orch.add_master.
FIRST_SET = ("master1", "master2")
NEW_MASTER = "master3"
# Minion id -> the role the demo gives it. master1/master2 are the masters' control minions.
MINIONS = {
    "master1": "control, hot",
    "master2": "control, hot",
    "minion1": "hot",
    "minion2": "failover",
}
# Minions that start later: a new hot minion (its one first highstate) and master3's control
# minion; both know the set of their day from their first start, as a bootstrap leaves them.
NEW_MINION = "minion3"
LATE_MINIONS = {NEW_MINION: "hot, new", NEW_MASTER: "control, hot"}
ALL_MINIONS = {**MINIONS, **LATE_MINIONS}
FAILOVER_MINION = "minion2"
PINGED_MINION = "minion1"
ALIVE_INTERVAL = 5
FORMULA_DIR = "/srv/formulas/multimaster-formula"
ROOTS = {
    "file_roots": {"base": ["/srv/salt", FORMULA_DIR]},
    "pillar_roots": {"base": ["/srv/pillar"]},
}
# Lab pace, on top of what a bootstrap leaves. Masters: few workers (a small machine), and
# `salt` waits 5s (default 10s) for minions that missed a publish. Minions: retry auth every 2s
# while the key is pending (default 10s), give up on a request after 20s (default 60s) - a
# request caught by a master restart otherwise stalls the minion's returns for a full minute.
MASTER_OPTIONS = {
    "open_mode": False,
    "auto_accept": False,
    "worker_threads": 2,
    "gather_job_timeout": 5,
    "log_level_logfile": "info",
}
MINION_OPTIONS = {
    "acceptance_wait_time": 2,
    "acceptance_wait_time_max": 2,
    "request_channel_timeout": 20,
    "log_level_logfile": "info",
}

# Bounds for every wait (seconds). Generous: this must pass on a busy 2-core machine.
DAEMON_START_TIMEOUT = 60
KEY_PENDING_TIMEOUT = 60
# The key the reactor demo accepts on master2 (pending on both masters, as a new hot minion's
# first contact leaves it).
NEWCOMER = "newcomer1"
REACTOR_TIMEOUT = 60
# How long the demo watches for a second highstate after the new minion restarts.
REACTION_GRACE = 5
ORCH_TIMEOUT = 900
PING_TIMEOUT = 120
STATE_TIMEOUT = 300
FAILOVER_TIMEOUT = 8 * ALIVE_INTERVAL + 60


class LabError(Exception):
    """
    A lab step failed; ``logs`` are the daemon log files that explain why.
    """

    def __init__(self, message, logs=()):
        super().__init__(message)
        self.logs = [Path(log) for log in logs]


def host(name):
    """The lab host ``name`` (a master's control minion has its master's name)."""
    return HOSTS[name]


def log(name, role):
    """The log file of the salt-``role`` on host ``name``, as the machine sees it."""
    return host(name).path(f"/var/log/salt/{role}")


def pid_of(name, role):
    """The live pid of the salt-``role`` on host ``name`` (its default pidfile), else None."""
    return devkit.read_pid(host(name).path(f"/run/salt-{role}.pid"))


# --------------------------------------------------------------------------------------------
# Report


class Report:
    """
    Collects each step's duration and prints progress as the lab runs.
    """

    def __init__(self):
        self.started = time.monotonic()
        self.steps = []
        self.matrices = []
        self.notes = []

    @contextlib.contextmanager
    def step(self, title):
        """Time the enclosed block as one named step; failures are recorded too."""
        print(f"==> {title}", flush=True)
        began = time.monotonic()
        try:
            yield
        except BaseException:
            self.steps.append((title, time.monotonic() - began, "FAILED"))
            raise
        seconds = time.monotonic() - began
        self.steps.append((title, seconds, "ok"))
        print(f"    done in {seconds:.1f}s", flush=True)

    def total(self):
        """Seconds since the lab started."""
        return time.monotonic() - self.started

    def render(self, outcome):
        """The final, human-readable report."""
        lines = ["", "=" * 72, f"multimaster demo lab: {outcome}", "=" * 72, "", "Steps:"]
        for number, (title, seconds, status) in enumerate(self.steps, 1):
            flag = "" if status == "ok" else f"  <-- {status}"
            lines.append(f"  {number:2d}. {title:<56} {seconds:6.1f}s{flag}")
        for title, table in self.matrices:
            lines += ["", title] + table
        if self.notes:
            lines += [""] + self.notes
        lines += ["", f"Total: {self.total():.1f}s", ""]
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Salt CLIs on the hosts


def run(on, *argv, timeout, out=None, check=True):
    """
    The command ``argv`` (a Salt CLI, ``--out=<out>`` added) on host ``on``; a
    ``devkit.CliResult``. LabError on timeout or (with ``check``) a non-zero exit.
    """
    argv = [*map(str, argv), *([f"--out={out}"] if out else [])]
    cmdline = f"{on}: {shlex.join(argv)}"
    try:
        proc = host(on).sh(shlex.join(argv), check=False, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"timed out after {timeout}s: {cmdline}") from exc
    if check and proc.returncode != 0:
        raise LabError(f"exit code {proc.returncode}: {cmdline}\n{proc.stdout}{proc.stderr}")
    return devkit.CliResult(proc.returncode, proc.stdout, proc.stderr)


def salt(on_master, target, fun, *args, timeout=30, list_target=False):
    """
    Run ``salt`` on master ``on_master``; returns the JSON result ({minion id: return}).
    Minions that did not return map to Salt's "did not return" message.
    """
    argv = ["salt", "--static", "-t", timeout, *(["-L"] if list_target else []), target, fun]
    result = run(on_master, *argv, *args, timeout=timeout + 60, out="json", check=False)
    return result.data if isinstance(result.data, dict) else {}


def salt_run(fun, *args, on="master1", timeout=300, check=True):
    """
    ``salt-run`` on master ``on`` (the primary). Returns the runner's return (the last JSON
    document printed; progress events come before it).
    """
    result = run(on, "salt-run", fun, *args, timeout=timeout, out="json", check=False)
    if check and result.returncode != 0:
        raise LabError(
            f"salt-run {fun} failed ({result.returncode}):\n{result.stdout}{result.stderr}",
            [log(on, "master")],
        )
    return result.data if isinstance(result.data, dict) else {}


def wait_for(what, check, timeout, interval=1.0, logs=()):
    """
    Call ``check`` until it returns something truthy (which is returned); LabError naming
    ``what`` and showing ``logs`` once ``timeout`` passes.
    """
    return devkit.wait_until(
        what, check, timeout, interval, error=lambda message: LabError(message, logs)
    )


def listening(name):
    """Whether the master of host ``name`` accepts connections on its publish and ret ports."""
    probes = " && ".join(f"timeout 2 bash -c '</dev/tcp/{MASTERS[name]}/{p}'" for p in PORTS)
    return host(name).sh(probes, check=False).returncode == 0


def wait_master_listening(name):
    """Wait until master ``name`` runs and listens on its ports."""
    wait_for(
        f"salt-master {name} to listen on {MASTERS[name]}:{PORTS}",
        lambda: pid_of(name, "master") and listening(name),
        DAEMON_START_TIMEOUT,
        interval=0.5,
        logs=[log(name, "master")],
    )


def wait_restarted(name, role, old_pid):
    """Wait until the salt-``role`` of ``name`` runs again under a pid other than ``old_pid``."""
    return wait_for(
        f"salt-{role} {name} to restart (it ran as pid {old_pid})",
        lambda: (pid := pid_of(name, role)) and pid != old_pid and pid,
        2 * DAEMON_START_TIMEOUT,
        interval=0.3,
        logs=[log(name, role)],
    )


# --------------------------------------------------------------------------------------------
# Configuration


def write(name, inside, data, header):
    """Write ``data`` as YAML to the path ``inside`` host ``name``."""
    devkit.write_config(host(name).path(inside), data, header)


def multimaster_pillar(masters):
    """
    The ``multimaster`` pillar every minion gets (hot mode, ``masters``, the lab's roots),
    master3's address a reserved slot: minions list it before master3 runs there.
    """
    return {
        "mode": "hot",
        "reserved": [MASTERS[NEW_MASTER]],
        "masters": [{"id": name, "host": MASTERS[name]} for name in masters],
        "install_packages": False,
        "reactor": {"keys": True, "first_highstate": True},
        "master": ROOTS,
    }


def write_pillar(masters=FIRST_SET):
    """
    master1's /srv/pillar: top.sls, multimaster.sls ('*', the set of ``masters``),
    multimaster_failover.sls (minion2: one master at a time).
    """
    top = {"base": {"*": ["multimaster"], FAILOVER_MINION: ["multimaster_failover"]}}
    write("master1", "/srv/pillar/top.sls", top, "Lab pillar top file (written by lab/lab.py)")
    write(
        "master1",
        "/srv/pillar/multimaster.sls",
        {"multimaster": multimaster_pillar(masters)},
        "Hot multi-master: every minion talks to every master",
    )
    failover = {
        "mode": "failover",
        "failover": {"alive_interval": ALIVE_INTERVAL, "failback": False, "random_reauth_delay": 2},
    }
    write(
        "master1",
        "/srv/pillar/multimaster_failover.sls",
        {"multimaster": failover},
        f"{FAILOVER_MINION} only: one master at a time",
    )


def write_configs():
    """The lab's pace on every host; the formula, lab states, roots and pillar on master1."""
    for name in HOSTS.hosts:
        write(name, "/etc/salt/minion.d/lab.conf", MINION_OPTIONS, "lab pace (lab/lab.py)")
    for name in MASTERS:
        write(name, "/etc/salt/master.d/lab.conf", MASTER_OPTIONS, "lab pace (lab/lab.py)")
    write("master1", "/etc/salt/master.d/roots.conf", ROOTS, "the formula and the lab states")
    devkit.copy_formula(host("master1").path(FORMULA_DIR))
    shutil.copytree(REPO / "lab" / "salt", host("master1").path("/srv/salt"), dirs_exist_ok=True)
    write_pillar()


def bootstrap(names, masters=("master1",), master_started=True):
    """
    Install Salt on the hosts ``names`` at once, as a bootstrap does; wait for the daemons.
    ``master_started=False``: salt-master installed on a master host, not started.
    """
    addresses = [MASTERS[m] for m in masters]

    def one(name):
        nshosts.bootstrap(
            host(name),
            addresses[0] if len(addresses) == 1 else addresses,
            name in MASTERS,
            master_started=master_started,
        )
        started = name in MASTERS and master_started
        roles = ["master", "minion"] if started else ["minion"]
        for role in roles:
            wait_for(
                f"salt-{role} {name} to start",
                lambda role=role: pid_of(name, role),
                DAEMON_START_TIMEOUT,
                interval=0.3,
                logs=[log(name, role)],
            )
        if started:
            wait_master_listening(name)

    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        for future in [pool.submit(one, name) for name in names]:
            future.result()


# --------------------------------------------------------------------------------------------
# Keys and the key-plane runners (run on master1, the primary).


def key_lists(on_master):
    """``salt-key -L`` of a master as a dict of state -> ids."""
    return run(on_master, "salt-key", "-L", timeout=60, out="json").data or {}


def accepted_key(on_master, mid):
    """The accepted key of ``mid`` on master ``on_master`` (as the machine sees it), or None."""
    path = host(on_master).path(f"/etc/salt/pki/master/minions/{mid}")
    return path.read_text() if path.is_file() else None


def accept_minion_keys(on_master):
    """Wait until every lab minion's key is pending on ``on_master``, then accept each one."""
    wanted = set(MINIONS)
    wait_for(
        f"{len(wanted)} minion keys pending on {on_master}",
        lambda: wanted <= set(key_lists(on_master).get("minions_pre", [])),
        KEY_PENDING_TIMEOUT,
        logs=[log(name, "minion") for name in MINIONS],
    )
    for name in MINIONS:
        run(on_master, "salt-key", "-a", name, "-y", timeout=60)
    accepted = set(key_lists(on_master).get("minions", []))
    if not wanted <= accepted:
        raise LabError(f"keys not accepted on {on_master}: {sorted(wanted - accepted)}")


def status_lines(title, status):
    """A few readable lines of ``multimaster.status``."""
    lines = [title]
    for name, info in status.get("masters", {}).items():
        if not info.get("reachable"):
            lines.append(f"  {name:<8} unreachable: {info.get('error')}")
            continue
        lines.append(
            f"  {name:<8} master key {str(info.get('master_key'))[:23]}...  "
            f"{info.get('keys')} minion keys, digest {info.get('keys_digest')}"
        )
    lines.append(
        f"  same master key: {status.get('same_master_key')}   "
        f"minion keys equal: {status.get('keys_equal')}   "
        f"roots equal: {status.get('roots_equal')}   retcode: {status.get('retcode')}"
    )
    for minion_id, seen in status.get("minions", {}).items():
        answered = ", ".join(m for m, ok in seen.items() if ok) or "none"
        lines.append(f"  {minion_id:<8} answers: {answered}")
    return lines


def sync_roots(report):
    """
    ``sync_roots``: master2's roots (empty so far) become master1's - the formula, the lab's
    states and the lab pillar - and master2's file server lists the formula at once.
    """
    synced = salt_run("multimaster.sync_roots").get("masters", {}).get("master2", {})
    changes = synced.get("changes", {})
    counts = changes.get("counts", {})
    line = (
        f"sync_roots -> master2: {counts.get('added', 0)} files added, "
        f"{counts.get('changed', 0)} changed, {counts.get('deleted', 0)} deleted, "
        f"{changes.get('bytes', 0)} bytes moved into master2's /srv (via {synced.get('via')})"
    )
    listed = run("master2", "salt-run", "fileserver.file_list", timeout=60, out="json").data
    if not counts.get("added") or "multimaster/minion/init.sls" not in (listed or []):
        raise LabError(f"sync_roots did not give master2 the formula: {synced}")
    report.notes.extend([line, ""])
    print(line, flush=True)


def show_status(report, title):
    """Run ``salt-run multimaster.status`` and add it to the report."""
    lines = status_lines(title, salt_run("multimaster.status", check=False))
    report.notes.extend(lines + [""])
    print("\n".join(lines), flush=True)


# --------------------------------------------------------------------------------------------
# Salt calls


def answering(on_master, targets, timeout=5):
    """The subset of ``targets`` that answers ``test.ping`` from ``on_master``."""
    if not pid_of(on_master, "master"):
        return set()
    data = salt(on_master, ",".join(targets), "test.ping", timeout=timeout, list_target=True)
    return {mid for mid, ret in data.items() if ret is True}


def wait_answering(on_master, targets, timeout=None):
    """Wait until every minion in ``targets`` answers ``test.ping`` from ``on_master``."""
    timeout = timeout or PING_TIMEOUT
    targets = sorted(targets)
    missing = set(targets)

    def check():
        missing.difference_update(answering(on_master, sorted(missing)))
        return not missing

    try:
        wait_for(f"{targets} to answer test.ping from {on_master}", check, timeout)
    except LabError as exc:
        logs = [log(on_master, "master")] + [log(mid, "minion") for mid in sorted(missing)]
        raise LabError(f"{exc}; still silent: {sorted(missing)}", logs) from None


def check_returns(data, targets, what, on_master):
    """Raise LabError unless every target returned; for states, unless every state succeeded."""
    logs = [log(on_master, "master")]
    for mid in targets:
        ret = data.get(mid)
        if ret is None or isinstance(ret, str) and "did not return" in ret:
            raise LabError(f"{what}: {mid} did not return", logs + [log(mid, "minion")])
        if not isinstance(ret, dict):
            raise LabError(f"{what}: {mid} returned {ret!r}", logs + [log(mid, "minion")])
        failed = [
            f"{state.get('__id__', sid)}: {state.get('comment')}"
            for sid, state in ret.items()
            if isinstance(state, dict) and "result" in state and state["result"] is not True
        ]
        if failed:
            raise LabError(
                f"{what} failed on {mid}:\n  " + "\n  ".join(failed), [log(mid, "minion")]
            )


def sync_all(on_master):
    """``saltutil.sync_all`` on every minion: brings the formula's modules, states and utils."""
    data = salt(on_master, "*", "saltutil.sync_all", timeout=120)
    check_returns(data, MINIONS, "saltutil.sync_all", on_master)
    for mid in MINIONS:
        if not any("multimaster" in name for name in data[mid].get("modules", [])):
            raise LabError(f"saltutil.sync_all on {mid} did not sync the multimaster module")


def apply_state(on_master, targets, sls):
    """
    ``state.apply sls`` on ``targets`` from ``on_master``; returns the ids whose run scheduled
    a daemon restart (the formula restarts after the job has returned).
    """
    data = salt(
        on_master, ",".join(targets), "state.apply", sls, timeout=STATE_TIMEOUT, list_target=True
    )
    check_returns(data, targets, f"state.apply {sls}", on_master)
    return {
        mid
        for mid in targets
        for state in data[mid].values()
        if isinstance(state, dict) and "restart" in (state.get("changes") or {})
    }


def active_master(on_master, mid):
    """The master address ``mid`` says it is connected to (asked through ``on_master``)."""
    data = salt(on_master, mid, "multimaster.active_master", timeout=10)
    ret = data.get(mid)
    return ret.get("master") if isinstance(ret, dict) else None


# --------------------------------------------------------------------------------------------
# Lab steps


def configure_masters(names):
    """Apply multimaster.master to the masters ``names`` from master1; wait for the restarts."""
    old = {name: pid_of(name, "master") for name in names}
    restarted = apply_state("master1", names, "multimaster.master")
    for name in names:
        if not host(name).path("/etc/salt/master.d/multimaster.conf").is_file():
            raise LabError(f"multimaster.master wrote no master.d/multimaster.conf on {name}")
        if name not in restarted:
            raise LabError(f"multimaster.master did not restart the running {name}")
        wait_restarted(name, "master", old[name])
        wait_master_listening(name)


def configure_minions():
    """Apply multimaster.minion everywhere from master1, then wait for the minions to restart."""
    old = {mid: pid_of(mid, "minion") for mid in MINIONS}
    restarted = apply_state("master1", sorted(MINIONS), "multimaster.minion")
    if restarted != set(MINIONS):
        raise LabError(f"multimaster.minion restarted only {sorted(restarted)}")
    for mid in MINIONS:
        wait_restarted(mid, "minion", old[mid])


def expected_answers(on_master, minions=MINIONS):
    """Which of ``minions`` must answer from ``on_master`` once configured (failover: master1)."""
    hot = {mid for mid, role in minions.items() if "hot" in role}
    return hot | {FAILOVER_MINION} if on_master == "master1" else hot


def ping_matrix(report, title, via, masters=FIRST_SET, minions=MINIONS):
    """
    test.ping from every one of ``masters``, shown as a minion x master table, plus the master
    the failover minion says it is connected to (asked through master ``via``). All queries run
    at once.
    """
    with concurrent.futures.ThreadPoolExecutor(len(masters) + 1) as pool:
        futures = {name: pool.submit(answering, name, sorted(minions), 3) for name in masters}
        connected = pool.submit(active_master, via, FAILOVER_MINION)
        answers = {name: future.result() for name, future in futures.items()}
        address = connected.result()
    header = f"  {'minion':<10}{'role':<16}" + "".join(f"{'from ' + n:<15}" for n in masters)
    table = [header.rstrip()]
    for mid, role in minions.items():
        cells = ""
        for name in masters:
            if not pid_of(name, "master"):
                cells += f"{'(stopped)':<15}"
            else:
                cells += f"{'yes' if mid in answers[name] else 'no':<15}"
        table.append(f"  {mid:<10}{role:<16}{cells}".rstrip())
    names = {ip: name for name, ip in MASTERS.items()}
    table.append(
        f"  {FAILOVER_MINION} (failover) is connected to {address} ({names.get(address, '?')}): "
        "it answers only that master."
    )
    report.matrices.append((title, table))
    print("\n".join([title] + table), flush=True)
    return answers


def host_lines():
    """Each host's name, address and daemons."""
    lines = ["Hosts (bridge " + HOSTS.bridge + ", Salt on its default paths and ports):"]
    for item in HOSTS:
        daemons = "salt-master + control minion" if item.name in MASTERS else "salt-minion"
        lines.append(f"  {item.name:<9} {item.address:<12} {daemons}")
    return lines


def build(report):
    """Everything up to a running, configured two-master lab with the ping matrix shown."""
    with report.step(f"make {len(HOSTS.hosts)} namespace hosts (a previous lab removed)"):
        HOSTS.up()
    report.notes.extend(host_lines() + [""])
    print("\n".join(host_lines()), flush=True)
    with report.step("lab config on every host; formula, lab states, pillar on master1"):
        write_configs()
    with report.step("bootstrap master1, master2, minion1, minion2 (minions know master1)"):
        bootstrap(["master1", "master2", "minion1", "minion2"])
    with report.step("accept the minion keys on master1 (salt-key -a)"):
        accept_minion_keys("master1")
        wait_answering("master1", MINIONS)
    with report.step("saltutil.sync_all (formula via master1's file_roots)"):
        sync_all("master1")
    with report.step("salt-run saltutil.sync_all (runners, before master1's reactors start)"):
        salt_run("saltutil.sync_all")
    with report.step("state.apply multimaster.master on master1, master2 (they restart)"):
        configure_masters(list(FIRST_SET))
        wait_answering("master1", MINIONS)
    with report.step("salt-run multimaster.status (before)"):
        show_status(report, "salt-run multimaster.status, before:")
    with report.step("salt-run multimaster.sync_master_key (sealed, restart)"):
        synced = salt_run("multimaster.sync_master_key")
        if not synced.get("masters", {}).get("master2", {}).get("served"):
            raise LabError(f"sync_master_key did not make master2 serve the shared key: {synced}")
    with report.step("salt-run multimaster.sync_keys"):
        salt_run("multimaster.sync_keys")
    with report.step("salt-run multimaster.sync_roots (master2's own roots)"):
        sync_roots(report)
    with report.step("state.apply multimaster.minion on all (they restart)"):
        configure_minions()
    with report.step("wait for the minions on both masters"):
        for name in FIRST_SET:
            wait_answering(name, expected_answers(name))
    with report.step("test.ping matrix"):
        ping_matrix(report, "test.ping answered (both masters up):", via="master1")
    with report.step("salt-run multimaster.status (after)"):
        show_status(report, "salt-run multimaster.status, after:")


def key_reactor(report):
    """``salt-key -a`` on master2 reaches master1 through master2's key reactor."""
    with report.step("sync_master_modules on master2 (runners for its reactors)"):
        old_pid = pid_of("master2", "master")
        synced = salt("master1", "master2", "multimaster_daemons.sync_master_modules", timeout=120)
        if "multimaster" not in str((synced.get("master2") or {}).get("synced")):
            raise LabError(f"master2 did not get the formula's runners: {synced}")
        wait_restarted("master2", "master", old_pid)
        wait_master_listening("master2")
        wait_answering("master2", expected_answers("master2"))
    with report.step(f"salt-key -a {NEWCOMER} on master2; the reactor accepts it on master1"):
        pem = devkit.new_public_pem()
        for name in FIRST_SET:
            pending = host(name).path(f"/etc/salt/pki/master/minions_pre/{NEWCOMER}")
            pending.write_text(pem)
        began = time.monotonic()
        run("master2", "salt-key", "-a", NEWCOMER, "-y", timeout=60)
        wait_for(
            f"{NEWCOMER} accepted on master1 by master2's key reactor",
            lambda: accepted_key("master1", NEWCOMER),
            REACTOR_TIMEOUT,
            interval=0.1,
            logs=[log("master2", "master")],
        )
        seconds = time.monotonic() - began
        if accepted_key("master1", NEWCOMER) != pem:
            raise LabError(f"master1 holds another key for {NEWCOMER}", [log("master2", "master")])
    report.notes.append(
        f"Key reactor: salt-key -a {NEWCOMER} on master2 -> the same key accepted on master1 "
        f"{seconds:.1f}s later (salt-key CLI included)."
    )
    print(report.notes[-1], flush=True)


def highstates(name):
    """The lines the demo's highstate (lab/salt/lab_demo) appended on minion ``name``."""
    path = host(name).path("/var/cache/salt/minion/highstates.log")
    return path.read_text().splitlines() if path.exists() else []


def accept_new_minion(name, reactor_on):
    """
    ``salt-key -a`` a minion's pending key on master1; wait until master ``reactor_on`` holds it
    accepted too (put there by master1's key reactor).
    """
    wait_for(
        f"{name}'s key pending on master1",
        lambda: name in key_lists("master1").get("minions_pre", []),
        KEY_PENDING_TIMEOUT,
        logs=[log(name, "minion")],
    )
    run("master1", "salt-key", "-a", name, "-y", timeout=60)
    wait_for(
        f"{name} accepted on {reactor_on} by master1's key reactor",
        lambda: accepted_key(reactor_on, name),
        REACTOR_TIMEOUT,
        interval=0.2,
        logs=[log("master1", "master")],
    )


def first_highstate(report):
    """
    A new hot minion (it knows both masters) is accepted on master1: the key reactor accepts it
    on master2, and its first start gets exactly one highstate from the set - not one per
    master, not another when it restarts.
    """
    with report.step(f"bootstrap {NEW_MINION} (new, hot); salt-key -a on master1 only"):
        bootstrap([NEW_MINION], masters=FIRST_SET)
        accept_new_minion(NEW_MINION, reactor_on="master2")
    with report.step(f"{NEW_MINION}'s first start: one highstate (first-highstate reactor)"):
        began = time.monotonic()
        wait_for(
            f"the first highstate on {NEW_MINION}",
            lambda: highstates(NEW_MINION),
            STATE_TIMEOUT,
            logs=[log(NEW_MINION, "minion"), log("master1", "master"), log("master2", "master")],
        )
        seconds = time.monotonic() - began
        for name in FIRST_SET:
            wait_answering(name, [NEW_MINION])
    with report.step(f"restart {NEW_MINION}: both masters react again, no second highstate"):
        host(NEW_MINION).sh("systemctl restart salt-minion")
        for name in FIRST_SET:
            wait_answering(name, [NEW_MINION])
        # Both masters' reactors have seen the start event by now; give them time to act.
        time.sleep(REACTION_GRACE)
        count = len(highstates(NEW_MINION))
        if count != 1:
            raise LabError(f"{NEW_MINION} ran {count} highstates, expected exactly 1")
    report.notes.append(
        f"First highstate: {NEW_MINION}, accepted with salt-key on master1 only, ran exactly one "
        f"highstate {seconds:.1f}s after it was accepted (both masters react; the minion claims "
        f"the run), and none after a restart ({REACTION_GRACE}s watched)."
    )
    print(report.notes[-1], flush=True)


def ping_loop(stop, record):
    """``test.ping`` the hot minion1 from master1 once a second until ``stop`` is set."""
    while not stop.is_set():
        began = time.monotonic()
        answered = salt("master1", PINGED_MINION, "test.ping", timeout=5).get(PINGED_MINION)
        record.append(answered is True)
        stop.wait(max(0.0, 1.0 - (time.monotonic() - began)))


def orchestration_failures(result):
    """
    ``<step>: <comment>`` for every failed step of a ``state.orch`` run's output, then
    ``<minion>: <state>: <comment>`` for each failed state a minion returned to it.
    """
    failed = []
    for step in devkit.orch_steps(result.stdout):
        if step.get("result") is not False:
            continue
        failed.append(f"{step['__id__']}: {str(step.get('comment'))[:300]}")
        returns = (step.get("changes") or {}).get("ret") or {}
        for mid, states in returns.items():
            if not isinstance(states, dict):
                failed.append(f"  {mid}: {str(states)[:300]}")
                continue
            failed += [
                f"  {mid}: {state.get('__id__', sid)}: {str(state.get('comment'))[:300]}"
                for sid, state in states.items()
                if isinstance(state, dict) and state.get("result") is False
            ]
    return failed or [result.stdout[-1500:] + result.stderr[-1500:]]


def bootstrap_new_master():
    """
    Bootstrap ``NEW_MASTER`` (its control minion; salt-master installed, not started: add_master
    starts it with the set's key), accept its control minion on master1, and wait until that
    minion's first highstate and every job of it have finished.
    """
    bootstrap([NEW_MASTER], master_started=False)
    accept_new_minion(NEW_MASTER, reactor_on="master2")
    wait_answering("master1", [NEW_MASTER])
    # Its first start got it a first highstate too: let that finish before the orchestration
    # applies states to it.
    wait_for(
        f"the first highstate on {NEW_MASTER}'s control minion",
        lambda: highstates(NEW_MASTER),
        STATE_TIMEOUT,
        logs=[log(NEW_MASTER, "minion")],
    )
    wait_for(
        f"{NEW_MASTER}'s control minion to finish its jobs",
        lambda: salt("master1", NEW_MASTER, "saltutil.running").get(NEW_MASTER) == [],
        STATE_TIMEOUT,
    )


def orchestrate_add_master():
    """
    Run ``state.orch multimaster.orch.add_master`` for ``NEW_MASTER`` on master1 while a thread
    pings ``PINGED_MINION``: ``(result, seconds, record)``, ``record`` holding each ping's
    outcome.
    """
    stop, record = threading.Event(), []
    pinger = threading.Thread(target=ping_loop, args=(stop, record), daemon=True)
    pinger.start()
    began = time.monotonic()
    try:
        result = run(
            "master1", "salt-run", "state.orch", "multimaster.orch.add_master",
            "pillar=" + json.dumps({"multimaster_new": NEW_MASTER}),
            timeout=ORCH_TIMEOUT, out="json", check=False,
        )  # fmt: skip
    finally:
        stop.set()
        pinger.join()
    seconds = time.monotonic() - began
    if result.returncode != 0:
        raise LabError(
            "add_master failed:\n  " + "\n  ".join(orchestration_failures(result)),
            [log("master1", "master")],
        )
    return result, seconds, record


def note_add_master(report, result, seconds, record):
    """
    Note (and print) how long the join took, how many pings missed meanwhile, and how long each
    step of the orchestration took.
    """
    missed = record.count(False)
    prefix = "multimaster-orch-add-master-"
    report.notes.append(
        f"add_master: {NEW_MASTER} joined in {seconds:.1f}s; master1 pinged {PINGED_MINION} "
        f"{len(record)} times meanwhile, {missed} missed. Steps: "
        + ", ".join(
            f"{step['__id__'].removeprefix(prefix)} {(step.get('duration') or 0) / 1000:.1f}s"
            for step in devkit.orch_steps(result.stdout)
        )
    )
    print(report.notes[-1], flush=True)


def add_master(report):
    """
    master3 joins with ``state.orch multimaster.orch.add_master`` while master1 pings the hot
    minion1 once a second; afterwards every hot minion answers master3.
    """
    with report.step(f"bootstrap {NEW_MASTER} (control minion, master not started); salt-key -a"):
        bootstrap_new_master()
    with report.step(f"pillar: {NEW_MASTER} added to multimaster:masters"):
        write_pillar(MASTERS)
    title = f"salt-run state.orch multimaster.orch.add_master ({NEW_MASTER}), pinging"
    with report.step(f"{title} {PINGED_MINION}"):
        result, seconds, record = orchestrate_add_master()
    with report.step(f"wait for every minion on {NEW_MASTER}"):
        wait_answering(NEW_MASTER, expected_answers(NEW_MASTER, ALL_MINIONS))
    note_add_master(report, result, seconds, record)
    with report.step("test.ping matrix (three masters)"):
        ping_matrix(
            report, "test.ping answered (three masters up):", "master1", MASTERS, ALL_MINIONS
        )


def failover(report):
    """Stop master1; measure how long the failover minion takes to answer from another master."""
    others = [name for name in MASTERS if name != "master1"]
    with report.step(f"stop master1; wait for {FAILOVER_MINION} to answer from another master"):
        began = time.monotonic()
        host("master1").sh("systemctl stop salt-master")
        stopped = time.monotonic() - began

        def answered_by():
            for name in others:
                if FAILOVER_MINION in answering(name, [FAILOVER_MINION], timeout=1):
                    return name
            return None

        serving = wait_for(
            f"{FAILOVER_MINION} to answer test.ping from {' or '.join(others)} after master1 "
            "stopped",
            answered_by,
            FAILOVER_TIMEOUT,
            interval=0.5,
            logs=[log(FAILOVER_MINION, "minion")] + [log(name, "master") for name in others],
        )
        seconds = time.monotonic() - began
    report.notes.append(
        f"Failover: {FAILOVER_MINION} answered test.ping from {serving} {seconds:.1f}s after "
        f"`systemctl stop salt-master` on master1 (master1 took {stopped:.1f}s to exit; "
        f"master_alive_interval {ALIVE_INTERVAL}s)."
    )
    print(report.notes[-1], flush=True)
    with report.step("test.ping matrix after master1 stopped"):
        ping_matrix(
            report, "test.ping answered (master1 stopped):", "master2", MASTERS, ALL_MINIONS
        )
    return seconds


def show_failure(exc):
    """Print a failed step's message and the end of each log that explains it."""
    sys.stdout.flush()
    print(f"\nERROR: {exc}", file=sys.stderr)
    for path in exc.logs:
        print(f"\n--- last lines of {path} ---", file=sys.stderr)
        try:
            print("\n".join(path.read_text(errors="replace").splitlines()[-15:]), file=sys.stderr)
        except OSError as err:
            print(f"(cannot read: {err})", file=sys.stderr)


def keep_logs():
    """Copy every host's /var/log/salt to lab/run/logs/<host>/ (before the hosts go)."""
    for item in HOSTS:
        dest = LOGS / item.name
        shutil.rmtree(dest, ignore_errors=True)
        if item.path("/var/log/salt").is_dir():
            shutil.copytree(item.path("/var/log/salt"), dest)
    return LOGS.relative_to(REPO)


def run_lab(keep_running, with_failover):
    """Build the lab (and run the failover demo); remove the hosts unless ``keep_running``."""
    report = Report()
    ok, outcome = False, "FAILED"
    try:
        build(report)
        key_reactor(report)
        first_highstate(report)
        add_master(report)
        if with_failover:
            failover(report)
        ok, outcome = True, "PASSED"
    except LabError as exc:
        show_failure(exc)
        outcome = f"FAILED: {str(exc).splitlines()[0]}"
        if exc.logs:
            outcome += "\n  see: " + ", ".join(str(path) for path in exc.logs)
    except (KeyboardInterrupt, nshosts.HostError) as exc:
        traceback.print_exc()
        outcome = f"FAILED: {exc!r}"
    except Exception as exc:  # a bug in the lab itself: still remove the hosts and say so
        traceback.print_exc()
        outcome = f"FAILED: unexpected {exc!r}"
    finally:
        if not ok:
            outcome += f"\n  the hosts' logs: {keep_logs()}/<host>/"
        if not (ok and keep_running):
            with report.step("stop every daemon, remove the hosts"):
                HOSTS.down()
    print(report.render(outcome), flush=True)
    if ok and keep_running:
        me = f"{sys.executable} {__file__}"
        print(
            "The lab is running. Try:\n"
            f"  {me} sh master1 salt '*' test.ping\n"
            f"  {me} sh master3 salt-run multimaster.status\n"
            f"  {me} sh minion1            # a shell on minion1 (exit to leave)\n"
            f"Each host's /etc/salt, /var/log/salt ... are under {nshosts.STATE_DIR}/"
            f"{PREFIX}-<host>/. Remove it all with: {me} down"
        )
    return 0 if ok else 1


def shell(name, command):
    """
    Run ``command`` on host ``name``: its words as one command line, or one word as a script;
    without one, an interactive shell there (the machine's rc files left out).
    """
    if name not in HOSTS.hosts:
        raise SystemExit(f"no lab host {name!r}; hosts: {', '.join(HOSTS.hosts)}")
    if not Path(f"/run/netns/{host(name).netns}").exists():
        raise SystemExit(f"{name} is not up: run lab.py up first")
    if command:
        args = ["-c", command[0] if len(command) == 1 else shlex.join(command)]
    else:
        args = ["--norc", "-i"]
    env = {"TERM": os.environ.get("TERM", "dumb"), "PS1": r"\u@\h:\w# "}
    argv = host(name).shell(*args, env=env)
    os.execvp(argv[0], argv)


def down():
    """Stop every lab daemon and remove the hosts."""
    HOSTS.down()
    print(f"lab stopped; hosts {', '.join(HOSTS.hosts)} and bridge {HOSTS.bridge} removed")
    return 0


def main(argv=None):
    """Command line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "command",
        nargs="?",
        default="demo",
        choices=("demo", "up", "sh", "down"),
        help="demo (default): run and remove; up: build and leave running; sh HOST [CMD...]: "
        "run on a host; down: stop and remove",
    )
    parser.add_argument("host", nargs="?", help="sh: the host")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="sh: the command")
    args = parser.parse_args(argv)
    if args.command == "down":
        return down()
    if args.command == "sh":
        if not args.host:
            parser.error("sh needs a host")
        return shell(args.host, args.cmd)
    if args.host:
        parser.error(f"{args.command} takes no host")
    return run_lab(keep_running=args.command == "up", with_failover=args.command == "demo")


if __name__ == "__main__":
    sys.exit(main())
