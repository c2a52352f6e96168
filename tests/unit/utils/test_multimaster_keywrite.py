"""
Crash-safe key store writes for the localfs_key layout, repair and key actions
(_utils/multimaster_keywrite.py).
"""

import os
import threading
import time

import multimaster_keystore as ks
import multimaster_keywrite as kw
import multimaster_saltcompat
import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from tests.support.keystore import (
    FP,
    OTHER,
    OTHER_FP,
    PEM,
    holding_the_lock,
    link_pending_dir,
    put,
    store_opts,
    where,
)


@pytest.fixture
def mopts(tmp_path):
    return store_opts(tmp_path)


def test_write_leaves_one_state_and_no_temp_files(mopts):
    kw.write(mopts, [("web1", "pending", PEM)])
    kw.write(mopts, [("web1", "accepted", PEM)])
    assert where(mopts, "web1") == ["minions"]
    with open(os.path.join(mopts["pki_dir"], "minions", "web1"), encoding="utf-8") as fh:
        assert fh.read() == PEM
    assert os.listdir(os.path.join(mopts["pki_dir"], ks.TMP_DIR)) == []


def test_a_write_that_fails_while_staging_changes_nothing_and_leaves_no_temp_file(
    mopts, monkeypatch
):
    written = ks._write_new

    def full_disk(dir_fd, name, *args):
        if len(os.listdir(dir_fd)) == 2:
            raise OSError(28, "No space left on device")
        written(dir_fd, name, *args)

    monkeypatch.setattr(ks, "_write_new", full_disk)
    with pytest.raises(OSError):
        kw.write(mopts, [(f"web{i}", "accepted", PEM) for i in range(5)])
    assert os.listdir(os.path.join(mopts["pki_dir"], ks.TMP_DIR)) == []
    assert [where(mopts, f"web{i}") for i in range(5)] == [[]] * 5
    assert not kw.repair_needed(mopts)


def test_deny_sits_beside_the_key_and_delete_removes_everything(mopts):
    kw.write(mopts, [("web1", "accepted", PEM), ("web1", "denied", PEM)])
    assert where(mopts, "web1") == ["minions", "minions_denied"]
    entries, _ = ks.inventory(mopts)
    assert entries["web1"][0] == "accepted" and len(entries["web1"]) == 3
    kw.write(mopts, [("web1", None, None)])
    assert where(mopts, "web1") == []


def test_repair_finishes_what_an_interrupted_run_left(mopts):
    pki = mopts["pki_dir"]
    os.makedirs(os.path.join(pki, ks.TMP_DIR))
    with open(os.path.join(pki, ks.TMP_DIR, "tmpabc123"), "w", encoding="utf-8") as fh:
        fh.write(PEM)
    for name in ("minions", "minions_pre"):
        with open(os.path.join(pki, name, "web1"), "w", encoding="utf-8") as fh:
            fh.write(PEM)
    assert kw.repair_needed(mopts)
    assert kw.repair(mopts) == ["web1"]
    assert where(mopts, "web1") == ["minions_pre"]
    assert os.listdir(os.path.join(pki, ks.TMP_DIR)) == []
    assert not kw.repair_needed(mopts)


@pytest.mark.parametrize("bad", ["../x", ".hidden", "-rf", "m*", "a,b", "a\nb", "x" * 300])
def test_bad_ids_are_refused_before_anything_is_written(mopts, bad):
    with pytest.raises(SaltInvocationError, match="not a valid id"):
        kw.write(mopts, [("good", "accepted", PEM), (bad, "accepted", PEM)])
    assert where(mopts, "good") == []


def test_an_accept_never_removes_a_rejected_file(mopts):
    put(mopts, "minions_rejected", "web1")
    skipped = kw.write(mopts, [("web1", "accepted", PEM)])
    assert skipped == [{"id": "web1", "state": "accepted", "reason": "rejected after the plan"}]
    assert where(mopts, "web1") == ["minions_rejected"]
    assert os.listdir(os.path.join(mopts["pki_dir"], ks.TMP_DIR)) == []


def test_an_accept_of_a_denied_key_is_skipped_but_a_spoof_record_does_not_block(mopts):
    put(mopts, "minions_denied", "web1")
    put(mopts, "minions_denied", "web2", OTHER)
    skipped = kw.write(mopts, [("web1", "accepted", PEM), ("web2", "accepted", PEM)])
    assert skipped == [{"id": "web1", "state": "accepted", "reason": "denied after the plan"}]
    assert where(mopts, "web1") == ["minions_denied"]
    assert where(mopts, "web2") == ["minions", "minions_denied"]


