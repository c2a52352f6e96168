"""
``multimaster_daemon``: pidfiles, who the pid really is, the command a restart runs, and the
detached watcher (``main``). Processes are real: short-lived children of this test, among them
stand-ins for a salt-master (a script whose file name is ``salt-master``).
"""

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import multimaster_daemon
import psutil
import pytest
import salt.syspaths
from salt.exceptions import CommandExecutionError

SLEEPER = "import time; time.sleep(60)"

# A salt-master stand-in: once set up, writes its pidfile (as Salt does), then sleeps.
# "ignore-term" makes it survive SIGTERM.
STAND_IN = """\
import os, signal, sys, time
if "ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.environ["STAND_IN_PIDFILE"], "w") as handle:
    handle.write(str(os.getpid()))
time.sleep(60)
"""

# Run as the restart command: records the directory it was started in.
RECORD_CWD = "import os, sys; open(sys.argv[1], 'w').write(os.getcwd())"


def _wait_exec(proc, first):
    # Between fork and exec the child's command line is still the parent's: wait for the exec.
    assert multimaster_daemon.wait_for(
        lambda: psutil.Process(proc.pid).cmdline()[1:2] == [first], 10, interval=0.01
    ), "the child did not start"
    return proc


# The real one, for its own tests: a watcher's would wait for a master these tests fake.
FLUSH_BUS = multimaster_daemon.flush_bus


@pytest.fixture(autouse=True)
def flushed(monkeypatch):
    """The buses ``flush_bus`` was asked to flush (it is not run)."""
    asked = []
    monkeypatch.setattr(multimaster_daemon, "flush_bus", asked.append)
    return asked


@pytest.fixture
def spawn():
    """
    Start ``argv`` (after the interpreter) as a child; every child is killed at the end.
    """
    procs = []

    def start(*argv, env=None):
        proc = subprocess.Popen([sys.executable, *argv], env=env)
        procs.append(proc)
        return _wait_exec(proc, argv[0])

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.fixture
def child(spawn):
    """
    A live process that is no salt daemon at all.
    """
    return lambda: spawn("-c", SLEEPER)


@pytest.fixture
def conf(tmp_path):
    path = tmp_path / "conf"
    path.mkdir()
    return str(path)


@pytest.fixture
def master(spawn, tmp_path):
    """
    Start a salt-master stand-in with ``args`` (and ``env``, else this environment without
    SALT_CONFIG_DIR); returns ``(proc, pidfile)`` once it has written its pidfile.
    """
    script = tmp_path / "bin" / "salt-master"
    script.parent.mkdir()
    script.write_text(STAND_IN)
    pidfile = tmp_path / "run" / "salt-master.pid"
    pidfile.parent.mkdir()

    def start(*args, env=None):
        if env is None:
            env = {k: v for k, v in os.environ.items() if k != "SALT_CONFIG_DIR"}
        proc = spawn(str(script), *args, env={**env, "STAND_IN_PIDFILE": str(pidfile)})
        wrote = multimaster_daemon.wait_for(
            lambda: multimaster_daemon.read_pid(str(pidfile)) == proc.pid, 10, interval=0.01
        )
        assert wrote, "the stand-in did not write its pidfile"
        return proc, str(pidfile)

    return start


@pytest.fixture
def no_exec(monkeypatch):
    """
    Records every process the module would start, and starts none.
    """
    started = []
    monkeypatch.setattr(multimaster_daemon, "_spawn", started.append)
    return started


def _pidfile(tmp_path, pid):
    pidfile = tmp_path / "salt-master.pid"
    pidfile.write_text(f"{pid}\n")
    return str(pidfile)


# --- read_pid --------------------------------------------------------------------------------


def test_read_pid_of_a_live_process(tmp_path):
    assert multimaster_daemon.read_pid(_pidfile(tmp_path, os.getpid())) == os.getpid()


