#!/usr/bin/env python3
"""
Benchmark ``salt-run multimaster.sync_roots`` on two tree shapes, side by side with ``rsync -a``
of the same tree and with the floor.

The shapes (``--shapes``, both by default, one after the other):

- ``large``: 5,000 files / 200 MB under 50 directories, 100 files of 1.6 MB and the rest 8 KB on
  average;
- ``small``: 30,000 files of 2 KB median (log-normal sizes) under 3,000 directories 3 to 6
  levels deep in 150 top-level directories, the shape of a tree of formula repositories.

For each shape: two masters (127.0.0.21-22) and their control minions inside bench/run/roots/;
master1's ``file_roots`` hold the generated tree (random content), master2's its own empty root.
Then one run measures, every figure the median of ``--repeat`` turns, each turn printed:

- floor: ``salt -L master2 test.ping`` (one publish round trip, CLI included);
- rsync: ``rsync -a`` of master1's tree into master2's (emptied) tree;
- rsync --fsync: the same with every file fsync'd, as ``sync_roots`` writes them (informative);
- first: the first ``sync_roots roots=file`` (the whole tree into master2's emptied tree), cold:
  no hash cache on either master; it takes turns with both rsyncs, each after the disk has gone
  quiet (synced, nothing written for 3 s): all three meet the disk in the same state;
- no-op: ``sync_roots`` again (manifests and digests only);
- one change: one file of the tree rewritten, then ``sync_roots``; each no-op and change turn
  also starts once the disk has gone quiet, past the writeback of the copies before it;
- peak RSS of the ``salt-run`` process (against ``salt-run test.arg``, its idle size) and of
  master2's control minion and master1's daemons (against their size before the first sync).

Both masters run the roots watch engine (``multimaster_rootswatch``), as ``multimaster.master``
configures a hot or failover set; ``--no-watch`` measures without it.

Usage: ``python bench/bench_sync_roots.py [--shapes large,small] [--repeat 3] [--no-watch]``.
"""

import argparse
import math
import os
import random
import shutil
import statistics
import subprocess
import types

from benchlab import (
    BenchLab,
    PeakSampler,
    devkit,
    peak_rss_mb,
    quiet_disk,
    timed,
    tree_peak_rss_mb,
)

MASTERS = [("master1", "127.0.0.21"), ("master2", "127.0.0.22")]
LARGE = 100  # files that hold most of the bytes


# Both masters run the roots watch engine, as ``multimaster.master`` configures them
# (``multimaster:master:roots_watch``, default true); ``--no-watch`` leaves it out.
ENGINES = [{"multimaster_rootswatch": {}}]


def roots(mid):
    return {
        **({"engines": ENGINES} if ENGINES else {}),
        "file_roots": {"base": [LAB.path(mid, "formula"), LAB.path(mid, "tree")]},
        # master1 serves the control minions' multimaster pillar; master2 has its own dir.
        "pillar_roots": {
            "base": [LAB.path("pillar") if mid == "master1" else LAB.path(mid, "pillar")]
        },
    }


LAB = BenchLab("roots", MASTERS, devkit.Ports(publish=32010, ret=32011), roots)


