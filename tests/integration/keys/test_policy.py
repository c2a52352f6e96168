"""
What the key plane refuses: two keys for one id, ids that are not safe, keys that are not one
canonical RSA public key, and acceptance of an id rejected or denied anywhere. Each refusal is
reported, exits non-zero and leaves every key store byte-identical.

The package's shared key set (``keys/conftest.py``): three masters with their own keypairs
(minion-key sync does not need a shared master key); the control minions' keys are synced first
so that each test starts from consistent stores.
"""

import base64
import concurrent.futures
import contextlib
import hashlib
import json

import pytest

from . import keytools

pytestmark = pytest.mark.integration


BAD_IDS = ["../x", ".hidden", "-rf", "m*", "a,b", "a\nb", "x" * 300]
# Those a key store can hold as file names (no '/', at most 255 bytes).
BAD_FILE_IDS = [".hidden", "-rf", "m*", "a,b", "a\nb"]


@pytest.fixture(scope="module")
def cluster(shared_key_cluster):
    ret = shared_key_cluster.run("sync_keys")
    assert ret.returncode == 0, ret
    lists = shared_key_cluster.key_lists()
    assert len({json.dumps(v) for v in lists.values()}) == 1, lists
    return shared_key_cluster


@contextlib.contextmanager
def planted(cluster, *entries):
    """
    Plant ``(master index, state dir, id, pem)`` keys; remove that id from every master after.
    """
    try:
        for index, state_dir, minion_id, pem in entries:
            keytools.write_key(cluster.masters[index], state_dir, minion_id, pem)
        yield
    finally:
        for _, _, minion_id, _ in entries:
            for master in cluster.masters:
                for state_dir in keytools.KEY_DIRS:
                    path = keytools.pki_dir(master) / state_dir / minion_id
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()


def output(ret):
    return ret.stdout + ret.stderr


def assert_refused(ret, *needles):
    assert ret.returncode != 0, ret
    for needle in needles:
        assert needle in output(ret), (needle, str(ret))


def test_conflict_reports_both_fingerprints_and_changes_nothing(cluster):
    """
    Same id, different keys: accepted on master1, pending on master2. ``sync_keys`` (all, and
    ``minion=``) and ``accept`` (with and without ``fingerprint=``) report both fingerprints,
    change nothing, and exit non-zero.
    """
    m1, m2, _ = cluster.masters
    first, second = keytools.new_public_pem(), keytools.new_public_pem()
    fp1, fp2 = keytools.fingerprint(first), keytools.fingerprint(second)
    dup = "kp-dup"
    with planted(cluster, (0, "minions", dup, first), (1, "minions_pre", dup, second)):
        before = cluster.snapshots()
        ret = cluster.run("sync_keys")
        assert_refused(ret, fp1, fp2)
        assert ret.data["conflicts"] == {dup: {m1.id: fp1, m2.id: fp2}}, ret.data
        assert ret.data["retcode"] == 1
        for args in (
            ("sync_keys", f"minion={dup}"),
            ("accept", f"minion={dup}"),
            ("accept", f"minion={dup}", f"fingerprint={fp1}"),
        ):
            ret = cluster.run(*args)
            assert_refused(ret, fp1, fp2)
        assert cluster.snapshots() == before


def run_bad_id(cluster, fun, bad):
    # A kwarg value cannot hold a newline on the CLI (Salt then passes the whole "minion=..."
    # positionally); ids starting with '-' would be taken as options: use minion= for them.
    arg = bad if "\n" in bad else f"minion={bad}"
    return (fun, bad), cluster.run(fun, arg)


def test_bad_ids_refused_with_nothing_written(cluster):
    """
    ``../x``, ``.hidden``, ``-rf``, ``m*``, ``a,b``, ``a<newline>b`` and a 300-character id
    given to accept/reject/delete/sync_keys are refused with a message naming the rule; no key
    store changes.
    """
    before = cluster.snapshots()
    calls = [(fun, bad) for fun in ("accept", "reject", "delete", "sync_keys") for bad in BAD_IDS]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(pool.map(lambda call: run_bad_id(cluster, *call), calls))
    for (fun, bad), ret in results.items():
        assert ret.returncode != 0, (fun, bad, str(ret))
        assert "is not a valid id" in output(ret), (fun, bad, str(ret))
        assert "not starting with '.' or '-'" in output(ret), (fun, bad, str(ret))
    assert cluster.snapshots() == before


