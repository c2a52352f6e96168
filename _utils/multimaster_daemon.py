"""
Restart a Salt daemon the way it runs: as a systemd service where it is one, otherwise by
re-running its own command line as a ``-d`` daemon (pidfile), under whatever config dir it uses.

The restart can wait for another process to end first: a minion restarting itself from inside a
job must let that job send its return, or the highstate that changed the master list would never
report back.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import psutil
import salt.utils.files

# Runs detached from the job: wait for the job process, then restart.  Kept as plain Python so the
# watcher needs nothing but the interpreter the daemon already runs on.
_WATCHER = r"""
import json, os, signal, subprocess, sys, time
import psutil

spec = json.loads(sys.argv[1])

def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False

deadline = time.time() + spec["wait_timeout"]
while spec["wait_pid"] and alive(spec["wait_pid"]) and time.time() < deadline:
    time.sleep(0.2)
time.sleep(spec["delay"])
if spec["service"]:
    subprocess.call(["systemctl", "restart", spec["service"]])
    sys.exit(0)
if alive(spec["pid"]):
    os.kill(spec["pid"], signal.SIGTERM)
    deadline = time.time() + spec["stop_timeout"]
    while alive(spec["pid"]) and time.time() < deadline:
        time.sleep(0.2)
    if alive(spec["pid"]):
        os.kill(spec["pid"], signal.SIGKILL)
# Salt refuses to start while its pidfile or process_responsibility_ file names a live process, and
# counts a zombie (a parent that does not reap: a container's pid 1, a test runner) as live.
pid_dir, pid_name = os.path.split(spec["pidfile"])
for path in (spec["pidfile"], os.path.join(pid_dir, "process_responsibility_" + pid_name)):
    try:
        with open(path) as handle:
            owner = json.loads(handle.read() or "null")
        if (owner.get("pid") if isinstance(owner, dict) else owner) == spec["pid"]:
            os.remove(path)
    except (OSError, ValueError):
        pass
subprocess.Popen(spec["cmdline"], cwd=spec["cwd"], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
"""


_PROCTITLE_RE = re.compile(r"[A-Z][A-Za-z0-9_.]*")


def read_pid(pidfile):
    """
    The pid in ``pidfile`` if that process is alive, else None.
    """
    try:
        with salt.utils.files.fopen(pidfile) as handle:
            pid = int(handle.read().strip())
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return pid
    except (OSError, ValueError, psutil.Error):
        return None


def systemd_service_of(pid, service):
    """
    ``service`` when ``pid`` is that systemd unit's main process, else None.
    """
    if not os.path.isdir("/run/systemd/system") or not shutil.which("systemctl"):
        return None
    try:
        out = subprocess.run(
            ["systemctl", "show", "-p", "MainPID", "--value", service],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return service if out == str(pid) else None


def daemon_cmdline(pid):
    """
    The command line that restarts process ``pid`` as a background daemon (adds ``-d``).
    """
    proc = psutil.Process(pid)
    if pid == os.getpid() or pid in {parent.pid for parent in psutil.Process().parents()}:
        # Restarting the daemon this job runs in: its exact argv, untouched by process titles.
        cmdline = [sys.executable, *sys.orig_argv[1:]]
    else:
        cmdline = proc.cmdline()
        # Salt appends process titles ("MainProcess", "MultiMinionProcessManager", ...) over argv.
        while len(cmdline) > 2 and _PROCTITLE_RE.fullmatch(cmdline[-1]):
            cmdline.pop()
    if "-d" not in cmdline and "--daemon" not in cmdline:
        cmdline.append("-d")
    return cmdline, proc.cwd()


def schedule_restart(pidfile, service, wait_pid=None, delay=0.0, wait_timeout=600):
    """
    Restart the daemon recorded in ``pidfile`` from a detached process once ``wait_pid`` has ended.

    Returns a dict describing what was scheduled; ``{"scheduled": False, ...}`` when no such
    daemon runs (image builds, ``salt-call --local`` on a host without the service).
    """
    pid = read_pid(pidfile)
    if pid is None:
        return {"scheduled": False, "reason": f"no running daemon recorded in {pidfile}"}
    if wait_pid == pid:
        # The job runs inside the daemon itself (multiprocessing off): a delay is all we can do.
        wait_pid, delay = None, max(delay, 5.0)
    unit = systemd_service_of(pid, service)
    cmdline, cwd = daemon_cmdline(pid)
    spec = {
        "pid": pid,
        "pidfile": pidfile,
        "wait_pid": wait_pid,
        "wait_timeout": wait_timeout,
        "stop_timeout": 30,
        "delay": delay,
        "service": unit,
        "cmdline": cmdline,
        "cwd": cwd,
    }
    subprocess.Popen(
        [sys.executable, "-c", _WATCHER, json.dumps(spec)],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )
    how = f"systemctl restart {unit}" if unit else " ".join(cmdline)
    return {"scheduled": True, "pid": pid, "how": how}


def stop_now(pidfile, service, timeout=30):
    """
    Stop the daemon recorded in ``pidfile`` and wait until it is gone. Returns how to start it
    again: ``{"was_running", "service", "cmdline", "cwd"}``.
    """
    pid = read_pid(pidfile)
    if pid is None:
        return {"was_running": False, "service": None, "cmdline": None, "cwd": None}
    unit = systemd_service_of(pid, service)
    cmdline, cwd = daemon_cmdline(pid)
    if unit:
        subprocess.run(["systemctl", "stop", unit], check=False, timeout=timeout)
    else:
        proc = psutil.Process(pid)
        proc.terminate()
        if not _wait_gone(proc, timeout):
            proc.kill()
            _wait_gone(proc, 10)
        _clear_stale_pidfiles(pidfile, pid)
    return {"was_running": True, "service": unit, "cmdline": cmdline, "cwd": cwd}


def _wait_gone(proc, timeout):
    """
    True once ``proc`` has exited. A zombie has exited: its parent (a test runner, a container's
    pid 1) may never reap it, and ``psutil.Process.wait`` would wait for that.
    """
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return False


def _clear_stale_pidfiles(pidfile, pid):
    """
    Remove the pidfile and ``process_responsibility_`` file naming the stopped ``pid``: Salt
    counts an unreaped zombie as a running instance and would refuse to start.
    """
    pid_dir, pid_name = os.path.split(pidfile)
    for path in (pidfile, os.path.join(pid_dir, "process_responsibility_" + pid_name)):
        try:
            with salt.utils.files.fopen(path) as handle:
                owner = json.loads(handle.read() or "null")
            if (owner.get("pid") if isinstance(owner, dict) else owner) == pid:
                os.remove(path)
        except (OSError, ValueError):
            pass


def start_now(stopped, default_cmdline):
    """
    Start a daemon stopped by ``stop_now`` the way it ran (``default_cmdline`` when it was not
    running at all).
    """
    if stopped["service"]:
        subprocess.run(["systemctl", "start", stopped["service"]], check=False, timeout=60)
        return
    subprocess.Popen(
        stopped["cmdline"] or default_cmdline,
        cwd=stopped["cwd"] or "/",
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )


def wait_port(host, port, timeout):
    """
    True once ``host:port`` accepts TCP connections, False after ``timeout`` seconds.
    """
    import socket
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1):
                return True
        except OSError:
            time.sleep(0.2)
    return False
