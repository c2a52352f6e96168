#!/usr/bin/env python3
"""
The multimaster demo lab: salt-masters, their control minions and plain minions on loopback,
configured by the formula's own states, entirely inside lab/run/ (nothing in /etc, no system
services).

Commands:

  demo   (default) build the lab, show test.ping answered from each master, the key reactor,
         a new minion's one first highstate, add_master bringing in master3, then stop master1
         and time how long the failover minion takes to answer from another master; print a
         report with timings, then stop every daemon.
  up     the same without the failover, leaving the lab running for exploration, e.g.
             .venv/bin/salt -c lab/run/master1 '*' test.ping
             .venv/bin/salt -c lab/run/master3 '*' multimaster.active_master
             .venv/bin/salt-key -c lab/run/master2 -L
         (lab/run/<host>/ is that host's /etc/salt; logs are in lab/run/<host>/log/).
  down   stop every lab daemon and remove lab/run/.

The lab:

  host      daemons                          address    role
  master1   salt-master + control minion     127.0.0.2  primary master
  master2   salt-master + control minion     127.0.0.3  second master, added by the formula
  master3   salt-master + control minion     127.0.0.4  third master, added by add_master
  minion1   salt-minion                      -          hot: connected to every master
  minion2   salt-minion                      -          failover: one master at a time
  minion3   salt-minion                      -          hot, new: its one first highstate

Every master uses publish port 24505 and ret port 24506. The first four minions start knowing
only master1; the formula (delivered through master1's file_roots = this checkout, synced with
saltutil.sync_all) configures master2; master2 starts with a key of its own;
``salt-run multimaster.sync_master_key`` gives it master1's (sealed, restart, verified),
``salt-run multimaster.sync_keys`` the accepted minion keys and ``sync_roots`` master1's roots;
``multimaster.status`` is shown before and after; then the formula re-points every minion at
both masters. A key accepted with ``salt-key -a`` on master2 reaches master1 through master2's
key reactor (``multimaster:reactor:keys``), timed. minion3 starts knowing both masters, is
accepted on master1 only, and runs exactly one highstate (``multimaster:reactor:
first_highstate``; lab/salt/ holds the top file and the demo state), none after a restart.
master3 joins with ``salt-run state.orch multimaster.orch.add_master`` while master1 pings
minion1 once a second.

Run it with the virtualenv's Python (``make demo`` / ``make down``): the Salt CLIs are taken from
the directory of that interpreter.
"""

import argparse
import concurrent.futures
import contextlib
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
# The dev toolkit (toolkit/) shared with the bench and the tests.
sys.path.insert(0, str(REPO))

from toolkit import devkit  # noqa: E402
from toolkit.devkit import BIN, port_open  # noqa: E402

RUN = REPO / "lab" / "run"
PILLAR = RUN / "pillar"

PORTS = devkit.Ports(publish=24505, ret=24506)
MASTERS = {"master1": "127.0.0.2", "master2": "127.0.0.3", "master3": "127.0.0.4"}
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
# file_roots is this checkout, which also holds .venv/, lab/run/, bench/run/ (private keys!):
# serve only the formula (multimaster/ and the _modules/, _states/ ... dirs). Salt matches these
# against relative paths when listing files and against absolute paths when serving one.
# master2's own file_roots (filled by sync_roots) live under lab/run/ too: its files are served.
# The lab's own states (lab/salt: a top file and the demo's highstate) are a second path of
# base, and the other masters' own roots live under lab/run/<host>/srv/: their files are served.
LAB_STATES = REPO / "lab" / "salt"
_SERVED = r"(?!(multimaster|_[a-z_]+|lab_demo|top\.sls)(/|$))"
_LAB_ROOTS = r"(?!lab/salt/)(?!lab/run/master[0-9]+/srv/)"
FILE_IGNORE_REGEX = [
    rf"^(?!/){_SERVED}",
    rf"^{re.escape(str(REPO))}/{_SERVED}{_LAB_ROOTS}",
]

# Bounds for every wait (seconds). Generous: this must pass on a busy 2-core machine.
DAEMON_START_TIMEOUT = 60
DAEMON_STOP_TIMEOUT = 30
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