def test_read_pid_stale_pidfile(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert multimaster_daemon.read_pid(_pidfile(tmp_path, proc.pid)) is None


def test_read_pid_of_a_zombie(tmp_path, child):
    proc = child()
    proc.kill()
    # Not waited for yet: a zombie, which must count as not running.
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    assert multimaster_daemon.read_pid(_pidfile(tmp_path, proc.pid)) is None


@pytest.mark.parametrize("content", ["", "garbage\n", "12ab", "-1", "1.5", "\x00\x01"])
def test_read_pid_garbage(tmp_path, content):
    pidfile = tmp_path / "d.pid"
    pidfile.write_text(content)
    assert multimaster_daemon.read_pid(str(pidfile)) is None


def test_read_pid_missing_or_unreadable(tmp_path):
    assert multimaster_daemon.read_pid(str(tmp_path / "missing.pid")) is None
    assert multimaster_daemon.read_pid(str(tmp_path)) is None  # a directory


# --- verified_pid: the attacks ---------------------------------------------------------------


def test_verified_pid_refuses_a_process_that_is_not_the_daemon(child, tmp_path, conf, caplog):
    proc = child()
    assert (
        multimaster_daemon.verified_pid(_pidfile(tmp_path, proc.pid), "salt-master", conf) is None
    )
    assert f"pid {proc.pid} is not salt-master" in caplog.text


def test_schedule_restart_never_signals_or_runs_a_foreign_process(child, tmp_path, conf, no_exec):
    proc = child()
    pidfile = _pidfile(tmp_path, proc.pid)
    result = multimaster_daemon.schedule_restart(pidfile, "no-such-unit", "salt-master", conf)
    assert result["scheduled"] is False
    assert f"pid {proc.pid} is not salt-master" in result["reason"]
    assert no_exec == []
    time.sleep(0.3)
    assert proc.poll() is None


def test_stop_now_refuses_a_foreign_process(child, tmp_path, conf, no_exec):
    proc = child()
    pidfile = _pidfile(tmp_path, proc.pid)
    with pytest.raises(
        CommandExecutionError, match=f"{pidfile}.*pid {proc.pid} is not salt-master"
    ):
        multimaster_daemon.stop_now(pidfile, "no-such-unit", "salt-master", conf)
    assert no_exec == []
    time.sleep(0.3)
    assert proc.poll() is None


# A user the test's processes do not run as.
NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="gives a file to another user")


@needs_root
def test_verified_pid_refuses_a_pidfile_older_than_the_process(master, conf, no_exec):
    # The pid was reused: the process holding it now, of another user than the pidfile's,
    # started after the pidfile was written.
    proc, pidfile = master("-c", conf)
    os.chown(pidfile, NOBODY, -1)
    old = time.time() - 3600
    os.utime(pidfile, (old, old))
    assert multimaster_daemon.verified_pid(pidfile, "salt-master", conf) is None
    assert (
        multimaster_daemon.schedule_restart(pidfile, "x", "salt-master", conf)["scheduled"] is False
    )
    with pytest.raises(CommandExecutionError, match="started after"):
        multimaster_daemon.stop_now(pidfile, "no-such-unit", "salt-master", conf)
    assert no_exec == [] and proc.poll() is None


def test_a_clock_step_does_not_make_the_owner_s_daemon_a_reused_pid(master, conf, no_exec):
    # The clock stepped forward an hour after the daemon wrote its pidfile (a VM resumed): as
    # psutil counts it, the daemon now started after it wrote the pidfile. It runs as the
    # pidfile's owner, so it is still the daemon, and is restarted.
    proc, pidfile = master("-c", conf)
    old = time.time() - 3600
    os.utime(pidfile, (old, old))
    assert multimaster_daemon.verified_pid(pidfile, "salt-master", conf) == proc.pid
    assert multimaster_daemon.schedule_restart(pidfile, "x", "salt-master", conf)["scheduled"]


def test_verified_pid_refuses_another_config_dir(master, conf, tmp_path, caplog):
    other = tmp_path / "other"
    other.mkdir()
    _, pidfile = master("-c", str(other))
    assert multimaster_daemon.verified_pid(pidfile, "salt-master", conf) is None
    assert f"salt-master of {other}, not of {conf}" in caplog.text


