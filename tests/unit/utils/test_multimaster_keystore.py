"""
Reading the minion key store (_utils/multimaster_keystore.py): the inventory and its
fingerprint cache, the store's lock, the master's options and the record of held keys.
"""

import json
import os
import re
import stat
import subprocess
import sys
import time

import multimaster_keys
import multimaster_keystore as ks
import multimaster_keywrite
import pytest
from salt.exceptions import CommandExecutionError

from tests.support import loading
from tests.support.keyfactory import pub_pem, rsa_private
from tests.support.keystore import (
    FP,
    OTHER,
    OTHER_FP,
    PEM,
    holding_the_lock,
    link_pending_dir,
    put,
    store_opts,
)


@pytest.fixture
def mopts(tmp_path):
    return store_opts(tmp_path)


def test_inventory_follows_salts_priority_for_an_id_in_two_dirs(mopts):
    for name in ("minions", "minions_rejected"):
        with open(os.path.join(mopts["pki_dir"], name, "web1"), "w", encoding="utf-8") as fh:
            fh.write(PEM)
    entries, _ = ks.inventory(mopts)
    assert entries["web1"][0] == "rejected"


def test_fingerprint_cache_rereads_only_replaced_files(mopts):
    other = pub_pem(rsa_private(tag=3))
    multimaster_keywrite.write(mopts, [("web1", "accepted", PEM), ("web2", "accepted", PEM)])
    first = ks.FingerprintCache()
    entries, _ = ks.inventory(mopts, fp_cache=first)
    assert first.reads == 2 and first.changed
    again = ks.FingerprintCache(first.seen)
    assert ks.inventory(mopts, fp_cache=again)[0] == entries
    assert again.reads == 0 and not again.changed
    multimaster_keywrite.write(mopts, [("web2", "accepted", other)])  # a rename: new inode
    third = ks.FingerprintCache(again.seen)
    entries, _ = ks.inventory(mopts, fp_cache=third)
    assert third.reads == 1
    assert entries["web2"][1] == multimaster_keys.fingerprint(other)


# --- hardening: locks, inventory reads, fingerprint cache ----------------------------------------


def test_the_lock_excludes_a_second_run_and_names_its_file_on_timeout(mopts):
    release, thread = holding_the_lock(mopts)
    lock_file = os.path.join(mopts["pki_dir"], ".multimaster.lock")
    try:
        start = time.monotonic()
        with pytest.raises(CommandExecutionError, match=re.escape(lock_file)):
            with ks.locked(mopts, timeout=0.3):
                pass
        assert time.monotonic() - start >= 0.3
    finally:
        release.set()
        thread.join()
    with ks.locked(mopts, timeout=1):
        assert stat.S_IMODE(os.lstat(lock_file).st_mode) == 0o600


def test_the_lock_file_is_never_followed(mopts, tmp_path):
    target = tmp_path / "elsewhere"
    os.symlink(target, os.path.join(mopts["pki_dir"], ".multimaster.lock"))
    with pytest.raises(CommandExecutionError, match="multimaster.lock"):
        with ks.locked(mopts, timeout=0.1):
            pass
    assert not target.exists()


def test_a_cluster_store_is_locked_in_the_cluster_pki_dir(mopts, tmp_path):
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    mopts.update(cluster_id="c1", cluster_pki_dir=str(cluster))
    with ks.locked(mopts):
        assert (cluster / ".multimaster.lock").is_file()


def test_a_symlinked_state_dir_is_not_read_and_is_reported(mopts, tmp_path, caplog):
    _, pre = link_pending_dir(mopts, tmp_path)
    entries, pubs = ks.inventory(mopts, with_pubs=True)
    assert entries == {} and pubs == {}
    assert "minions_pre" in caplog.text
    problems = ks.store_problems(mopts)
    assert len(problems) == 1 and pre in problems[0] and "symbolic link" in problems[0]


def test_a_store_without_problems_reports_none(mopts):
    assert ks.store_problems(mopts) == []