@dataclass(frozen=True)
class Daemon:
    """
    One salt-master or salt-minion of the lab; ``host`` names its directory under lab/run/.
    """

    host: str
    role: str  # "master" or "minion"

    @property
    def dir(self):
        """The host's config dir (its /etc/salt) and root_dir."""
        return RUN / self.host

    @property
    def pidfile(self):
        """Where the daemon records its pid."""
        return self.dir / "run" / f"salt-{self.role}.pid"

    @property
    def log(self):
        """The daemon's log file."""
        return self.dir / "log" / f"{self.role}.log"

    @property
    def pki_dir(self):
        """The daemon's key directory."""
        return self.dir / "pki" / self.role

    @property
    def label(self):
        """How messages name the daemon."""
        return f"salt-{self.role} {self.host}"


def master(name):
    """The salt-master of host ``name``."""
    return Daemon(name, "master")


def minion(name):
    """The salt-minion with id ``name`` (its host directory has the same name)."""
    return Daemon(name, "minion")


def all_daemons():
    """Every daemon the lab can run, masters first."""
    return [master(name) for name in MASTERS] + [minion(name) for name in ALL_MINIONS]


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
# Processes


def cli(name):
    """Path of a Salt CLI in the virtualenv that runs this script."""
    path = BIN / name
    if not path.exists():
        raise LabError(
            f"{path} not found: run the lab with the virtualenv's Python (make venv; make demo)"
        )
    return str(path)


def run(name, config_dir, *args, timeout, out=None, check=True):
    """
    Salt CLI ``name`` against ``config_dir`` (``devkit.salt_cli``, ``--out=<out>``) from the
    checkout; LabError on timeout or (with ``check``) a non-zero exit.
    """
    cmdline = " ".join([cli(name), "-c", str(config_dir), *map(str, args)])
    try:
        result = devkit.salt_cli(name, config_dir, *args, out=out, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"timed out after {timeout}s: {cmdline}") from exc
    if check and result.returncode != 0:
        raise LabError(
            f"exit code {result.returncode}: {cmdline}\n{result.stdout}{result.stderr}".rstrip()
        )
    return result


def salt(on_master, target, fun, *args, timeout=30, list_target=False):
    """
    Run ``salt`` on master ``on_master``; returns the JSON result ({minion id: return}).
    Minions that did not return map to Salt's "did not return" message.
    """
    argv = ["--static", "-t", timeout, *(["-L"] if list_target else []), target, fun, *args]
    result = run(
        "salt", master(on_master).dir, *argv, timeout=timeout + 60, out="json", check=False
    )
    return result.data if isinstance(result.data, dict) else {}


def read_pid(daemon):
    """The live (not zombie) pid recorded in the daemon's pidfile, else None."""
    return devkit.read_pid(daemon.pidfile)


def wait_for(what, check, timeout, interval=1.0, logs=()):
    """
    Call ``check`` until it returns something truthy (which is returned); LabError naming
    ``what`` and showing ``logs`` once ``timeout`` passes.
    """
    return devkit.wait_until(
        what, check, timeout, interval, error=lambda message: LabError(message, logs)
    )


def start_daemon(daemon):
    """Start a lab daemon in the background and wait until its pidfile names a live process."""
    proc = run(f"salt-{daemon.role}", daemon.dir, "-d", timeout=DAEMON_START_TIMEOUT, check=False)
    if proc.returncode != 0:
        raise LabError(
            f"{daemon.label} failed to start ({proc.returncode}): {proc.stderr.strip()}",
            [daemon.log],
        )
    return wait_for(
        f"{daemon.label} to write {daemon.pidfile}",
        lambda: read_pid(daemon),
        DAEMON_START_TIMEOUT,
        interval=0.3,
        logs=[daemon.log],
    )


def wait_master_listening(name):
    """Wait until master ``name`` accepts connections on its publish and ret ports."""
    daemon = master(name)
    for port in (PORTS.publish, PORTS.ret):
        wait_for(
            f"{daemon.label} to listen on {MASTERS[name]}:{port}",
            lambda port=port: read_pid(daemon) and port_open(MASTERS[name], port),
            DAEMON_START_TIMEOUT,
            interval=0.3,
            logs=[daemon.log],
        )


