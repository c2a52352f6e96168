"""
The pure parts of ``multimaster_daemon``: pidfiles, command lines, and the no-daemon case of
``schedule_restart``. Processes are real (short-lived children of this test).
"""

import os
import subprocess
import sys
import time

import multimaster_daemon
import psutil
import pytest


@pytest.fixture
def child():
    procs = []

    def start(*extra):
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *extra])
        procs.append(proc)
        # Between fork and exec the child's command line is still empty: wait for the exec.
        deadline = time.monotonic() + 10
        while psutil.Process(proc.pid).cmdline()[:1] != [sys.executable]:
            assert time.monotonic() < deadline, "the child did not start"
            time.sleep(0.01)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_read_pid_of_a_live_process(tmp_path):
    pidfile = tmp_path / "d.pid"
    pidfile.write_text(f"{os.getpid()}\n")
    assert multimaster_daemon.read_pid(str(pidfile)) == os.getpid()


def test_read_pid_stale_pidfile(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    pidfile = tmp_path / "d.pid"
    pidfile.write_text(str(proc.pid))
    assert multimaster_daemon.read_pid(str(pidfile)) is None


def test_read_pid_of_a_zombie(tmp_path, child):
    proc = child()
    proc.kill()
    # Not waited for yet: a zombie, which must count as not running.
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    pidfile = tmp_path / "d.pid"
    pidfile.write_text(str(proc.pid))
    assert multimaster_daemon.read_pid(str(pidfile)) is None


@pytest.mark.parametrize("content", ["", "garbage\n", "12ab", "-1", "1.5", "\x00\x01"])
def test_read_pid_garbage(tmp_path, content):
    pidfile = tmp_path / "d.pid"
    pidfile.write_text(content)
    assert multimaster_daemon.read_pid(str(pidfile)) is None


def test_read_pid_missing_or_unreadable(tmp_path):
    assert multimaster_daemon.read_pid(str(tmp_path / "missing.pid")) is None
    assert multimaster_daemon.read_pid(str(tmp_path)) is None  # a directory


def test_daemon_cmdline_adds_daemon_flag(child, tmp_path):
    proc = child()
    cmdline, cwd = multimaster_daemon.daemon_cmdline(proc.pid)
    assert cmdline == [sys.executable, "-c", "import time; time.sleep(60)", "-d"]
    assert cwd == os.getcwd()


@pytest.mark.parametrize("flag", ["-d", "--daemon"])
def test_daemon_cmdline_keeps_existing_flag(child, flag):
    proc = child(flag)
    cmdline, _ = multimaster_daemon.daemon_cmdline(proc.pid)
    assert cmdline == [sys.executable, "-c", "import time; time.sleep(60)", flag]


def test_schedule_restart_when_nothing_runs(tmp_path):
    pidfile = tmp_path / "salt-minion.pid"
    assert multimaster_daemon.schedule_restart(str(pidfile), "salt-minion") == {
        "scheduled": False,
        "reason": f"no running daemon recorded in {pidfile}",
    }


def test_systemd_service_of_a_non_service_process(child):
    # Not a systemd unit's main process (or no systemd at all): treated as a plain daemon.
    proc = child()
    assert multimaster_daemon.systemd_service_of(proc.pid, "salt-minion") is None