def make_large_tree(root, rng, files=5000, total_mb=200):
    """
    ``files`` files under 50 nested directories, ``total_mb`` MB in all: ``LARGE`` files carry
    80% of the bytes, the rest are small (sizes vary).
    """
    total = total_mb * 1024 * 1024
    large = int(total * 0.8) // LARGE
    small = (total - large * LARGE) // max(files - LARGE, 1)
    for i in range(files):
        directory = os.path.join(root, f"d{i % 10}", f"e{i % 50 // 10}")
        size = large if i < LARGE else rng.randint(small // 2, small * 3 // 2)
        write_random(os.path.join(directory, f"f{i:05d}.sls"), size, rng)


def make_small_tree(root, rng, files=30000, per_dir=10, repos=150):
    """
    ``files`` files of 2 KB median (log-normal, at most 256 KB), ``per_dir`` to a directory,
    the directories 3 to 6 levels deep under ``repos`` top-level ones.
    """
    for i in range(files):
        directory = i // per_dir
        below = directory // repos
        levels = [f"l{below % 4}", f"m{below // 4 % 5}", f"n{below // 20}", "states", "files"]
        path = os.path.join(root, f"repo{directory % repos:03d}", *levels[: 2 + directory % 5])
        size = min(int(rng.lognormvariate(math.log(2048), 0.9)), 256 * 1024)
        write_random(os.path.join(path, f"f{i:05d}.sls"), size, rng)


SHAPES = {"large": make_large_tree, "small": make_small_tree}


def write_random(path, size, rng):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(rng.randbytes(size))


def prepare(shape):
    def run():
        SHAPES[shape](LAB.path("master1", "tree"), random.Random(7))
        devkit.copy_formula(LAB.path("master1", "formula"))
        devkit.copy_formula(LAB.path("master2", "formula"))
        for directory in (LAB.path("master2", "tree"), LAB.path("master2", "pillar")):
            os.makedirs(directory)

    return run


def sync_roots():
    """
    ``salt-run multimaster.sync_roots roots=file``: ``(seconds, peak RSS MB)``.
    """
    cmd = LAB.command("salt-run", "master1", "multimaster.sync_roots", "roots=file", "--out=json")
    seconds, (rc, out, rss) = timed(lambda: peak_rss_mb(cmd))
    if rc != 0:
        raise SystemExit(f"sync_roots failed ({rc}): {out[-3000:]}")
    return seconds, rss


def forget_hashes():
    """
    Remove every master's hash cache of its roots (``<cachedir>/multimaster/roots-hashes``)
    and the snapshots of their last reads (``roots-snapshots``, kept with the roots watch):
    the next sync hashes every file again, on both sides.
    """
    for dirpath, dirnames, _ in os.walk(LAB.run_dir):
        for cache in ("roots-hashes", "roots-snapshots"):
            if cache in dirnames:
                shutil.rmtree(os.path.join(dirpath, cache))
                dirnames.remove(cache)


def tree_size(root):
    count = size = 0
    for dirpath, _, names in os.walk(root):
        count += len(names)
        size += sum(os.path.getsize(os.path.join(dirpath, n)) for n in names)
    return count, size


def parse_args():
    """The command line: the tree shapes and the turns of each measure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--shapes", default=",".join(SHAPES), help="tree shapes, in turn")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="leave the daemons running")
    parser.add_argument(
        "--no-watch", action="store_true", help="no roots watch engine: every sync stats all"
    )
    return parser.parse_args()


def idle_measures(repeat):
    """
    Before any sync: the floor (median of ``repeat`` pings), the peak RSS of an idle
    ``salt-run``, and the pids and sizes of master2's control minion and master1's daemons.
    """
    floors = [timed(lambda: LAB.ping("master2", ("-L",)))[0] for _ in range(repeat)]
    idle_cmd = LAB.command("salt-run", "master1", "test.arg", "--out=json")
    idle_runner = peak_rss_mb(idle_cmd)[2]
    minion_pid = LAB.control_minion_pid("master2")
    master_pid = devkit.read_pid(LAB.path("master1", "var", "run", "salt-master.pid"))
    idle_minion, idle_master = tree_peak_rss_mb(minion_pid), tree_peak_rss_mb(master_pid)
    return {
        "floors": floors,
        "floor": statistics.median(floors),
        "idle_runner": idle_runner,
        "minion_pid": minion_pid,
        "master_pid": master_pid,
        "idle_minion": idle_minion,
        "idle_master": idle_master,
    }


def whole_tree_copies(rsync, source, repeat, pids):
    """
    ``(rsynced, firsts, peaks)``: the seconds of each ``rsync -a`` and ``rsync -a --fsync`` of
    ``source`` into master2's tree, the ``(seconds, peak RSS MB)`` of each first ``sync_roots``,
    taking turns ``repeat`` times, and the peak RSS of ``pids`` meanwhile.
    """
    # The rsyncs and the first sync take turns between the same two directories, master2's
    # emptied each time and the disk left to go quiet: all meet the disk in the same state.
    target = LAB.path("master2", "tree")
    copies = {
        "rsync": [rsync, "-a", f"{source}/", target],
        "fsync": [rsync, "-a", "--fsync", f"{source}/", target],
    }

    def emptied():
        shutil.rmtree(target, ignore_errors=True)
        quiet_disk(LAB.path("master2"))

    rsynced, firsts = {name: [] for name in copies}, []
    with PeakSampler(pids) as sampler:
        for _ in range(repeat):
            for name, copy in copies.items():
                emptied()
                rsynced[name].append(timed(lambda copy=copy: subprocess.run(copy, check=True))[0])
            emptied()
            forget_hashes()
            firsts.append(sync_roots())
    return rsynced, firsts, sampler.peaks


def quiet_sync_roots():
    """
    ``sync_roots`` once the disk has gone quiet: a turn does not meet the writeback of the
    copies before it (a peer's atomic write waits for it), as no first sync does.
    """
    quiet_disk(LAB.path("master2"))
    return sync_roots()


def changed_file_syncs(source, repeat):
    """
    ``sync_roots`` ``repeat`` times, each after one more file of ``source`` was changed.
    """
    files = sorted(os.path.join(d, name) for d, _, names in os.walk(source) for name in names)
    changes = []
    for i in range(repeat):
        quiet_disk(LAB.path("master2"))
        with open(files[len(files) // 2 + i], "ab") as handle:
            handle.write(b"# changed\n")
        changes.append(sync_roots())
    return changes


def measure(args, shape, rsync, source):
    """
    Start the lab with a tree of ``shape`` and take every measure of one run, as
    ``print_results`` reads them.
    """
    setup, _ = timed(lambda: LAB.start(prepare(shape)))
    count, size = tree_size(source)
    print(f"set-up: {setup:.1f}s (tree: {count} files, {size / 2**20:.0f} MB)")
    found = {"count": count, "size": size, **idle_measures(args.repeat)}
    minion_pid, master_pid = found["minion_pid"], found["master_pid"]
    rsynced, firsts, peaks = whole_tree_copies(rsync, source, args.repeat, [minion_pid, master_pid])
    found.update(
        rsynced=rsynced,
        firsts=firsts,
        rsync_time=statistics.median(rsynced["rsync"]),
        fsync_time=statistics.median(rsynced["fsync"]),
        first=statistics.median(t for t, _ in firsts),
    )
    first_rss = max(r for _, r in firsts)
    found.update(minion_peak=peaks[minion_pid], master_peak=peaks[master_pid])
    copied = tree_size(LAB.path("master2", "tree"))
    if copied != (count, size):
        raise SystemExit(f"master2's tree holds {copied}, expected {(count, size)}")
    noops = [quiet_sync_roots() for _ in range(args.repeat)]
    found["noops"], found["noop"] = noops, statistics.median(t for t, _ in noops)
    changes = changed_file_syncs(source, args.repeat)
    found["changes"], found["change"] = changes, statistics.median(t for t, _ in changes)
    found["peak_runner"] = max([first_rss, *(r for _, r in noops + changes)])
    return types.SimpleNamespace(**found)


def turns(values):
    return ", ".join(f"{t:.2f}" for t in values)


def result_rows(found):
    """
    ``(measure, median seconds, relative)`` rows of one run (``measure``).
    """
    first, noop, change, floor = found.first, found.noop, found.change, found.floor
    return [
        ("floor: salt -L master2 test.ping", floor, ""),
        (f"rsync -a of the tree ({found.count} files)", found.rsync_time, ""),
        ("rsync -a --fsync of the tree", found.fsync_time, ""),
        (
            "cold first sync_roots (whole tree to master2)",
            first,
            f"{first / found.rsync_time:.2f} x rsync; {first / found.fsync_time:.2f} x --fsync",
        ),
        ("no-op sync_roots", noop, f"floor + {noop - floor:.2f}s; {noop / floor:.2f} x floor"),
        (
            "sync_roots after one changed file",
            change,
            f"no-op + {change - noop:.2f}s; {change / noop:.2f} x no-op",
        ),
    ]


def print_results(shape, found):
    """
    The measures of one run (``measure``) as a table, each turn's times and the peak RSS.
    """
    print(f"\n{shape} tree: {found.count} files, {found.size / 2**20:.0f} MB")
    print(f"{'measure':<50} {'seconds':>8}  relative")
    for name, secs, rel in result_rows(found):
        print(f"{name:<50} {secs:8.2f}  {rel}")
    print(
        f"each turn, s: floor {turns(found.floors)}; rsync {turns(found.rsynced['rsync'])}; "
        f"rsync --fsync {turns(found.rsynced['fsync'])}; "
        f"cold first sync_roots {turns(t for t, _ in found.firsts)}; "
        f"no-op {turns(t for t, _ in found.noops)}; "
        f"one change {turns(t for t, _ in found.changes)}"
    )
    print(
        f"peak RSS, MB (idle -> peak): salt-run {found.idle_runner:.0f} -> "
        f"{found.peak_runner:.0f}; "
        f"master2's control minion {found.idle_minion:.0f} -> {found.minion_peak:.0f}; "
        f"master1's daemons {found.idle_master:.0f} -> {found.master_peak:.0f}"
    )


def main():
    args = parse_args()
    if args.no_watch:
        ENGINES.clear()
    rsync = shutil.which("rsync")
    if not rsync:
        raise SystemExit("rsync is needed for the comparison: apt-get install rsync")
    source = LAB.path("master1", "tree")
    try:
        # Each shape starts from a fresh run directory (LAB.start stops what ran before); its
        # figures are printed as soon as it is measured.
        for shape in args.shapes.split(","):
            print_results(shape, measure(args, shape, rsync, source))
    finally:
        if not args.keep:
            LAB.stop_all()
    print(
        "\ntargets: cold first <= 3 x rsync -a and <= 2 x rsync --fsync; one change <= 1.5 x "
        "no-op; no-op <= floor + 1 s; peak RSS within 100 MB of idle"
    )


if __name__ == "__main__":
    main()