def wait_restarted(daemon, old_pid):
    """Wait until ``daemon`` runs again under a pid other than ``old_pid``."""
    return wait_for(
        f"{daemon.label} to restart (it ran as pid {old_pid})",
        lambda: (pid := read_pid(daemon)) and pid != old_pid and pid,
        DAEMON_START_TIMEOUT + DAEMON_STOP_TIMEOUT,
        interval=0.3,
        logs=[daemon.log],
    )


def stop_pids(pids):
    """SIGTERM ``pids`` and wait for them and their children; SIGKILL what outlives the timeout."""
    devkit.stop_pids(pids, timeout=DAEMON_STOP_TIMEOUT)


def stop_daemon(daemon):
    """Stop a lab daemon via its pidfile (no-op when it is not running)."""
    pid = read_pid(daemon)
    if pid is not None:
        stop_pids([pid])


def stray_lab_processes():
    """
    Pids of this checkout's virtualenv working on lab/run (daemon children whose parent died,
    the formula's detached restart watchers). Never this script or its ancestors.
    """
    own = {os.getpid()} | {parent.pid for parent in psutil.Process().parents()}
    marker = str(RUN) + os.sep
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["pid"] in own or not cmdline:
            continue
        uses_venv = any(arg.startswith(str(BIN)) for arg in cmdline[:2])
        if uses_venv and marker in " ".join(cmdline):
            found.append(proc.info["pid"])
    return found


def stop_all():
    """Stop every lab daemon (pidfiles first, then stragglers); again if a restart raced us."""
    for _ in range(3):
        stop_pids([pid for pid in map(read_pid, all_daemons()) if pid])
        stop_pids(stray_lab_processes())
        if not stray_lab_processes() and not any(map(read_pid, all_daemons())):
            return
    raise LabError(f"lab processes still running: {stray_lab_processes()}")


# --------------------------------------------------------------------------------------------
# Configuration


def daemon_options(daemon):
    """Options every lab daemon gets: its id and every path inside lab/run/<host>/."""
    return {
        "id": daemon.host,
        "root_dir": str(daemon.dir),
        "user": pwd.getpwuid(os.getuid()).pw_name,
        "pki_dir": str(daemon.pki_dir),
        "cachedir": str(daemon.dir / "cache" / daemon.role),
        "sock_dir": str(daemon.dir / "run" / daemon.role),
        "pidfile": str(daemon.pidfile),
        "log_file": str(daemon.log),
        "log_level_logfile": "info",
    }


def master_options(name):
    """Base config of a lab master. Only master1 has roots: master2 gets them from the formula."""
    options = daemon_options(master(name))
    options.update(
        devkit.loopback_master(
            MASTERS[name],
            PORTS,
            worker_threads=2,
            # How long `salt` waits for minions that missed a publish (default 10s).
            gather_job_timeout=2,
        )
    )
    if name == "master1":
        options.update(roots_options())
    return options


def roots_options():
    """
    file_roots = this checkout (the formula, as a user adds it) and the lab's states,
    pillar_roots = lab pillar.
    """
    return {
        "file_roots": {"base": [str(REPO), str(LAB_STATES)]},
        "pillar_roots": {"base": [str(PILLAR)]},
        "file_ignore_regex": FILE_IGNORE_REGEX,
    }


def minion_options(name):
    """
    Base config of a lab minion: the first four know only master1 until the formula says
    otherwise; the new hot minion knows the first set (master3's control minion: master1).
    """
    known = [MASTERS[m] for m in FIRST_SET] if name == NEW_MINION else MASTERS["master1"]
    options = daemon_options(minion(name))
    options.update(
        devkit.loopback_minion(
            known,
            PORTS,
            # Lab pace: retry auth every 2s while the key is pending (default 10s), and give up on
            # a request after 20s (default 60s) - a request caught by a master restart otherwise
            # stalls the minion's returns for a full minute.
            acceptance_wait=2,
            request_channel_timeout=20,
        )
    )
    return options


