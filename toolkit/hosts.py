"""
Separate hosts on one machine, made from Linux namespaces: each host has its own network
namespace (one address on a private bridge this module creates, nothing routed beyond it), its
own mount namespace (private ``/etc/salt``, ``/etc/haproxy``, ``/var/cache/salt``,
``/var/log/salt``, ``/srv``, ``/run`` and ``/etc/hosts``) and its own UTS namespace
(hostname). Salt runs there on its default paths and ports, started as ``salt-master -d`` /
``salt-minion -d``: no init system (docs/development.md says why; ``toolkit/sdhosts.py`` makes
hosts that boot systemd).

Everything a ``HostSet`` makes is named with its ``prefix`` and removed by ``down()`` (and by
the next ``up()`` after a run that was killed): processes, namespaces, veth pairs, the bridge,
mounts, the hosts' directories. Sets of different prefixes (the tests' ``mm``, the lab's) can
exist at once, each on its own bridge. Needs root, ``ip`` (iproute2), ``unshare`` and
``nsenter`` (util-linux).

    with HostSet([Host("master1", "10.0.3.61"), Host("minion1", "10.0.3.71")]) as hosts:
        hosts["master1"].sh("salt-key -L")
"""

import contextlib
import dataclasses
import json
import pathlib
import shlex
import shutil
import subprocess
import sys
import time

import psutil

# The Salt CLIs of the virtualenv running us go first on every host's PATH.
SALT_BIN = pathlib.Path(sys.executable).parent
# Where each host's private directories live on the machine's disk.
STATE_DIR = pathlib.Path("/var/tmp/multimaster-hosts")
# Namespace handles (bind-mounted nsfs files) need a mount with private propagation.
HANDLES = pathlib.Path("/run/multimaster-hosts")
# Not /root: the interpreter running Salt may live there (pyenv).
PRIVATE_DIRS = ("/etc/salt", "/etc/haproxy", "/var/cache/salt", "/var/log/salt", "/srv", "/run")
PREFIX_LEN = 4
# A stand-in for the service manager of a host with no init: `systemctl start|stop|restart
# salt-master|salt-minion` does what the unit would, by Salt's default pidfile.
SYSTEMCTL = """#!/bin/sh
set -e
action=$1 unit=${2%.service}
# What Salt's grains ask of any systemctl on PATH.
[ "$action" = --version ] && { echo "systemd 252 (252.0)"; echo "+PAM"; exit 0; }
case $unit in
    salt-master|salt-minion) ;;
    *) echo "systemctl: unit $unit unknown here" >&2; exit 5 ;;
esac
pidfile=/run/$unit.pid
stop() {
    pid=$(cat "$pidfile" 2>/dev/null) || pid=
    if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then
        while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
    fi
    rm -f "$pidfile"
}
case $action in
    start) [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null || "$unit" -d ;;
    stop) stop ;;
    restart) stop; "$unit" -d ;;
    is-active) [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null ;;
    *) echo "systemctl: $action not supported here" >&2; exit 2 ;;
esac
"""


class HostError(RuntimeError):
    """
    A command on a host failed; the message carries its output.
    """