def test_verified_pid_refuses_another_daemon(master, conf):
    _, pidfile = master("-c", conf)
    assert multimaster_daemon.verified_pid(pidfile, "salt-minion", conf) is None


def test_verified_pid_default_config_dir(master, conf):
    # No -c: Salt's default config dir, which is not ``conf``.
    proc, pidfile = master()
    assert multimaster_daemon.verified_pid(pidfile, "salt-master", conf) is None
    got = multimaster_daemon.verified_pid(pidfile, "salt-master", salt.syspaths.CONFIG_DIR)
    assert got == proc.pid


def test_verified_pid_config_dir_from_the_environment(master, conf):
    # No -c, but SALT_CONFIG_DIR: Salt takes its config dir from there.
    proc, pidfile = master(env={**os.environ, "SALT_CONFIG_DIR": conf})
    assert multimaster_daemon.verified_pid(pidfile, "salt-master", conf) == proc.pid
    assert multimaster_daemon.verified_pid(pidfile, "salt-master", salt.syspaths.CONFIG_DIR) is None


# --- verified_pid: the daemon itself ---------------------------------------------------------


@pytest.mark.parametrize("form", ["-c {}", "--config-dir {}", "--config-dir={}", "-c{}"])
def test_verified_pid_of_the_daemon(master, conf, form):
    proc, pidfile = master(*form.format(conf).split(" "), "-l", "info")
    assert multimaster_daemon.verified_pid(pidfile, "salt-master", conf) == proc.pid


def test_verified_pid_compares_real_paths(master, conf, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(conf)
    proc, pidfile = master("-c", str(link))
    assert multimaster_daemon.verified_pid(pidfile, "salt-master", conf + "/") == proc.pid


def test_verified_pid_when_nothing_runs(tmp_path, conf, caplog):
    assert multimaster_daemon.verified_pid(str(tmp_path / "none.pid"), "salt-master", conf) is None
    assert caplog.text == ""


# --- daemon_command --------------------------------------------------------------------------


def test_daemon_command_uses_the_script_of_this_install(conf):
    script = os.path.join(os.path.dirname(sys.executable), "salt-master")
    assert multimaster_daemon.daemon_command("salt-master", conf) == [script, "-c", conf, "-d"]


@pytest.mark.parametrize(
    "args, level",
    [
        (["-l", "info"], ["-l", "info"]),
        (["--log-level=debug"], ["-l", "debug"]),
        (["--log-level", "warning"], ["-l", "warning"]),
        (["-l", "-d"], []),  # a flag is not a level
        (["-l", "bogus"], []),
        (["-l", "info", "--log-level", "nonsense"], []),  # the last one counts, as in optparse
        ([], []),
    ],
)
def test_daemon_command_keeps_only_a_known_log_level(master, conf, args, level):
    proc, _ = master("-c", "/elsewhere", "--user", "evil", *args, "-d")
    command = multimaster_daemon.daemon_command("salt-master", conf, proc.pid)
    assert command[1:] == ["-c", conf, "-d", *level]


def test_daemon_command_script_on_path(monkeypatch, tmp_path, conf):
    # Not next to the interpreter (a system Python): found on PATH.
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "salt-master"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(bindir))
    assert multimaster_daemon.daemon_command("salt-master", conf)[0] == str(script)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(CommandExecutionError, match="salt-master"):
        multimaster_daemon.daemon_command("salt-master", conf)


# --- stop_now / start_now --------------------------------------------------------------------


def test_stop_now_and_start_now(master, conf, tmp_path):
    proc, pidfile = master("-c", conf, "-l", "info")
    stopped = multimaster_daemon.stop_now(pidfile, "no-such-unit", "salt-master", conf, timeout=10)
    assert stopped["was_running"] is True and stopped["service"] is None
    assert stopped["pid"] == proc.pid
    assert stopped["command"][1:] == ["-c", conf, "-d", "-l", "info"]
    assert proc.wait(timeout=5) == -signal.SIGTERM
    assert not os.path.exists(pidfile)
    # start_now runs the command it was given, from "/" (never a directory read from /proc).
    out = tmp_path / "cwd"
    stopped["command"] = [sys.executable, "-c", RECORD_CWD, str(out)]
    multimaster_daemon.start_now(stopped, "salt-master", conf)
    assert multimaster_daemon.wait_for(out.exists, 10)
    assert multimaster_daemon.wait_for(out.read_text, 5) == "/"