def own_roots(name):
    """
    master2's and master3's own (initially empty) roots: ``sync_roots`` fills them from
    master1's; master1 serves the checkout, the lab's states and the lab pillar (``master:``).
    """
    if name == "master1":
        return {}
    srv = master(name).dir / "srv"
    return {
        "file_roots": {"base": [str(srv / "salt"), str(srv / "salt-lab")]},
        "pillar_roots": {"base": [str(srv / "pillar")]},
    }


def multimaster_pillar(masters):
    """The ``multimaster`` pillar every minion gets (hot mode, ``masters``, lab paths)."""
    roots = roots_options()
    return devkit.multimaster_section(
        [
            devkit.master_entry(
                name, MASTERS[name], master(name).dir, interface=MASTERS[name], **own_roots(name)
            )
            for name in masters
        ],
        PORTS,
        install_packages=False,
        manage_services=True,
        reactor={"keys": True, "first_highstate": True},
        master={
            "file_roots": roots["file_roots"],
            "pillar_roots": roots["pillar_roots"],
            "config": {"file_ignore_regex": FILE_IGNORE_REGEX},
        },
    )


def failover_pillar():
    """What the failover minion gets on top (failover options are refused in hot mode)."""
    return {
        "mode": "failover",
        "failover": {
            "alive_interval": ALIVE_INTERVAL,
            "failback": False,
            "random_reauth_delay": 2,
        },
    }


def write_pillar(masters=FIRST_SET):
    """
    lab/run/pillar: top.sls, multimaster.sls ('*', the set of ``masters``),
    multimaster_failover.sls (minion2).
    """
    top = {"base": {"*": ["multimaster"], FAILOVER_MINION: ["multimaster_failover"]}}
    devkit.write_config(PILLAR / "top.sls", top, "Lab pillar top file (written by lab/lab.py)")
    devkit.write_config(
        PILLAR / "multimaster.sls",
        {"multimaster": multimaster_pillar(masters)},
        "Hot multi-master: every minion talks to every master",
    )
    devkit.write_config(
        PILLAR / "multimaster_failover.sls",
        {"multimaster": failover_pillar()},
        f"{FAILOVER_MINION} only: one master at a time",
    )


def write_configs():
    """Config of every daemon (lab/run/<host>/master, lab/run/<host>/minion) and the pillar."""
    for name in MASTERS:
        devkit.write_config(master(name).dir / "master", master_options(name), f"lab master {name}")
    for name in ALL_MINIONS:
        devkit.write_config(minion(name).dir / "minion", minion_options(name), f"lab minion {name}")
    write_pillar()


# --------------------------------------------------------------------------------------------
# Keys and the key-plane runners (run on master1, the primary).


def key_lists(on_master):
    """``salt-key -L`` of a master as a dict of state -> ids."""
    return run("salt-key", master(on_master).dir, "-L", timeout=60, out="json").data or {}


def accept_minion_keys(on_master):
    """Wait until every lab minion's key is pending on ``on_master``, then accept each one."""
    wanted = set(MINIONS)
    wait_for(
        f"{len(wanted)} minion keys pending on {on_master}",
        lambda: wanted <= set(key_lists(on_master).get("minions_pre", [])),
        KEY_PENDING_TIMEOUT,
        logs=[minion(name).log for name in MINIONS],
    )
    for name in MINIONS:
        run("salt-key", master(on_master).dir, "-a", name, "-y", timeout=60)
    accepted = set(key_lists(on_master).get("minions", []))
    if not wanted <= accepted:
        raise LabError(f"keys not accepted on {on_master}: {sorted(wanted - accepted)}")