def _run(argv, check=True, timeout=60, **kwargs):
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )
    if check and proc.returncode:
        raise HostError(f"{shlex.join(argv)}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
    return proc


@dataclasses.dataclass
class Host:
    """
    One host: its name (also its hostname and the Salt id the tests give it) and address.
    """

    name: str
    address: str
    prefix: str = "mm"
    state_dir: pathlib.Path = STATE_DIR

    @property
    def netns(self):
        return f"{self.prefix}-{self.name}"

    @property
    def veth(self):
        return f"{self.prefix}v{self.address.rsplit('.', 1)[1]}"

    @property
    def root(self):
        """
        This host's private directories on the machine's disk.
        """
        return self.state_dir / self.netns

    @property
    def handles(self):
        """
        The stem of this host's namespace handles (``.mnt``, ``.uts``).
        """
        return HANDLES / self.netns

    def path(self, inside):
        """
        Where the host's ``inside`` path (under one of its private directories) lies on disk.
        """
        if inside == "/etc/hosts":
            return self.root / "hosts"
        for private in PRIVATE_DIRS:
            if inside == private or inside.startswith(private + "/"):
                rest = inside[len(private) :].lstrip("/")
                return self.root / private.strip("/").replace("/", "_") / rest
        raise ValueError(f"{inside} is not private to {self.name}")

    def enter(self):
        """
        The ``nsenter`` prefix that runs a command on this host.
        """
        return [
            "nsenter",
            f"--net=/run/netns/{self.netns}",
            f"--mount={self.handles}.mnt",
            f"--uts={self.handles}.uts",
            "--wd=/srv",
            "--",
        ]

    def environment(self):
        return {
            "PATH": f"{self.root / 'bin'}:{SALT_BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "HOSTNAME": self.name,
        }

    def shell(self, *args, env=None):
        """
        The argv of ``bash *args`` on this host, in its environment (``env`` added).
        """
        argv = [*self.enter(), "env", "-i"]
        argv += [f"{k}={v}" for k, v in {**self.environment(), **(env or {})}.items()]
        return [*argv, "bash", *args]

    def sh(self, script, check=True, timeout=300, env=None):
        """
        Run ``script`` with ``bash -e`` on this host; returns the CompletedProcess. A failure
        (with ``check``) raises ``HostError`` carrying the output.
        """
        argv = self.shell("-e", "-o", "pipefail", "-c", script, env=env)
        return _run(argv, check=check, timeout=timeout)

    def pids(self):
        """
        The processes running on this host (in its network namespace).
        """
        proc = _run(["ip", "netns", "pids", self.netns], check=False)
        return [int(p) for p in proc.stdout.split()]

    def kill_all(self, timeout=20):
        """
        Stop every process of this host: SIGTERM, then SIGKILL what is left.
        """
        _kill(self.pids(), timeout)

    def start_command(self, daemon):
        """
        How the packages start ``daemon`` (``salt-master``, ``salt-minion``) on this host.
        """
        return f"{daemon} -d"

    def log(self, name, tail=80):
        """
        The last ``tail`` lines of ``/var/log/salt/<name>`` on this host.
        """
        path = self.path(f"/var/log/salt/{name}")
        if not path.is_file():
            return f"({name}: no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-tail:])


class HostSet:
    """
    Hosts on one private bridge: ``up()`` makes them, ``down()`` removes everything made.
    """

    def __init__(self, hosts, prefix="mm", subnet="10.0.3"):
        self.prefix = prefix
        self.subnet = subnet
        self.bridge = f"{prefix}br0"
        self.hosts = {h.name: dataclasses.replace(h, prefix=prefix) for h in hosts}
        for host in self.hosts.values():
            if not host.address.startswith(subnet + "."):
                raise ValueError(f"{host.name}: {host.address} is not in {subnet}.0/24")

    def __getitem__(self, name):
        return self.hosts[name]

    def __iter__(self):
        return iter(self.hosts.values())

    def __enter__(self):
        self.up()
        return self

    def __exit__(self, *_):
        self.down()

    def up(self):
        self.down()
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "link", "set", self.bridge, "up"])
        HANDLES.mkdir(parents=True, exist_ok=True)
        if not _is_private_mount(HANDLES):
            _run(["mount", "--bind", str(HANDLES), str(HANDLES)])
            _run(["mount", "--make-private", str(HANDLES)])
        for host in self:
            self._make(host)

    def _make(self, host):
        self._network(host)
        self._directories(host)
        bindir = host.root / "bin"
        bindir.mkdir()
        (bindir / "systemctl").write_text(SYSTEMCTL)
        (bindir / "systemctl").chmod(0o755)
        handles = host.handles
        for kind in ("mnt", "uts"):
            pathlib.Path(f"{handles}.{kind}").touch()
        binds = [f"mount --bind {host.path(p)} {p}" for p in (*PRIVATE_DIRS, "/etc/hosts")]
        _run(
            [
                "unshare",
                f"--mount={handles}.mnt",
                f"--uts={handles}.uts",
                "--propagation",
                "private",
                "sh",
                "-ec",
                "; ".join([f"hostname {host.name}", *binds]),
            ]
        )

    def _network(self, host):
        """
        The host's network namespace, its end of a veth pair on the bridge, its address.
        """
        _run(["ip", "netns", "add", host.netns])
        _run(
            [
                "ip",
                "link",
                "add",
                host.veth,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                host.netns,
            ]
        )
        _run(["ip", "link", "set", host.veth, "master", self.bridge, "up"])
        inside = ["ip", "-n", host.netns]
        _run([*inside, "addr", "add", f"{host.address}/24", "dev", "eth0"])
        _run([*inside, "link", "set", "eth0", "up"])
        _run([*inside, "link", "set", "lo", "up"])

    def _directories(self, host):
        """
        The host's private directories on the machine's disk, and its ``/etc/hosts``.
        """
        shutil.rmtree(host.root, ignore_errors=True)
        for private in PRIVATE_DIRS:
            host.path(private).mkdir(parents=True, exist_ok=True)
            pathlib.Path(private).mkdir(parents=True, exist_ok=True)
        host.path("/etc/hosts").write_text(self._hosts_file())

    def _hosts_file(self):
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        lines += [f"{h.address} {h.name}" for h in self]
        return "\n".join(lines) + "\n"

    def down(self):
        """
        Remove every host of this prefix, also those a killed run left behind.
        """
        names = [
            line.split(" ")[0]
            for line in _run(["ip", "netns", "list"], check=False).stdout.splitlines()
            if line.startswith(f"{self.prefix}-")
        ]
        # Every host's processes at once: their daemons stop side by side.
        _kill(
            [
                pid
                for name in names
                for pid in Host(name[len(self.prefix) + 1 :], "0.0.0.0", self.prefix).pids()
            ]
        )
        for name in names:
            _run(["ip", "netns", "delete", name], check=False)
        for link in _links(f"{self.prefix}v"):
            _run(["ip", "link", "delete", link], check=False)
        _run(["ip", "link", "delete", self.bridge], check=False)
        for host in self:
            for kind in ("mnt", "uts"):
                handle = pathlib.Path(f"{host.handles}.{kind}")
                _run(["umount", str(handle)], check=False)
                handle.unlink(missing_ok=True)
            shutil.rmtree(host.root, ignore_errors=True)
        # The shared parents go with the last set of any prefix.
        with contextlib.suppress(OSError):
            STATE_DIR.rmdir()
        if HANDLES.is_dir() and not any(HANDLES.iterdir()):
            _run(["umount", str(HANDLES)], check=False)
            with contextlib.suppress(OSError):
                HANDLES.rmdir()

    def wait(self, what, check, timeout, interval=2.0):
        """
        Call ``check`` until it is truthy; AssertionError naming ``what`` after ``timeout`` s.
        """
        deadline = time.monotonic() + timeout
        while True:
            result = check()
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(interval)


