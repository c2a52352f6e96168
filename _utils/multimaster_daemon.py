"""
Restart a Salt daemon the way it runs: as a systemd service where it is one, otherwise as
``<salt-master|salt-minion> -c <config dir> -d`` of this very Salt install.

A pidfile is only a claim: a stale pidfile, or its pid reused by another process, may name
anything. So the pid is signalled only once it is verified to be that daemon of that config dir,
and the command that starts it again is built from the config dir and this Salt install, never
read from ``/proc`` (a root process must not run a command line that anyone could have put there).

The restart can wait for another process to end first: a minion restarting itself from inside a
job must let that job send its return, or the highstate that changed the master list would never
report back. That waiting is done by this file run as a script (``main``), detached from the job.

Also the daemon toolkit of the lab, the bench and the tests: ``read_pid``, ``wait_for``,
``port_open`` and ``wait_port``.
"""

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time

import psutil
import salt._logging
import salt.syspaths
import salt.utils.files
import salt.utils.minion
from salt.exceptions import CommandExecutionError

log = logging.getLogger(__name__)

# Salt writes its pidfile just after the process starts; allow for the clock-tick rounding of a
# process start time and the whole-second boot time it is counted from.
PIDFILE_SLACK = 1.0
# A SIGKILLed process is gone at once, unless stuck in the kernel.
KILL_TIMEOUT = 10


# --- waiting ---------------------------------------------------------------------------------