def salt_run(fun, *args, timeout=300, check=True):
    """
    ``salt-run`` on master1 (the primary). Returns the runner's return (the last JSON document
    printed; progress events come before it).
    """
    result = run(
        "salt-run", master("master1").dir, fun, *args, timeout=timeout, out="json", check=False
    )
    if check and result.returncode != 0:
        raise LabError(
            f"salt-run {fun} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
        )
    return result.data if isinstance(result.data, dict) else {}


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
    ``sync_roots``: master2's own roots (empty so far) become master1's - the formula and the
    lab pillar - and master2's file server lists the formula at once.
    """
    synced = salt_run("multimaster.sync_roots").get("masters", {}).get("master2", {})
    changes = synced.get("changes", {})
    counts = changes.get("counts", {})
    line = (
        f"sync_roots -> master2: {counts.get('added', 0)} files added, "
        f"{counts.get('changed', 0)} changed, {counts.get('deleted', 0)} deleted, "
        f"{changes.get('bytes', 0)} bytes moved into master2's own roots under "
        f"{master('master2').dir.relative_to(REPO) / 'srv'} (via {synced.get('via')})"
    )
    listed = run(
        "salt-run", master("master2").dir, "fileserver.file_list", timeout=60, out="json"
    ).data
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
    if not read_pid(master(on_master)):
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
        logs = [master(on_master).log] + [minion(mid).log for mid in sorted(missing)]
        raise LabError(f"{exc}; still silent: {sorted(missing)}", logs) from None


def check_returns(data, targets, what, on_master):
    """Raise LabError unless every target returned; for states, unless every state succeeded."""
    logs = [master(on_master).log]
    for mid in targets:
        ret = data.get(mid)
        if ret is None or isinstance(ret, str) and "did not return" in ret:
            raise LabError(f"{what}: {mid} did not return", logs + [minion(mid).log])
        if not isinstance(ret, dict):
            raise LabError(f"{what}: {mid} returned {ret!r}", logs + [minion(mid).log])
        failed = [
            f"{state.get('__id__', sid)}: {state.get('comment')}"
            for sid, state in ret.items()
            if isinstance(state, dict) and "result" in state and state["result"] is not True
        ]
        if failed:
            raise LabError(f"{what} failed on {mid}:\n  " + "\n  ".join(failed), [minion(mid).log])


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


def clean():
    """Stop any previous lab's daemons and remove lab/run."""
    stop_all()
    if RUN.exists():
        shutil.rmtree(RUN)


def check_ports_free():
    """Refuse to start when something already listens on the lab's addresses and ports."""
    busy = [
        f"{ip}:{port}"
        for ip in MASTERS.values()
        for port in (PORTS.publish, PORTS.ret)
        if port_open(ip, port)
    ]
    if busy:
        raise LabError(f"already in use: {', '.join(busy)} (another lab? try: lab.py down)")


def restart_master_via_state(name):
    """Apply multimaster.master to master ``name``'s control minion; wait if it restarted."""
    old_pid = read_pid(master(name))
    restarted = apply_state("master1", [name], "multimaster.master")
    conf = master(name).dir / "master.d" / "multimaster.conf"
    if not conf.is_file():
        raise LabError(f"multimaster.master did not write {conf}", [minion(name).log])
    if old_pid and name in restarted:
        wait_restarted(master(name), old_pid)
        wait_master_listening(name)
    return restarted


def configure_minions():
    """Apply multimaster.minion everywhere from master1, then wait for the minions to restart."""
    old = {mid: read_pid(minion(mid)) for mid in MINIONS}
    restarted = apply_state("master1", sorted(MINIONS), "multimaster.minion")
    if restarted != set(MINIONS):
        raise LabError(f"multimaster.minion restarted only {sorted(restarted)}")
    for mid in MINIONS:
        wait_restarted(minion(mid), old[mid])


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
            if not read_pid(master(name)):
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


