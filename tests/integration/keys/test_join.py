"""
Two empty masters join a primary that already holds minion keys in every state.

master1 has real minions accepted with ``salt-key``, a running minion whose key is pending, and
keys planted in every state dir. ``sync_master_key`` + ``sync_keys`` bring master2/master3 (each
started with its own keypair) to the same master key and the same minion keys; once the minions
list all three masters, every master reaches every accepted minion and no other. The same masters
then serve the dry-run, secret-hygiene, state, status, revocation and failover-accept tests.

Tests run in file order (pytest's default): the revocations and the failover (which stops master1)
come last.
"""

import concurrent.futures
import json
import pathlib
import pwd
import time
import uuid

import pytest
import yaml
from cryptography.hazmat.primitives import serialization

from .. import harness
from ..harness import Ports
from . import keytools
from .conftest import HOSTS, START_TIMEOUT

pytestmark = pytest.mark.integration

PREFIX = "kj"
PORTS = Ports(publish=31100, ret=31101)
# Secret hygiene is checked against everything a debug-level daemon writes.
DAEMON_EXTRA = {"log_level": "debug", "log_level_logfile": "debug"}
# No master's file server serves transfers (its fileserver_backend does not name multimaster,
# as before the restart multimaster.master asks for): the control minions pull by peer_run,
# whose returns pass the event bus test_sealed_key_replayed_is_refused copies an envelope from.
# With the backend synced after the masters started, a request worker serves through it or not
# depending on whether it had loaded it, and the envelope may pass no bus at all.
MASTER_D_OPTIONS = {"fileserver_backend": ["roots"]}

ALPHA = "kj-alpha"  # accepted on master1 with salt-key, running
GAMMA = "kj-gamma"  # running, its key left pending on master1
REVOKED = {"reject": "kj-rev-a", "delete": "kj-rev-b", "salt-key": "kj-rev-c"}
PLANTED = {
    "minions": ["kj-plant-acc1", "kj-plant-acc2"],
    "minions_pre": ["kj-plant-pend"],
    "minions_rejected": ["kj-plant-rej"],
    "minions_denied": ["kj-plant-den"],
}
FAILOVER = "kj-fo"
ALIVE_INTERVAL = 3
# The maintenance loop (loop_interval 1) rotates the AES key after a delete/reject, taking
# the drop file away: this long at most.
ROTATION_WAIT = 10
CONVERGE_TIMEOUT = 180


def MASTER_OPTIONS(index, pillar_dir):  # noqa: N802  (the conftest hook's name)
    """
    Every master serves one formula dir (roots shared, as over NFS), so ``status`` finds the
    roots equal and the key-plane outcomes decide its exit code.
    """
    formula = pillar_dir.parent / f"{PREFIX}-formula"
    if index == 0:
        harness.copy_formula(formula)
    return {"file_roots": {"base": [str(formula)]}}


def master_pids(cluster):
    return keytools.master_pids(cluster.masters)


def planned(ret, master):
    """
    ``{(id, op)}`` a dry run planned for ``master``.
    """
    entry = ret.data["masters"].get(master.id, {})
    return {(a["id"], a["op"]) for a in entry.get("planned", []) if isinstance(a, dict)}


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def primary_keys(key_cluster):
    """
    master1 before any sync: minions accepted with ``salt-key``, one running minion pending,
    one planted key per state dir (two accepted). master2/master3 hold no minion keys.
    """
    primary = key_cluster.primary
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(key_cluster.start_minion, [ALPHA, *REVOKED.values()]))
    key_cluster.start_minion(GAMMA, accept=False, wait=False)
    keytools.wait_for(
        lambda: GAMMA in keytools.salt_key_list(primary)["minions_pre"],
        60,
        what=f"{GAMMA}'s key to be pending on master1",
    )
    for state_dir, ids in PLANTED.items():
        for minion_id in ids:
            keytools.write_key(primary, state_dir, minion_id, keytools.new_public_pem())
    for peer in key_cluster.masters[1:]:
        assert not any(keytools.key_ids(peer).values()), f"{peer.id} should hold no keys"
    return keytools.salt_key_list(primary)


