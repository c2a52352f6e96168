#!/usr/bin/env python3
"""
Benchmark ``salt-run multimaster.sync_keys`` at 100,000 keys, side by side with its floor.

Starts three masters (127.0.0.11-13, one port pair) and their control minions inside
bench/run/keys/, puts N accepted keys on the primary, then measures in one run, every figure
the median of ``--repeat`` turns (each turn printed):

- floor: ``salt -L <peer control minions> test.ping`` (one publish round trip, CLI included);
- full: the first ``sync_keys`` (every key copied to both peers); before each turn the peers
  are stopped, given new empty key stores (the old ones moved aside, deleted after the last
  turn) and an empty record of held keys, and started again, and the turn starts once the
  disk has gone quiet (``benchlab.quiet_disk``);
- no-op: ``sync_keys`` again (digests only);
- 100 changes: 50 new accepted and 50 accepted keys rejected on the primary, then
  ``sync_keys`` (other keys each turn);
- peak RSS: of the ``salt-run`` process and of each control minion with its job processes;
- Salt's own store: the N keys stored through ``salt.cache.Cache`` with the peers' driver into
  a fresh scratch store beside master2's, one ``store`` per key as the sync (and ``salt-key``)
  does: what the driver alone costs, per peer.

The whole scenario runs once per key-cache driver of the two peers (``localfs_key``, then
``mmap_key``; master1 stays on ``localfs_key``), and the figures are printed side by side.

Keys are real 2048-bit RSA public keys; to keep set-up short, ids share a pool of distinct keys
(the sync never compares keys across ids). Usage:
``python bench/bench_sync_keys.py [--keys 100000] [--repeat 3] [--drivers localfs_key,mmap_key]``.
"""

import argparse
import os
import shutil
import statistics

import salt.cache
import salt.config
from benchlab import (
    BenchLab,
    PeakSampler,
    devkit,
    largest_load,
    peak_rss_mb,
    quiet_disk,
    timed,
    write,
)

MASTERS = [("master1", "127.0.0.11"), ("master2", "127.0.0.12"), ("master3", "127.0.0.13")]
PEERS = [mid for mid, _ in MASTERS[1:]]
DRIVERS = ("localfs_key", "mmap_key")
# The peers' key-cache driver of the scenario being run. master1 stays on localfs_key: Salt
# 3008.3 checks its minions' request tokens against PEM files that mmap_key never writes.
PEER_DRIVER = {"name": DRIVERS[0]}
CHANGES = 100
TARGETS = {"full": 60, "noop": 2, "changed": 3}  # seconds over the floor


def roots(mid):
    # Only the formula: the checkout also holds .venv and bench/run (keys) - never serve those.
    # The control minions read their own master's paths from the multimaster pillar.
    extra = {
        "file_roots": {"base": [LAB.path("formula")]},
        "pillar_roots": {"base": [LAB.path("pillar")]},
    }
    if mid != MASTERS[0][0]:
        extra["keys.cache_driver"] = PEER_DRIVER["name"]
    return extra


LAB = BenchLab("keys", MASTERS, devkit.Ports(publish=32000, ret=32001), roots)


def master_pid(mid):
    return devkit.read_pid(LAB.path(mid, "var", "run", "salt-master.pid"))


def sync():
    """
    ``salt-run multimaster.sync_keys`` on the primary: ``(seconds, peak RSS of salt-run MB,
    peak RSS of the control minions MB)``.
    """
    cmd = LAB.command("salt-run", "master1", "multimaster.sync_keys", "--out=json")
    with PeakSampler([LAB.control_minion_pid(mid) for mid, _ in MASTERS]) as sampler:
        seconds, (rc, out, rss) = timed(lambda: peak_rss_mb(cmd))
    if rc != 0:
        raise SystemExit(f"sync_keys failed ({rc}): {out[-2000:]}")
    return seconds, rss, max(sampler.peaks.values())