def wait_for(predicate, timeout, interval=0.2):
    """
    Call ``predicate`` until it returns something truthy and return that; None once ``timeout``
    seconds have passed. It is always called at least once.

    interval
        Seconds between two checks.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)


def port_open(host, port):
    """
    True when ``host:port`` accepts a TCP connection now.
    """
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def wait_port(host, port, timeout):
    """
    True once ``host:port`` accepts TCP connections, False after ``timeout`` seconds.
    """
    return bool(wait_for(lambda: port_open(host, port), timeout))


# --- which process -------------------------------------------------------------------------


def read_pid(pidfile):
    """
    The pid in ``pidfile`` if that process is alive (not a zombie), else None.
    """
    try:
        with salt.utils.files.fopen(pidfile) as handle:
            pid = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    return pid if pid > 0 and _pid_alive(pid) else None


def verified_pid(pidfile, daemon, config_dir):
    """
    The pid in ``pidfile`` if that process really is ``daemon`` (``salt-master``/``salt-minion``)
    running with ``config_dir``, else None; a live process that is not is logged as a warning.
    """
    proc, problem = _recorded_daemon(pidfile, daemon, config_dir)
    if problem:
        log.warning("Not trusting %s: %s", pidfile, problem)
    return proc.pid if proc else None


def running_since(pidfile, daemon, config_dir):
    """
    When the verified ``daemon`` of ``config_dir`` recorded in ``pidfile`` started, in epoch
    seconds (the scale of file times), or None when none runs.
    """
    proc, _ = _recorded_daemon(pidfile, daemon, config_dir)
    try:
        return proc.create_time() if proc else None
    except psutil.Error:
        return None


def _recorded_daemon(pidfile, daemon, config_dir):
    """
    ``(process, None)`` when ``pidfile`` names a verified ``daemon`` of ``config_dir``;
    ``(None, why)`` when it names a live process that is not; ``(None, None)`` when none runs.
    """
    pid = read_pid(pidfile)
    if pid is None:
        return None, None
    try:
        proc = psutil.Process(pid)
        problem = _identity_problem(proc, pidfile, daemon, config_dir)
    except psutil.NoSuchProcess:
        return None, None
    except (OSError, psutil.Error) as exc:
        problem = f"cannot inspect pid {pid}: {exc}"
    if problem and not _pid_alive(pid):
        return None, None  # it exited while we looked (a zombie shows no command line)
    return (None, problem) if problem else (proc, None)


def _identity_problem(proc, pidfile, daemon, config_dir):
    """
    Why ``proc`` is not the ``daemon`` of ``config_dir`` that wrote ``pidfile``; None if it is.
    """
    argv = proc.cmdline()
    # "/x/bin/salt-master ..." or "python /x/bin/salt-master ...", or the launcher script
    # pytest-salt-factories writes for it (cli_salt_master.py).
    names = {daemon, f"cli_{daemon.replace('-', '_')}.py"}
    script = next((i for i, arg in enumerate(argv[:2]) if os.path.basename(arg) in names), None)
    if script is None:
        return f"pid {proc.pid} is not {daemon}: it runs {argv[:2]}"
    running = option_value(argv[script + 1 :], "-c", "--config-dir")
    if running is None:
        running = proc.environ().get("SALT_CONFIG_DIR") or salt.syspaths.CONFIG_DIR
    if not os.path.isabs(running):
        running = os.path.join(proc.cwd(), running)
    if os.path.realpath(running) != os.path.realpath(config_dir):
        return f"pid {proc.pid} is {daemon} of {running}, not of {config_dir}"
    if not may_have_written(proc, os.stat(pidfile)):
        return f"pid {proc.pid} started after {pidfile} was written (a reused pid)"
    return None


def option_value(argv, short, long):
    """
    The value of option ``short``/``long`` in ``argv`` (``-x V``, ``-xV``, ``--long V``,
    ``--long=V``), the last one winning as in Salt's option parser; None when absent.
    """
    value = None
    args = iter(argv)
    for arg in args:
        if arg in (short, long):
            value = next(args, None)  # consumed: never read as an option itself
        elif arg.startswith(long + "="):
            value = arg[len(long) + 1 :]
        elif arg.startswith(short) and not arg.startswith("--"):
            value = arg[len(short) :]
    return value


def _create_time(proc):
    """
    When ``proc`` started, in seconds since boot: with its pid, it identifies the process, and
    unlike ``proc.create_time()`` it does not move when the clock is set.
    """
    return round(proc.create_time() - psutil.boot_time(), 3)


def _alive(proc):
    """
    True while ``proc`` runs. A zombie has exited: its parent (a test runner, a container's
    pid 1) may just never reap it, and Salt would still count it as running.
    """
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _pid_alive(pid):
    try:
        return _alive(psutil.Process(pid))
    except psutil.Error:
        return False


def _systemd_property(service, name):
    """
    The value of the unit ``service``'s property ``name`` (``systemctl show``), or None where
    this host runs no systemd or it cannot be read.
    """
    if not os.path.isdir("/run/systemd/system") or not shutil.which("systemctl"):
        return None
    try:
        return subprocess.run(
            ["systemctl", "show", "-p", name, "--value", service],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def systemd_service_of(pid, service):
    """
    ``service`` when ``pid`` is that systemd unit's main process, or a child of it: a
    salt-minion's pidfile names the minion process its keepalive parent (the unit's main
    process) forks. Else None.
    """
    out = _systemd_property(service, "MainPID")
    if not out or not out.isdigit() or out == "0":
        return None
    if out == str(pid):
        return service
    try:
        return service if psutil.Process(pid).ppid() == int(out) else None
    except psutil.Error:
        return None


def systemd_unit_known(service):
    """
    Whether this host runs systemd and knows the unit ``service`` (installed by a package).
    """
    return _systemd_property(service, "LoadState") == "loaded"


# --- what to run -----------------------------------------------------------------------------


def daemon_command(daemon, config_dir, pid=None):
    """
    ``[<daemon script of this Salt install>, "-c", config_dir, "-d"]``, plus ``["-l", LEVEL]``
    when the running ``pid`` was given a log level Salt knows; nothing else is taken from it.
    """
    command = [_daemon_script(daemon), "-c", config_dir, "-d"]
    level = _log_level(pid) if pid else None
    return command + ["-l", level] if level else command


def script_installed(daemon):
    """
    Whether this Salt install has the ``daemon`` script (next to this interpreter or on PATH):
    a pip or onedir install carries every daemon, a distro package only the ones installed.
    """
    try:
        return bool(_daemon_script(daemon))
    except CommandExecutionError:
        return False


def _daemon_script(daemon):
    """
    The ``daemon`` script next to this interpreter (a virtualenv's or pip install's bin dir),
    else the one on PATH.
    """
    beside = os.path.join(os.path.dirname(sys.executable), daemon)
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    found = shutil.which(daemon)
    if not found:
        raise CommandExecutionError(f"no {daemon} script next to {sys.executable} or on PATH")
    return found


def _log_level(pid):
    """
    The log level ``pid`` was started with, if it is one of Salt's (so never a stray flag).
    """
    try:
        level = option_value(psutil.Process(pid).cmdline(), "-l", "--log-level")
    except psutil.Error:
        return None
    return level if level in salt._logging.LOG_LEVELS else None


def _spawn(argv):
    """
    Start ``argv`` detached from this process: own session, from ``/``, no inherited stdio.
    """
    subprocess.Popen(
        argv,
        cwd="/",
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )


# --- stop, start, restart --------------------------------------------------------------------


def stop_now(pidfile, service, daemon, config_dir, timeout=30):
    """
    Stop the ``daemon`` of ``config_dir`` recorded in ``pidfile`` and wait until it is gone.
    Returns how to start it again: ``{"was_running", "service", "pid", "command"}``.

    A pidfile naming a live process that is not that daemon raises CommandExecutionError:
    that process is not signalled, and someone must look at it.

    timeout
        Seconds to wait for the daemon to exit before giving up.
    """
    proc, problem = _recorded_daemon(pidfile, daemon, config_dir)
    if problem:
        raise CommandExecutionError(f"{pidfile}: {problem}; not stopping it, check it by hand")
    if proc is None:
        return {"was_running": False, "service": None, "pid": None, "command": None}
    unit = systemd_service_of(proc.pid, service)
    # Built before stopping: a daemon that could not be started again is left running.
    command = None if unit else daemon_command(daemon, config_dir, proc.pid)
    if unit:
        subprocess.run(["systemctl", "stop", unit], check=False, timeout=timeout)
    elif not _stop(proc, pidfile, timeout):
        raise CommandExecutionError(f"{daemon} pid {proc.pid} did not exit, even on SIGKILL")
    return {"was_running": True, "service": unit, "pid": proc.pid, "command": command}


def start_now(stopped, daemon, config_dir):
    """
    Start a daemon stopped by ``stop_now`` the way it ran; as ``daemon_command`` when it was not
    running at all.

    config_dir
        The daemon's config dir (the ``-c`` of the command built).
    """
    if stopped["service"]:
        subprocess.run(["systemctl", "start", stopped["service"]], check=False, timeout=60)
    else:
        _spawn(stopped["command"] or daemon_command(daemon, config_dir))


def start_if_stopped(pidfile, service, daemon, config_dir):
    """
    Start the ``daemon`` of ``config_dir`` unless the one ``pidfile`` records runs: as the
    systemd unit ``service`` where the host knows it, else as ``daemon_command``. Returns how
    it was started (``"service"``, ``"daemon"``), or None when it was running already.

    A pidfile naming a live process that is not that daemon raises CommandExecutionError.
    """
    proc, problem = _recorded_daemon(pidfile, daemon, config_dir)
    if problem:
        raise CommandExecutionError(f"{pidfile}: {problem}; not starting another, check it by hand")
    if proc is not None:
        return None
    if systemd_unit_known(service):
        subprocess.run(["systemctl", "start", service], check=False, timeout=60)
        return "service"
    _spawn(daemon_command(daemon, config_dir))
    return "daemon"


# A master restarted the moment the job that reconfigured it ended can drop that job's return:
# the minion has its reply once a worker took the return, but the event still travels to the
# master's event bus and on to whoever waits for it (an orchestration run on that very master).
# Seen lost on a loaded machine, where 0.2 s separated the return event from the SIGTERM.
MASTER_RETURN_GRACE = 3.0
# The other minions of the job that reconfigured a master return to it too: ``salt 'master*'
# state.apply multimaster.master`` run on master1 restarts master1 when its own minion is done,
# and master2's return, still to come, would be lost. The watcher waits for them this long at most.
DRAIN_TIMEOUT = 120.0
FIND_JOB_TIMEOUT = 5
# A longer target is handed to the watcher as "*" (its spec is one argv string, at most 128 KiB).
DRAIN_TARGET_MAX = 8192


def job_to_drain(opts, pid, config_dir):
    """
    The published job that process ``pid`` of this minion runs, as the watcher of a master
    restart waits for it (``{"jid", "tgt", "tgt_type", "config_dir", "timeout"}``, ``config_dir``
    the master's), or None when ``pid`` runs no published job (``salt-call``).

    opts
        The minion's opts (its proc dir holds one file per running job).

    pid
        The job's process (``os.getpid()`` in an execution module).

    config_dir
        The config dir of the master to restart.
    """
    for job in salt.utils.minion.running(opts):
        # A salt-call's proc file names the target "salt-call" and has no target type.
        if job.get("pid") != pid or not all(job.get(k) for k in ("jid", "tgt", "tgt_type")):
            continue
        tgt, tgt_type = job["tgt"], job["tgt_type"]
        if len(json.dumps(tgt)) > DRAIN_TARGET_MAX:
            tgt, tgt_type = "*", "glob"
        drain = {"jid": str(job["jid"]), "tgt": tgt, "tgt_type": tgt_type}
        return dict(drain, config_dir=config_dir, timeout=DRAIN_TIMEOUT)
    return None


def _local_client(config_dir):
    import salt.client  # pylint: disable=import-outside-toplevel

    return salt.client.LocalClient(c_path=os.path.join(config_dir, "master"))


def drain_job(drain, client=None):
    """
    Wait, at most ``drain["timeout"]`` seconds, until no minion reached through this master still
    runs job ``drain["jid"]`` (asked with ``saltutil.find_job``, as the ``salt`` CLI asks). Returns
    the minions still running it at the deadline, or None when the master could not be asked
    (the restart then goes ahead: it is never held for good).

    drain
        What ``job_to_drain`` returned.

    client
        A ``LocalClient`` of the master (default: one built from ``drain["config_dir"]``).
    """
    deadline = time.monotonic() + float(drain["timeout"])
    tgt, tgt_type, own = drain["tgt"], drain["tgt_type"], client is None
    try:
        client = client or _local_client(drain["config_dir"])
        while True:
            ask = {"tgt_type": tgt_type, "timeout": FIND_JOB_TIMEOUT}
            answers = client.cmd(tgt, "saltutil.find_job", [drain["jid"]], **ask)
            running = sorted(m for m, job in (answers or {}).items() if job)
            if not running or time.monotonic() >= deadline:
                return running
            tgt, tgt_type = running, "list"
            time.sleep(1)
    except Exception as exc:  # pylint: disable=broad-except
        log.warning("multimaster: restarting without waiting for job %s: %s", drain["jid"], exc)
        return None
    finally:
        if own and client is not None:
            client.destroy()


# How long a master's restart waits for its event bus to publish what came before
# (``flush_bus``). A cluster peer that is down makes Salt 3008.3 re-announce the AES key for
# each event that failed to reach it: measured here, such a storm held a return event back for
# more than the 3 s grace on the master that ran the orchestration (docs/cluster.md).
BUS_FLUSH_TIMEOUT = 60.0


def _master_bus(config_dir):
    import salt.config  # pylint: disable=import-outside-toplevel
    import salt.utils.event  # pylint: disable=import-outside-toplevel

    mopts = salt.config.master_config(os.path.join(config_dir, "master"))
    socket_path = os.path.join(mopts["sock_dir"], "master_event_pub.ipc")
    if mopts.get("ipc_mode") != "tcp" and not os.path.exists(socket_path):
        # No master listens there: connecting would only retry until the deadline.
        raise OSError(f"{socket_path} does not exist")
    return salt.utils.event.get_master_event(mopts, mopts["sock_dir"], listen=True)


def flush_bus(config_dir, timeout=BUS_FLUSH_TIMEOUT, bus=None):
    """
    Fire a marker event on the bus of the master of ``config_dir`` and wait, at most
    ``timeout`` seconds, until the master publishes it: then it has published every event it
    took before, a job's return among them. True when it did; False (the restart then goes
    ahead: it is never held for good) at the deadline or when the bus could not be reached.

    bus
        An event bus of the master (default: one opened from ``config_dir``).
    """
    tag = f"multimaster/restart/flush/{os.urandom(8).hex()}"
    deadline = time.monotonic() + float(timeout)
    try:
        with bus or _master_bus(config_dir) as events:
            events.fire_event({}, tag)
            while (left := deadline - time.monotonic()) > 0:
                if events.get_event(wait=min(left, 1.0), tag=tag, full=True):
                    return True
    except Exception as exc:  # pylint: disable=broad-except
        log.warning("multimaster: restarting without flushing the master's bus: %s", exc)
        return False
    log.warning("multimaster: the master's bus did not publish a marker in %ss", timeout)
    return False


def schedule_restart(
    pidfile,
    service,
    daemon,
    config_dir,
    wait_pid=None,
    delay=0.0,
    wait_timeout=600,
    stop=False,
    drain=None,
):
    """
    Restart the ``daemon`` of ``config_dir`` recorded in ``pidfile`` from a detached watcher once
    ``wait_pid`` has ended (or ``wait_timeout`` seconds passed) and no minion runs the job
    ``drain`` (``job_to_drain``; ``drain_job``) any more and, for a salt-master, its bus has
    published what came before (``flush_bus``), ``delay`` seconds later (for a salt-master at
    least ``MASTER_RETURN_GRACE``, so that the job's return reaches whoever waits for it).
    ``stop``: stop it and start nothing (a minion whose only master this is can still return).

    Returns a dict describing what was scheduled; ``{"scheduled": False, "reason": ...}`` when
    no verified daemon runs (image builds, ``salt-call --local`` on a host without the service).
    """
    proc, problem = _recorded_daemon(pidfile, daemon, config_dir)
    if proc is None:
        if problem:
            log.warning("Not restarting from %s: %s", pidfile, problem)
        reason = f"{pidfile}: {problem}" if problem else f"no running daemon recorded in {pidfile}"
        return {"scheduled": False, "reason": reason}
    if wait_pid == proc.pid:
        # The job runs inside the daemon itself (multiprocessing off): a delay is all we can do.
        wait_pid, delay = None, max(delay, 5.0)
    elif wait_pid is not None and daemon == "salt-master":
        delay = max(delay, MASTER_RETURN_GRACE)
    unit = systemd_service_of(proc.pid, service)
    command = None if unit else daemon_command(daemon, config_dir, proc.pid)
    spec = {
        "pid": proc.pid,
        "create_time": _create_time(proc),
        "pidfile": pidfile,
        "wait_pid": wait_pid,
        "wait_timeout": wait_timeout,
        "stop_timeout": 30,
        "delay": delay,
        "service": unit,
        "command": command,
        "stop": stop,
        "drain": drain,
        # A master restarted after a job publishes the job's return before it goes.
        "flush": config_dir if wait_pid is not None and daemon == "salt-master" else None,
    }
    _spawn([sys.executable, os.path.abspath(__file__), json.dumps(spec)])
    if stop:
        how = f"systemctl stop {unit}" if unit else f"stop pid {proc.pid}"
    else:
        how = f"systemctl restart {unit}" if unit else " ".join(command)
    return {"scheduled": True, "pid": proc.pid, "how": how}


def restart_pending(pidfile):
    """
    Is a watcher from ``schedule_restart`` still waiting to restart (or restarting) the daemon
    recorded in ``pidfile``? Only a process of root or of this user, run by this interpreter,
    counts (``_started_here``).

    pidfile
        The daemon's pidfile, as given to ``schedule_restart``.
    """
    me = os.path.abspath(__file__)
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        if len(argv) != 3 or os.path.abspath(argv[1]) != me:
            continue
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            if json.loads(argv[2]).get("pidfile") == pidfile and _started_here(proc):
                return True
    return False


def host_restart_pending(mopts, minion_pidfile):
    """
    Is a restart of this host's salt-master (``mopts["pidfile"]``) or of its control minion
    (``minion_pidfile``) pending? Until the control minion's own restart has happened the
    runners would lose it mid-call, so it counts too.
    """
    return any(restart_pending(pidfile) for pidfile in (mopts["pidfile"], minion_pidfile))


def may_have_written(proc, written):
    """
    Whether ``proc`` may have written the file whose ``os.stat`` is ``written`` (a pidfile
    naming it): it runs as the file's owner, or it started no later than the file was last
    written. A process of another user that started later holds a reused pid. The owner is not
    held to the times: a forward step of the clock (a VM resumed, NTP setting the time) moves
    the start time of every running process, as it is counted from the boot time, past the
    files it wrote, and a master would never be restarted again.
    """
    if proc.uids().effective == written.st_uid:
        return True
    return proc.create_time() <= written.st_mtime + PIDFILE_SLACK


def _started_here(proc):
    """
    True when ``proc`` could be a watcher ``schedule_restart`` started: it runs as root or as
    this process's user (the watcher inherits the user of the minion that spawns it) and on
    this very interpreter. A command line is only a claim: any local user can run a process
    whose argv looks like a watcher's and keep a master "restarting" for ever.
    """
    try:
        uids, exe = proc.uids(), proc.exe()
    except psutil.Error:
        # Another user's process this one may not inspect: not one of ours.
        return False
    trusted = {0, os.geteuid()}
    return (
        uids.real in trusted
        and uids.effective in trusted
        and bool(exe)
        and os.path.realpath(exe) == os.path.realpath(sys.executable)
    )


def _stop(proc, pidfile, timeout):
    """
    SIGTERM ``proc``, SIGKILL it after ``timeout`` seconds, then clear the pidfiles naming it.
    False when it survived both.
    """
    for send, wait in ((proc.terminate, timeout), (proc.kill, KILL_TIMEOUT)):
        # psutil refuses to signal a pid that now belongs to another process (NoSuchProcess).
        with contextlib.suppress(psutil.NoSuchProcess):
            send()
        if wait_for(lambda: not _alive(proc), wait):
            _clear_stale_pidfiles(pidfile, proc.pid)
            return True
    return False


def _clear_stale_pidfiles(pidfile, pid):
    """
    Remove the pidfile and ``process_responsibility_`` file naming the stopped ``pid``: Salt
    counts an unreaped zombie (or a pid reused since) as a running instance and would refuse to
    start.
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


# --- the watcher -----------------------------------------------------------------------------


def main(argv):
    """
    The detached watcher started by ``schedule_restart``: ``argv`` is its JSON spec. Waits for
    the job, then restarts the recorded daemon if it still is that process. Returns the exit code.
    """
    spec = json.loads(argv[0])
    if spec["wait_pid"]:
        wait_for(lambda: not _pid_alive(spec["wait_pid"]), spec["wait_timeout"])
    if spec.get("drain"):
        drain_job(spec["drain"])
    if spec.get("flush"):
        flush_bus(spec["flush"])
    time.sleep(spec["delay"])
    if spec["service"]:
        action = "stop" if spec.get("stop") else "restart"
        return subprocess.call(["systemctl", action, spec["service"]])
    proc = _same_process(spec["pid"], spec["create_time"])
    if proc is None:
        # The daemon is gone already; a pidfile still naming its pid is stale.
        _clear_stale_pidfiles(spec["pidfile"], spec["pid"])
    elif not _stop(proc, spec["pidfile"], spec["stop_timeout"]):
        return 1
    if not spec.get("stop"):
        _spawn(spec["command"])
    return 0


def _same_process(pid, started):
    """
    ``pid``'s process if it started at ``started`` (see ``_create_time``), else None: a pid
    reused since must not be signalled.
    """
    try:
        proc = psutil.Process(pid)
        return proc if _create_time(proc) == started else None
    except psutil.Error:
        return None


# --- peer side (run by a control minion) ---


def master_alive(master, mopts):
    """
    Is the salt-master of ``master`` (its opts ``mopts``) running (a verified pid) and listening
    on its ret port?
    """
    if verified_pid(mopts["pidfile"], "salt-master", master["config_dir"]):
        host = mopts["interface"]
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return wait_port(host, mopts["ret_port"], timeout=2)
    return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