def _kill(pids, timeout=20):
    """
    SIGTERM ``pids``, then SIGKILL what is left after ``timeout`` s.
    """
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            proc.terminate()
            procs.append(proc)
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=10)


def _links(prefix):
    out = _run(["ip", "-o", "link", "show"], check=False).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]
    return [name for name in names if name.startswith(prefix)]


def _is_private_mount(path):
    for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(path):
            return "shared:" not in line
    return False


# What the hosts' masters run with beside Salt's defaults: every host shares this machine's
# cores. Two request workers, not five, halve a master's start-up CPU (5-6 s instead of 10-11
# s); a CLI (and an orchestration's salt.state step) waits 20 s, not 10, for a minion busy on a
# loaded machine to answer find_job before it reports "did not return". The formula renders
# neither option.
SHARED_CORES_MASTER = "worker_threads: 2\ngather_job_timeout: 20\n"
# A probe that a wait loop repeats: ``test.ping`` through ``manage.up`` with a short find_job
# round, so that a minion not connected yet costs the timeout plus 2 s, not the 20 s above (the
# ``salt`` CLI has no option for it). Prints the answering ids as a JSON list.
UP = "salt-run manage.up gather_job_timeout=2 --out=json"


def answering(host, minions=None, timeout=5):
    """
    The ids among ``minions`` (default: every accepted minion) that answer ``test.ping`` from
    the master on ``host`` within ``timeout`` seconds; empty while that master does not answer.
    """
    tgt = f"tgt={','.join(minions)} tgt_type=list" if minions else "tgt='*'"
    out = host.sh(f"{UP} {tgt} timeout={timeout}", check=False).stdout
    try:
        found = json.loads(out or "[]")
    except ValueError:
        return set()
    return set(found) if isinstance(found, list) else set()