DRY_RUNS = {
    "sync_master_key": ("sync_master_key", "test=True"),
    "sync_keys": ("sync_keys", "test=True"),
    "sync_keys minion": ("sync_keys", f"minion={ALPHA}", "test=True"),
    "accept": ("accept", f"minion={GAMMA}", "test=True"),
    "reject": ("reject", f"minion={ALPHA}", "test=True"),
    "delete": ("delete", f"minion={ALPHA}", "test=True"),
    "status": ("status", "test=True"),
}


@pytest.fixture(scope="module")
def dry_runs(key_cluster, primary_keys):
    """
    Every runner function with ``test=True`` while everything is still to do: the return, and
    the key stores and master pids before and after.
    """
    results = {}
    for name, (fun, *args) in DRY_RUNS.items():
        before, pids = key_cluster.snapshots(), master_pids(key_cluster)
        ret = key_cluster.run(fun, *args)
        results[name] = (ret, before, key_cluster.snapshots(), pids, master_pids(key_cluster))
    return results


@pytest.fixture(scope="module")
def joined(key_cluster, dry_runs, event_listener):
    """
    ``sync_master_key`` then ``sync_keys`` from master1, with every event captured.
    """
    with keytools.EventCapture(event_listener) as capture:
        key_ret = key_cluster.run("sync_master_key")
        keys_ret = key_cluster.run("sync_keys")
    return {"sync_master_key": key_ret, "sync_keys": keys_ret, "events": capture}


def running(key_cluster):
    """
    The ids of every minion daemon the module started (control minions included).
    """
    return [m.id for m in key_cluster.minions]


def expected_answering(key_cluster):
    """
    The running minions whose key is accepted on master1 (those every master must reach).
    """
    accepted = set(keytools.salt_key_list(key_cluster.primary)["minions"])
    return sorted(m.id for m in key_cluster.minions if m.id in accepted)


@pytest.fixture(scope="module")
def hot(key_cluster, joined):
    """
    Every running minion (control minions included) restarted with all three masters in its
    ``master:`` list (what ``multimaster.minion`` renders for mode hot).
    """
    assert joined["sync_master_key"].returncode == 0, joined["sync_master_key"]
    assert joined["sync_keys"].returncode == 0, joined["sync_keys"]
    for minion in key_cluster.minions:
        conf = pathlib.Path(minion.config_dir) / "minion.d" / "hot.conf"
        conf.parent.mkdir(exist_ok=True)
        conf.write_text(yaml.safe_dump({"master": list(HOSTS), "master_type": "str"}))
        minion.terminate()
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda m: m.start(start_timeout=START_TIMEOUT), key_cluster.minions))
    expected = expected_answering(key_cluster)
    for master in key_cluster.masters:
        keytools.wait_for(
            lambda m=master: keytools.pingers(m, running(key_cluster), timeout=6) == expected,
            CONVERGE_TIMEOUT,
            interval=2,
            what=f"{expected} to answer {master.id}",
        )
    return expected


# --- dry runs --------------------------------------------------------------------------------


def test_dry_runs_plan_and_change_nothing(key_cluster, dry_runs, primary_keys):
    """
    ``test=True`` on every runner function returns the plan, exits 0, and leaves every key
    store byte-identical and every master running as before (no restart).
    """
    m1, m2, m3 = key_cluster.masters
    for name, (ret, before, after, pids, pids_after) in dry_runs.items():
        assert isinstance(ret.data, dict), f"{name}: {ret}"
        assert after == before, f"{name} test=True changed a key store"
        assert pids_after == pids, f"{name} test=True restarted a master"
        if name != "status":
            assert ret.returncode == 0 and ret.data["retcode"] == 0, f"{name}: {ret}"
    assert set(dry_runs["status"][0].data["masters"]) == {m.id for m in key_cluster.masters}

    ret = dry_runs["sync_master_key"][0]
    intended = keytools.fingerprint(keytools.master_public_pem(m1))
    assert ret.data["fingerprint"] == intended
    for peer in (m2, m3):
        entry = ret.data["masters"][peer.id]
        assert entry["result"] is None and entry["planned"], entry
        assert entry["new"] == intended != entry["old"]

    ret = dry_runs["sync_keys"][0]
    for peer in (m2, m3):
        plan = planned(ret, peer)
        for minion_id in [ALPHA, *key_cluster.control_ids(), *PLANTED["minions"]]:
            assert (minion_id, "accept") in plan, (minion_id, plan)
        assert {(GAMMA, "pend"), ("kj-plant-pend", "pend")} <= plan
        assert ("kj-plant-rej", "reject") in plan
        assert ("kj-plant-den", "deny") in plan
    assert not planned(ret, m1), "master1 already holds every key"

    ret = dry_runs["sync_keys minion"][0]
    assert planned(ret, m2) == planned(ret, m3) == {(ALPHA, "accept")}

    ret = dry_runs["accept"][0]
    assert all(planned(ret, m) == {(GAMMA, "accept")} for m in (m1, m2, m3)), ret.data
    ret = dry_runs["reject"][0]
    assert all(planned(ret, m) == {(ALPHA, "reject")} for m in (m1, m2, m3)), ret.data
    ret = dry_runs["delete"][0]
    assert planned(ret, m1) == {(ALPHA, "delete")}, ret.data
    assert not planned(ret, m2) and not planned(ret, m3), ret.data


