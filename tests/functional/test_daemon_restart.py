"""
``multimaster_daemon.schedule_restart`` on a real (stand-in) daemon that is not a systemd
service: it is restarted from its own command line as a ``-d`` daemon, and only once the
process it was told to wait for (the job that asked) has ended.
"""

import os
import pathlib
import signal
import subprocess
import sys
import time

import psutil
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "_utils"))

import multimaster_daemon  # noqa: E402

DAEMON = """
import os, signal, sys, time
with open(sys.argv[1], "w") as handle:
    handle.write(str(os.getpid()))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
time.sleep(120)
"""


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def daemon(tmp_path):
    script = tmp_path / "fake_daemon.py"
    script.write_text(DAEMON)
    pidfile = tmp_path / "fake.pid"
    proc = subprocess.Popen([sys.executable, str(script), str(pidfile)], cwd=tmp_path)
    wait_for(lambda: multimaster_daemon.read_pid(str(pidfile)) == proc.pid, 10, "the daemon")
    yield proc, pidfile, script
    # Stop what this test started: the original and the restarted daemon, by pid.
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    pid = multimaster_daemon.read_pid(str(pidfile))
    if pid is not None and pid != proc.pid:
        os.kill(pid, signal.SIGKILL)


def restarted(pidfile, old_pid):
    pid = multimaster_daemon.read_pid(str(pidfile))
    return pid if pid not in (None, old_pid) else None


def test_restart_as_daemon_from_own_cmdline(daemon, tmp_path):
    proc, pidfile, script = daemon
    result = multimaster_daemon.schedule_restart(str(pidfile), "no-such-unit-xyz")
    assert result["scheduled"] is True
    assert result["pid"] == proc.pid
    assert result["how"] == f"{sys.executable} {script} {pidfile} -d"
    proc.wait(timeout=30)  # SIGTERM from the watcher
    new_pid = wait_for(lambda: restarted(pidfile, proc.pid), 30, "the restarted daemon")
    new = psutil.Process(new_pid)
    assert new.cmdline() == [sys.executable, str(script), str(pidfile), "-d"]
    assert new.cwd() == str(tmp_path)


def test_restart_waits_for_the_job(daemon):
    proc, pidfile, _ = daemon
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
    started = time.monotonic()
    result = multimaster_daemon.schedule_restart(str(pidfile), "no-such-unit-xyz", wait_pid=job.pid)
    assert result["scheduled"] is True
    time.sleep(1)
    assert job.poll() is None, "the job should still run"
    assert proc.poll() is None, "the daemon was restarted before the job ended"
    job.wait(timeout=30)
    wait_for(lambda: restarted(pidfile, proc.pid), 30, "the restarted daemon")
    assert time.monotonic() - started >= 2
    proc.wait(timeout=30)