def test_bad_id_files_on_primary_are_reported_not_propagated(cluster):
    """
    Key files on master1 named like ``-rf``, ``m*``, ``a,b``, ``a<newline>b`` (Salt lists
    them as minions) are reported by ``sync_keys`` as invalid, exit non-zero, and reach no peer;
    ``.hidden`` (which Salt itself does not list) reaches no peer either.
    """
    m1 = cluster.primary
    entries = [(0, "minions", bad, keytools.pem_pool()[i]) for i, bad in enumerate(BAD_FILE_IDS)]
    with planted(cluster, *entries):
        listed = {i for ids in keytools.salt_key_list(m1).values() for i in ids}
        salt_lists = sorted(set(BAD_FILE_IDS) & listed)
        assert set(salt_lists) >= {"-rf", "m*", "a,b", "a\nb"}, salt_lists
        before = cluster.snapshots()
        ret = cluster.run("sync_keys")
        assert ret.returncode != 0, ret
        assert sorted(ret.data["invalid"]) == salt_lists, ret.data
        assert cluster.snapshots() == before


def test_bad_pems_refused_and_not_propagated(cluster):
    """
    Keys Salt's loader would take but that are not exactly one RSA >= 2048-bit
    SubjectPublicKeyInfo PEM (trailing junk, two PEMs, 1024-bit RSA, EC, PKCS#1, a private key)
    planted on master1 as accepted are refused by ``sync_keys``: each reported with a reason,
    none propagated, exit non-zero. Bad keys that are only pending (an EC key on master2, a
    1024-bit key on master1) are warnings: listed, never copied. ``accept`` of the pending
    1024-bit key is refused.
    """
    bad = keytools.bad_pems()
    entries = [(0, "minions", f"kp-bad-{name}", pem) for name, pem in bad.items()]
    pending = [
        (1, "minions_pre", "kp-bad-peer-ec", bad["ec-p256"]),
        (0, "minions_pre", "kp-bad-pending", bad["rsa-1024"]),
    ]
    with planted(cluster, *entries, *pending):
        before = cluster.snapshots()
        ret = cluster.run("sync_keys")
        assert ret.returncode != 0, ret
        invalid = ret.data.get("invalid_keys", {})
        assert set(invalid) == {minion_id for _, _, minion_id, _ in entries}, ret.data
        assert all(isinstance(msg, str) and msg for msg in invalid.values()), invalid
        assert "1024" in invalid["kp-bad-rsa-1024"]
        assert set(ret.data.get("warnings", {})) >= {"kp-bad-peer-ec", "kp-bad-pending"}
        assert cluster.snapshots() == before

        ret = cluster.run("accept", "minion=kp-bad-pending")
        assert_refused(ret, "1024")
        ret = cluster.run("sync_keys", "minion=kp-bad-two-pems")
        assert_refused(ret, "kp-bad-two-pems")
        assert cluster.snapshots() == before


def test_invalid_pending_keys_do_not_fail_a_sync(cluster):
    """
    A pending key with a bad id or a 1024-bit key (anyone can submit one) is a warning:
    ``sync_keys`` and ``status`` still exit 0 (an orchestration goes on), and it is copied
    nowhere.
    """
    entries = [
        (1, "minions_pre", "kp-weak", keytools.new_public_pem(bits=1024)),
        (1, "minions_pre", "m*", keytools.new_public_pem()),
    ]
    with planted(cluster, *entries):
        before = cluster.snapshots()
        ret = cluster.run("sync_keys")
        assert ret.returncode == 0, ret
        assert {"kp-weak", "m*"} <= set(ret.data.get("warnings", {})), ret.data
        assert cluster.snapshots() == before


def test_a_spoofed_key_does_not_freeze_the_accepted_one(cluster):
    """
    A client offering another key for an accepted id makes Salt store it in minions_denied by
    itself: that spoof record is reported and copied as denied, but the accepted key still
    reaches every master (sync_keys exits 0), and accept of that key is not refused.
    """
    m1, m2, m3 = cluster.masters
    real, spoof = keytools.new_public_pem(), keytools.new_public_pem()
    with planted(
        cluster, (0, "minions", "kp-spoofed", real), (1, "minions_denied", "kp-spoofed", spoof)
    ):
        ret = cluster.run("sync_keys")
        assert ret.returncode == 0, ret
        assert set(ret.data["spoofed"]["kp-spoofed"]) == {m2.id}, ret.data
        for master in (m1, m2, m3):
            listed = keytools.salt_key_list(master)
            assert "kp-spoofed" in listed["minions"], (master.id, listed)
            assert "kp-spoofed" in listed["minions_denied"], (master.id, listed)
            stored = (keytools.pki_dir(master) / "minions" / "kp-spoofed").read_text()
            assert keytools.fingerprint(stored) == keytools.fingerprint(real)
        ret = cluster.run("accept", "minion=kp-spoofed")
        assert ret.returncode == 0, ret


