"""
What the key plane refuses: two keys for one id, ids that are not safe, keys that are not one
canonical RSA public key, and acceptance of an id rejected or denied anywhere. Each refusal is
reported, exits non-zero and leaves every key store byte-identical.

Three masters with their own keypairs (minion-key sync does not need a shared master key); the
control minions' keys are synced first so that each test starts from consistent stores.
"""

import concurrent.futures
import contextlib
import json

import pytest

from ..harness import Ports
from . import keytools

pytestmark = pytest.mark.integration

PREFIX = "kp"
PORTS = Ports(publish=31110, ret=31111)

BAD_IDS = ["../x", ".hidden", "-rf", "m*", "a,b", "a\nb", "x" * 300]
# Those a key store can hold as file names (no '/', at most 255 bytes).
BAD_FILE_IDS = [".hidden", "-rf", "m*", "a,b", "a\nb"]


@pytest.fixture(scope="module")
def cluster(key_cluster):
    ret = key_cluster.run("sync_keys")
    assert ret.returncode == 0, ret
    lists = key_cluster.key_lists()
    assert len({json.dumps(v) for v in lists.values()}) == 1, lists
    return key_cluster


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
    planted on master1 as accepted (and an EC key pending on master2) are refused by
    ``sync_keys``: each reported with a reason, none propagated, exit non-zero. ``accept`` of a
    pending 1024-bit key is refused too.
    """
    bad = keytools.bad_pems()
    entries = [(0, "minions", f"kp-bad-{name}", pem) for name, pem in bad.items()]
    entries.append((1, "minions_pre", "kp-bad-peer-ec", bad["ec-p256"]))
    entries.append((0, "minions_pre", "kp-bad-pending", bad["rsa-1024"]))
    with planted(cluster, *entries):
        before = cluster.snapshots()
        ret = cluster.run("sync_keys")
        assert ret.returncode != 0, ret
        invalid = ret.data.get("invalid_keys", {})
        expected = {minion_id for _, _, minion_id, _ in entries}
        assert set(invalid) == expected, ret.data
        assert all(isinstance(msg, str) and msg for msg in invalid.values()), invalid
        assert "1024" in invalid["kp-bad-rsa-1024"]
        assert cluster.snapshots() == before

        ret = cluster.run("accept", "minion=kp-bad-pending")
        assert_refused(ret, "1024")
        ret = cluster.run("sync_keys", "minion=kp-bad-two-pems")
        assert_refused(ret, "kp-bad-two-pems")
        assert cluster.snapshots() == before


def test_rejected_or_denied_anywhere_wins(cluster):
    """
    An id accepted on master1 but denied on master2 is never accepted on the peers (its denied
    key is propagated); an id accepted on master1 but rejected on master3 ends rejected
    everywhere. ``accept`` of either is refused with the reason, changing nothing.
    """
    m1, m2, m3 = cluster.masters
    den_key, den_other, rej_key = (keytools.new_public_pem() for _ in range(3))
    with planted(
        cluster,
        (0, "minions", "kp-den", den_key),
        (1, "minions_denied", "kp-den", den_other),
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
        denied_fp = keytools.fingerprint(den_other)
        for master in (m1, m3):
            stored = (keytools.pki_dir(master) / "minions_denied" / "kp-den").read_text()
            assert keytools.fingerprint(stored) == denied_fp

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