def build(report):
    """Everything up to a running, configured two-master lab with the ping matrix shown."""
    with report.step("clean previous lab"):
        clean()
        check_ports_free()
    with report.step("write configs (3 masters, 6 minions) and pillar (master1, master2)"):
        write_configs()
    with report.step("start master1"):
        start_daemon(master("master1"))
        wait_master_listening("master1")
    with report.step("start 4 minions (they know only master1)"):
        with concurrent.futures.ThreadPoolExecutor(len(MINIONS)) as pool:
            for future in [pool.submit(start_daemon, minion(mid)) for mid in MINIONS]:
                future.result()
    with report.step("accept the minion keys on master1 (salt-key -a)"):
        accept_minion_keys("master1")
        wait_answering("master1", MINIONS)
    with report.step("saltutil.sync_all (formula via master1's file_roots)"):
        sync_all("master1")
    with report.step("salt-run saltutil.sync_all (runners, before master1's reactors start)"):
        salt_run("saltutil.sync_all")
    with report.step("state.apply multimaster.master on master2 (stopped)"):
        restart_master_via_state("master2")
    with report.step("state.apply multimaster.master on master1 (restarts it)"):
        if "master1" not in restart_master_via_state("master1"):
            raise LabError("multimaster.master did not restart the running master1")
        wait_answering("master1", MINIONS)
    with report.step("start master2 (it makes its own master key)"):
        start_daemon(master("master2"))
        wait_master_listening("master2")
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
    with report.step("multimaster.sync_master_modules on master2 (runners for its reactors)"):
        old_pid = read_pid(master("master2"))
        synced = salt("master1", "master2", "multimaster.sync_master_modules", timeout=120)
        if "multimaster" not in str((synced.get("master2") or {}).get("synced")):
            raise LabError(f"master2 did not get the formula's runners: {synced}")
        wait_restarted(master("master2"), old_pid)
        wait_master_listening("master2")
        wait_answering("master2", expected_answers("master2"))
    with report.step(f"salt-key -a {NEWCOMER} on master2; the reactor accepts it on master1"):
        pem = devkit.new_public_pem()
        for name in FIRST_SET:
            pending = master(name).pki_dir / "minions_pre" / NEWCOMER
            pending.write_text(pem)
        began = time.monotonic()
        run("salt-key", master("master2").dir, "-a", NEWCOMER, "-y", timeout=60)
        accepted = master("master1").pki_dir / "minions" / NEWCOMER
        wait_for(
            f"{NEWCOMER} accepted on master1 by master2's key reactor",
            accepted.exists,
            REACTOR_TIMEOUT,
            interval=0.1,
            logs=[master("master2").log],
        )
        seconds = time.monotonic() - began
        if accepted.read_text() != pem:
            raise LabError(f"master1 holds another key for {NEWCOMER}", [master("master2").log])
    report.notes.append(
        f"Key reactor: salt-key -a {NEWCOMER} on master2 -> the same key accepted on master1 "
        f"{seconds:.1f}s later (salt-key CLI included)."
    )
    print(report.notes[-1], flush=True)


def highstates(name):
    """The lines the demo's highstate (lab/salt/lab_demo) appended on minion ``name``."""
    path = minion(name).dir / "highstates.log"
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
        logs=[minion(name).log],
    )
    run("salt-key", master("master1").dir, "-a", name, "-y", timeout=60)
    accepted = master(reactor_on).pki_dir / "minions" / name
    wait_for(
        f"{name} accepted on {reactor_on} by master1's key reactor",
        accepted.exists,
        REACTOR_TIMEOUT,
        interval=0.2,
        logs=[master("master1").log],
    )


def first_highstate(report):
    """
    A new hot minion (it knows both masters) is accepted on master1: the key reactor accepts it
    on master2, and its first start gets exactly one highstate from the set - not one per
    master, not another when it restarts.
    """
    with report.step(f"start {NEW_MINION} (new, hot); salt-key -a on master1 only"):
        start_daemon(minion(NEW_MINION))
        accept_new_minion(NEW_MINION, reactor_on="master2")
    with report.step(f"{NEW_MINION}'s first start: one highstate (first-highstate reactor)"):
        began = time.monotonic()
        wait_for(
            f"the first highstate on {NEW_MINION}",
            lambda: highstates(NEW_MINION),
            STATE_TIMEOUT,
            logs=[minion(NEW_MINION).log, master("master1").log, master("master2").log],
        )
        seconds = time.monotonic() - began
        for name in FIRST_SET:
            wait_answering(name, [NEW_MINION])
    with report.step(f"restart {NEW_MINION}: both masters react again, no second highstate"):
        stop_daemon(minion(NEW_MINION))
        start_daemon(minion(NEW_MINION))
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