# --- the join --------------------------------------------------------------------------------


def test_join_every_master_reaches_every_accepted_minion(key_cluster, joined, hot):
    """
    After ``sync_master_key`` + ``sync_keys`` and making the minions hot: ``salt '*'
    test.ping`` from every master returns every accepted running minion and no other, and
    ``salt-key -L`` (and every key's fingerprint) is identical on all masters.
    """
    key_ret = joined["sync_master_key"]
    for peer in key_cluster.masters[1:]:
        entry = key_ret.data["masters"][peer.id]
        assert entry["changed"] and entry["served"] and entry["result"], entry
    assert key_ret.data["masters"][key_cluster.primary.id]["served"]
    # Each served key is vouched for by another host's control minion, not its own.
    for master in key_cluster.masters:
        verified_by = key_ret.data["masters"][master.id]["verified_by"]
        assert verified_by != master.id and verified_by in {m.id for m in key_cluster.masters}

    assert set(key_cluster.control_ids()) | {ALPHA} <= set(hot)
    assert GAMMA not in hot
    for master in key_cluster.masters:
        assert keytools.pingers(master, running(key_cluster), timeout=6) == hot, master.id

    lists = key_cluster.key_lists()
    first = lists[key_cluster.primary.id]
    assert all(listed == first for listed in lists.values()), lists
    assert set(PLANTED["minions"]) | {ALPHA} <= set(first["minions"])
    assert set(PLANTED["minions_pre"]) | {GAMMA} <= set(first["minions_pre"])
    assert set(PLANTED["minions_rejected"]) <= set(first["minions_rejected"])
    assert set(PLANTED["minions_denied"]) <= set(first["minions_denied"])

    prints = [
        {
            (state_dir, minion_id): keytools.fingerprint(
                (keytools.pki_dir(master) / state_dir / minion_id).read_text()
            )
            for state_dir in keytools.KEY_DIRS
            for minion_id in keytools.key_ids(master)[state_dir]
        }
        for master in key_cluster.masters
    ]
    assert prints[0] == prints[1] == prints[2]


def test_second_run_changes_nothing(key_cluster, hot):
    """
    Re-running ``sync_master_key`` and ``sync_keys`` changes nothing, says so, and restarts no
    master.
    """
    before, pids = key_cluster.snapshots(), master_pids(key_cluster)
    ret = key_cluster.run("sync_master_key")
    assert ret.returncode == 0, ret
    for peer in key_cluster.masters[1:]:
        assert ret.data["masters"][peer.id]["changed"] is False, ret.data
    ret = key_cluster.run("sync_keys")
    assert ret.returncode == 0, ret
    assert "already" in ret.data.get("comment", ""), ret.data
    assert key_cluster.snapshots() == before
    assert master_pids(key_cluster) == pids


def test_peer_master_key_files_are_secure(key_cluster, joined):
    """
    On each peer the delivered pair is stored where its Salt keeps it (3008: ``<id>.pem/.pub``,
    with ``master.pem/.pub`` linking to them; 3006/3007: ``master.pem/.pub``): regular files,
    the private one 0400 and owned by the master's user, the public one matching the private one
    and the primary's.
    """
    intended = keytools.fingerprint(keytools.master_public_pem(key_cluster.primary))
    for peer in key_cluster.masters[1:]:
        pki = keytools.pki_dir(peer)
        pem, pub = keytools.stored_master_pair(peer)
        assert not pem.is_symlink() and pem.is_file(), pem
        assert not pub.is_symlink() and pub.is_file(), pub
        assert (pem.stat().st_mode & 0o777) == 0o400, oct(pem.stat().st_mode)
        assert pem.stat().st_uid == pwd.getpwnam(peer.config["user"]).pw_uid
        assert (pki / "master.pem").resolve() == pem and (pki / "master.pub").resolve() == pub
        private = serialization.load_pem_private_key(pem.read_bytes(), password=None)
        public = private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        assert keytools.fingerprint(public.decode()) == keytools.fingerprint(pub.read_text())
        assert keytools.fingerprint(pub.read_text()) == intended


