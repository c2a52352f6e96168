"""
The daemons a benchmark runs against: masters on loopback addresses with one control minion
each (connected to and accepted on the primary), the formula synced as a user syncs it, all
inside one run directory under bench/run/. Shared by the key and roots benchmarks.
"""

import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The dev toolkit (toolkit/) shared with the lab and the tests.
sys.path.insert(0, ROOT)

from toolkit import devkit  # noqa: E402


def timed(fn):
    """
    ``(seconds, result)`` of ``fn()``.
    """
    start = time.monotonic()
    result = fn()
    return time.monotonic() - start, result


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _disk_counters(dev):
    # /proc/diskstats: major minor name, reads completed ... writes completed (8th field),
    # sectors written (10th), I/Os in flight (12th), discards completed (15th, where the kernel
    # counts them: a delete on a disk mounted with `discard` goes on discarding after it).
    major, minor = str(os.major(dev)), str(os.minor(dev))
    try:
        with open("/proc/diskstats", encoding="ascii") as handle:
            for line in handle:
                fields = line.split()
                if fields[:2] == [major, minor]:
                    return fields[7], fields[9], fields[11], fields[14:15]
    except OSError:
        pass
    return None


def quiet_disk(path, settle=3, timeout=60):
    """
    Sync, then wait until the block device holding ``path`` has written nothing for ``settle``
    seconds (at most ``timeout``): a timed copy does not start while the one before is still
    being flushed or discarded. Returns the seconds waited.
    """
    start = time.monotonic()
    os.sync()
    dev = os.stat(path).st_dev
    last, calm = _disk_counters(dev), 0
    while last is not None and calm < settle and time.monotonic() - start < timeout:
        time.sleep(1)
        now = _disk_counters(dev)
        calm = calm + 1 if now == last else 0
        last = now
    return time.monotonic() - start


def largest_load(master_dir):
    """
    The largest ``.load.p`` in the master's job cache: what its biggest publish (or kept job)
    stored.
    """
    sizes = [0]
    for dirpath, _, filenames in os.walk(master_dir):
        if ".load.p" in filenames:
            sizes.append(os.path.getsize(os.path.join(dirpath, ".load.p")))
    return max(sizes)