@pytest.mark.parametrize(
    "content",
    [
        "root:$6$secret:19000:0:99999:7:::\n",
        PEM + "\n" * (20 * 1024),  # a key padded past any public key's size
        PEM + PEM,
        "",
    ],
    ids=["not-a-key", "oversized", "two-pems", "empty"],
)
def test_a_file_that_is_not_one_public_key_is_listed_without_its_content(mopts, content):
    put(mopts, "minions", "web1", content)
    put(mopts, "minions_denied", "web1", content)
    entries, pubs = ks.inventory(mopts, with_pubs=True)
    assert entries["web1"] == ["accepted", None, None]
    assert pubs.get("web1", {}) == {}
    cache = ks.FingerprintCache()
    assert ks.inventory(mopts, fp_cache=cache)[0] == entries


def test_fingerprint_cache_never_follows_a_link(mopts, tmp_path):
    target = tmp_path / "key"
    target.write_text(PEM)
    link = os.path.join(mopts["pki_dir"], "minions", "web1")
    os.symlink(target, link)
    st = os.lstat(link)
    assert ks.FingerprintCache().fingerprint(link, [st.st_ino, st.st_mtime_ns, st.st_size]) is None


def test_fingerprint_cache_sees_a_rewrite_that_restores_mtime(mopts):
    put(mopts, "minions", "web1")
    path = os.path.join(mopts["pki_dir"], "minions", "web1")
    first = ks.FingerprintCache()
    assert ks.inventory(mopts, fp_cache=first)[0]["web1"] == ["accepted", FP]
    before = os.stat(path)
    assert len(OTHER) == len(PEM)
    for _ in range(100):  # until the clock tick moves ctime (coarse on some kernels)
        time.sleep(0.01)
        with open(path, "r+", encoding="utf-8") as fh:  # same inode, same size
            fh.write(OTHER)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        if os.stat(path).st_ctime_ns != before.st_ctime_ns:
            break
    again = ks.FingerprintCache(first.seen)
    assert ks.inventory(mopts, fp_cache=again)[0]["web1"] == ["accepted", OTHER_FP]
    assert again.reads == 1


def test_the_lock_excludes_another_process(mopts):
    # What two salt-call runs (or reactors) do: separate processes on one store.
    code = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); import multimaster_keystore as ks\n"
        "with ks.locked({'pki_dir': sys.argv[2]}):\n"
        "    print('held', flush=True); sys.stdin.read()\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code, str(loading.UTILS), mopts["pki_dir"]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(CommandExecutionError, match="another run holds"):
            with ks.locked(mopts, timeout=0.2):
                pass
        holder.stdin.close()
        assert holder.wait(10) == 0
    with ks.locked(mopts, timeout=1):
        pass


def test_master_opts_needs_no_master_file(tmp_path):
    """
    A pip-installed Salt ships no ``master`` file: a master runs on Salt's defaults plus
    ``master.d/`` and so do the peer calls; only a missing config directory is refused.
    """
    (tmp_path / "master.d").mkdir()
    (tmp_path / "master.d" / "roots.conf").write_text("file_roots: {base: [/srv/site]}\n")
    opts = ks.master_opts(str(tmp_path))
    assert opts["file_roots"]["base"] == ["/srv/site"]
    assert opts["pki_dir"]
    with pytest.raises(CommandExecutionError, match=r"no master config directory .*/absent"):
        ks.master_opts(str(tmp_path / "absent"))


def test_own_master_options_leave_the_formulas_files_out(tmp_path):
    (tmp_path / "master").write_text("fileserver_backend: [gitfs, roots]\n")
    (tmp_path / "master.d").mkdir()
    (tmp_path / "master.d" / "multimaster.conf").write_text("fileserver_backend: [roots]\n")
    (tmp_path / "master.d" / "acl.conf").write_text("peer_run: {ops: ['jobs.*']}\n")
    own = ks.own_master_options(str(tmp_path), ("multimaster.conf",))
    assert own["fileserver_backend"] == ["gitfs", "roots"]
    assert own["peer_run"] == {"ops": ["jobs.*"]}
    assert ks.own_master_options(str(tmp_path / "none")) == {}


