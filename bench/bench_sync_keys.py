#!/usr/bin/env python3
"""
Benchmark ``salt-run multimaster.sync_keys`` at 10,000 keys, side by side with its floor.

Starts three masters (127.0.0.11-13, one port pair) and their control minions inside
bench/run/, puts N accepted keys on the primary, then measures in one run:

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
import shutil
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The dev toolkit shared with the lab and the tests.
sys.path.insert(0, ROOT)

from tests.support import devkit  # noqa: E402

RUN = os.path.join(ROOT, "bench", "run")
PORTS = devkit.Ports(publish=32000, ret=32001)
MASTERS = [("master1", "127.0.0.11"), ("master2", "127.0.0.12"), ("master3", "127.0.0.13")]


def cli(name, config_dir, *args, out=None):
    """
    ``name -c config_dir args`` (a Salt CLI of this venv); ``out`` is its ``--out``.
    """
    return devkit.salt_cli(name, config_dir, *args, out=out, timeout=600)


def timed(fn):
    start = time.monotonic()
    result = fn()
    return time.monotonic() - start, result


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def section():
    return devkit.multimaster_section(
        [devkit.master_entry(mid, ip, os.path.join(RUN, mid)) for mid, ip in MASTERS], PORTS
    )


def master_config(mid, ip):
    return devkit.loopback_master(
        ip,
        PORTS,
        root_dir=os.path.join(RUN, mid),
        user="root",
        log_file=os.path.join(RUN, mid, "master.log"),
        log_level_logfile="info",
        # Only the formula: the checkout also holds .venv and bench/run (keys) - never serve those.
        file_roots={"base": [os.path.join(RUN, "formula")]},
        # The control minions read their own master's paths from the multimaster pillar.
        pillar_roots={"base": [os.path.join(RUN, "pillar")]},
        **devkit.multimaster_master_options(section()),
    )


def minion_config(mid):
    return devkit.loopback_minion(
        MASTERS[0][1],
        PORTS,
        id=mid,
        root_dir=os.path.join(RUN, f"{mid}-minion"),
        user="root",
        log_file=os.path.join(RUN, f"{mid}-minion", "minion.log"),
    )


def pidfiles():
    for dirpath, _, files in os.walk(RUN):
        for name in files:
            if name.endswith(".pid"):
                yield os.path.join(dirpath, name)


def stop_all():
    if not os.path.isdir(RUN):
        return
    devkit.stop_pids(filter(None, map(devkit.read_pid, pidfiles())))


def wait(what, check, timeout=120):
    devkit.wait_until(f"{what}; see logs under {RUN}", check, timeout, error=SystemExit)


def pki(mid):
    return os.path.join(RUN, mid, "etc", "salt", "pki", "master")


def setup(keys):
    stop_all()
    shutil.rmtree(RUN, ignore_errors=True)
    for part in ("multimaster", "_modules", "_runners", "_states", "_utils"):
        shutil.copytree(os.path.join(ROOT, part), os.path.join(RUN, "formula", part))
    devkit.write_multimaster_pillar(os.path.join(RUN, "pillar"), section())
    for mid, ip in MASTERS:
        devkit.write_config(os.path.join(RUN, mid, "master"), master_config(mid, ip))
        devkit.write_config(os.path.join(RUN, f"{mid}-minion", "minion"), minion_config(mid))
    for mid, _ in MASTERS:
        cli("salt-master", os.path.join(RUN, mid), "-d")
    for mid, _ in MASTERS:
        cli("salt-minion", os.path.join(RUN, f"{mid}-minion"), "-d")
    m1 = os.path.join(RUN, "master1")

    def pending():
        listed = cli("salt-key", m1, "-l", "pre", out="json").data or {}
        return len(listed.get("minions_pre", [])) == len(MASTERS)

    wait("control minion keys", pending)
    cli("salt-key", m1, "-A", "-y")
    wait("control minions", lambda: ping(m1).count("True") == len(MASTERS))
    cli("salt", m1, "*", "saltutil.sync_all", "-t", "60")
    cli("salt-run", m1, "saltutil.sync_all")
    pool = devkit.public_pem_pool(64)
    accepted = os.path.join(pki("master1"), "minions")
    for i in range(keys):
        write(os.path.join(accepted, f"bench-{i:05d}"), pool[i % len(pool)])
    return pool


def ping(m1, targets="*", tgt_type=()):
    return cli("salt", m1, *tgt_type, targets, "test.ping", "-t", "10", out="txt").stdout


def sync(m1):
    out = cli("salt-run", m1, "multimaster.sync_keys", out="json")
    if out.returncode != 0:
        raise SystemExit(f"sync_keys failed ({out.returncode}): {out.stdout[-2000:]}")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--keys", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="leave the daemons running")
    args = parser.parse_args()
    m1 = os.path.join(RUN, "master1")
    try:
        t0 = time.monotonic()
        pool = setup(args.keys)
        print(f"set-up: {time.monotonic() - t0:.1f}s ({args.keys} accepted keys on master1)")
        floor = statistics.median(
            timed(lambda: ping(m1, "master2,master3", ("-L",)))[0] for _ in range(args.repeat)
        )
        full, _ = timed(lambda: sync(m1))
        for mid in ("master2", "master3"):
            count = len(os.listdir(os.path.join(pki(mid), "minions")))
            if count < args.keys:
                raise SystemExit(f"{mid} holds {count} accepted keys after the full sync")
        noop = statistics.median(timed(lambda: sync(m1))[0] for _ in range(args.repeat))
        accepted = os.path.join(pki("master1"), "minions")
        rejected = os.path.join(pki("master1"), "minions_rejected")
        for i in range(50):
            write(os.path.join(accepted, f"bench-new-{i:03d}"), pool[i % len(pool)])
            os.replace(
                os.path.join(accepted, f"bench-{i:05d}"), os.path.join(rejected, f"bench-{i:05d}")
            )
        changed, _ = timed(lambda: sync(m1))
    finally:
        if not args.keep:
            stop_all()
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
    print("\ntargets: no-op <= 2 x floor; 100 changes <= 3 x floor; full <= floor + 10 s")


if __name__ == "__main__":
    main()
