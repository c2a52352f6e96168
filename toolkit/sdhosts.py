"""
Separate hosts booted with systemd as their PID 1, each over a root filesystem of its own:
Salt's daemons run there as the units ``salt-master.service`` and ``salt-minion.service``, as
the packages ship them (``Type=notify``, the minion's ``KillMode=process``).

Each host is a ``toolkit.hosts`` host (its network namespace on the set's bridge, its private
``/etc/salt``, ``/var/cache/salt``, ``/var/log/salt`` and ``/srv`` on the machine's disk) whose
init runs in new PID, mount, UTS and cgroup namespaces over a root made for it alone, in its
own mount namespace (nothing propagates back to the machine):

- ``/`` a tmpfs; ``/usr`` (and the ``bin``, ``lib`` links to it) bound read-only;
- ``/etc`` an overlay of the machine's ``/etc`` whose upper layer is on a tmpfs, with
  ``/etc/systemd/system`` and ``/etc/systemd/system-generators`` of the host's own (on disk):
  every generator is disabled and every installed unit is masked but the targets, slices and
  the journal, so nothing of the machine's (its services, timers, gettys, udev, networkd) runs;
- ``/tmp``, ``/run``, ``/var``, ``/root``, ``/dev`` fresh tmpfs (``/dev`` with ``null``,
  ``zero``, ``full``, ``random``, ``urandom``, ``tty`` bound in and a devpts of its own);
- ``/proc`` of its PID namespace with ``/proc/sys`` and ``/proc/sysrq-trigger`` read-only, a
  read-only ``/sys``, and ``/sys/fs/cgroup`` the cgroup2 hierarchy seen from a cgroup made for
  the host (its cgroup namespace's root);
- the interpreter running us (its virtualenv and base installation) and this repository bound
  read-only, so the units run the Salt under test;
- PID 1 runs without ``CAP_SYS_MODULE``, ``CAP_SYS_TIME``, ``CAP_SYS_RAWIO``, ``CAP_SYS_BOOT``
  and ``CAP_SYSLOG`` (bounding set), with ``container=multimaster``.

Before systemd is started, the shell that becomes it checks from inside the new root that a
marker the harness put in the machine's ``/tmp`` is not visible, that ``/``, ``/tmp``, ``/run``
and ``/var`` are tmpfs and ``/etc`` an overlay, and that ``/usr`` is read-only; any failure
stops the boot. ``down()`` kills each init (SIGKILL: the kernel then ends its whole PID
namespace) and removes what ``toolkit.hosts`` removes plus the hosts' cgroups.

    with SystemdHostSet([SystemdHost("master1", "10.0.9.61")], prefix="sd", subnet="10.0.9") as hs:
        hs["master1"].sh("systemctl is-system-running")
"""

import contextlib
import dataclasses
import os
import pathlib
import secrets
import shlex
import signal
import subprocess
import sys
import time

import psutil

from toolkit import hosts as nshosts

REPO = pathlib.Path(__file__).resolve().parents[1]
SYSTEMD = "/lib/systemd/systemd"
UNIT_DIRS = ("/usr/lib/systemd/system", "/usr/local/lib/systemd/system")
GENERATOR_DIRS = ("/usr/lib/systemd/system-generators", "/usr/local/lib/systemd/system-generators")
# What systemd needs of the installed units; everything else is masked.
KEPT_UNITS = (
    "systemd-journald.service",
    "systemd-journald.socket",
    "systemd-journald-dev-log.socket",
)
KEPT_SUFFIXES = (".target", ".slice")
DROPPED_CAPS = ("sys_module", "sys_time", "sys_rawio", "sys_boot", "syslog", "wake_alarm")
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
BOOT_TARGET = "multimaster-host.target"
# As the Salt packages ship them (their ExecStart names the daemon of the Salt under test).
UNITS = {
    "salt-master.service": """\
[Unit]
Description=The Salt Master Server
After=network.target

[Service]
LimitNOFILE=100000
Type=notify
NotifyAccess=all
ExecStart={bin}/salt-master

[Install]
WantedBy=multi-user.target
""",
    "salt-minion.service": """\
[Unit]
Description=The Salt Minion
After=network.target salt-master.service

[Service]
KillMode=process
Type=notify
NotifyAccess=all
LimitNOFILE=8192
ExecStart={bin}/salt-minion

[Install]
WantedBy=multi-user.target
""",
    BOOT_TARGET: """\
[Unit]
Description=A multimaster test host
Requires=basic.target
After=basic.target
AllowIsolate=yes
""",
}


def cgroup2_mount():
    """
    Where the machine's cgroup2 hierarchy is mounted (``/sys/fs/cgroup`` on a unified system,
    ``/sys/fs/cgroup/unified`` on a hybrid one); HostError when there is none.
    """
    for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        if post.split()[0] == "cgroup2":
            return pathlib.Path(pre.split()[4])
    raise nshosts.HostError("no cgroup2 hierarchy mounted: systemd hosts need one")