def test_rejected_or_denied_anywhere_wins(cluster):
    """
    An id accepted on master1 whose very key is denied on master2 (an operator's deny) is never
    accepted on the peers (its denied key is propagated); an id accepted on master1 but rejected
    on master3 ends rejected everywhere. ``accept`` of either is refused with the reason,
    changing nothing.
    """
    m1, m2, m3 = cluster.masters
    den_key, rej_key = keytools.new_public_pem(), keytools.new_public_pem()
    with planted(
        cluster,
        (0, "minions", "kp-den", den_key),
        (1, "minions_denied", "kp-den", den_key),
        (0, "minions", "kp-rej", rej_key),
        (2, "minions_rejected", "kp-rej", rej_key),
    ):
        ret = cluster.run("sync_keys")
        assert ret.returncode == 0, ret
        assert set(ret.data["denied"]["kp-den"]) == {m2.id}, ret.data
        for master in (m1, m2, m3):
            listed = keytools.salt_key_list(master)
            assert "kp-den" in listed["minions_denied"], (master.id, listed)
            assert "kp-rej" in listed["minions_rejected"], (master.id, listed)
            assert "kp-rej" not in listed["minions"], (master.id, listed)
        for peer in (m2, m3):
            assert "kp-den" not in keytools.salt_key_list(peer)["minions"], peer.id
        for master in (m1, m3):
            stored = (keytools.pki_dir(master) / "minions_denied" / "kp-den").read_text()
            assert keytools.fingerprint(stored) == keytools.fingerprint(den_key)

        before = cluster.snapshots()
        for minion_id in ("kp-den", "kp-rej"):
            ret = cluster.run("accept", f"minion={minion_id}")
            assert_refused(ret, "deny wins")
        assert cluster.snapshots() == before


def test_accept_is_fingerprint_checked(cluster):
    """
    ``accept ID fingerprint=<wrong>`` is refused and changes nothing; with the key's own
    fingerprint the key, pending on master2 only, becomes accepted on every master, stored
    with that fingerprint.
    """
    pem = keytools.new_public_pem()
    fp = keytools.fingerprint(pem)
    wrong = keytools.fingerprint(keytools.new_public_pem())
    with planted(cluster, (1, "minions_pre", "kp-fp", pem)):
        before = cluster.snapshots()
        ret = cluster.run("accept", "minion=kp-fp", f"fingerprint={wrong}")
        assert_refused(ret, wrong, fp)
        assert cluster.snapshots() == before

        ret = cluster.run("accept", "minion=kp-fp", f"fingerprint={fp}")
        assert ret.returncode == 0, ret
        for master in cluster.masters:
            listed = keytools.salt_key_list(master)
            assert "kp-fp" in listed["minions"] and "kp-fp" not in listed["minions_pre"]
            stored = (keytools.pki_dir(master) / "minions" / "kp-fp").read_text()
            assert keytools.fingerprint(stored) == fp


def test_mass_revocation_needs_force(cluster):
    """
    A peer that reports most accepted keys as rejected (a compromised or broken host) does not
    revoke the fleet: ``sync_keys`` refuses, naming the master and the share, and changes
    nothing; with ``force=True`` the rejections propagate.
    """
    m1, m2, m3 = cluster.masters
    ids = [f"kp-mass-{i}" for i in range(8)]
    pems = keytools.pem_pool()
    accepted = [(i, "minions", mid, pems[n]) for n, mid in enumerate(ids) for i in range(3)]
    with planted(cluster, *accepted):
        for n, mid in enumerate(ids):
            keytools.write_key(m3, "minions_rejected", mid, pems[n])
            (keytools.pki_dir(m3) / "minions" / mid).unlink()
        before = cluster.snapshots()
        ret = cluster.run("sync_keys")
        assert_refused(ret, "force=True", m1.id)
        assert cluster.snapshots() == before
        ret = cluster.run("sync_keys", "force=True")
        assert ret.returncode == 0, ret
        for master in (m1, m2):
            listed = keytools.salt_key_list(master)
            assert set(ids) <= set(listed["minions_rejected"]), listed
            assert not set(ids) & set(listed["minions"]), listed