# --- what this master held -----------------------------------------------------------------------


def note_all(mopts, now, ids=None):
    entries, _ = ks.inventory(mopts, ids=ids)
    ks.note_held(mopts, entries, ids, now=now)


def test_held_before_names_the_key_of_an_id_held_accepted_or_pending(mopts):
    put(mopts, "minions", "web1")
    put(mopts, "minions_pre", "web2", OTHER)
    put(mopts, "minions_rejected", "web3")
    put(mopts, "minions_denied", "web4")
    note_all(mopts, now=100)
    assert ks.held_before(mopts, "web1", now=100) == FP
    assert ks.held_before(mopts, "web2", now=100) == OTHER_FP
    for minion_id in ("web3", "web4", "never"):
        assert ks.held_before(mopts, minion_id, now=100) is None


def test_an_id_gone_from_the_store_is_held_before_for_the_grace_period_only(mopts):
    put(mopts, "minions", "web1")
    note_all(mopts, now=100)
    os.unlink(os.path.join(mopts["pki_dir"], "minions", "web1"))
    assert ks.held_before(mopts, "web1", now=10**6) == FP  # no read has seen it gone yet
    note_all(mopts, now=200)
    assert ks.held_before(mopts, "web1", now=200 + ks.HELD_GRACE) == FP
    assert ks.held_before(mopts, "web1", now=201 + ks.HELD_GRACE) is None
    note_all(mopts, now=201 + ks.HELD_GRACE)
    assert ks.held_before(mopts, "web1", now=100) is None


def test_a_read_of_some_ids_records_only_those(mopts):
    put(mopts, "minions", "web1")
    put(mopts, "minions", "web2")
    note_all(mopts, now=100)
    for minion_id in ("web1", "web2"):
        os.unlink(os.path.join(mopts["pki_dir"], "minions", minion_id))
    put(mopts, "minions", "web3")
    note_all(mopts, now=200, ids={"web1", "web3"})
    after = 201 + ks.HELD_GRACE
    assert ks.held_before(mopts, "web1", now=after) is None
    assert ks.held_before(mopts, "web2", now=after) == FP
    assert ks.held_before(mopts, "web3", now=after) == FP


def test_the_record_is_private_and_a_planted_link_is_neither_read_nor_followed(mopts, tmp_path):
    put(mopts, "minions", "web1")
    note_all(mopts, now=100)
    record = ks.held_path(mopts)
    assert stat.S_IMODE(os.stat(record).st_mode) == 0o600
    elsewhere = tmp_path / "elsewhere.json"
    planted = json.dumps({"web9": [FP, None]})
    elsewhere.write_text(planted)
    os.unlink(record)
    os.symlink(elsewhere, record)
    assert ks.held_before(mopts, "web9", now=100) is None
    note_all(mopts, now=100)
    assert not os.path.islink(record) and ks.held_before(mopts, "web1", now=100) == FP
    assert elsewhere.read_text() == planted
    assert sorted(os.listdir(os.path.dirname(record))) == sorted([ks.HELD_FILE, ks.HELD_LOCK])


@pytest.mark.parametrize(
    "content", ["{not json", "[1]", '{"web1": "x"}', '{"web1": [5, null]}', '{"web1": ["a", "b"]}']
)
def test_a_record_that_is_not_one_holds_nothing(mopts, content):
    os.makedirs(os.path.dirname(ks.held_path(mopts)))
    with open(ks.held_path(mopts), "w", encoding="utf-8") as handle:
        handle.write(content)
    assert ks.held_before(mopts, "web1", now=100) is None
    put(mopts, "minions", "web2")
    note_all(mopts, now=100)
    assert ks.held_before(mopts, "web2", now=100) == FP
