"""
Watching separate hosts (``toolkit/hosts.py``) while a runner works: a minion's answers to
pings from each master, the salt-minion pids, a runner's JSON report, a file as the host sees
it.
"""

import itertools
import json
import os
import pathlib
import subprocess
import threading

from toolkit import hosts as nshosts


def read(host, inside):
    """
    The text of ``inside`` on ``host``; a link is followed on that host (Salt 3008 links
    ``master.pem``/``.pub`` to ``<id>.pem``/``.pub`` by absolute path).
    """
    path = host.path(inside)
    while path.is_symlink():
        inside = str(pathlib.PurePosixPath(inside).parent / os.readlink(path))
        path = host.path(inside)
    return path.read_text()


def minion_pid(host):
    """
    The pid in the salt-minion's pidfile on ``host``, or None while there is none.
    """
    path = host.path("/run/salt-minion.pid")
    return path.read_text().strip() if path.is_file() else None


def answers(master, minion, timeout=3):
    """
    Whether ``minion`` answers ``test.ping`` on ``master`` within ``timeout`` seconds (one
    not on that master costs a short find_job round: ``toolkit.hosts.answering``).
    """
    return minion in nshosts.answering(master, [minion], timeout)


def run_json(master, command, timeout=900):
    """
    ``(returncode, report)`` of a ``salt-run ... --out=json`` on ``master`` (the report is the
    last JSON document printed: progress events come before it).
    """
    ret = master.sh(f"{command} --out=json", check=False, timeout=timeout)
    text = "\n" + ret.stdout
    assert "\n{" in text, ret.stdout + ret.stderr
    return ret.returncode, json.loads(text[text.rindex("\n{") :])


PINGLOOP = pathlib.Path(__file__).with_name("pingloop.py")


class Pinger:
    """
    Pings ``minion`` (or every id of a comma-separated list) once a second from each master,
    by one ``pingloop.py`` process on each master's host, read in one thread per master: a
    failover minion answers the one master it is connected to. A ping waits ``timeout``
    seconds, and as long again for find_job. ``missed`` holds ``(master, start, ids that
    answered)`` of each ping not every id answered.
    """

    def __init__(self, masters, minion, timeout=2):
        self.masters, self.minion, self.timeout = masters, minion, timeout
        self.answered, self.ticks, self.missed = [], [], []
        self.answered_by = {master.name: [] for master in masters}
        self.procs = []
        self.threads = []

    def _read(self, master, proc):
        # A ping is dated by its start, on the same monotonic clock as the test's.
        for line in proc.stdout:
            began, ok, ids = line.split()
            self.ticks.append(float(began))
            if ok == "1":
                self.answered.append(float(began))
                self.answered_by[master.name].append(float(began))
            else:
                self.missed.append((master.name, float(began), ids))

    def __enter__(self):
        for master in self.masters:
            script = f'exec python -u {PINGLOOP} "$0" {self.timeout}'
            proc = subprocess.Popen(
                master.shell("-c", script, self.minion), stdout=subprocess.PIPE, text=True
            )
            self.procs.append(proc)
            self.threads.append(threading.Thread(target=self._read, args=(master, proc)))
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_):
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for thread in self.threads:
            thread.join()

    def answered_since(self, since, master=None):
        """
        Whether a ping begun at or after ``since`` (``time.monotonic()``) was answered (by
        ``master``, by name, or by any master). A ping is dated by its start: under load one
        takes a few seconds (it publishes, waits, asks find_job), so "the last answer is at
        most N seconds old" would wait for what a slow ping can never give.
        """
        times = self.answered if master is None else self.answered_by[master]
        # Not times[-1]: both masters' threads append to ``answered``, the later append may be
        # the ping begun earlier.
        return any(began >= since for began in times)

    def longest_outage(self, master=None):
        """
        The longest time, in seconds, between two answers from any master (or from ``master``,
        by name).
        """
        times = sorted(self.answered if master is None else self.answered_by[master])
        return max((b - a for a, b in itertools.pairwise(times)), default=float("inf"))


class PidWatch:
    """
    Samples the salt-minion pid of each host in ``hosts`` every ``interval`` seconds, in a
    thread: ``restarts()`` counts, per host, the pids seen after the first.
    """

    def __init__(self, hosts, interval=0.3):
        self.hosts, self.interval = list(hosts), interval
        self.seen = {host.name: [] for host in self.hosts}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch)

    def _watch(self):
        while not self.stop.is_set():
            for host in self.hosts:
                pid = minion_pid(host)
                if pid and (not self.seen[host.name] or self.seen[host.name][-1] != pid):
                    self.seen[host.name].append(pid)
            self.stop.wait(self.interval)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_):
        self.stop.set()
        self.thread.join()

    def restarts(self):
        return {name: max(0, len(pids) - 1) for name, pids in self.seen.items()}
