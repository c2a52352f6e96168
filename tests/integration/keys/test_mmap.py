"""
The key plane on masters whose key store is Salt 3008's ``mmap_key`` (no PEM files at all):
``sync_master_key``, ``sync_keys`` (bulk, revocations, no-op), ``status`` and a run killed with
``kill -9`` mid-apply all work through Salt's cache API, checked with the real ``salt-key``.

master1 (the primary, which the control minions connect to) keeps ``localfs_key``: Salt 3008.3's
request server checks every minion request's token against the PEM file
``<pki_dir>/minions/<id>`` (``ReqServerChannel.validate_token``), so an ``mmap_key`` master
denies its own minions' pillar requests and they never start. master2 and master3, which no
minion talks to, run ``mmap_key``: a mixed set, as during a migration.
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
BULK = 2000


def MASTER_OPTIONS(index, pillar_dir):  # noqa: N802  (the conftest hook's name)
    return {"keys.cache_driver": "mmap_key"} if index else {}


def key_cache(master):
    """
    The master's key store through Salt's cache API, with the driver its config names.
    """
    opts = salt.config.master_config(f"{master.config_dir}/master")
    return salt.cache.Cache(opts, driver=opts["keys.cache_driver"])


def plant(master, ids, state="accepted"):
    """
    Store keys in a running master's key store through Salt's cache API (as salt-key does).
    """
    cache, pool = key_cache(master), keytools.pem_pool()
    for index, minion_id in enumerate(ids):
        cache.store("keys", minion_id, {"state": state, "pub": pool[index % len(pool)]})


def master_pub_fingerprint(master):
    """
    The fingerprint ``salt-key --finger-all`` gives for the master's own public key (3008 names
    it ``<master id>.pub``).
    """
    ret = keytools.run_cli("salt-key", master.config_dir, "--finger-all", timeout=60)
    assert ret.returncode == 0 and isinstance(ret.data, dict), ret
    local = ret.data.get("local", {})
    pubs = [fp for name, fp in local.items() if name.endswith(".pub") and "sign" not in name]
    assert len(pubs) == 1, local
    return pubs[0]


def assert_identical(cluster):
    lists = cluster.key_lists()
    first = lists[cluster.primary.id]
    assert all(listed == first for listed in lists.values()), {
        m: {s: len(ids) for s, ids in listed.items()} for m, listed in lists.items()
    }
    return first


@pytest.fixture(scope="module")
def cluster(key_cluster):
    ret = key_cluster.run("sync_master_key")
    assert ret.returncode == 0, ret
    ret = key_cluster.run("sync_keys")
    assert ret.returncode == 0, ret
    for peer in key_cluster.masters[1:]:
        # The control minions' keys landed in the peers' mmap index, not as PEM files.
        pki = keytools.pki_dir(peer)
        assert (pki / ".mmap_keys.idx").is_file(), peer.id
        assert set(key_cache(peer).list("keys")) >= set(key_cluster.control_ids()), peer.id
        pem_dir = pki / "minions"
        assert not pem_dir.is_dir() or not any(pem_dir.iterdir()), peer.id
    return key_cluster


def test_master_key_and_keys_reach_every_mmap_master(cluster):
    """
    After ``sync_master_key`` every master serves the primary's master key (``salt-key -F``);
    keys accepted on the primary (a live minion and 2000 stored ones) are accepted on every
    master after ``sync_keys``; a second run changes nothing; ``status`` finds one master key
    and equal key sets.
    """
    primary_fp = master_pub_fingerprint(cluster.primary)
    for master in cluster.masters[1:]:
        assert master_pub_fingerprint(master) == primary_fp, master.id
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
    # The key part of ``status`` (the roots differ here: only master1 serves the formula).
    report = cluster.run("status").data
    assert report["same_master_key"] is True and report["keys_equal"] is True, report
    for master_id, entry in report["masters"].items():
        assert entry["reachable"] and not entry.get("store_problems"), (master_id, entry)
        assert entry["keys"] == len(accepted), (master_id, entry)


def test_a_rejection_reaches_every_mmap_master(cluster):
    """
    ``salt-key -r --include-accepted`` on the primary, then ``sync_keys``: rejected on every
    master (master2 and master3 hold it in their mmap index).
    """
    ret = keytools.run_cli(
        "salt-key",
        cluster.primary.config_dir,
        "-r",
        "kmm-bulk-00001",
        "--include-accepted",
        "-y",
        timeout=60,
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
    deadline, killed, jobs = time.monotonic() + 300, False, []
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
    assert jobs, "no job of master2's control minion was running to kill"
    # Killed mid-write: master2 holds some of the keys, not all of them.
    held = sum(1 for key in key_cache(peer).list("keys") if key.startswith("kmm-kill-"))
    assert 0 < held < BULK, f"master2 held {held} of {BULK} keys after the kill"
    ret = cluster.run("sync_keys")
    assert ret.returncode == 0, ret
    assert set(ids) <= set(assert_identical(cluster)["minions"])
