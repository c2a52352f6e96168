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
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The daemon toolkit shared with the formula's own restarts, the lab and the tests.
sys.path.insert(0, os.path.join(ROOT, "_utils"))

from multimaster_daemon import read_pid, wait_for  # noqa: E402

RUN = os.path.join(ROOT, "bench", "run")
BIN = os.path.dirname(sys.executable)
PORTS = {"publish": 32000, "ret": 32001}
MASTERS = [("master1", "127.0.0.11"), ("master2", "127.0.0.12"), ("master3", "127.0.0.13")]


def cli(name, *args, timeout=600):
    return subprocess.run(
        [os.path.join(BIN, name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def timed(fn):
    start = time.monotonic()
    result = fn()
    return time.monotonic() - start, result


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def section():
    return {
        "mode": "hot",
        "ports": PORTS,
        "masters": [
            {"id": mid, "host": ip, "config_dir": os.path.join(RUN, mid)} for mid, ip in MASTERS
        ],
    }


def master_config(mid, ip):
    conf = {
        "root_dir": os.path.join(RUN, mid),
        "user": "root",
        "interface": ip,
        "publish_port": PORTS["publish"],
        "ret_port": PORTS["ret"],
        "worker_threads": 3,
        "log_file": os.path.join(RUN, mid, "master.log"),
        "log_level_logfile": "info",
        # Only the formula: the checkout also holds .venv and bench/run (keys) - never serve those.
        "file_roots": {"base": [os.path.join(RUN, "formula")]},
        # The control minions read their own master's paths from the multimaster pillar.
        "pillar_roots": {"base": [os.path.join(RUN, "pillar")]},
        "multimaster": section(),
    }
    return json.dumps(conf)


def minion_config(mid):
    conf = {
        "id": mid,
        "root_dir": os.path.join(RUN, f"{mid}-minion"),
        "user": "root",
        "master": MASTERS[0][1],
        "master_port": PORTS["ret"],
        "log_file": os.path.join(RUN, f"{mid}-minion", "minion.log"),
        "acceptance_wait_time": 1,
    }
    return json.dumps(conf)


def pidfiles():
    for dirpath, _, files in os.walk(RUN):
        for name in files:
            if name.endswith(".pid"):
                yield os.path.join(dirpath, name)


def stop_all():
    if not os.path.isdir(RUN):
        return
    for pid in filter(None, map(read_pid, pidfiles())):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    time.sleep(2)


def wait(what, check, timeout=120):
    if not wait_for(check, timeout, interval=1):
        raise SystemExit(f"timed out waiting for {what}; see logs under {RUN}")


def pki(mid):
    return os.path.join(RUN, mid, "etc", "salt", "pki", "master")


def key_pool(size):
    pool = []
    for _ in range(size):
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pool.append(
            key.public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            .decode()
        )
    return pool


def setup(keys):
    stop_all()
    shutil.rmtree(RUN, ignore_errors=True)
    for part in ("multimaster", "_modules", "_runners", "_states", "_utils"):
        shutil.copytree(os.path.join(ROOT, part), os.path.join(RUN, "formula", part))
    write(os.path.join(RUN, "pillar", "top.sls"), json.dumps({"base": {"*": ["multimaster"]}}))
    write(os.path.join(RUN, "pillar", "multimaster.sls"), json.dumps({"multimaster": section()}))
    for mid, ip in MASTERS:
        write(os.path.join(RUN, mid, "master"), master_config(mid, ip))
        write(os.path.join(RUN, f"{mid}-minion", "minion"), minion_config(mid))
    for mid, _ in MASTERS:
        cli("salt-master", "-c", os.path.join(RUN, mid), "-d")
    for mid, _ in MASTERS:
        cli("salt-minion", "-c", os.path.join(RUN, f"{mid}-minion"), "-d")
    m1 = os.path.join(RUN, "master1")

    def pending():
        out = cli("salt-key", "-c", m1, "-l", "pre", "--out=json").stdout
        return out and len(json.loads(out).get("minions_pre", [])) == len(MASTERS)

    wait("control minion keys", pending)
    cli("salt-key", "-c", m1, "-A", "-y")
    wait("control minions", lambda: ping(m1).count("True") == len(MASTERS))
    cli("salt", "-c", m1, "*", "saltutil.sync_all", "-t", "60")
    cli("salt-run", "-c", m1, "saltutil.sync_all")
    pool = key_pool(64)
    accepted = os.path.join(pki("master1"), "minions")
    for i in range(keys):
        write(os.path.join(accepted, f"bench-{i:05d}"), pool[i % len(pool)])
    return pool


def ping(m1, targets="*", tgt_type=()):
    return cli("salt", "-c", m1, *tgt_type, targets, "test.ping", "-t", "10", "--out=txt").stdout


def sync(m1):
    out = cli("salt-run", "-c", m1, "multimaster.sync_keys", "--out=json")
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