def test_stop_now_when_nothing_runs(tmp_path, conf):
    assert multimaster_daemon.stop_now(str(tmp_path / "none.pid"), "x", "salt-master", conf) == {
        "was_running": False,
        "service": None,
        "pid": None,
        "command": None,
    }


def test_start_now_when_it_was_not_running(conf, no_exec):
    multimaster_daemon.start_now({"service": None, "command": None}, "salt-master", conf)
    assert no_exec == [multimaster_daemon.daemon_command("salt-master", conf)]


def test_start_if_stopped_starts_a_master_that_does_not_run(tmp_path, conf, no_exec):
    how = multimaster_daemon.start_if_stopped(str(tmp_path / "none.pid"), "x", "salt-master", conf)
    assert how == "daemon"
    assert no_exec == [multimaster_daemon.daemon_command("salt-master", conf)]


def test_start_if_stopped_leaves_a_running_master_alone(master, conf, no_exec):
    proc, pidfile = master("-c", conf)
    assert multimaster_daemon.start_if_stopped(pidfile, "x", "salt-master", conf) is None
    assert no_exec == [] and proc.poll() is None


def test_start_if_stopped_refuses_a_pidfile_naming_another_process(child, tmp_path, conf, no_exec):
    proc = child()
    pidfile = _pidfile(tmp_path, proc.pid)
    with pytest.raises(CommandExecutionError, match=f"pid {proc.pid} is not salt-master"):
        multimaster_daemon.start_if_stopped(pidfile, "x", "salt-master", conf)
    assert no_exec == []


# --- schedule_restart ------------------------------------------------------------------------


def test_schedule_restart_when_nothing_runs(tmp_path, conf):
    pidfile = tmp_path / "salt-minion.pid"
    assert multimaster_daemon.schedule_restart(
        str(pidfile), "salt-minion", "salt-minion", conf
    ) == {
        "scheduled": False,
        "reason": f"no running daemon recorded in {pidfile}",
    }


def test_schedule_restart_starts_this_file_as_the_watcher(master, conf, no_exec):
    proc, pidfile = master("-c", conf, "-l", "info")
    result = multimaster_daemon.schedule_restart(pidfile, "no-such-unit", "salt-master", conf)
    [watcher] = no_exec
    assert watcher[:2] == [sys.executable, os.path.abspath(multimaster_daemon.__file__)]
    spec = json.loads(watcher[2])
    assert spec["pid"] == proc.pid and spec["pidfile"] == pidfile
    assert spec["command"] == multimaster_daemon.daemon_command("salt-master", conf, proc.pid)
    assert spec["command"][-2:] == ["-l", "info"]
    assert result == {"scheduled": True, "pid": proc.pid, "how": " ".join(spec["command"])}


# --- the watcher -----------------------------------------------------------------------------


def _watcher_spec(monkeypatch, pidfile, conf, out, **kwargs):
    """
    The spec ``schedule_restart`` hands its watcher (which is not started), with the restart
    command replaced by one that records its working directory in ``out``.
    """
    started = []
    with monkeypatch.context() as patch:
        patch.setattr(multimaster_daemon, "_spawn", started.append)
        result = multimaster_daemon.schedule_restart(pidfile, "x", "salt-master", conf, **kwargs)
    assert result["scheduled"] is True
    spec = json.loads(started[0][2])
    spec["command"] = [sys.executable, "-c", RECORD_CWD, str(out)]
    return spec


def _ran_in(out):
    assert multimaster_daemon.wait_for(out.exists, 10), "the restart command did not run"
    return multimaster_daemon.wait_for(out.read_text, 5)


