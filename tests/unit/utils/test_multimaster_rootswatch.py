"""
The roots watch on this machine's real inotify: a manifest read through its record equals a full
scan after every kind of change a tree meets (content, mode, new and removed directories, a
moved directory, a replaced root, a lost event queue), reads only the directories that changed,
and falls back to a full scan where no engine answers.
"""

import os
import pathlib
import shutil
import threading

import multimaster_manifest as manifest
import multimaster_rootsread as rootsread
import multimaster_rootswatch as rootswatch
import multimaster_safefs as safefs
import pytest


class Engine:
    """The engine's loop in a thread of this process, over the roots it is started with."""

    def __init__(self, cachedir):
        self.cachedir = str(cachedir)
        self.stop = threading.Event()
        self.paused = threading.Event()
        self.thread = None

    def start(self, *roots):
        ready = threading.Event()

        def running():
            ready.set()
            while self.paused.is_set() and not self.stop.is_set():
                self.stop.wait(0.01)
            return not self.stop.is_set()

        self.thread = threading.Thread(
            target=rootswatch.run, args=([str(r) for r in roots], self.cachedir, running)
        )
        self.thread.start()
        assert ready.wait(10)
        return self

    def close(self):
        self.stop.set()
        self.paused.clear()
        if self.thread:
            self.thread.join(10)


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "roots"
    for d in ("a/b", "a/c", "d"):
        (root / d).mkdir(parents=True)
    for i, rel in enumerate(("top.sls", "a/init.sls", "a/b/one.sls", "a/c/two.sls", "d/x.sls")):
        (root / rel).write_text(f"file {i}\n")
    return root


@pytest.fixture
def engine(tmp_path):
    started = Engine(tmp_path / "cache")
    yield started
    started.close()


def full_scan(root):
    dirs, by_dir = {}, {}
    files, skipped = manifest.manifest(str(root), dirs=dirs, by_dir=by_dir)
    return files, skipped, dirs, by_dir


def through_record(root, cachedir):
    """
    What a full scan returns, per-directory digests included: those of the directories the
    record does not name come from the snapshot.
    """
    dirs, by_dir = {}, {}
    files, skipped = manifest.manifest(str(root), cachedir=str(cachedir), dirs=dirs, by_dir=by_dir)
    return files, skipped, dirs, by_dir


@pytest.fixture
def reads(monkeypatch):
    """The directories each ``safefs.walk`` call reads: ``(below, recursive)``."""
    seen = []
    walk = safefs.walk

    def recording(root, skipped, ignored=None, temps=None, dirs=None, below="", recursive=True):
        seen.append((below, recursive))
        return walk(root, skipped, ignored, temps, dirs, below, recursive)

    monkeypatch.setattr(safefs, "walk", recording)
    return seen


def test_a_read_through_the_record_equals_a_full_scan_after_every_kind_of_change(tree, engine):
    engine.start(tree)
    cache = engine.cachedir
    assert through_record(tree, cache) == full_scan(tree)
    changes = [
        lambda: (tree / "a" / "b" / "one.sls").write_text("file 9\n"),  # same size
        lambda: (tree / "a" / "c" / "two.sls").chmod(0o600),
        lambda: (tree / "a" / "c").chmod(0o750),
        lambda: (tree / "e" / "f" / "g").mkdir(parents=True),
        lambda: (tree / "e" / "f" / "g" / "new.sls").write_text("new\n"),
        lambda: shutil.rmtree(tree / "d"),
        lambda: (tree / "a" / "b").rename(tree / "moved"),
        lambda: (tree / "link").symlink_to("/etc"),
        lambda: (tree / "top.sls").unlink(),
    ]
    for change in changes:
        change()
        assert through_record(tree, cache) == full_scan(tree)


def test_a_tree_made_at_once_is_read_whole(tree, engine):
    engine.start(tree)
    through_record(tree, engine.cachedir)
    deep = tree / "n1" / "n2" / "n3"
    deep.mkdir(parents=True)
    for name in ("p.sls", "q.sls"):
        (deep / name).write_text(name)
    files = through_record(tree, engine.cachedir)[0]
    assert {"n1/n2/n3/p.sls", "n1/n2/n3/q.sls"} <= set(files)
    assert through_record(tree, engine.cachedir) == full_scan(tree)


