#!/usr/bin/env python3
"""
Benchmark ``salt-run multimaster.sync_keys`` at 10,000 keys, side by side with its floor.

Starts three masters (127.0.0.11-13, one port pair) and their control minions inside
bench/run/keys/, puts N accepted keys on the primary, then measures in one run:

- floor: ``salt -L <peer control minions> test.ping`` (one publish round trip, CLI included);
- full: the first ``sync_keys`` (every key copied to both peers);
- no-op: ``sync_keys`` again (digests only);
- 100 changes: 50 new accepted and 50 accepted keys rejected on the primary, then ``sync_keys``;
- Salt's own store: the N keys stored through ``salt.cache.Cache`` with the peers' driver into
  a fresh scratch store, one ``store`` per key as the sync (and ``salt-key``) does: what the
  driver alone costs, per peer.

The whole scenario runs once per key-cache driver of the two peers (``localfs_key``, then
``mmap_key``; master1 stays on ``localfs_key``), and the figures are printed side by side.

Each figure is the median of a few runs where the run is repeatable. Keys are real 2048-bit RSA
public keys; to keep set-up short, ids share a pool of distinct keys (the sync never compares
keys across ids). Usage:
``python bench/bench_sync_keys.py [--keys 10000] [--repeat 3] [--drivers localfs_key,mmap_key]``.
"""

import argparse
import os
import shutil
import statistics

import salt.cache
import salt.config
from benchlab import BenchLab, devkit, largest_load, timed, write

MASTERS = [("master1", "127.0.0.11"), ("master2", "127.0.0.12"), ("master3", "127.0.0.13")]
DRIVERS = ("localfs_key", "mmap_key")
# The peers' key-cache driver of the scenario being run. master1 stays on localfs_key: Salt
# 3008.3 checks its minions' request tokens against PEM files that mmap_key never writes.
PEER_DRIVER = {"name": DRIVERS[0]}


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


def sync():
    out = LAB.cli("salt-run", "master1", "multimaster.sync_keys", out="json")
    if out.returncode != 0:
        raise SystemExit(f"sync_keys failed ({out.returncode}): {out.stdout[-2000:]}")
    return out


def accepted_count(mid):
    # Through salt-key: an mmap_key store has no files to count.
    listed = LAB.cli("salt-key", mid, "-l", "acc", out="json").data or {}
    return len(listed.get("minions", []))


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
    entries = [(f"bench-{i:05d}", pool[i % len(pool)]) for i in range(keys)]

    def store_all():
        for mid, pem in entries:
            cache.store("keys", mid, {"state": "accepted", "pub": pem})

    seconds, _ = timed(store_all)
    shutil.rmtree(scratch, ignore_errors=True)
    return seconds


def scenario(driver, keys, repeat):
    """
    One run with the peers on ``driver``: ``{measure: seconds}`` and the largest publish.
    """
    PEER_DRIVER["name"] = driver
    accepted = os.path.join(LAB.pki("master1"), "minions")
    rejected = os.path.join(LAB.pki("master1"), "minions_rejected")
    setup, _ = timed(LAB.start)
    pool = devkit.public_pem_pool(64)
    for i in range(keys):
        write(os.path.join(accepted, f"bench-{i:05d}"), pool[i % len(pool)])
    print(f"set-up ({driver} peers): {setup:.1f}s ({keys} accepted keys on master1)", flush=True)
    floor = statistics.median(timed(LAB.peer_ping)[0] for _ in range(repeat))
    full, _ = timed(sync)
    for mid in ("master2", "master3"):
        count = accepted_count(mid)
        if count < keys:
            raise SystemExit(f"{mid} ({driver}) holds {count} accepted keys after the full sync")
    noop = statistics.median(timed(sync)[0] for _ in range(repeat))
    for i in range(50):
        write(os.path.join(accepted, f"bench-new-{i:03d}"), pool[i % len(pool)])
        os.replace(
            os.path.join(accepted, f"bench-{i:05d}"), os.path.join(rejected, f"bench-{i:05d}")
        )
    changed, _ = timed(sync)
    store = store_seconds(driver, keys, pool)
    times = {"floor": floor, "full": full, "noop": noop, "changed": changed, "store": store}
    return times, largest_load(LAB.path("master1"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--keys", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--drivers", default=",".join(DRIVERS), help="peers' key-cache drivers")
    parser.add_argument("--keep", action="store_true", help="leave the daemons running")
    args = parser.parse_args()
    drivers = args.drivers.split(",")
    results, largest = {}, 0
    try:
        # Each scenario starts from a fresh run directory (LAB.start stops what ran before).
        for driver in drivers:
            results[driver], load = scenario(driver, args.keys, args.repeat)
            largest = max(largest, load)
    finally:
        if not args.keep:
            LAB.stop_all()
    rows = [
        ("floor: salt -L <2 peer control minions> test.ping", "floor", None),
        (f"full first sync_keys ({args.keys} keys to 2 peers)", "full", "floor +"),
        ("no-op sync_keys", "noop", "x floor"),
        ("sync_keys after 100 changes", "changed", "x floor"),
        (f"Salt's own store of {args.keys} keys (one peer)", "store", None),
    ]
    print(f"\n{'measure (seconds; relative)':<52}" + "".join(f"{d:>24}" for d in drivers))
    for name, key, rel in rows:
        cells = []
        for driver in drivers:
            secs, floor = results[driver][key], results[driver]["floor"]
            if rel == "floor +":
                cells.append(f"{secs:.2f} (floor + {secs - floor:.1f}s)")
            elif rel:
                cells.append(f"{secs:.2f} ({secs / floor:.2f} x floor)")
            else:
                cells.append(f"{secs:.2f}")
        print(f"{name:<52}" + "".join(f"{c:>24}" for c in cells))
    print(f"\nlargest .load.p in master1's job cache: {largest} bytes (target <= 65536)")
    print("targets: no-op <= 2 x floor; 100 changes <= 3 x floor; full <= floor + 10 s")
    print("peers' key-cache driver per column; master1 (the primary) stays on localfs_key")


if __name__ == "__main__":
    main()