def test_watcher_waits_for_the_job_then_restarts(master, conf, spawn, tmp_path, monkeypatch):
    proc, pidfile = master("-c", conf)
    responsibility = tmp_path / "run" / "process_responsibility_salt-master.pid"
    responsibility.write_text(json.dumps({"pid": proc.pid}))
    # The job ends as an unreaped zombie (nobody waits for it): that counts as ended.
    job = spawn("-c", "import time; time.sleep(1.5)")
    out = tmp_path / "cwd"
    spec = _watcher_spec(monkeypatch, pidfile, conf, out, wait_pid=job.pid)
    started = time.monotonic()
    assert multimaster_daemon.main([json.dumps(spec)]) == 0
    assert time.monotonic() - started >= 1, "did not wait for the job"
    assert proc.wait(timeout=5) == -signal.SIGTERM
    assert not os.path.exists(pidfile) and not responsibility.exists()
    assert _ran_in(out) == "/"


def test_a_master_restarted_after_a_job_flushes_its_bus_first(
    master, conf, spawn, tmp_path, monkeypatch, flushed
):
    proc, pidfile = master("-c", conf)
    # A job that ends at once may be gone before its exec is seen: this one lives a moment.
    job = spawn("-c", "import time; time.sleep(0.5)")
    out = tmp_path / "cwd"
    spec = _watcher_spec(monkeypatch, pidfile, conf, out, wait_pid=job.pid)
    assert spec["flush"] == conf
    monkeypatch.setitem(spec, "delay", 0)
    assert multimaster_daemon.main([json.dumps(spec)]) == 0
    # The job's return is on the master's bus before the restart.
    assert flushed == [conf]
    assert proc.wait(timeout=5) == -signal.SIGTERM
    _ran_in(out)


def test_watcher_kills_a_daemon_that_ignores_sigterm(master, conf, tmp_path, monkeypatch):
    proc, pidfile = master("-c", conf, "ignore-term")
    out = tmp_path / "cwd"
    spec = dict(_watcher_spec(monkeypatch, pidfile, conf, out), stop_timeout=0.5)
    assert multimaster_daemon.main([json.dumps(spec)]) == 0
    assert proc.wait(timeout=5) == -signal.SIGKILL
    assert _ran_in(out) == "/"


def test_watcher_keeps_pidfiles_of_other_processes(master, conf, tmp_path, monkeypatch):
    _, pidfile = master("-c", conf)
    responsibility = tmp_path / "run" / "process_responsibility_salt-master.pid"
    responsibility.write_text(json.dumps({"pid": os.getpid()}))
    spec = _watcher_spec(monkeypatch, pidfile, conf, tmp_path / "cwd")
    assert multimaster_daemon.main([json.dumps(spec)]) == 0
    assert responsibility.exists()


def test_watcher_does_not_signal_a_reused_pid(master, conf, tmp_path, monkeypatch):
    # Between scheduling and restarting, the pid came to name a process that started at another
    # time than the one recorded.
    proc, pidfile = master("-c", conf)
    out = tmp_path / "cwd"
    spec = _watcher_spec(monkeypatch, pidfile, conf, out)
    spec["create_time"] -= 100
    assert multimaster_daemon.main([json.dumps(spec)]) == 0
    assert _ran_in(out) == "/"
    assert proc.poll() is None
    assert not os.path.exists(pidfile)  # it no longer names the daemon


def test_watcher_restarts_a_service_with_systemctl(master, conf, tmp_path, monkeypatch, no_exec):
    proc, pidfile = master("-c", conf)
    spec = dict(_watcher_spec(monkeypatch, pidfile, conf, tmp_path / "cwd"), service="salt-master")
    calls = []
    monkeypatch.setattr(multimaster_daemon.subprocess, "call", calls.append)
    multimaster_daemon.main([json.dumps(spec)])
    assert calls == [["systemctl", "restart", "salt-master"]]
    assert proc.poll() is None and no_exec == []


# --- small helpers ---------------------------------------------------------------------------


def test_wait_for():
    values = iter([0, None, "", 7])
    assert multimaster_daemon.wait_for(lambda: next(values), 5, interval=0.01) == 7
    assert multimaster_daemon.wait_for(lambda: False, 0.1, interval=0.01) is None
    calls = []
    assert multimaster_daemon.wait_for(lambda: calls.append(1), 0) is None
    assert calls == [1]  # asked at least once