def accepted_count(mid):
    # Through salt-key: an mmap_key store has no files to count.
    listed = LAB.cli("salt-key", mid, "-l", "acc", out="json").data or {}
    return len(listed.get("minions", []))


def emptied_peers(turn):
    """
    Stop the peers (master and control minion), give them new empty key stores and an empty
    record of the keys they held, and start them again: the next ``sync_keys`` is a first one.
    The old stores are moved aside, not deleted: a first sync meets a new master's disk, not
    one that has just deleted 200,000 key files (on this machine's disk that halves the speed
    of the writes that follow, see bench/README.md); ``deleted_old_stores`` removes them.
    """
    devkit.stop_pids([master_pid(mid) for mid in PEERS] + list(map(LAB.control_minion_pid, PEERS)))
    for mid in PEERS:
        pki, aside = LAB.pki(mid), LAB.path(mid, "old-stores", f"turn{turn}")
        os.makedirs(aside)
        for name in os.listdir(pki):
            if name.startswith(("minions", ".mmap_")):
                os.rename(os.path.join(pki, name), os.path.join(aside, name))
                if name.startswith("minions"):
                    os.makedirs(os.path.join(pki, name))
        shutil.rmtree(LAB.path(mid, "var", "cache", "salt", "master", "multimaster"), True)
        LAB.cli("salt-master", mid, "-d")
        devkit.salt_cli("salt-minion", LAB.path(f"{mid}-minion"), "-d", out=None)
    LAB.wait("the peers' control minions", lambda: LAB.peer_ping().stdout.count("True") == 2)


def deleted_old_stores():
    """Delete the key stores ``emptied_peers`` moved aside, and wait for the disk to go quiet."""
    for mid in PEERS:
        shutil.rmtree(LAB.path(mid, "old-stores"), ignore_errors=True)
    quiet_disk(LAB.path("master2"), timeout=600)


def full_syncs(keys, repeat):
    """
    ``repeat`` first syncs, each into new empty peer stores, each checked to have copied every
    key. Each turn starts once the disk has gone quiet: writing the keys of the turn before is
    still being flushed for a while and would slow only the turns after it.
    """
    turns = []
    for turn in range(repeat):
        if turn:
            emptied_peers(turn)
        quiet_disk(LAB.path("master2"))
        turns.append(sync())
        for mid in PEERS:
            count = accepted_count(mid)
            if count < keys:
                raise SystemExit(f"{mid} holds {count} accepted keys after the full sync")
    deleted_old_stores()
    return turns