def cgroup_parent():
    """
    The cgroup (a directory of the cgroup2 hierarchy) the hosts' cgroups are made in: the one
    this process runs in.
    """
    for line in pathlib.Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return cgroup2_mount() / line[3:].lstrip("/")
    raise nshosts.HostError("this process is in no cgroup2 cgroup")


def read_only_binds():
    """
    The directories the hosts see read-only besides ``/usr``: the virtualenv and base
    installation of the interpreter running us, and this repository (the formula's origin)
    with its git directories (a worktree's lie outside it).
    """
    git = nshosts._run(
        ["git", "-C", str(REPO), "rev-parse", "--absolute-git-dir", "--git-common-dir"]
    ).stdout.split()
    paths = sorted(
        {pathlib.Path(os.path.realpath(p)) for p in (sys.prefix, sys.base_prefix, REPO)}
        | {pathlib.Path(sys.prefix).absolute()}
        | {pathlib.Path(os.path.realpath(REPO / p)) for p in git}
    )
    kept = []
    for path in paths:
        if path == pathlib.Path("/usr") or pathlib.Path("/usr") in path.parents:
            continue
        if not any(k == path or k in path.parents for k in kept):
            kept.append(path)
    return kept


@dataclasses.dataclass
class SystemdHost(nshosts.Host):
    """
    A host whose PID 1 is systemd; ``init_pid`` is that process as the machine sees it.
    """

    init_pid: int = 0

    @property
    def cgroup(self):
        return cgroup_parent() / f"multimaster-{self.netns}"

    def enter(self):
        if not self.init_pid:
            raise nshosts.HostError(f"{self.name}: not booted")
        return [
            "nsenter",
            f"--target={self.init_pid}",
            "--mount",
            "--uts",
            "--net",
            "--pid",
            "--cgroup",
            "--root",
            "--wd",
            "--",
            # nsenter's own --wd=DIR would be looked up before entering the host's root.
            "sh",
            "-c",
            'cd /srv && exec "$@"',
            "sh",
        ]

    def environment(self):
        return {**super().environment(), "PATH": f"{nshosts.SALT_BIN}:/usr/sbin:/usr/bin"}

    def start_command(self, daemon):
        return f"systemctl enable --now {daemon}"

    def log(self, name, tail=80):
        if name != "systemd":
            return super().log(name, tail)
        path = self.root / "systemd.log"
        if not path.is_file():
            return "(systemd: no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-tail:])