def test_a_no_op_reads_no_directory_and_one_change_reads_one(tree, engine, reads):
    # Every file here was written in the last 2 s: only the record says what to read again.
    engine.start(tree)
    through_record(tree, engine.cachedir)
    reads.clear()
    assert through_record(tree, engine.cachedir) == full_scan(tree)
    assert reads[:-1] == []  # the full scan's own walk is the last
    reads.clear()
    (tree / "a" / "c" / "two.sls").write_text("changed\n")
    through_record(tree, engine.cachedir)
    assert reads == [("a/c", False)]


def test_a_read_of_a_few_directories_keeps_the_snapshot_and_the_next_reads_them_again(
    tree, engine, reads, monkeypatch
):
    monkeypatch.setattr(rootsread, "_FEW_DIRS", 2)
    engine.start(tree)
    through_record(tree, engine.cachedir)
    snapshot = pathlib.Path(rootsread._snapshot_path(engine.cachedir, str(tree)))
    kept = snapshot.read_bytes()
    (tree / "a" / "c" / "two.sls").write_text("changed\n")
    assert through_record(tree, engine.cachedir) == full_scan(tree)
    assert snapshot.read_bytes() == kept
    reads.clear()
    (tree / "d" / "x.sls").write_text("changed too\n")
    assert through_record(tree, engine.cachedir) == full_scan(tree)
    assert sorted(reads[:-1]) == [("a/c", False), ("d", False)]
    # Past the few, the read brings the snapshot to the record's number.
    (tree / "a" / "b" / "one.sls").write_text("changed as well\n")
    assert through_record(tree, engine.cachedir) == full_scan(tree)
    assert snapshot.read_bytes() != kept
    reads.clear()
    assert through_record(tree, engine.cachedir) == full_scan(tree)
    assert reads[:-1] == []


def test_a_rewrite_its_stat_does_not_show_is_hashed_again(tree, engine, monkeypatch):
    """
    A file rewritten with its size within one timestamp tick keeps its stat key: its directory
    is in the record, and a file written too recently to trust its key is hashed again.
    """
    now = rootsread.time.time_ns()
    monkeypatch.setattr(
        rootsread, "_stat_key", lambda info: [info.st_dev, info.st_ino, info.st_size, now, now]
    )
    engine.start(tree)
    through_record(tree, engine.cachedir)
    (tree / "d" / "x.sls").write_text("file 8\n")  # the size of "file 4\n"
    assert through_record(tree, engine.cachedir)[0]["d/x.sls"] == full_scan(tree)[0]["d/x.sls"]


def test_only_the_directories_read_again_get_their_digests_computed(tree, engine, monkeypatch):
    engine.start(tree)
    through_record(tree, engine.cachedir)
    hashed = []
    sha256_json = rootsread.sha256_json

    def counting(document):
        hashed.append(document)
        return sha256_json(document)

    monkeypatch.setattr(rootsread, "sha256_json", counting)
    through_record(tree, engine.cachedir)
    assert hashed == []
    (tree / "a" / "c" / "two.sls").write_text("changed\n")
    read = through_record(tree, engine.cachedir)
    assert [sorted(d["files"]) for d in hashed] == [["a/c/two.sls"]]
    monkeypatch.setattr(rootsread, "sha256_json", sha256_json)
    assert read == full_scan(tree)


def test_a_replaced_root_is_read_whole(tree, engine):
    engine.start(tree)
    through_record(tree, engine.cachedir)
    tree.rename(tree.with_name("old"))
    tree.mkdir()
    (tree / "only.sls").write_text("only\n")
    assert through_record(tree, engine.cachedir) == full_scan(tree)
    assert set(through_record(tree, engine.cachedir)[0]) == {"only.sls"}