def changed_syncs(accepted, rejected, pool, repeat):
    """
    ``repeat`` syncs, each after ``CHANGES`` other changes on the primary: half new accepted
    keys, half accepted keys rejected.
    """
    turns = []
    for turn in range(repeat):
        for i in range(CHANGES // 2):
            write(os.path.join(accepted, f"bench-new-{turn}-{i:03d}"), pool[i % len(pool)])
            gone = f"bench-{turn * CHANGES + i:06d}"
            os.replace(os.path.join(accepted, gone), os.path.join(rejected, gone))
        turns.append(sync())
    return turns


def store_seconds(driver, keys, pool):
    """
    Seconds Salt's ``driver`` takes to store ``keys`` accepted keys, one ``Cache.store`` each,
    into a fresh scratch store beside master2's (same disk, same options).
    """
    scratch = LAB.path("store-scratch")
    shutil.rmtree(scratch, ignore_errors=True)
    opts = salt.config.master_config(os.path.join(LAB.config_dir("master2"), "master"))
    opts.update({"pki_dir": scratch, "keys.cache_driver": driver, "cluster_id": None})
    cache = salt.cache.Cache(opts, driver=driver)
    entries = [(f"bench-{i:06d}", pool[i % len(pool)]) for i in range(keys)]

    def store_all():
        for mid, pem in entries:
            cache.store("keys", mid, {"state": "accepted", "pub": pem})

    seconds, _ = timed(store_all)
    shutil.rmtree(scratch, ignore_errors=True)
    return seconds


def scenario(driver, keys, repeat):
    """
    One run with the peers on ``driver``: ``{measure: [turns]}`` (a sync's turn is ``(seconds,
    runner RSS, control minion RSS)``) and the largest publish.
    """
    PEER_DRIVER["name"] = driver
    accepted = os.path.join(LAB.pki("master1"), "minions")
    rejected = os.path.join(LAB.pki("master1"), "minions_rejected")
    setup, _ = timed(LAB.start)
    pool = devkit.public_pem_pool(64)
    for i in range(keys):
        write(os.path.join(accepted, f"bench-{i:06d}"), pool[i % len(pool)])
    print(f"set-up ({driver} peers): {setup:.1f}s ({keys} accepted keys on master1)", flush=True)
    found = {"floor": [(timed(LAB.peer_ping)[0], 0, 0) for _ in range(repeat)]}
    found["full"] = full_syncs(keys, repeat)
    found["noop"] = [sync() for _ in range(repeat)]
    found["changed"] = changed_syncs(accepted, rejected, pool, repeat)
    found["store"] = [(store_seconds(driver, keys, pool), 0, 0)]
    for name, turns in found.items():
        print(f"  {driver} {name}: " + ", ".join(f"{t[0]:.2f}" for t in turns), flush=True)
    return found, largest_load(LAB.path("master1"))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--keys", type=int, default=100000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--drivers", default=",".join(DRIVERS), help="peers' key-cache drivers")
    parser.add_argument("--keep", action="store_true", help="leave the daemons running")
    return parser.parse_args()


def cell(found, key):
    """
    One table cell: the median seconds of ``key`` and, for the syncs, the delta over the floor
    and the ratio to it.
    """
    secs = statistics.median(t[0] for t in found[key])
    if key not in TARGETS:
        return f"{secs:.2f}"
    floor = statistics.median(t[0] for t in found["floor"])
    return f"{secs:.2f} (floor + {secs - floor:.1f}s; {secs / floor:.2f} x)"


def print_results(results, keys, largest):
    drivers = list(results)
    rows = [
        ("floor: salt -L <2 peer control minions> test.ping", "floor"),
        (f"full first sync_keys ({keys} keys to 2 peers)", "full"),
        ("no-op sync_keys", "noop"),
        (f"sync_keys after {CHANGES} changes", "changed"),
        (f"Salt's own store of {keys} keys (one peer)", "store"),
    ]
    print(f"\n{'measure (median seconds)':<50}" + "".join(f"{d:>34}" for d in drivers))
    for name, key in rows:
        print(f"{name:<50}" + "".join(f"{cell(results[d], key):>34}" for d in drivers))
    for driver in drivers:
        syncs = [t for key in TARGETS for t in results[driver][key]]
        print(
            f"peak RSS, {driver} peers: salt-run {max(t[1] for t in syncs):.0f} MB, "
            f"control minions {max(t[2] for t in syncs):.0f} MB"
        )
    print(f"\nlargest .load.p in master1's job cache: {largest} bytes (target <= 65536)")
    print(
        "targets: full <= floor + {full} s; no-op <= floor + {noop} s; "
        "100 changes <= floor + {changed} s".format(**TARGETS)
    )
    print("peers' key-cache driver per column; master1 (the primary) stays on localfs_key")


def main():
    args = parse_args()
    results, largest = {}, 0
    try:
        # Each scenario starts from a fresh run directory (LAB.start stops what ran before).
        for driver in args.drivers.split(","):
            results[driver], load = scenario(driver, args.keys, args.repeat)
            largest = max(largest, load)
    finally:
        if not args.keep:
            LAB.stop_all()
    print_results(results, args.keys, largest)


if __name__ == "__main__":
    main()
