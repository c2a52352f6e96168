"""
The key plane on masters whose key store is Salt 3008's ``mmap_key`` (no PEM files at all):
``sync_master_key``, ``sync_keys`` (bulk, revocations, no-op), ``status`` and a run killed with
``kill -9`` mid-apply all work through Salt's cache API, checked with the real ``salt-key``.
"""

import contextlib
import signal
import subprocess
import time

import psutil
import pytest
import salt.cache
import salt.config

from ..harness import Ports
from . import keytools

pytestmark = pytest.mark.integration

PREFIX = "kmm"
PORTS = Ports(publish=31180, ret=31181)
DAEMON_EXTRA = {"keys.cache_driver": "mmap_key"}
BULK = 2000


def key_cache(master):
    opts = salt.config.master_config(f"{master.config_dir}/master")
    assert opts["keys.cache_driver"] == "mmap_key"
    return salt.cache.Cache(opts, driver="mmap_key")


def plant(master, ids, state="accepted"):
    """
    Store keys in a running master's mmap key store through Salt's cache API (as salt-key does).
    """
    cache, pool = key_cache(master), keytools.pem_pool()
    for index, minion_id in enumerate(ids):
        cache.store("keys", minion_id, {"state": state, "pub": pool[index % len(pool)]})


def local_fingerprints(master):
    ret = keytools.run_cli("salt-key", master.config_dir, "--finger-all", timeout=60)
    assert ret.returncode == 0 and isinstance(ret.data, dict), ret
    return ret.data.get("local", {})


def assert_identical(cluster):
    lists = cluster.key_lists()
    first = lists[cluster.primary.id]
    assert all(listed == first for listed in lists.values()), {
        m: {s: len(ids) for s, ids in listed.items()} for m, listed in lists.items()
    }
    return first


@pytest.fixture(scope="module")
def cluster(key_cluster):
    for master in key_cluster.masters:
        assert not (keytools.pki_dir(master) / "minions").exists(), "not an mmap_key store"
    ret = key_cluster.run("sync_master_key")
    assert ret.returncode == 0, ret
    ret = key_cluster.run("sync_keys")
    assert ret.returncode == 0, ret
    return key_cluster


def test_master_key_and_keys_reach_every_mmap_master(cluster):
    """
    After ``sync_master_key`` every master serves the primary's master key (``salt-key -F``);
    keys accepted on the primary (a live minion and 2000 stored ones) are accepted on every
    master after ``sync_keys``; a second run changes nothing; ``status`` is clean.
    """
    primary_fp = local_fingerprints(cluster.primary)
    assert primary_fp
    for master in cluster.masters[1:]:
        assert local_fingerprints(master).get("master.pub") == primary_fp.get("master.pub")
    cluster.start_minion("kmm-web1")
    ids = [f"kmm-bulk-{i:05d}" for i in range(BULK)]
    plant(cluster.primary, ids)
    ret = cluster.run("sync_keys")
    assert ret.returncode == 0, ret
    accepted = set(assert_identical(cluster)["minions"])
    assert {"kmm-web1", *ids} <= accepted
    ret = cluster.run("sync_keys")
    assert ret.returncode == 0, ret
    for master_id, entry in ret.data["masters"].items():
        assert not entry.get("changes"), (master_id, entry)
    ret = cluster.run("status")
    assert ret.returncode == 0, ret


def test_a_rejection_reaches_every_mmap_master(cluster):
    """
    ``salt-key -r`` on the primary, then ``sync_keys``: rejected on every master.
    """
    ret = keytools.run_cli(
        "salt-key", cluster.primary.config_dir, "-r", "kmm-bulk-00001", "-y", timeout=60
    )
    assert ret.returncode == 0, ret
    ret = cluster.run("sync_keys")
    assert ret.returncode == 0, ret
    for master_id, listed in cluster.key_lists().items():
        assert "kmm-bulk-00001" in listed["minions_rejected"], master_id
        assert "kmm-bulk-00001" not in listed["minions"], master_id


def _kill(procs):
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)
    psutil.wait_procs(procs, timeout=10)


def test_kill_9_mid_apply_then_rerun_converges(cluster):
    """
    2000 more keys accepted on the primary; ``sync_keys`` is killed (``kill -9`` on the runner
    and master2's control-minion job processes) while master2 is writing them. A re-run exits 0
    and ``salt-key -L`` is identical on every master.
    """
    ids = [f"kmm-kill-{i:05d}" for i in range(BULK)]
    plant(cluster.primary, ids)
    peer = cluster.masters[1]
    minion_pid = keytools.read_pid(cluster.control[1].config["pidfile"])
    started = time.time() - 1
    runner = subprocess.Popen(
        [*keytools.cli_cmd("salt-run", cluster.primary.config_dir, "multimaster.sync_keys")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline, killed = time.monotonic() + 300, False
    try:
        while time.monotonic() < deadline and runner.poll() is None:
            # A fresh cache each time: a loaded mmap_key keeps the index it mapped.
            keys = key_cache(peer).list("keys")
            written = sum(1 for key in keys if key.startswith("kmm-kill-"))
            if written:
                jobs = [
                    child
                    for child in psutil.Process(minion_pid).children(recursive=True)
                    if child.create_time() >= started
                ]
                _kill([psutil.Process(runner.pid), *jobs])
                killed = True
                break
            time.sleep(0.05)
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.wait(timeout=30)
    assert killed, "the run finished before master2 started writing"
    ret = cluster.run("sync_keys")
    assert ret.returncode == 0, ret
    assert set(ids) <= set(assert_identical(cluster)["minions"])
