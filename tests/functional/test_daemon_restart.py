"""
``multimaster_daemon.schedule_restart`` end to end, on a stand-in salt-master that is not a
systemd service: the detached watcher (this module's file run as a script) stops it and starts
``salt-master -c <config dir> -d`` again, keeping its log level but nothing else of its command
line or working directory, and only once the process it was told to wait for has ended (and,
for a master, the grace that lets that job's return reach its bus has passed).
"""

import os
import signal
import subprocess
import sys
import time

import multimaster_daemon
import psutil
import pytest

# Behaves as far as a restart can tell like salt-master: writes <config dir>/salt-master.pid,
# exits on SIGTERM.
STAND_IN = f"""#!{sys.executable}
import os, signal, sys, time
conf = sys.argv[sys.argv.index("-c") + 1]
with open(os.path.join(conf, "salt-master.pid"), "w") as handle:
    handle.write(str(os.getpid()))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
time.sleep(120)
"""


def wait_for(predicate, timeout, what):
    value = multimaster_daemon.wait_for(predicate, timeout, interval=0.1)
    assert value, f"timed out after {timeout}s waiting for {what}"
    return value


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    """
    A running stand-in ``salt-master -c <conf> -l info``, started from ``tmp_path``; restarts
    use its script. Yields ``(process, pidfile, script, conf)``.
    """
    script = tmp_path / "bin" / "salt-master"
    script.parent.mkdir()
    script.write_text(STAND_IN)
    script.chmod(0o755)
    monkeypatch.setattr(multimaster_daemon, "_daemon_script", lambda daemon: str(script))
    conf = tmp_path / "conf"
    conf.mkdir()
    pidfile = conf / "salt-master.pid"
    argv = [sys.executable, str(script), "-c", str(conf), "-l", "info"]
    proc = subprocess.Popen(argv, cwd=tmp_path)
    wait_for(lambda: verified(pidfile, conf) == proc.pid, 10, "the daemon")
    yield proc, pidfile, script, conf
    # Stop what this test started: the original and the restarted daemon, by pid.
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    pid = multimaster_daemon.read_pid(str(pidfile))
    if pid is not None and pid != proc.pid:
        os.kill(pid, signal.SIGKILL)


def verified(pidfile, conf):
    return multimaster_daemon.verified_pid(str(pidfile), "salt-master", str(conf))


def restarted(pidfile, conf, old_pid):
    pid = verified(pidfile, conf)
    return pid if pid not in (None, old_pid) else None


def test_restart_as_daemon_of_its_config_dir(daemon):
    proc, pidfile, script, conf = daemon
    result = multimaster_daemon.schedule_restart(
        str(pidfile), "no-such-unit-xyz", "salt-master", str(conf)
    )
    assert result == {
        "scheduled": True,
        "pid": proc.pid,
        "how": f"{script} -c {conf} -d -l info",
    }
    assert proc.wait(timeout=30) == 0  # SIGTERM from the watcher
    new_pid = wait_for(lambda: restarted(pidfile, conf, proc.pid), 30, "the restarted daemon")
    new = psutil.Process(new_pid)
    assert new.cmdline() == [sys.executable, str(script), "-c", str(conf), "-d", "-l", "info"]
    assert new.cwd() == "/"


def test_restart_waits_for_the_job(daemon):
    proc, pidfile, _, conf = daemon
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
    result = multimaster_daemon.schedule_restart(
        str(pidfile), "no-such-unit-xyz", "salt-master", str(conf), wait_pid=job.pid
    )
    assert result["scheduled"] is True
    time.sleep(1)
    assert job.poll() is None, "the job should still run"
    assert proc.poll() is None, "the daemon was restarted before the job ended"
    job.wait(timeout=30)
    ended = time.monotonic()
    # A master waits a little longer, so that the job's return reaches its event bus.
    time.sleep(multimaster_daemon.MASTER_RETURN_GRACE - 1)
    assert proc.poll() is None, "the master was restarted before the return's grace ended"
    wait_for(lambda: restarted(pidfile, conf, proc.pid), 30, "the restarted daemon")
    assert time.monotonic() - ended >= multimaster_daemon.MASTER_RETURN_GRACE - 0.5
    proc.wait(timeout=30)