def test_a_lost_event_queue_means_a_full_read(tree, engine):
    engine.start(tree)
    through_record(tree, engine.cachedir)
    engine.paused.set()
    with open("/proc/sys/fs/inotify/max_queued_events", encoding="utf-8") as handle:
        limit = int(handle.read())
    target = tree / "d" / "x.sls"
    for i in range(limit // 2 + 10):
        target.write_text(str(i))  # two events each: modify and close
    target.write_text("last\n")
    engine.paused.clear()
    assert through_record(tree, engine.cachedir) == full_scan(tree)
    assert through_record(tree, engine.cachedir)[0]["d/x.sls"]["size"] == 5


def test_a_missing_root_counts_as_watched_while_the_engine_runs(tmp_path, engine):
    def watched():
        how = {}
        manifest.manifest(str(tmp_path / "missing"), cachedir=engine.cachedir, how=how)
        return how["watched"]

    assert watched() is False
    engine.start(tmp_path / "missing")
    assert watched() is True


def test_without_an_engine_the_whole_tree_is_read(tree, tmp_path, reads):
    files = through_record(tree, tmp_path / "cache")
    assert files == full_scan(tree)
    assert ("", True) in reads


def test_an_engine_that_died_is_not_waited_for(tree, engine, reads):
    engine.start(tree)
    through_record(tree, engine.cachedir)
    engine.close()
    pid = os.path.join(rootswatch.state_dir(engine.cachedir), "engine.pid")
    with open(pid, "w", encoding="utf-8") as handle:
        handle.write("999999999\n")
    (tree / "d" / "x.sls").write_text("after\n")
    reads.clear()
    assert through_record(tree, engine.cachedir) == full_scan(tree)
    assert reads[0] == ("", True)


def test_a_root_on_another_file_system_kind_is_not_watched(tree, engine, monkeypatch):
    monkeypatch.setattr(rootswatch, "fs_type", lambda path: "nfs4")
    engine.start(tree)
    answer = rootswatch.changes_since(engine.cachedir, 0)
    entry = answer["roots"][str(tree)]
    assert entry["watched"] is False
    assert "nfs4" in entry["why"]
    assert rootswatch.usable(answer, str(tree), answer["seq"], answer["instance"], None) is None
    # Not tried again at every request (each try would void every reader's record).
    again = rootswatch.changes_since(engine.cachedir, 0)
    assert again["seq"] == answer["seq"]


def test_a_root_made_after_the_engine_started_is_watched_from_then(tmp_path, engine, reads):
    root = tmp_path / "later"
    engine.start(root)
    root.mkdir()
    (root / "a.sls").write_text("a\n")
    assert through_record(root, engine.cachedir) == full_scan(root)
    (root / "b.sls").write_text("b\n")
    reads.clear()
    read = through_record(root, engine.cachedir)
    assert reads == [("", False)]
    assert read == full_scan(root)


def test_a_request_that_is_not_a_number_gets_no_answer(tree, engine):
    engine.start(tree)
    barrier = os.path.join(rootswatch.state_dir(engine.cachedir), "barrier", "bad")
    with open(barrier, "w", encoding="utf-8") as handle:
        handle.write('{"since": "x"}')
    assert rootswatch.changes_since(engine.cachedir, 0) is not None
    answers = os.path.join(rootswatch.state_dir(engine.cachedir), "answers")
    assert os.listdir(answers) == []


def test_many_changed_directories_are_read_in_one_walk(tree, engine, reads):
    many = [tree / "many" / f"m{n}" for n in range(rootsread._MOST_DIRS + 1)]
    for directory in many:
        directory.mkdir(parents=True)
    engine.start(tree)
    through_record(tree, engine.cachedir)
    for n, directory in enumerate(many):
        (directory / "init.sls").write_text(f"{n}\n")
    reads.clear()
    assert through_record(tree, engine.cachedir) == full_scan(tree)
    assert reads[0] == ("", True)


def test_a_root_inside_another_hears_its_changes_as_the_outer_one_does(tree, engine, monkeypatch):
    # No file is read again for being recent: only the record says what changed.
    monkeypatch.setattr(rootsread, "_RACY_NS", -(10**9))
    inner = tree / "a"
    engine.start(tree, inner)
    through_record(tree, engine.cachedir)
    through_record(inner, engine.cachedir)
    (inner / "c" / "two.sls").write_text("changed in both\n")
    assert through_record(inner, engine.cachedir) == full_scan(inner)
    assert through_record(tree, engine.cachedir) == full_scan(tree)
    assert through_record(inner, engine.cachedir)[0]["c/two.sls"]["size"] == 16