def test_systemd_service_of_a_non_service_process(child):
    # Not a systemd unit's main process (or no systemd at all): treated as a plain daemon.
    proc = child()
    assert multimaster_daemon.systemd_service_of(proc.pid, "salt-minion") is None


@pytest.mark.parametrize("main", ["self", "parent", "other", "0"])
def test_systemd_service_of_a_unit_main_process_or_its_child(monkeypatch, tmp_path, main):
    # A salt-minion unit's main process is the keepalive parent; the pidfile names its child.
    (tmp_path / "run" / "systemd" / "system").mkdir(parents=True)
    real_isdir = os.path.isdir
    monkeypatch.setattr(
        multimaster_daemon.os.path,
        "isdir",
        lambda p: real_isdir(str(tmp_path) + p) if p == "/run/systemd/system" else real_isdir(p),
    )
    monkeypatch.setattr(multimaster_daemon.shutil, "which", lambda _: "/usr/bin/systemctl")
    value = {"self": os.getpid(), "parent": os.getppid(), "other": 1, "0": 0}[main]
    monkeypatch.setattr(
        multimaster_daemon.subprocess,
        "run",
        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=f"{value}\n"),
    )
    found = multimaster_daemon.systemd_service_of(os.getpid(), "salt-minion")
    assert found == ("salt-minion" if main in ("self", "parent") else None)


def test_running_since_is_none_without_a_running_daemon(tmp_path):
    assert multimaster_daemon.running_since(str(tmp_path / "none.pid"), "salt-master", "/") is None
    (tmp_path / "stale.pid").write_text("999999999")
    assert multimaster_daemon.running_since(str(tmp_path / "stale.pid"), "salt-master", "/") is None


def test_script_installed_finds_a_daemon_beside_this_salt_or_on_path(tmp_path, monkeypatch):
    """
    A pip or onedir Salt carries salt-master: ``multimaster.master`` then installs no package.
    """
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert multimaster_daemon.script_installed("salt-master") is False
    script = tmp_path / "salt-master"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    assert multimaster_daemon.script_installed("salt-master") is True


# --- restart_pending -------------------------------------------------------------------------

# Keeps a process looking like a restart watcher: imported at start-up, before the script runs.
LINGER = "import time\ntime.sleep(60)\n"


@pytest.fixture
def lookalike(tmp_path):
    """
    ``lookalike(interpreter, pidfile)``: a live process whose command line is exactly a
    watcher's for ``pidfile`` (``[interpreter, this module's file, spec]``), run by
    ``interpreter``; it never runs the watcher, it lingers in its ``sitecustomize``.
    """
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(LINGER)
    procs = []

    def start(interpreter, pidfile):
        me = os.path.abspath(multimaster_daemon.__file__)
        env = {
            "PATH": os.environ.get("PATH", ""),
            "PYTHONPATH": str(site),
            "PYTHONHOME": sys.base_prefix,
        }
        proc = subprocess.Popen([interpreter, me, json.dumps({"pidfile": pidfile})], env=env)
        procs.append(proc)
        return _wait_exec(proc, me)

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_watcher_run_by_this_interpreter_is_pending(lookalike, tmp_path):
    pidfile = str(tmp_path / "salt-master.pid")
    assert multimaster_daemon.restart_pending(pidfile) is False
    lookalike(sys.executable, pidfile)
    assert multimaster_daemon.restart_pending(pidfile) is True
    assert multimaster_daemon.restart_pending(str(tmp_path / "other.pid")) is False


def test_a_lookalike_run_by_another_interpreter_is_not_pending(lookalike, tmp_path):
    # Anyone may copy an interpreter, or bring one: the command line is all it shares.
    other = tmp_path / "bin" / "python3"
    other.parent.mkdir()
    shutil.copy2(os.path.realpath(sys.executable), other)
    pidfile = str(tmp_path / "salt-master.pid")
    lookalike(str(other), pidfile)
    assert multimaster_daemon.restart_pending(pidfile) is False


_Uids = collections.namedtuple("_Uids", "real effective saved")