def test_repair_keeps_rejected_over_accepted(mopts):
    put(mopts, "minions", "web1")
    put(mopts, "minions_rejected", "web1")
    assert kw.repair(mopts) == ["web1"]
    assert where(mopts, "web1") == ["minions_rejected"]


def test_a_write_to_a_symlinked_state_dir_is_refused(mopts, tmp_path):
    outside, _ = link_pending_dir(mopts, tmp_path)
    with pytest.raises(CommandExecutionError, match="symbolic link"):
        kw.write(mopts, [("web1", "pending", PEM)])
    assert sorted(os.listdir(outside)) == ["shadow", "web1"]


# --- apply: compare-and-set under the lock -------------------------------------------------------


def _accept_web1(mopts):
    kw.apply_actions(mopts, [({"id": "web1", "op": "accept", "fp": FP, "expect": None}, PEM)])


@pytest.mark.parametrize(
    "run",
    [
        lambda m: kw.write(m, [("web1", "accepted", PEM)]),
        _accept_web1,
        lambda m: kw.repair(m),
    ],
    ids=["write", "apply_actions", "repair"],
)
def test_writes_and_repairs_wait_for_the_lock(mopts, run):
    # The other run has a file staged: a repair that does not wait would delete it.
    staged = os.path.join(mopts["pki_dir"], ks.TMP_DIR, "tmpother")
    os.makedirs(os.path.dirname(staged), mode=0o700)
    release, thread = holding_the_lock(mopts)
    with open(staged, "w", encoding="utf-8") as fh:
        fh.write(PEM)
    worker = threading.Thread(target=run, args=(mopts,))
    worker.start()
    time.sleep(0.3)
    assert worker.is_alive()
    assert os.path.exists(staged) and where(mopts, "web1") == []
    os.unlink(staged)  # the other run renames it into place before it lets go
    release.set()
    thread.join()
    worker.join(5)
    assert not worker.is_alive()


def test_apply_actions_sets_only_what_is_still_as_planned(mopts):
    put(mopts, "minions", "gone")
    put(mopts, "minions_pre", "new", OTHER)
    planned, _ = ks.inventory(mopts)
    put(mopts, "minions", "moved", OTHER)  # appeared after the plan
    checked = [
        ({"id": "gone", "op": "delete", "fp": None, "expect": planned["gone"]}, None),
        ({"id": "new", "op": "accept", "fp": OTHER_FP, "expect": tuple(planned["new"])}, OTHER),
        ({"id": "moved", "op": "pend", "fp": FP, "expect": None}, PEM),
        ({"id": "fresh", "op": "reject", "fp": FP, "expect": None}, PEM),
    ]
    result = kw.apply_actions(mopts, checked)
    assert result["done"] == [
        {"id": "gone", "op": "delete"},
        {"id": "new", "op": "accept"},
        {"id": "fresh", "op": "reject"},
    ]
    assert [(s["id"], s["op"]) for s in result["skipped"]] == [("moved", "pend")]
    assert "changed since planned" in result["skipped"][0]["reason"]
    assert result["rotated"] and result["repaired"] == []
    assert os.path.isfile(os.path.join(mopts["cachedir"], ".dfn"))
    assert where(mopts, "gone") == [] and where(mopts, "new") == ["minions"]
    assert where(mopts, "moved") == ["minions"] and where(mopts, "fresh") == ["minions_rejected"]


def test_an_accept_planned_on_nothing_takes_the_same_key_pending_since(mopts):
    # A minion that lists this master signed in with the key being accepted: accepted. Another
    # key under that id is skipped, never replaced.
    put(mopts, "minions_pre", "web1")
    put(mopts, "minions_pre", "web2", OTHER)
    checked = [
        ({"id": "web1", "op": "accept", "fp": FP, "expect": None}, PEM),
        ({"id": "web2", "op": "accept", "fp": FP, "expect": None}, PEM),
    ]
    result = kw.apply_actions(mopts, checked)
    assert result["done"] == [{"id": "web1", "op": "accept"}]
    assert [(s["id"], s["op"]) for s in result["skipped"]] == [("web2", "accept")]
    assert where(mopts, "web1") == ["minions"] and where(mopts, "web2") == ["minions_pre"]


def test_apply_actions_rotates_only_when_an_accepted_key_is_removed(mopts):
    put(mopts, "minions_pre", "web1")
    expect = ["pending", FP]
    result = kw.apply_actions(mopts, [({"id": "web1", "op": "delete", "expect": expect}, None)])
    assert result["done"] == [{"id": "web1", "op": "delete"}] and not result["rotated"]
    assert not os.path.exists(os.path.join(mopts["cachedir"], ".dfn"))