def bootstrap(host, master_address, master=False, ship_config=True, master_started=True):
    """
    What the Salt Project's bootstrap script leaves on a host (``-A <address> -i <id>``, ``-M``
    for a master): Salt on PATH, ``/etc/salt/minion`` (and ``master``) as the packages ship
    them, every option commented out, the minion id and master address (a list: the minion of
    several masters, as configured after the bootstrap), and the daemons started. A master
    also gets ``SHARED_CORES_MASTER`` in ``master.d``.
    ``ship_config=False``: a pip install, which ships no config file at all.
    ``master_started=False``: salt-master installed but not started (the minion is).
    """
    files = {"/etc/salt/minion_id": host.name}
    # The packages create both include dirs; a pip install creates neither.
    if ship_config:
        host.path("/etc/salt/master.d" if master else "/etc/salt/minion.d").mkdir(
            parents=True, exist_ok=True
        )
    if not isinstance(master_address, str):
        master_address = f"[{', '.join(master_address)}]"
    files["/etc/salt/minion.d/99-master-address.conf"] = f"master: {master_address}\n"
    if master:
        files["/etc/salt/master.d/00-shared-cores.conf"] = SHARED_CORES_MASTER
    if ship_config:
        files["/etc/salt/minion"] = "##### Primary configuration settings #####\n#master: salt\n"
        if master:
            files["/etc/salt/master"] = (
                "##### Primary configuration settings #####\n#interface: 0.0.0.0\n"
                "#file_roots:\n#  base:\n#    - /srv/salt\n"
            )
    for inside, text in files.items():
        path = host.path(inside)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    daemons = ["salt-master"] if master and master_started else []
    host.sh("; ".join(host.start_command(d) for d in [*daemons, "salt-minion"]))


def formula_git():
    """
    The repository under test as the URL a host clones the formula from (its committed HEAD).
    """
    root = pathlib.Path(__file__).resolve().parents[1]
    _run(["git", "-C", str(root), "rev-parse", "HEAD"])
    return str(root)


# What a user does on the first master of a walk-through: clone the formula (``$FORMULA_GIT``,
# see ``formula_git``) beside the site's roots and target the ``multimaster`` pillar at all.
SERVE_FORMULA = """\
git clone -q "$FORMULA_GIT" /srv/formulas/multimaster-formula
mkdir -p /srv/salt /srv/pillar
cat > /etc/salt/master.d/roots.conf <<'YAML'
file_roots:
  base: [/srv/salt, /srv/formulas/multimaster-formula]
pillar_roots:
  base: [/srv/pillar]
YAML
printf "base:\\n  '*': [multimaster]\\n" > /srv/pillar/top.sls
"""


def accept_all(ids_pattern, count):
    """
    Shell that restarts the first master, waits for the ``count`` keys whose ids match the
    extended regex ``ids_pattern`` to be pending, accepts them by name and waits until all
    answer. By name, not ``salt-key -A``: Salt writes a pending key through a temporary file
    in ``minions_pre`` (``localfs_key.store``), which ``-A`` would accept as a minion.
    """
    return f"""\
systemctl restart salt-master
until [ "$(salt-key -l un | grep -cxE '({ids_pattern})')" = {count} ]; do sleep 2; done
until [ "$(salt-key -l acc | grep -cxE '({ids_pattern})')" = {count} ]; do
  for id in $(salt-key -l un | grep -xE '({ids_pattern})'); do salt-key -a "$id" -y >/dev/null; done
  sleep 1
done
until [ "$({UP} | grep -cE '^ *"({ids_pattern})",?$')" = {count} ]; do sleep 1; done
"""