# --- secret hygiene --------------------------------------------------------------------------


def test_master_private_key_appears_nowhere(key_cluster, joined):
    """
    With every daemon logging at debug level, after ``sync_master_key`` no 40-character run of
    the master private key's base64 body is in any daemon's root dir (cache, job cache, proc,
    logs; pki dirs excepted), in any event, or in the runner's output.
    """
    private = keytools.master_private_pem(key_cluster.primary)
    scanner = keytools.SecretScanner.for_private_key(private)
    assert len(scanner.windows) > 1000, "the private exponent and primes are searched"
    # The scanner finds the key where it must be: master2 now holds it.
    assert scanner.scan_tree(keytools.pki_dir(key_cluster.masters[1]), skip_dirs=())

    hits = []
    for daemon in [*key_cluster.masters, *key_cluster.minions]:
        hits += scanner.scan_tree(daemon.config["root_dir"])
    assert not hits, f"master private key material found in: {hits}"

    events = joined["events"].dumps()
    assert any(tag.startswith("salt/job/") for _, tag, _ in events), "no events captured"
    leaked = [(d, tag) for d, tag, data in events if scanner.find(data.encode()) is not None]
    assert not leaked, f"master private key material in events: {leaked}"

    for name in ("sync_master_key", "sync_keys"):
        ret = joined[name]
        assert scanner.find((ret.stdout + ret.stderr).encode()) is None, name


def test_sealed_key_replayed_is_refused(key_cluster, joined):
    """
    The sealed envelope that carried the master key to master2 is not in master1's job cache:
    the publish carried a ticket, master2's control minion pulled the envelope, and the pull's
    own job was removed. The ticket, published again, is refused (used up); the envelope,
    copied from the event bus (the pull's return passes it) and staged again by someone root
    on master1, is refused too (its challenge is used up): no restart.
    """
    m1 = key_cluster.primary
    cm2 = key_cluster.control[1].id
    kwargs = keytools.last_job_kwargs(m1, "multimaster_peer.install_master_key", cm2)
    assert set(kwargs) >= {"transfer"} and "envelope" not in kwargs, kwargs
    assert keytools.pulled_documents(m1, '"wrapped_key"') == []
    pids = master_pids(key_cluster)

    def install(transfer):
        returns = keytools.salt_cmd(
            m1,
            cm2,
            "multimaster_peer.install_master_key",
            f"transfer={json.dumps(transfer)}",
            timeout=60,
        )
        return str(returns.get(cm2))

    assert "used ticket" in install(kwargs["transfer"])
    envelopes = [
        e
        for e in keytools.pulled_from_events(joined["events"], '"wrapped_key"')
        if e.get("recipient") == cm2
    ]
    assert envelopes, "no pulled envelope on the event bus"
    assert "already used" in install(keytools.stage_for(m1, cm2, envelopes[-1]))
    assert master_pids(key_cluster) == pids


# --- the state -------------------------------------------------------------------------------


def test_master_key_served_state(key_cluster, joined):
    """
    ``multimaster.master_key_served`` on master2's control minion: True when master2 serves the
    given fingerprint; False, naming both fingerprints and the fix, for a wrong one; with
    ``test=True`` the same verdicts and nothing changed (key store, master pid).
    """
    m1, m2, _ = key_cluster.masters
    control = key_cluster.control[1]
    good = keytools.fingerprint(keytools.master_public_pem(m1))
    wrong = keytools.fingerprint(keytools.new_public_pem())

    def apply(fingerprint, *extra):
        returns = keytools.salt_cmd(
            m1,
            control.id,
            "state.single",
            "multimaster.master_key_served",
            "name=served",
            f"fingerprint={fingerprint}",
            *extra,
            timeout=120,
        )
        states = returns.get(control.id)
        assert isinstance(states, dict) and len(states) == 1, returns
        return next(iter(states.values()))

    before, pids = keytools.store_snapshot(m2), master_pids(key_cluster)
    for extra in ((), ("test=True",)):
        state = apply(good, *extra)
        assert state["result"] is True, state
        assert good in state["comment"] and not state["changes"], state
        state = apply(wrong, *extra)
        assert state["result"] is False, state
        assert wrong in state["comment"] and good in state["comment"], state
        assert "sync_master_key" in state["comment"] and not state["changes"], state
    assert keytools.store_snapshot(m2) == before
    assert master_pids(key_cluster) == pids