def accept_action(pem):
    """An ``accept`` key action for ``kp-evil`` with the public key ``pem``."""
    return {
        "id": "kp-evil",
        "op": "accept",
        "fp": keytools.fingerprint(pem),
        "pub": pem,
        "expect": None,
    }


def forged_order(recipient, action):
    """An order for ``action`` addressed to ``recipient``, with a made-up signature."""
    digest = hashlib.sha256(
        json.dumps({"actions": [action]}, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    return {
        "v": 2,
        "purpose": "key_actions",
        "recipient": recipient,
        "bound": {},
        "digest": digest,
        "signature": base64.b64encode(b"x" * 256).decode(),
    }


def apply_key_actions(master, target, transfer, order):
    """
    ``multimaster_peer.apply_key_actions`` published by ``master`` to ``target`` with
    ``transfer`` and ``order``; returns ``target``'s answer as a string.
    """
    returns = keytools.salt_cmd(
        master,
        target,
        "multimaster_peer.apply_key_actions",
        f"transfer={json.dumps(transfer)}",
        f"order={json.dumps(order)}",
        timeout=60,
    )
    return str(returns.get(target))


def assert_replayed_order_refused(cluster, pem):
    """
    A real ``sync_keys`` run's transfer and order, read back from master1's job cache and
    presented again, are refused (the ticket is used up) and change nothing.
    """
    m1, m2, _ = cluster.masters
    cm2 = cluster.control[1].id
    # A real transfer and order, from a real run: the job cache keeps the descriptor and the
    # order (never the actions); replaying them must fail.
    with planted(cluster, (0, "minions", "kp-replay", pem)):
        ret = cluster.run("sync_keys")
        assert ret.returncode == 0, ret
        load = keytools.last_job_kwargs(m1, "multimaster_peer.apply_key_actions", cm2)
        assert set(load) >= {"transfer", "order"} and "actions" not in load, load
        ret = keytools.run_cli("salt-key", m2.config_dir, "-d", "kp-replay", "-y")
        assert ret.returncode == 0, ret
        after_delete = keytools.store_snapshot(m2)
        assert "used ticket" in apply_key_actions(m1, cm2, load["transfer"], load["order"])
        assert keytools.store_snapshot(m2) == after_delete
        assert "kp-replay" not in keytools.salt_key_list(m2)["minions"]


def test_peer_functions_refuse_unsigned_or_replayed_orders(cluster):
    """
    Someone allowed to publish ``multimaster_peer.*`` (or reading the job cache) cannot use the
    peer side: actions staged on master1 with an order that is missing or forged are refused; a
    transfer and order replayed from master1's job cache are refused (the ticket is used up);
    a transfer staged for another control minion is refused. The key store is untouched.
    """
    m1, m2, _ = cluster.masters
    cm2, cm3 = cluster.control[1].id, cluster.control[2].id
    pem = keytools.new_public_pem()
    action = accept_action(pem)
    forged = forged_order(cm2, action)
    before = keytools.store_snapshot(m2)

    for order, reason in (({}, "does not match"), (forged, "signature")):
        transfer = keytools.stage_for(m1, cm2, {"actions": [action]})
        assert reason in apply_key_actions(m1, cm2, transfer, order)
    # Staged for cm2, presented by cm3: master1 refuses to serve it.
    transfer = keytools.stage_for(m1, cm2, {"actions": [action]})
    assert f"not issued to '{cm3}'" in apply_key_actions(m1, cm3, transfer, forged)
    assert keytools.store_snapshot(m2) == before

    assert_replayed_order_refused(cluster, pem)


def test_no_publish_carries_bulk_data(cluster):
    """
    300 keys accepted on master1 reach master2 and master3, yet no publish of the run (the
    ``.load.p`` of each ``multimaster_peer`` job in master1's job cache) exceeds 64 KB: the keys
    were pulled.
    """
    m1, m2, m3 = cluster.masters
    pems = keytools.pem_pool(24)
    entries = [(0, "minions", f"kp-bulk-{n:03d}", pems[n % len(pems)]) for n in range(300)]
    with planted(cluster, *entries):
        started = keytools.job_loads(m1)
        ret = cluster.run("sync_keys")
        assert ret.returncode == 0, ret
        for master in (m2, m3):
            assert {f"kp-bulk-{n:03d}" for n in range(300)} <= set(
                keytools.key_ids(master)["minions"]
            )
        loads = {j: v for j, v in keytools.job_loads(m1).items() if j not in started}
        published, pulled = keytools.largest_publish(loads)
        print(
            f"\n300-key sync_keys: largest publish {published} bytes; largest pull job kept "
            f"in the job cache {pulled} bytes"
        )
        assert 0 < published <= 64 * 1024, loads
        assert pulled < 4096, loads  # the pull jobs that carried chunks are gone


def test_master_key_recipients_come_from_config_only(cluster):
    """
    ``sync_master_key masters=[...]`` is refused (a runner ACL must not choose who receives the
    master's private key); a control minion with a second key for its id on any master (pending
    on one, denied on another) is refused as a recipient: nothing is delivered, no master
    restarts, no master key changes.
    """
    m1, m2, m3 = cluster.masters
    master_keys = {m.id: master_key_files(m) for m in cluster.masters}
    pids = keytools.master_pids(cluster.masters)
    evil = [
        {"id": m.id, "host": h, "minion_id": "kp-attacker"}
        for m, h in zip(cluster.masters, cluster.hosts, strict=True)
    ]
    ret = cluster.run("sync_master_key", f"masters={json.dumps(evil)}")
    assert_refused(ret, "masters= is not accepted")
    cm2, cm3 = cluster.control[1].id, cluster.control[2].id
    extra = [
        keytools.write_key(m3, "minions_pre", cm2, keytools.new_public_pem()),
        keytools.write_key(m2, "minions_denied", cm3, keytools.new_public_pem()),
    ]
    try:
        ret = cluster.run("sync_master_key", "test=True")
        for master in (m2, m3):
            assert ret.data["masters"][master.id]["planned"].startswith("refuse:"), ret.data
        ret = cluster.run("sync_master_key")
        assert ret.returncode != 0, ret
        for master in (m2, m3):
            report = ret.data["masters"][master.id]
            assert report["result"] is False and "refused" in report["error"], ret.data
    finally:
        # Only the planted records (and their copies): the control minions stay accepted.
        for master in cluster.masters:
            for path in extra:
                copy = keytools.pki_dir(master) / path.parent.name / path.name
                copy.unlink(missing_ok=True)
    assert keytools.master_pids(cluster.masters) == pids
    assert {m.id: master_key_files(m) for m in cluster.masters} == master_keys


def master_key_files(master):
    snap = keytools.store_snapshot(master)
    return {k: v for k, v in snap.items() if not k.startswith(("minions", "."))}


def test_a_return_forged_under_a_control_minion_s_id_is_refused(cluster):
    """
    An ordinary minion sees every publish and Salt 3008 takes a return's id from its unchecked
    ``resource_id``: it answers each ``master_settled`` poll for cm3 with "settled" while cm3
    is paused (so the forgery is the only answer). ``wait_masters`` must not take it as
    master3's: it reports that the answer is not signed by cm3 and exits non-zero.
    """
    m3, cm3 = cluster.masters[2], cluster.control[2]
    ordinary = cluster.start_minion("kp-ordinary")
    settled = {"up": True, "restart_pending": False, "settled": True}
    forger = keytools.ReturnForger(
        cluster.primary, ordinary, cm3.id, "multimaster_peer.master_settled", settled
    )
    forger.start()
    try:
        assert forger.ready.wait(60), f"the forger never listened: {forger.error!r}"
        with keytools.paused(cm3):
            ret = cluster.run("wait_masters", "timeout=10")
            assert forger.sent, f"no master_settled job for cm3 was answered: {forger.error!r}"
            # Salt took the forgery as cm3's return: master1's job cache holds it under cm3.
            stored = keytools.salt_run(cluster.primary, "jobs.lookup_jid", forger.sent[0])
    finally:
        forger.done.set()
        forger.join(30)
        ordinary.terminate()
        keytools.run_cli("salt-key", cluster.primary.config_dir, "-d", ordinary.id, "-y")
    assert stored.data.get(cm3.id) == settled, stored
    assert ret.returncode != 0, ret
    assert list(ret.data["masters"]) == [m3.id], ret.data
    assert f"not signed by {cm3.id}" in ret.data["masters"][m3.id], ret.data
