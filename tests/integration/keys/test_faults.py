"""
Faults: a master that dies (SIGKILL) is reported and the others stay consistent; once it is
back a re-run converges. A run killed with ``kill -9`` in the middle of writing thousands of
keys (the runner and the control minion's job process) leaves nothing a re-run cannot repair:
afterwards every id is in exactly one state on every master and no temp file is left.
"""

import contextlib
import json
import signal
import subprocess
import time

import psutil
import pytest

from . import keytools
from .conftest import START_TIMEOUT

pytestmark = pytest.mark.integration

BULK = 3000


@pytest.fixture(scope="module")
def cluster(shared_key_cluster):
    ret = shared_key_cluster.run("sync_keys")
    assert ret.returncode == 0, ret
    return shared_key_cluster


def assert_identical(cluster):
    lists = cluster.key_lists()
    first = lists[cluster.primary.id]
    assert all(listed == first for listed in lists.values()), {
        m: {s: len(ids) for s, ids in listed.items()} for m, listed in lists.items()
    }
    return first


def assert_one_state_no_temp_files(cluster):
    for master in cluster.masters:
        ids = keytools.key_ids(master)
        seen = {}
        for state_dir in ("minions", "minions_pre", "minions_rejected"):
            for minion_id in ids[state_dir]:
                assert minion_id not in seen, (master.id, minion_id, seen[minion_id], state_dir)
                seen[minion_id] = state_dir
        assert keytools.stray_files(master) == [], master.id


def kill_tree(pid):
    """
    SIGKILL a daemon and every process it started (a crash, an OOM kill of its cgroup).
    """
    proc = psutil.Process(pid)
    procs = [proc, *proc.children(recursive=True)]
    for each in procs:
        with contextlib.suppress(psutil.Error):
            each.send_signal(signal.SIGKILL)
    psutil.wait_procs(procs, timeout=10)


def test_master_killed_is_reported_then_rerun_converges(cluster):
    """
    master3 SIGKILLed: ``sync_keys`` exits non-zero naming master3, and master1/master2 end
    identical (with the new keys); master3 started again, a re-run converges all three.
    """
    m1, m2, m3 = cluster.masters
    new_ids = [f"kf-new-{i}" for i in range(5)]
    for index, minion_id in enumerate(new_ids):
        keytools.write_key(m1, "minions", minion_id, keytools.pem_pool()[index])
    before3 = keytools.store_snapshot(m3)
    kill_tree(keytools.read_pid(m3.config["pidfile"]))
    try:
        ret = cluster.run("sync_keys")
        assert ret.returncode != 0, ret
        entry = ret.data["masters"][m3.id]
        assert entry["result"] is False and "not running" in entry["error"], ret.data
        assert keytools.salt_key_list(m1) == keytools.salt_key_list(m2)
        assert set(new_ids) <= set(keytools.salt_key_list(m2)["minions"])
        assert keytools.store_snapshot(m3) == before3
    finally:
        m3.terminate()
        m3.start(start_timeout=START_TIMEOUT)
    ret = cluster.run("sync_keys")
    assert ret.returncode == 0, ret
    assert set(new_ids) <= set(assert_identical(cluster)["minions"])


def job_processes(minion, since):
    """
    The processes master2's control minion started since ``since``: its job processes (Salt
    names them ``ProcessPayload(jid=...)``).
    """
    pid = keytools.read_pid(minion.config["pidfile"])
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.create_time() >= since:
                found.append(child)
    return found


def count(master, state_dir):
    return sum(1 for _ in (keytools.pki_dir(master) / state_dir).iterdir())


def plant_bulk_keys(m1, m2, victims):
    """
    ``BULK`` keys accepted on ``m1`` and pending on ``m2`` (the same keys), their ids named
    after ``victims``. Returns the ids.
    """
    pool = keytools.pem_pool()
    ids = [f"kf-{victims.replace('+', '-')}-{i:05d}" for i in range(BULK)]
    for index, minion_id in enumerate(ids):
        pem = pool[index % len(pool)]
        keytools.write_key(m1, "minions", minion_id, pem)
        keytools.write_key(m2, "minions_pre", minion_id, pem)
    return ids