class SystemdHostSet(nshosts.HostSet):
    """
    ``toolkit.hosts.HostSet`` whose hosts boot systemd (``SystemdHost``); ``up()`` returns once
    every host's systemd says ``running``.
    """

    BOOT_TIMEOUT = 90

    def __init__(self, hosts, prefix="sd", subnet="10.0.9"):
        super().__init__(
            [h if isinstance(h, SystemdHost) else SystemdHost(h.name, h.address) for h in hosts],
            prefix=prefix,
            subnet=subnet,
        )
        self._inits = {}

    def up(self):
        super().up()
        for host in self:
            self._boot(host)
        for host in self:
            self.wait(
                f"systemd on {host.name} running",
                lambda host=host: self._state(host) in ("running", "degraded"),
                self.BOOT_TIMEOUT,
                interval=0.5,
            )
            state = self._state(host)
            if state != "running":
                failed = host.sh("systemctl --failed --no-legend", check=False).stdout
                raise nshosts.HostError(f"{host.name}: systemd is {state}:\n{failed}")

    def _state(self, host):
        if self._inits[host.name].poll() is not None:
            raise nshosts.HostError(
                f"{host.name}: its init exited ({self._inits[host.name].returncode})\n"
                f"{host.log('systemd')}"
            )
        if not host.init_pid:
            return None
        proc = host.sh("systemctl is-system-running", check=False, timeout=30)
        return proc.stdout.strip()

    def _make(self, host):
        """
        The host's network, its private directories on disk and what its root is made of.
        """
        self._network(host)
        self._directories(host)
        units = host.root / "units"
        generators = host.root / "generators"
        for path in (units, generators, host.root / "mnt"):
            path.mkdir()
        for directory in UNIT_DIRS:
            for unit in sorted(pathlib.Path(directory).glob("*")):
                name = unit.name
                # Their .wants/.requires/.d directories stay: what they list is masked here.
                if (
                    unit.is_dir()
                    or name in KEPT_UNITS
                    or name.endswith(KEPT_SUFFIXES)
                    or name in UNITS
                ):
                    continue
                if not (units / name).is_symlink():
                    (units / name).symlink_to("/dev/null")
        for directory in GENERATOR_DIRS:
            for generator in sorted(pathlib.Path(directory).glob("*")):
                if not (generators / generator.name).is_symlink():
                    (generators / generator.name).symlink_to("/dev/null")
        for name, text in UNITS.items():
            (units / name).write_text(text.format(bin=nshosts.SALT_BIN))

    def _boot(self, host):
        marker = pathlib.Path("/tmp") / f"multimaster-{host.netns}-{secrets.token_hex(8)}"
        marker.write_text("the machine's /tmp: must not be visible inside a host\n")
        try:
            self._start(host, marker)
        finally:
            marker.unlink(missing_ok=True)

    def _start(self, host, marker):
        host.cgroup.mkdir(exist_ok=True)
        script = self._boot_script(host, marker)
        log = (host.root / "systemd.log").open("w")
        # Into the host's cgroup first: the cgroup namespace unshare makes is rooted there.
        argv = [
            "sh",
            "-c",
            f'echo $$ > {shlex.quote(str(host.cgroup / "cgroup.procs"))} && exec "$@"',
            "sh",
            "nsenter",
            f"--net=/run/netns/{host.netns}",
            "--",
            "unshare",
            "--mount",
            "--uts",
            "--pid",
            "--cgroup",
            "--fork",
            "--kill-child=SIGKILL",
            "--propagation",
            "private",
            "--",
            "sh",
            "-ec",
            script,
        ]
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
            )
        finally:
            log.close()
        self._inits[host.name] = proc
        deadline = time.monotonic() + 30
        while not host.init_pid:
            children = psutil.Process(proc.pid).children() if proc.poll() is None else []
            if children:
                host.init_pid = children[0].pid
            elif proc.poll() is not None or time.monotonic() > deadline:
                raise nshosts.HostError(f"{host.name}: no init started\n{host.log('systemd')}")
            else:
                time.sleep(0.1)
        # Only the shell that checked the root execs systemd: wait for it to have done so.
        while True:
            try:
                exe = os.readlink(f"/proc/{host.init_pid}/exe")
            except OSError:
                exe = ""
            if exe.endswith("/systemd"):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise nshosts.HostError(f"{host.name}: systemd not started\n{host.log('systemd')}")
            time.sleep(0.1)

    def _boot_script(self, host, marker):
        lines = [
            *self._root_lines(host),
            *self._bind_lines(host),
            *self._kernel_fs_lines(),
            "pivot_root . .old",
            "exec chroot . /bin/sh -ec " + shlex.quote(self._inside_script(marker)),
        ]
        return "\n".join(lines)

    def _root_lines(self, host):
        """
        The new root on a tmpfs: ``/usr`` read-only, ``/etc`` an overlay with the host's own
        units, generators, hostname, hosts and machine id, fresh ``/tmp``, ``/run``, ``/var``
        and ``/root``.
        """
        q = shlex.quote
        root = q(str(host.root / "mnt"))
        return [
            f"hostname {q(host.name)}",
            f"mount -t tmpfs -o mode=0755 {q(host.netns)} {root}",
            f"cd {root}",
            "mkdir -p .layers root-fs",
            "mount -t tmpfs -o mode=0700 layers .layers",
            "mkdir -p .layers/etc .layers/etc-work",
            # pivot_root wants the new root to be a mount point.
            "mount --bind root-fs root-fs",
            "cd root-fs",
            "mkdir -p usr etc var tmp run proc sys dev root srv .old",
            "ln -s usr/bin bin; ln -s usr/sbin sbin; ln -s usr/lib lib; ln -s usr/lib64 lib64",
            "mount --bind /usr usr && mount -o remount,bind,ro usr",
            f"mount -t overlay -o lowerdir=/etc,upperdir={root}/.layers/etc,"
            f"workdir={root}/.layers/etc-work overlay etc",
            "mount -t tmpfs -o mode=1777 tmp tmp",
            "mount -t tmpfs -o mode=0755 run run",
            "mount -t tmpfs -o mode=0755 var var",
            "mount -t tmpfs -o mode=0700 root root",
            "mkdir -p var/lib var/log var/cache var/tmp var/spool var/lib/systemd",
            "ln -s ../run var/run; ln -s ../run/lock var/lock",
            # The host's own unit and generator directories, hostname, hosts, machine id.
            "mkdir -p etc/systemd/system etc/systemd/system-generators",
            f"mount --bind {q(str(host.root / 'units'))} etc/systemd/system",
            f"mount --bind {q(str(host.root / 'generators'))} etc/systemd/system-generators",
            f"echo {q(host.name)} > etc/hostname",
            f"echo {secrets.token_hex(16)} > etc/machine-id",
            ": > etc/fstab",
            "touch etc/hosts",
            f"mount --bind {q(str(host.path('/etc/hosts')))} etc/hosts",
        ]

    def _bind_lines(self, host):
        """
        The host's private ``/etc/salt``, ``/var/cache/salt``, ``/var/log/salt`` and ``/srv``
        bound in, and the read-only binds (``read_only_binds``).
        """
        q = shlex.quote
        binds = [
            (host.path(p), p) for p in ("/etc/salt", "/var/cache/salt", "/var/log/salt", "/srv")
        ]
        ro_binds = read_only_binds()
        lines = []
        for source, inside in binds:
            lines += [f"mkdir -p .{inside}", f"mount --bind {q(str(source))} .{q(inside)}"]
        for path in ro_binds:
            inside = q("." + str(path))
            lines += [
                f"mkdir -p {inside}",
                f"mount --bind {q(str(path))} {inside}",
                f"mount -o remount,bind,ro {inside}",
            ]
        return lines

    def _kernel_fs_lines(self):
        """
        ``/dev`` (a few of the machine's devices, a devpts of its own), ``/proc`` of the new PID
        namespace with the kernel's knobs read-only, a read-only ``/sys`` and the cgroup2
        hierarchy.
        """
        return [
            # /dev: a few devices of the machine's (as every container has them), own devpts.
            "mount -t tmpfs -o mode=0755,nosuid dev dev",
            *(f"touch dev/{d} && mount --bind /dev/{d} dev/{d}" for d in DEVICES),
            "touch dev/console && mount --bind /dev/null dev/console",
            "mkdir dev/pts dev/shm",
            "mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts dev/pts",
            "ln -s pts/ptmx dev/ptmx",
            "mount -t tmpfs -o mode=1777,nosuid,nodev shm dev/shm",
            "ln -s /proc/self/fd dev/fd; ln -s /proc/self/fd/0 dev/stdin",
            "ln -s /proc/self/fd/1 dev/stdout; ln -s /proc/self/fd/2 dev/stderr",
            # /proc of the new PID namespace; the kernel's knobs read-only.
            "mount -t proc -o nosuid,nodev,noexec proc proc",
            "mount --bind proc/sys proc/sys",
            "mount -o remount,bind,ro proc/sys",
            "if [ -e proc/sysrq-trigger ]; then",
            "  mount --bind proc/sysrq-trigger proc/sysrq-trigger",
            "  mount -o remount,bind,ro proc/sysrq-trigger",
            "fi",
            "mount -t sysfs -o ro,nosuid,nodev,noexec sysfs sys",
            "mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 sys/fs/cgroup",
        ]

    def _inside_script(self, marker):
        q = shlex.quote
        bounding = ",".join(f"-{c}" for c in DROPPED_CAPS)
        return "\n".join(
            [
                "umount -l /.old",
                "rmdir /.old",
                # Safety: nothing of the machine's /tmp, /run, /var, /etc is writable here.
                f"if [ -e {q(str(marker))} ]; then",
                "  echo 'the machine /tmp is visible' >&2; exit 1",
                "fi",
                "for d in / /tmp /run /var /root /dev; do",
                '  t=$(stat -f -c %T "$d")',
                '  [ "$t" = tmpfs ] || { echo "$d is $t, not tmpfs" >&2; exit 1; }',
                "done",
                't=$(stat -f -c %T /etc); [ "$t" = overlayfs ] || '
                '{ echo "/etc is $t, not an overlay" >&2; exit 1; }',
                "if touch /usr/.multimaster-probe 2>/dev/null; then",
                "  rm -f /usr/.multimaster-probe; echo '/usr is writable' >&2; exit 1",
                "fi",
                "if (echo 0 > /proc/sys/kernel/printk) 2>/dev/null; then",
                "  echo '/proc/sys is writable' >&2; exit 1",
                "fi",
                "echo 'root checked: booting systemd'",
                f"exec env -i container=multimaster setpriv --bounding-set {bounding} "
                f"{SYSTEMD} --unit={BOOT_TARGET} --log-target=console",
            ]
        )

    def down(self):
        # Each init first (SIGKILL: its PID namespace ends with it), then the rest as always;
        # whatever fails on the way, the namespaces, links and cgroups still go.
        try:
            for name, proc in getattr(self, "_inits", {}).items():
                host = self.hosts[name]
                # Only while its launcher lives: a pid of an init that died may be reused.
                if host.init_pid and proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(host.init_pid, signal.SIGKILL)
                if proc.poll() is None:
                    proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=30)
                host.init_pid = 0
        finally:
            super().down()
            parent = cgroup_parent()
            for cgroup in sorted(parent.glob(f"multimaster-{self.prefix}-*")):
                with contextlib.suppress(OSError):
                    _remove_cgroup(cgroup)


def _remove_cgroup(path, timeout=10):
    deadline = time.monotonic() + timeout
    for directory, _, _ in sorted(os.walk(path), key=lambda w: -w[0].count("/")):
        while True:
            try:
                os.rmdir(directory)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