def test_a_reject_between_plan_and_apply_wins(mopts):
    put(mopts, "minions_pre", "web1")
    planned, _ = ks.inventory(mopts)
    # salt-key -r web1 on this master after the plan:
    os.rename(
        *(os.path.join(mopts["pki_dir"], d, "web1") for d in ("minions_pre", "minions_rejected"))
    )
    action = {"id": "web1", "op": "accept", "fp": FP, "expect": planned["web1"]}
    result = kw.apply_actions(mopts, [(action, PEM)])
    assert result["done"] == [] and result["skipped"][0]["id"] == "web1"
    assert where(mopts, "web1") == ["minions_rejected"]


def test_a_reject_after_the_locked_read_still_wins(mopts, monkeypatch):
    # salt-key takes no lock: it can land between apply_actions' read and its write.
    put(mopts, "minions_pre", "web1")
    planned = ks.inventory(mopts)
    put(mopts, "minions_rejected", "web1")
    monkeypatch.setattr(ks, "inventory", lambda *a, **k: planned)
    action = {"id": "web1", "op": "accept", "fp": FP, "expect": planned[0]["web1"]}
    result = kw.apply_actions(mopts, [(action, PEM)])
    assert result["done"] == []
    assert result["skipped"] == [
        {"id": "web1", "op": "accept", "reason": "rejected after the plan"}
    ]
    assert "minions_rejected" in where(mopts, "web1") and "minions" not in where(mopts, "web1")


def test_apply_actions_records_what_it_leaves(mopts):
    kw.apply_actions(mopts, [({"id": "web1", "op": "accept", "fp": FP, "expect": None}, PEM)])
    assert ks.held_before(mopts, "web1") == FP
    kw.apply_actions(mopts, [({"id": "web1", "op": "delete", "expect": ["accepted", FP]}, None)])
    assert ks.held_before(mopts, "web1", now=time.time() + ks.HELD_GRACE + 1) is None


def test_the_record_after_an_apply_is_what_the_store_holds(mopts):
    put(mopts, "minions", "web1")
    put(mopts, "minions_pre", "web2")
    later = time.time() + ks.HELD_GRACE + 1
    kw.apply_actions(
        mopts,
        [
            ({"id": "web1", "op": "reject", "fp": FP, "expect": ["accepted", FP]}, PEM),
            # Planned on another entry: skipped, so web2 stays held pending.
            ({"id": "web2", "op": "accept", "fp": FP, "expect": ["rejected", FP]}, PEM),
            ({"id": "web3", "op": "pend", "fp": FP, "expect": None}, PEM),
        ],
    )
    assert ks.held_before(mopts, "web1", now=later) is None
    assert ks.held_before(mopts, "web2", now=later) == FP
    assert ks.held_before(mopts, "web3", now=later) == FP


# --- the key cache (mmap_key) --------------------------------------------------------------------


class TornIndexCache:
    """
    What Salt 3008's ``mmap_key`` showed after a ``kill -9`` mid-write: the record is there for
    ``fetch`` but missing from ``list``, and ``store`` updates a present record in place.
    """

    def __init__(self, torn):
        self.records, self.listed = dict(torn), set()

    def list(self, bank):
        return sorted(self.listed) if bank == "keys" else []

    def list_all(self, bank, include_data=False):
        return {k: self.records[k] for k in self.listed} if bank == "keys" else {}

    def fetch(self, bank, key):
        return self.records.get(key) if bank == "keys" else None

    def store(self, bank, key, data):
        if key not in self.records:
            self.listed.add(key)
        self.records[key] = data

    def flush(self, bank, key=None):
        self.records.pop(key, None)
        self.listed.discard(key)


def test_a_record_an_interrupted_mmap_write_left_unlisted_is_listed_again(mopts, monkeypatch):
    torn = TornIndexCache({"web1": {"state": "accepted", "pub": PEM}})
    monkeypatch.setattr(multimaster_saltcompat, "key_cache", lambda _: torn)
    monkeypatch.setattr(multimaster_saltcompat, "keys_are_files", lambda _: False)
    mopts["keys.cache_driver"] = "mmap_key"
    assert ks.inventory(mopts)[0] == {}
    kw.write(mopts, [("web1", "accepted", PEM)])
    assert list(ks.inventory(mopts)[0]) == ["web1"]