def kill_sync_mid_apply(m1, m2, control, accepted_before, victims):
    """
    ``salt-run multimaster.sync_keys`` started on ``m1``; once ``m2``'s accepted keys grow,
    SIGKILL the ``salt-run`` process (and, for ``job+runner``, the job processes of
    ``control``). Returns ``(started, jobs)``: the wall-clock time the job processes are
    looked for from, and the job processes killed.
    """
    started = time.time() - 1
    runner = subprocess.Popen(
        [*keytools.cli_cmd("salt-run", m1.config_dir, "multimaster.sync_keys"), "--out=json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    jobs = []
    try:
        # Writing 3000 keys takes about a second here: poll without sleeping.
        deadline = time.monotonic() + 300
        while count(m2, "minions") <= accepted_before + 20:
            assert runner.poll() is None, "sync_keys ended before master2's writes were seen"
            assert time.monotonic() < deadline, "master2's control minion never started writing"
        jobs = job_processes(control, started) if victims == "job+runner" else []
        for proc in [*jobs, psutil.Process(runner.pid)]:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
        runner.wait(30)
        psutil.wait_procs(jobs, timeout=10)
    finally:
        if runner.poll() is None:
            runner.kill()
    return started, jobs


def assert_job_killed_mid_apply(m2, jobs, accepted_before, written):
    """A job process was killed part-way through ``m2``'s keys, and wrote nothing after."""
    assert jobs, "no job process of master2's control minion to kill"
    assert 0 < written < BULK, f"not killed mid-apply: {written} of {BULK} written"
    time.sleep(1)
    assert count(m2, "minions") - accepted_before == written, "the killed job kept writing"


def assert_job_finished_master2_only(cluster, m2, control, started, ids):
    """
    The job outlived the runner and finished master2: every id is accepted there and none on
    master3, which never got its turn.
    """
    keytools.wait_for(
        lambda: not job_processes(control, started), 120, what="master2's job to finish"
    )
    assert set(ids) <= set(keytools.key_ids(m2)["minions"])
    assert not set(ids) & set(keytools.key_ids(cluster.masters[2])["minions"])


def print_damage(m2, victims, written):
    """Print how many keys the killed run wrote on ``m2`` and what it left to repair."""
    damage = {
        "temp files": len(keytools.stray_files(m2)),
        "ids in two states": len(
            set(keytools.key_ids(m2)["minions"]) & set(keytools.key_ids(m2)["minions_pre"])
        ),
    }
    print(f"\nkill -9 {victims}: {written} of {BULK} keys on master2; left: {json.dumps(damage)}")


def rerun_sync_keys(cluster):
    """``sync_keys`` run again; prints how long it took and its progress steps."""
    rerun_started = time.monotonic()
    ret = cluster.run("sync_keys", timeout=600)
    steps = [
        f"{doc['event']['_stamp'][11:19]} {doc['event']['message']}"
        for doc in keytools.json_docs(ret.stdout)
        if isinstance(doc, dict) and doc.get("suffix") == "progress"
    ]
    print(f"re-run took {time.monotonic() - rerun_started:.1f}s: {steps}")
    return ret


@pytest.mark.parametrize("victims", ["job+runner", "runner"])
def test_kill_9_mid_apply_then_rerun_repairs(cluster, victims):
    """
    3000 keys accepted on master1 and pending on master2 (same keys): ``sync_keys`` moves them
    to accepted on master2. While master2's control minion is writing, ``kill -9`` its job
    process and the ``salt-run`` process (or the ``salt-run`` process only: the job finishes
    master2, master3 never gets its turn). A re-run then exits 0 and leaves every id in exactly
    one state on every master, no temp files, and ``salt-key -L`` identical everywhere.
    """
    m1, m2, _ = cluster.masters
    ids = plant_bulk_keys(m1, m2, victims)
    accepted_before = count(m2, "minions")

    control = cluster.control[1]
    started, jobs = kill_sync_mid_apply(m1, m2, control, accepted_before, victims)
    written = count(m2, "minions") - accepted_before
    if victims == "job+runner":
        assert_job_killed_mid_apply(m2, jobs, accepted_before, written)
    else:
        assert_job_finished_master2_only(cluster, m2, control, started, ids)
    print_damage(m2, victims, written)

    ret = rerun_sync_keys(cluster)
    assert ret.returncode == 0, ret
    assert_one_state_no_temp_files(cluster)
    listed = assert_identical(cluster)
    assert set(ids) <= set(listed["minions"])
    assert not set(ids) & set(listed["minions_pre"])