class _Lookalike:
    """
    A process as ``psutil.process_iter`` yields it: a watcher's command line, run by this very
    interpreter, as user ``uid``.
    """

    def __init__(self, pidfile, uid):
        me = os.path.abspath(multimaster_daemon.__file__)
        self.pid = 4242
        self.info = {
            "cmdline": [sys.executable, me, json.dumps({"pidfile": pidfile})],
            "uids": _Uids(uid, uid, uid),
            "exe": os.path.realpath(sys.executable),
        }

    def cmdline(self):
        return self.info["cmdline"]

    def uids(self):
        return self.info["uids"]

    def exe(self):
        return self.info["exe"]


def test_a_lookalike_of_another_user_is_not_pending(tmp_path, monkeypatch):
    # A local user keeps a master "restarting" by running a process with a watcher's argv.
    pidfile = str(tmp_path / "salt-master.pid")
    stranger = next(uid for uid in range(1000, 70000) if uid not in (0, os.geteuid()))
    procs = [_Lookalike(pidfile, stranger)]
    monkeypatch.setattr(multimaster_daemon.psutil, "process_iter", lambda *a, **k: iter(procs))
    assert multimaster_daemon.restart_pending(pidfile) is False
    procs.append(_Lookalike(pidfile, os.geteuid()))
    assert multimaster_daemon.restart_pending(pidfile) is True


def test_a_scheduled_stop_waits_for_the_job_stops_and_starts_nothing(
    master, conf, spawn, tmp_path, monkeypatch
):
    proc, pidfile = master("-c", conf)
    job = spawn("-c", "import time; time.sleep(1)")
    out = tmp_path / "cwd"
    spec = _watcher_spec(monkeypatch, pidfile, conf, out, wait_pid=job.pid, stop=True)
    assert spec["stop"] is True
    started = time.monotonic()
    assert multimaster_daemon.main([json.dumps(spec)]) == 0
    assert time.monotonic() - started >= 1, "did not wait for the job"
    assert proc.wait(timeout=5) == -signal.SIGTERM
    assert not os.path.exists(pidfile)
    time.sleep(0.5)
    assert not out.exists(), "a stop started the daemon again"


# --- draining the job that reconfigured a master ----------------------------------------------


class _FindJob:
    """
    A master's ``LocalClient`` stand-in: ``saltutil.find_job`` answers from ``rounds`` in turn
    (each ``{minion: job or {}}``), the last one for ever; records the targets it was asked.
    """

    def __init__(self, *rounds):
        self.rounds, self.asked = list(rounds), []

    def cmd(self, tgt, fun, arg, tgt_type="glob", timeout=None):
        assert fun == "saltutil.find_job"
        self.asked.append((tgt, tgt_type, arg))
        return self.rounds.pop(0) if len(self.rounds) > 1 else self.rounds[0]


def _drain(**kwargs):
    drain = {"jid": "20261128000000000001", "tgt": "master*", "tgt_type": "glob"}
    return {**drain, "config_dir": "/etc/salt", "timeout": 30, **kwargs}


def test_the_job_to_drain_is_the_one_this_process_runs(monkeypatch):
    jobs = [
        {"pid": 1, "jid": "20261128000000000002", "tgt": "other", "tgt_type": "glob"},
        {"pid": 2, "jid": "20261128000000000001", "tgt": ["m1", "m2"], "tgt_type": "list"},
        {"pid": 4, "jid": "20261128000000000003", "tgt": "salt-call"},
    ]
    monkeypatch.setattr(multimaster_daemon.salt.utils.minion, "running", lambda opts: jobs)
    drain = multimaster_daemon.job_to_drain({}, 2, "/etc/salt")
    assert drain == {
        "jid": "20261128000000000001",
        "tgt": ["m1", "m2"],
        "tgt_type": "list",
        "config_dir": "/etc/salt",
        "timeout": multimaster_daemon.DRAIN_TIMEOUT,
    }
    # salt-call runs no published job: nothing to wait for, whether or not it left a proc file.
    assert multimaster_daemon.job_to_drain({}, 3, "/etc/salt") is None
    assert multimaster_daemon.job_to_drain({}, 4, "/etc/salt") is None