# --- status ----------------------------------------------------------------------------------


def test_status_reports_consistency_and_differences(key_cluster, hot):
    """
    ``status`` after the join: every master reachable, one master key, equal key sets, and
    every accepted running minion answering every master. After ``salt-key -d`` of one key on
    master3: not equal, naming the id and where it is missing, exit code 1; ``sync_keys
    test=True`` plans the repair and changes nothing; ``sync_keys`` repairs it.
    """
    m1, _, m3 = key_cluster.masters
    # Each control minion pings every minion at once: under CI's load a ping can take over
    # status's default 5 s, and this test is about who answers, not how fast.
    ret = key_cluster.run("status", "ping_timeout=15")
    assert ret.returncode == 0, ret
    report = ret.data
    assert report["same_master_key"] is True and report["keys_equal"] is True, report
    assert all(entry["reachable"] for entry in report["masters"].values()), report
    fps = {entry["master_key"] for entry in report["masters"].values()}
    assert fps == {keytools.fingerprint(keytools.master_public_pem(m1))}
    for minion_id in hot:
        assert all(report["minions"][minion_id].values()), (minion_id, report["minions"])
    assert GAMMA not in report["minions"]

    victim = PLANTED["minions"][0]
    ret = keytools.run_cli("salt-key", m3.config_dir, "-d", victim, "-y")
    assert ret.returncode == 0, ret
    ret = key_cluster.run("status")
    assert ret.returncode == 1 and ret.data["keys_equal"] is False, ret
    assert ret.data["keys_differ"] == {
        victim: {m.id: (None if m is m3 else "accepted") for m in key_cluster.masters}
    }

    before = key_cluster.snapshots()
    ret = key_cluster.run("sync_keys", "test=True")
    assert ret.returncode == 0, ret
    assert planned(ret, m3) == {(victim, "accept")}, ret.data
    assert key_cluster.snapshots() == before

    ret = key_cluster.run("sync_keys")
    assert ret.returncode == 0, ret
    ret = key_cluster.run("status")
    assert ret.returncode == 0 and ret.data["keys_equal"] is True, ret


# --- revocation ------------------------------------------------------------------------------


def assert_cut_off(key_cluster, revoked, witness=ALPHA, attempts=6):
    """
    After a few loop intervals (AES rotation), a publish from each master no longer reaches
    ``revoked``: not in the returns, and not in its own log; ``witness`` (still accepted) shows
    that each publish went out and that its log records such publishes.
    """
    for master in key_cluster.masters:
        dropfile = pathlib.Path(master.config["cachedir"], ".dfn")
        harness.wait_for(
            lambda dropfile=dropfile: not dropfile.exists(),
            ROTATION_WAIT,
            interval=0.2,
            what=f"{master.id} to rotate its AES key",
        )
    revoked_log = pathlib.Path(key_cluster.minion(revoked).config["log_file"])
    witness_log = pathlib.Path(key_cluster.minion(witness).config["log_file"])
    sent = {}
    for master in key_cluster.masters:
        tokens = sent[master.id] = []
        for _ in range(attempts):
            token = f"mm-token-{uuid.uuid4().hex}"
            tokens.append(token)
            returns = keytools.salt_cmd(
                master, f"{witness},{revoked}", "test.echo", token, list_tgt=True, timeout=8
            )
            assert revoked not in returns, (master.id, returns)
            if returns.get(witness) == token:
                break
        else:
            raise AssertionError(f"{witness} never answered {master.id}: {tokens}")
        assert token in witness_log.read_text(errors="replace")
    # A minion that could still decrypt would have logged the last publish within this second.
    time.sleep(1)
    text = revoked_log.read_text(errors="replace")
    for master_id, tokens in sent.items():
        assert not [t for t in tokens if t in text], f"{revoked} still decrypts {master_id}"