def peak_rss_mb(cmd):
    """
    ``(returncode, output, peak RSS in MB)`` of the command ``cmd`` run to completion: the
    kernel's high-water mark of that one process, from ``wait4``.
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    proc.stdout.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, out, usage.ru_maxrss / 1024


def tree_peak_rss_mb(pid):
    """
    The largest high-water mark (``VmHWM``, MB) among ``pid`` and its descendants right now.
    """
    import psutil

    peak = 0
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return peak
    for proc in procs:
        try:
            with open(f"/proc/{proc.pid}/status", encoding="ascii") as handle:
                for line in handle:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]) / 1024)
        except OSError:
            continue
    return peak


class PeakSampler(devkit.Poller):
    """
    While active, samples ``tree_peak_rss_mb`` of each pid every ``interval`` seconds and keeps
    the largest value per pid (a job process's own high-water mark is read until it exits).
    """

    def __init__(self, pids, interval=0.05):
        super().__init__(interval)
        self.pids = pids
        self.peaks = {pid: 0 for pid in pids}

    def poll(self):
        for pid in self.pids:
            self.peaks[pid] = max(self.peaks[pid], tree_peak_rss_mb(pid))


class BenchLab:
    """
    ``masters``: ``[(id, ip)]``, the first one the primary; ``roots(mid)``: extra master config
    (``file_roots``/``pillar_roots``) for master ``mid``. With ``hot``, the masters share the
    primary's keypair and the control minions connect to every master (as after
    ``multimaster.minion``); ``reactor`` is the pillar's ``multimaster:reactor``.
    """

    def __init__(self, name, masters, ports, roots, hot=False, reactor=None):
        self.run_dir = os.path.join(ROOT, "bench", "run", name)
        self.masters = masters
        self.ports = ports
        self.roots = roots
        self.hot = hot
        self.reactor = reactor

    def path(self, *parts):
        return os.path.join(self.run_dir, *parts)

    def config_dir(self, mid):
        return self.path(mid)

    def pki(self, mid):
        return self.path(mid, "etc", "salt", "pki", "master")

    def cli(self, name, mid, *args, out=None):
        """
        ``name -c <master mid's config dir> args`` (a Salt CLI of this venv).
        """
        return devkit.salt_cli(name, self.config_dir(mid), *args, out=out, timeout=1800)

    def command(self, name, mid, *args):
        return devkit.salt_command(name, self.config_dir(mid), *args)

    def section(self):
        return devkit.multimaster_section(
            [devkit.master_entry(mid, ip, self.path(mid)) for mid, ip in self.masters],
            self.ports,
        )

    def master_config(self, mid, ip):
        return devkit.loopback_master(
            ip,
            self.ports,
            id=mid,
            root_dir=self.path(mid),
            user="root",
            log_file=self.path(mid, "master.log"),
            log_level_logfile="info",
            **self.roots(mid),
            **devkit.multimaster_master_options(self.section(), reactor=self.reactor),
        )

    def minion_config(self, mid):
        return devkit.loopback_minion(
            [ip for _, ip in self.masters] if self.hot else self.masters[0][1],
            self.ports,
            id=mid,
            root_dir=self.path(f"{mid}-minion"),
            user="root",
            log_file=self.path(f"{mid}-minion", "minion.log"),
        )

    def _pidfiles(self):
        for dirpath, _, files in os.walk(self.run_dir):
            for name in files:
                if name.endswith(".pid"):
                    yield os.path.join(dirpath, name)

    def stop_all(self):
        if os.path.isdir(self.run_dir):
            devkit.stop_pids(filter(None, map(devkit.read_pid, self._pidfiles())))

    def wait(self, what, check, timeout=120):
        devkit.wait_until(
            f"{what}; see logs under {self.run_dir}", check, timeout, error=SystemExit
        )

    def ping(self, targets="*", tgt_type=()):
        primary = self.masters[0][0]
        return self.cli("salt", primary, *tgt_type, targets, "test.ping", "-t", "10", out="txt")

    def peer_ping(self):
        """
        The floor: one publish round trip to the peers' control minions, CLI included.
        """
        peers = ",".join(mid for mid, _ in self.masters[1:])
        return self.ping(peers, ("-L",))

    def start(self, prepare=None):
        """
        Fresh run directory, configs, pillar and formula; ``prepare()`` (writing trees) runs
        before the daemons start; then daemons up, control minions accepted, modules synced.
        """
        self.stop_all()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        devkit.copy_formula(self.path("formula"))
        devkit.write_multimaster_pillar(self.path("pillar"), self.section())
        for mid, ip in self.masters:
            devkit.write_config(self.path(mid, "master"), self.master_config(mid, ip))
            devkit.write_config(self.path(f"{mid}-minion", "minion"), self.minion_config(mid))
        if prepare:
            prepare()
        primary = self.masters[0][0]
        acceptors = [mid for mid, _ in self.masters] if self.hot else [primary]
        # A master that runs the formula's engines needs them synced before it starts.
        engines = any(self.roots(mid).get("engines") for mid, _ in self.masters)
        for mid in [mid for mid, _ in self.masters] if engines else acceptors:
            # Before the master starts: its reactor loads the runners once, at start (salt-run
            # needs only the job tracker dir the running master would have made).
            os.makedirs(self.path(mid, "var", "cache", "salt", "master", "proc"), exist_ok=True)
            self.cli("salt-run", mid, "saltutil.sync_all")
        self.cli("salt-master", primary, "-d")
        if self.hot:
            self.wait(
                "the primary's key", lambda: os.path.exists(self.pki(primary) + "/master.pub")
            )
            for mid, _ in self.masters[1:]:
                devkit.copy_master_keypair(self.pki(primary), self.pki(mid))
        for mid, _ in self.masters[1:]:
            self.cli("salt-master", mid, "-d")
        for mid, _ in self.masters:
            devkit.salt_cli("salt-minion", self.path(f"{mid}-minion"), "-d", out=None)
        for mid in acceptors:

            def pending(mid=mid):
                listed = self.cli("salt-key", mid, "-l", "pre", out="json").data or {}
                return len(listed.get("minions_pre", [])) == len(self.masters)

            self.wait(f"control minion keys on {mid}", pending)
            self.cli("salt-key", mid, "-A", "-y")
        self.wait(
            "control minions",
            lambda: self.ping().stdout.count("True") == len(self.masters),
        )
        self.cli("salt", primary, "*", "saltutil.sync_all", "-t", "60")

    def control_minion_pid(self, mid):
        return devkit.read_pid(self.path(f"{mid}-minion", "var", "run", "salt-minion.pid"))