def test_a_target_too_long_for_an_argv_is_drained_as_every_minion(monkeypatch):
    many = [f"minion{i}" for i in range(5000)]
    jobs = [{"pid": 2, "jid": "20261128000000000001", "tgt": many, "tgt_type": "list"}]
    monkeypatch.setattr(multimaster_daemon.salt.utils.minion, "running", lambda opts: jobs)
    drain = multimaster_daemon.job_to_drain({}, 2, "/etc/salt")
    assert (drain["tgt"], drain["tgt_type"]) == ("*", "glob")


def test_the_restart_waits_until_no_minion_runs_the_job(monkeypatch):
    monkeypatch.setattr(multimaster_daemon.time, "sleep", lambda seconds: None)
    running = {"jid": "20261128000000000001", "pid": 7}
    client = _FindJob(
        {"master1": {}, "master2": running, "master3": running},
        {"master2": running, "master3": {}},
        {"master2": {}},
    )
    assert multimaster_daemon.drain_job(_drain(), client) == []
    # After the first answer only the minions still running it are asked.
    assert client.asked == [
        ("master*", "glob", ["20261128000000000001"]),
        (["master2", "master3"], "list", ["20261128000000000001"]),
        (["master2"], "list", ["20261128000000000001"]),
    ]


def test_a_job_that_never_ends_holds_the_restart_only_until_the_deadline():
    client = _FindJob({"master2": {"jid": "20261128000000000001"}})
    started = time.monotonic()
    assert multimaster_daemon.drain_job(_drain(timeout=1.5), client) == ["master2"]
    assert 1.5 <= time.monotonic() - started < 5


def test_a_master_that_cannot_be_asked_is_restarted_anyway():
    class Unreachable:
        def cmd(self, *args, **kwargs):
            raise OSError("no master listening")

    assert multimaster_daemon.drain_job(_drain(), Unreachable()) is None


def test_the_watcher_drains_the_job_before_the_restart(master, conf, tmp_path, monkeypatch):
    proc, pidfile = master("-c", conf)
    out = tmp_path / "cwd"
    spec = _watcher_spec(monkeypatch, pidfile, conf, out, drain=_drain())
    assert spec["drain"] == _drain()
    drained = []
    monkeypatch.setattr(multimaster_daemon, "drain_job", drained.append)
    assert multimaster_daemon.main([json.dumps(spec)]) == 0
    assert drained == [_drain()]
    assert proc.wait(timeout=5) == -signal.SIGTERM
    _ran_in(out)


class _Bus:
    """A master's event bus that publishes a fired event after ``lag`` reads (None: never)."""

    def __init__(self, lag=0, fails=False):
        self.lag, self.fails, self.fired, self.reads = lag, fails, [], 0

    def __enter__(self):
        if self.fails:
            raise OSError("no such socket")
        return self

    def __exit__(self, *exc):
        return False

    def fire_event(self, data, tag):
        self.fired.append(tag)

    def get_event(self, wait, tag, full):
        self.reads += 1
        if self.lag is not None and self.reads > self.lag and tag in self.fired:
            return {"tag": tag, "data": {}}
        time.sleep(min(wait, 0.05))
        return None


def test_the_bus_is_flushed_once_the_master_publishes_the_marker():
    bus = _Bus(lag=3)
    assert FLUSH_BUS("/etc/salt", timeout=10, bus=bus) is True
    assert len(bus.fired) == 1 and bus.fired[0].startswith("multimaster/restart/flush/")
    assert bus.reads == 4


def test_a_bus_that_never_publishes_holds_the_restart_only_until_the_deadline():
    started = time.monotonic()
    assert FLUSH_BUS("/etc/salt", timeout=0.5, bus=_Bus(lag=None)) is False
    assert 0.5 <= time.monotonic() - started < 3


def test_a_bus_that_cannot_be_reached_does_not_hold_the_restart():
    assert FLUSH_BUS("/etc/salt", timeout=10, bus=_Bus(fails=True)) is False