def test_reject_takes_minion_off_every_master(key_cluster, hot):
    """
    ``multimaster.reject ID``: rejected on every master, AES rotated where it was accepted,
    and the minion no longer receives publishes from any master.
    """
    revoked = REVOKED["reject"]
    ret = key_cluster.run("reject", f"minion={revoked}")
    assert ret.returncode == 0, ret
    for master in key_cluster.masters:
        assert ret.data["masters"][master.id]["aes_rotated"] is True, ret.data
        listed = keytools.salt_key_list(master)
        assert revoked in listed["minions_rejected"] and revoked not in listed["minions"]
    assert_cut_off(key_cluster, revoked)


def test_delete_takes_minion_off_every_master(key_cluster, hot):
    """
    ``multimaster.delete ID``: no longer accepted anywhere (the running minion may re-submit
    its key, which then waits as pending), and it receives no publishes from any master.
    """
    revoked = REVOKED["delete"]
    ret = key_cluster.run("delete", f"minion={revoked}")
    assert ret.returncode == 0, ret
    for master in key_cluster.masters:
        assert ret.data["masters"][master.id]["aes_rotated"] is True, ret.data
        assert revoked not in keytools.salt_key_list(master)["minions"]
    assert_cut_off(key_cluster, revoked)
    for master in key_cluster.masters:
        listed = keytools.salt_key_list(master)
        assert revoked not in listed["minions"] + listed["minions_rejected"], listed


def test_salt_key_reject_on_primary_then_sync(key_cluster, hot):
    """
    ``salt-key -r ID --include-accepted -y`` on the primary, then ``sync_keys``: rejected on
    every master, the peers rotate their AES key, and the minion receives no publishes from any
    master.
    """
    revoked = REVOKED["salt-key"]
    m1 = key_cluster.primary
    # salt-key -r alone only rejects pending keys.
    ret = keytools.run_cli("salt-key", m1.config_dir, "-r", revoked, "--include-accepted", "-y")
    assert ret.returncode == 0, ret
    ret = key_cluster.run("sync_keys")
    assert ret.returncode == 0, ret
    for peer in key_cluster.masters[1:]:
        assert ret.data["masters"][peer.id]["aes_rotated"] is True, ret.data
    for master in key_cluster.masters:
        listed = keytools.salt_key_list(master)
        assert revoked in listed["minions_rejected"] and revoked not in listed["minions"]
    assert_cut_off(key_cluster, revoked)


# --- failover minion accepted everywhere ------------------------------------------------------


def test_failover_minion_pending_on_primary_served_by_master2(key_cluster, hot):
    """
    A failover minion whose key is pending on master1 only: ``multimaster.accept ID``, then
    master1 stops, and the minion answers ``test.ping`` from master2 with no further step.
    """
    m1, m2, m3 = key_cluster.masters
    key_cluster.start_minion(
        FAILOVER,
        master_hosts=HOSTS,
        accept=False,
        wait=False,
        master_type="failover",
        master_alive_interval=ALIVE_INTERVAL,
        master_failback=False,
        random_master=False,
        retry_dns=0,
    )
    keytools.wait_for(
        lambda: FAILOVER in keytools.salt_key_list(m1)["minions_pre"],
        60,
        what=f"{FAILOVER}'s key pending on master1",
    )
    for peer in (m2, m3):
        assert not any(FAILOVER in ids for ids in keytools.salt_key_list(peer).values())

    ret = key_cluster.run("accept", f"minion={FAILOVER}")
    assert ret.returncode == 0, ret
    for master in key_cluster.masters:
        assert FAILOVER in keytools.salt_key_list(master)["minions"], master.id
    keytools.wait_for(
        lambda: keytools.salt_cmd(m1, FAILOVER, "test.ping", timeout=5).get(FAILOVER) is True,
        90,
        what=f"{FAILOVER} to answer master1",
    )
    # The module's last test: master1 stays down (its teardown stops the rest).
    m1.terminate()
    keytools.wait_for(
        lambda: keytools.salt_cmd(m2, FAILOVER, "test.ping", timeout=5).get(FAILOVER),
        4 * ALIVE_INTERVAL + 60,
        what=f"{FAILOVER} to answer master2 once master1 stopped",
    )
