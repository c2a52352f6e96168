#!/usr/bin/env python3
"""
Benchmark the key reactor: latency from ``salt-key -a`` on one master to the key accepted on
every other master.

Starts three hot masters (127.0.0.21-23, one keypair, the key reactor on) and their control
minions (connected to every master) inside bench/run/reactor/. For each of N ids it places a key
pending on every master (as a hot minion's first contact leaves it), runs ``salt-key -a ID -y``
on master2 and polls master1's and master3's stores until the key is accepted on both. Reports
p50 and max, measured from when ``salt-key`` returned (the accept is done on master2) and from
when it was started. Usage: ``python bench/bench_reactor.py [--accepts 20]``.
"""

import argparse
import os
import statistics
import time

from benchlab import BenchLab, devkit, write

MASTERS = [("master1", "127.0.0.21"), ("master2", "127.0.0.22"), ("master3", "127.0.0.23")]
TIMEOUT = 120


def roots(mid):
    return {
        "file_roots": {"base": [LAB.path("formula")]},
        "pillar_roots": {"base": [LAB.path("pillar")]},
    }


LAB = BenchLab(
    "reactor", MASTERS, devkit.Ports(publish=32020, ret=32021), roots, hot=True,
    reactor={"keys": True},
)  # fmt: skip


def accepted_everywhere(minion_id):
    return all(
        os.path.exists(os.path.join(LAB.pki(mid), "minions", minion_id))
        for mid, _ in MASTERS
        if mid != "master2"
    )


def one_accept(minion_id, pem):
    for mid, _ in MASTERS:
        write(os.path.join(LAB.pki(mid), "minions_pre", minion_id), pem)
    started = time.monotonic()
    out = LAB.cli("salt-key", "master2", "-a", minion_id, "-y")
    if out.returncode != 0:
        raise SystemExit(f"salt-key -a {minion_id} failed: {out.stdout[-2000:]}")
    returned = time.monotonic()
    while not accepted_everywhere(minion_id):
        if time.monotonic() - returned > TIMEOUT:
            raise SystemExit(f"{minion_id} not accepted everywhere after {TIMEOUT}s")
        time.sleep(0.05)
    done = time.monotonic()
    return done - returned, done - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--accepts", type=int, default=20)
    parser.add_argument("--keep", action="store_true", help="leave the daemons running")
    args = parser.parse_args()
    try:
        LAB.start()
        # The control minions' own accepts fired reactions before the runner was synced.
        time.sleep(2)
        pool = devkit.public_pem_pool(args.accepts)
        samples = [one_accept(f"bench-react-{i:02d}", pool[i]) for i in range(args.accepts)]
    finally:
        if not args.keep:
            LAB.stop_all()
    after, total = zip(*samples, strict=True)
    print(f"key reactor, {args.accepts} accepts (salt-key -a on master2 -> master1 and master3):")
    print(
        f"  after salt-key returned : p50 {statistics.median(after):5.2f}s  max {max(after):5.2f}s"
    )
    print(f"  with the salt-key CLI : p50 {statistics.median(total):5.2f}s  max {max(total):5.2f}s")
    print("  target: p50 <= 3 s (after salt-key returned)")


if __name__ == "__main__":
    main()
