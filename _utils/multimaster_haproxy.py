"""
The HAProxy in front of a master cluster: its configuration (publish and return ports, every
master as a health-checked backend server), installed only after ``haproxy -c`` accepts it, and
the balancer started or gracefully reloaded as a plain ``haproxy -D -p <pidfile>`` process.

A bad pillar must never break a running balancer, so a new configuration is written beside the
live one, checked, and only then renamed over it. A pidfile is only a claim: its pid is signalled
only once it is verified to be an HAProxy running this very configuration file.
"""

import os
import re
import shutil
import subprocess
import tempfile

import multimaster_daemon
import multimaster_pillarcheck
import psutil
from salt.exceptions import CommandExecutionError

HEADER = (
    "# Managed by the multimaster formula (multimaster.haproxy): edit the pillar, not this file."
)
_SERVER_NAME_RE = re.compile(r"[A-Za-z0-9_.:-]+\Z")
CHECK_TIMEOUT = 30
HARD_STOP_AFTER = 5


def _server_name(index, master):
    return master["id"] if _SERVER_NAME_RE.match(master["id"]) else f"master{index + 1}"


def request_balance(cluster):
    """
    How the request port spreads connections: ``[algorithm, extra option…]``. With an isolated
    filesystem Salt 3008.3 keeps a minion's session key only on the master it signed in to, and
    the minion opens a new connection for each sign-in, pillar and file request: they must all
    reach that master, so the port hashes the minion's address (consistent hashing, so adding or
    losing a master moves only the minions that hashed to it). With a shared filesystem any
    master reads the session and round robin spreads best.
    """
    if cluster["isolated_filesystem"]:
        return ["source", "hash-type consistent"]
    return ["roundrobin"]


def config_text(settings):
    """
    The ``haproxy.cfg`` text for the cluster in ``settings`` (merged, validated, mode cluster):
    one TCP frontend per Salt port bound to the balancer address, one backend per port with
    every master. The publish side keeps a minion's connection as long as the masters'
    ``publish_session``, as Salt's cluster docs ask.
    """
    cluster, ports = settings["cluster"], settings["ports"]
    haproxy = cluster["haproxy"]
    session = f"{cluster['publish_session']}s"
    check = f"check inter {haproxy['check_interval']}s fall 2 rise 2"
    lines = [
        HEADER,
        "global",
        # Each minion holds two connections (publish, return): at least twice the fleet.
        f"    maxconn {haproxy['maxconn']}",
        # A reload must not leave minions on the old process: its connections keep the old
        # backends, so a minion whose address now hashes to another master would sign in there
        # and send its returns to the old one. Cut them; the minions reconnect at once.
        f"    hard-stop-after {HARD_STOP_AFTER}s",
        "",
        "defaults",
        "    mode tcp",
        "    option dontlognull",
        f"    timeout connect {haproxy['connect_timeout']}s",
        "    timeout client 1m",
        "    timeout server 1m",
    ]
    for name, port, timeout, balance in (
        ("salt-master-pub", ports["publish"], session, ["roundrobin"]),
        ("salt-master-req", ports["ret"], "1m", request_balance(cluster)),
    ):
        lines += [
            "",
            f"frontend {name}",
            f"    bind {cluster['balancer']}:{port}",
            f"    timeout client {timeout}",
            f"    default_backend {name}",
            "",
            f"backend {name}",
            f"    balance {balance[0]}",
            *(f"    {option}" for option in balance[1:]),
            f"    timeout server {timeout}",
        ]
        lines += [
            f"    server {_server_name(index, master)} "
            f"{multimaster_pillarcheck.cluster_address(master)}:{port} {check}"
            for index, master in enumerate(settings["masters"])
        ]
    return "\n".join(lines) + "\n"


def _haproxy():
    path = shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if os.access(p, os.X_OK)),
        None,
    )
    if path is None:
        raise CommandExecutionError(
            "haproxy is not installed: set multimaster:install_packages true or install it"
        )
    return path


def check(path):
    """
    ``(True, output)`` when ``haproxy -c -f path`` accepts the file, else ``(False, output)``.
    """
    proc = subprocess.run(
        [_haproxy(), "-c", "-f", path],
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT,
        check=False,
    )
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def install(path, text):
    """
    Make ``path`` hold ``text`` only if HAProxy accepts it: staged in the same directory,
    checked with ``haproxy -c``, made durable and renamed over the live file. Returns False when
    the file already held ``text``; raises ``CommandExecutionError`` with HAProxy's own message
    when it does not accept the new one (the live file is left as it was).
    """
    if read(path) == text:
        return False
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, staged = tempfile.mkstemp(prefix=".multimaster-", suffix=".cfg", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(staged, 0o644)
        valid, output = check(staged)
        if not valid:
            raise CommandExecutionError(
                f"haproxy -c refused the new configuration; {path} is unchanged: {output}"
            )
        os.replace(staged, path)
        staged = None
    finally:
        if staged:
            os.unlink(staged)
    return True


def read(path):
    """
    The text of ``path``; None when it does not exist or is not text.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def running_pids(pidfile, config_file):
    """
    The pids in ``pidfile`` that are HAProxy processes of ``config_file`` that may have written
    it (``multimaster_daemon.may_have_written``); ``[]`` when none is (a stale pidfile, a
    reused pid).
    """
    try:
        with open(pidfile, encoding="ascii") as handle:
            claimed = [int(line) for line in handle.read().split() if line.isdigit()]
        written = os.stat(pidfile)
    except (OSError, ValueError):
        return []
    return [pid for pid in claimed if _is_haproxy_of(pid, config_file, written)]


def _is_haproxy_of(pid, config_file, written):
    try:
        proc = psutil.Process(pid)
        argv = proc.cmdline()
        if not argv or os.path.basename(argv[0]) != "haproxy":
            return False
        used = multimaster_daemon.option_value(argv[1:], "-f", "--config")
        if used is None or os.path.realpath(used) != os.path.realpath(config_file):
            return False
        return multimaster_daemon.may_have_written(proc, written)
    except (psutil.Error, OSError):
        return False


def start_or_reload(config_file, pidfile):
    """
    Start ``haproxy -D -p pidfile -f config_file``, or, when a verified HAProxy of that file
    runs, start the new one with ``-sf <old pids>``: the old process hands over its listeners
    and finishes its connections (a graceful reload). Returns ``"started"`` or ``"reloaded"``.
    """
    old = running_pids(pidfile, config_file)
    argv = [_haproxy(), "-D", "-p", pidfile, "-f", config_file]
    if old:
        argv += ["-sf", *map(str, old)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=CHECK_TIMEOUT, check=False)
    if proc.returncode != 0:
        raise CommandExecutionError(
            f"haproxy did not start from {config_file}: {(proc.stdout + proc.stderr).strip()}"
        )
    return "reloaded" if old else "started"


def stop(config_file, pidfile, timeout=10):
    """
    Stop the verified HAProxy of ``config_file`` recorded in ``pidfile``; True if one ran.
    """
    pids = running_pids(pidfile, config_file)
    procs = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            proc.terminate()
            procs.append(proc)
        except psutil.Error:
            continue
    try:
        psutil.wait_procs(procs, timeout=timeout)
    except OSError:
        # psutil 7.2 waits through pidfd_open, which the kernel fails (EINVAL, ENOENT) for a
        # process it is reaping: that one is gone.
        pass
    return bool(pids)
