#!/usr/bin/env python3
"""
Benchmark ``salt-run multimaster.sync_keys`` at 10,000 keys, side by side with its floor.

Starts three masters (127.0.0.11-13, one port pair) and their control minions inside
bench/run/keys/, puts N accepted keys on the primary, then measures in one run:

- floor: ``salt -L <peer control minions> test.ping`` (one publish round trip, CLI included);
- full: the first ``sync_keys`` (every key copied to both peers);
- no-op: ``sync_keys`` again (digests only);
- 100 changes: 50 new accepted and 50 accepted keys rejected on the primary, then ``sync_keys``.

Each figure is the median of a few runs where the run is repeatable. Keys are real 2048-bit RSA
public keys; to keep set-up short, ids share a pool of distinct keys (the sync never compares
keys across ids). Usage: ``python bench/bench_sync_keys.py [--keys 10000] [--repeat 3]``.
"""

import argparse
import os
import statistics

from benchlab import BenchLab, devkit, largest_load, timed, write

MASTERS = [("master1", "127.0.0.11"), ("master2", "127.0.0.12"), ("master3", "127.0.0.13")]


def roots(mid):
    # Only the formula: the checkout also holds .venv and bench/run (keys) - never serve those.
    # The control minions read their own master's paths from the multimaster pillar.
    return {
        "file_roots": {"base": [LAB.path("formula")]},
        "pillar_roots": {"base": [LAB.path("pillar")]},
    }


LAB = BenchLab("keys", MASTERS, devkit.Ports(publish=32000, ret=32001), roots)


def sync():
    out = LAB.cli("salt-run", "master1", "multimaster.sync_keys", out="json")
    if out.returncode != 0:
        raise SystemExit(f"sync_keys failed ({out.returncode}): {out.stdout[-2000:]}")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--keys", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="leave the daemons running")
    args = parser.parse_args()
    accepted = os.path.join(LAB.pki("master1"), "minions")
    rejected = os.path.join(LAB.pki("master1"), "minions_rejected")
    try:
        setup, _ = timed(LAB.start)
        pool = devkit.public_pem_pool(64)
        for i in range(args.keys):
            write(os.path.join(accepted, f"bench-{i:05d}"), pool[i % len(pool)])
        print(f"set-up: {setup:.1f}s ({args.keys} accepted keys on master1)")
        floor = statistics.median(timed(LAB.peer_ping)[0] for _ in range(args.repeat))
        full, _ = timed(sync)
        for mid in ("master2", "master3"):
            count = len(os.listdir(os.path.join(LAB.pki(mid), "minions")))
            if count < args.keys:
                raise SystemExit(f"{mid} holds {count} accepted keys after the full sync")
        noop = statistics.median(timed(sync)[0] for _ in range(args.repeat))
        for i in range(50):
            write(os.path.join(accepted, f"bench-new-{i:03d}"), pool[i % len(pool)])
            os.replace(
                os.path.join(accepted, f"bench-{i:05d}"), os.path.join(rejected, f"bench-{i:05d}")
            )
        changed, _ = timed(sync)
        largest = largest_load(LAB.path("master1"))
    finally:
        if not args.keep:
            LAB.stop_all()
    rows = [
        ("floor: salt -L <2 peer control minions> test.ping", floor, None),
        (
            f"full first sync_keys ({args.keys} keys to 2 peers)",
            full,
            f"floor + {full - floor:.1f}s",
        ),
        ("no-op sync_keys", noop, f"{noop / floor:.2f} x floor"),
        ("sync_keys after 100 changes", changed, f"{changed / floor:.2f} x floor"),
    ]
    print(f"\n{'measure':<58} {'seconds':>8}  relative")
    for name, secs, rel in rows:
        print(f"{name:<58} {secs:8.2f}  {rel or ''}")
    print(f"\nlargest .load.p in master1's job cache: {largest} bytes (target <= 65536)")
    print("targets: no-op <= 2 x floor; 100 changes <= 3 x floor; full <= floor + 10 s")


if __name__ == "__main__":
    main()