def add_master(report):
    """
    master3 joins with ``state.orch multimaster.orch.add_master`` while master1 pings the hot
    minion1 once a second; afterwards every hot minion answers master3.
    """
    with report.step(f"start {NEW_MASTER} and its control minion; salt-key -a on master1"):
        start_daemon(master(NEW_MASTER))
        wait_master_listening(NEW_MASTER)
        start_daemon(minion(NEW_MASTER))
        accept_new_minion(NEW_MASTER, reactor_on="master2")
        wait_answering("master1", [NEW_MASTER])
        # Its first start got it a first highstate too: let that finish before the orchestration
        # applies states to it.
        wait_for(
            f"the first highstate on {NEW_MASTER}'s control minion",
            lambda: highstates(NEW_MASTER),
            STATE_TIMEOUT,
            logs=[minion(NEW_MASTER).log],
        )
        wait_for(
            f"{NEW_MASTER}'s control minion to finish its jobs",
            lambda: salt("master1", NEW_MASTER, "saltutil.running").get(NEW_MASTER) == [],
            STATE_TIMEOUT,
        )
    with report.step(f"pillar: {NEW_MASTER} added to multimaster:masters"):
        write_pillar(MASTERS)
    title = f"salt-run state.orch multimaster.orch.add_master ({NEW_MASTER}), pinging"
    with report.step(f"{title} {PINGED_MINION}"):
        stop, record = threading.Event(), []
        pinger = threading.Thread(target=ping_loop, args=(stop, record), daemon=True)
        pinger.start()
        began = time.monotonic()
        try:
            result = run(
                "salt-run", master("master1").dir, "state.orch", "multimaster.orch.add_master",
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
                [master("master1").log],
            )
    with report.step(f"wait for every minion on {NEW_MASTER}"):
        wait_answering(NEW_MASTER, expected_answers(NEW_MASTER, ALL_MINIONS))
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
    with report.step("test.ping matrix (three masters)"):
        ping_matrix(
            report, "test.ping answered (three masters up):", "master1", MASTERS, ALL_MINIONS
        )


def failover(report):
    """Stop master1; measure how long the failover minion takes to answer from another master."""
    others = [name for name in MASTERS if name != "master1"]
    with report.step(f"stop master1; wait for {FAILOVER_MINION} to answer from another master"):
        began = time.monotonic()
        stop_daemon(master("master1"))
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
            logs=[minion(FAILOVER_MINION).log] + [master(name).log for name in others],
        )
        seconds = time.monotonic() - began
    report.notes.append(
        f"Failover: {FAILOVER_MINION} answered test.ping from {serving} {seconds:.1f}s after "
        f"master1 was sent SIGTERM (master1 took {stopped:.1f}s to exit; "
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
    for log in exc.logs:
        print(f"\n--- last lines of {log} ---", file=sys.stderr)
        try:
            print("\n".join(log.read_text(errors="replace").splitlines()[-15:]), file=sys.stderr)
        except OSError as err:
            print(f"(cannot read: {err})", file=sys.stderr)


def run_lab(keep_running, with_failover):
    """Build the lab (and run the failover demo); stop everything unless ``keep_running``."""
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
            outcome += "\n  see: " + ", ".join(str(log) for log in exc.logs)
    except KeyboardInterrupt:
        outcome = "FAILED: interrupted"
    except Exception as exc:  # a bug in the lab itself: still stop the daemons and say so
        traceback.print_exc()
        outcome = f"FAILED: unexpected {exc!r}"
    finally:
        if not (ok and keep_running):
            with report.step("stop all lab daemons"):
                stop_all()
    print(report.render(outcome), flush=True)
    if ok and keep_running:
        print(
            "The lab is running. Try:\n"
            f"  {BIN / 'salt'} -c {master('master1').dir} '*' test.ping\n"
            f"  {BIN / 'salt'} -c {master('master2').dir} '*' test.ping\n"
            f"Logs: {RUN}/<host>/log/. Stop it with: {sys.executable} {__file__} down"
        )
    return 0 if ok else 1


def down():
    """Stop every lab daemon and remove lab/run."""
    clean()
    print(f"lab stopped; {RUN} removed")
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
        choices=("demo", "up", "down"),
        help="demo (default): run and stop; up: build and leave running; down: stop and clean",
    )
    args = parser.parse_args(argv)
    if args.command == "down":
        return down()
    return run_lab(keep_running=args.command == "up", with_failover=args.command == "demo")


if __name__ == "__main__":
    sys.exit(main())
