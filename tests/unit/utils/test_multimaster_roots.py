"""
Applying a roots plan on the peer: every write, delete and mode change stays inside the root
whatever names, links or symlinks a local user arranged, a file is renamed into place only with
its planned content, and a plan's pair names a root from this master's own config only.
"""

import os
import stat

import multimaster_roots as roots
import multimaster_safefs as safefs
import pytest
from salt.exceptions import CommandExecutionError


def test_write_is_atomic_and_keeps_the_mode(tmp_path):
    digest = safefs.write_file(tmp_path, "a/b/c.sh", [b"#!", b"/bin/sh\n"], 0o755)
    path = tmp_path / "a" / "b" / "c.sh"
    assert path.read_bytes() == b"#!/bin/sh\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert digest == safefs.sha256_file(path)
    assert [n for n in os.listdir(path.parent) if n.startswith(".multimaster-tmp")] == []


@pytest.mark.parametrize(
    "relpath",
    ["../escape", "a/../../escape", "/etc/passwd", "a//b", "./x", "new\nline", "a\0b", ""],
)
def test_unsafe_paths_are_refused_with_nothing_written(tmp_path, relpath):
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(safefs.SafeFsError):
        safefs.write_file(root, relpath, [b"x"], 0o644)
    assert list(root.iterdir()) == []
    assert not (tmp_path / "escape").exists()


def test_a_symlinked_directory_on_the_peer_is_never_written_through(tmp_path):
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (root / "etc").symlink_to(elsewhere)
    with pytest.raises(safefs.SafeFsError, match="not a plain directory"):
        safefs.write_file(root, "etc/passwd", [b"owned"], 0o644)
    assert list(elsewhere.iterdir()) == []


def test_a_symlinked_file_on_the_peer_is_replaced_not_followed(tmp_path):
    root, target = tmp_path / "root", tmp_path / "target"
    root.mkdir()
    target.write_text("untouched\n")
    (root / "file.sls").symlink_to(target)
    safefs.write_file(root, "file.sls", [b"new\n"], 0o644)
    assert target.read_text() == "untouched\n"
    assert not (root / "file.sls").is_symlink()
    assert (root / "file.sls").read_text() == "new\n"


def test_delete_removes_the_file_and_empty_dirs_but_never_the_root(tmp_path):
    safefs.write_file(tmp_path, "a/b/c", [b"x"], 0o644)
    safefs.write_file(tmp_path, "a/keep", [b"x"], 0o644)
    safefs.delete_file(tmp_path, "a/b/c")
    assert sorted(os.listdir(tmp_path)) == ["a"]
    assert os.listdir(tmp_path / "a") == ["keep"]
    safefs.delete_file(tmp_path, "a/keep")
    assert tmp_path.exists() and os.listdir(tmp_path) == []


def test_delete_removes_a_symlink_itself_not_its_target(tmp_path):
    root, target = tmp_path / "root", tmp_path / "target"
    root.mkdir()
    target.write_text("keep\n")
    (root / "link").symlink_to(target)
    safefs.delete_file(root, "link")
    assert not (root / "link").is_symlink() and target.read_text() == "keep\n"


def test_set_mode_refuses_a_symlink(tmp_path):
    target = tmp_path / "target"
    target.write_text("x")
    target.chmod(0o644)
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "link").symlink_to(target)
    with pytest.raises(OSError):
        safefs.set_mode(tmp_path / "root", "link", 0o777)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_content_that_does_not_match_its_manifest_is_not_renamed_into_place(tmp_path):
    (tmp_path / "f").write_text("old\n")
    with pytest.raises(safefs.SafeFsError, match="changed during the sync"):
        safefs.write_file(tmp_path, "f", [b"new\n"], 0o644, expect_sha256="0" * 64)
    assert os.listdir(tmp_path) == ["f"] and (tmp_path / "f").read_text() == "old\n"


def test_a_batch_of_writes_syncs_each_directory_once_and_never_through_a_link(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "one.sls").write_text("old\n")
    (tmp_path / "top.sls").write_text("old\n")
    with safefs.Batch() as batch:
        for rel in ("a/b/one.sls", "top.sls"):
            safefs.write_file(tmp_path, rel, [b"x"], 0o644, batch=batch)
    assert batch.dirs == {("a", "b"), ()} and not batch.unsynced
    safefs.make_durable(tmp_path, batch)
    (tmp_path / "a" / "b").rename(tmp_path / "a" / "moved")
    (tmp_path / "a" / "b").symlink_to("/etc")
    with pytest.raises(safefs.SafeFsError, match="not a plain directory"):
        safefs.make_durable(tmp_path, batch)


def test_a_batch_walks_to_a_directory_once_for_its_files_and_closes_it(tmp_path, monkeypatch):
    walks = []
    real_open_dir = safefs._open_dir
    monkeypatch.setattr(
        safefs,
        "_open_dir",
        lambda root, parts, create: walks.append(parts) or real_open_dir(root, parts, create),
    )
    fds_before = len(os.listdir("/proc/self/fd"))
    with safefs.Batch() as batch:
        for rel in ("a/b/one.sls", "a/b/two.sls", "a/b/three.sls", "top.sls", "a/b/four.sls"):
            safefs.write_file(tmp_path, rel, [rel.encode()], 0o644, batch=batch)
    assert walks == [["a", "b"], [], ["a", "b"]]
    assert len(os.listdir("/proc/self/fd")) == fds_before
    assert (tmp_path / "a" / "b" / "four.sls").read_text() == "a/b/four.sls"


def test_only_a_new_file_of_a_batch_waits_for_the_batch_to_reach_the_disk(tmp_path, monkeypatch):
    (tmp_path / "old.sls").write_text("old\n")
    (tmp_path / "new").mkdir()
    synced, flushed = [], []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    monkeypatch.setattr(os, "sync", lambda: flushed.append(True))
    with safefs.Batch() as batch:
        safefs.write_file(tmp_path, "old.sls", [b"new\n"], 0o644, batch=batch)
        assert len(synced) == 1 and not batch.unsynced  # the replacing file, before its rename
        safefs.write_file(tmp_path, "new/one.sls", [b"new\n"], 0o644, batch=batch)
        assert len(synced) == 1 and batch.unsynced
        safefs.make_durable(tmp_path, batch)
    assert flushed == [True]
    assert (tmp_path / "new" / "one.sls").read_text() == "new\n"


def test_set_mode_never_changes_a_file_another_hard_link_shares(tmp_path):
    # A local user on the peer replaces a file due for a mode change by a link to /etc/shadow.
    shadow = tmp_path / "shadow"
    shadow.write_text("root:*:\n")
    shadow.chmod(0o600)
    (tmp_path / "root").mkdir()
    os.link(shadow, tmp_path / "root" / "f")
    with pytest.raises(safefs.SafeFsError, match="other hard links"):
        safefs.set_mode(tmp_path / "root", "f", 0o644)
    assert stat.S_IMODE(shadow.stat().st_mode) == 0o600


def test_set_mode_refuses_a_fifo_instead_of_waiting_on_it(tmp_path):
    os.mkfifo(tmp_path / "f")
    with pytest.raises(safefs.SafeFsError, match="not a regular file"):
        safefs.set_mode(tmp_path, "f", 0o644)


def test_temporary_files_an_interrupted_sync_left_are_cleared(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / ".multimaster-tmp-0123456789ab").write_text("half")
    (tmp_path / "a" / "keep.sls").write_text("x\n")
    (tmp_path / ".multimaster-tmp-link").symlink_to(tmp_path / "a" / "keep.sls")
    assert safefs.clear_temps(tmp_path) == ["a/.multimaster-tmp-0123456789ab"]
    assert sorted(os.listdir(tmp_path / "a")) == ["keep.sls"]
    assert (tmp_path / "a" / "keep.sls").read_text() == "x\n"


def test_only_a_sync_that_did_not_reach_its_end_makes_the_next_look_for_its_temporary_files(
    tmp_path, monkeypatch
):
    mopts, root, pair = {"cachedir": str(tmp_path / "cache")}, tmp_path / "root", {}
    leftover = root / "a" / ".multimaster-tmp-0123456789ab"
    leftover.parent.mkdir(parents=True)
    leftover.write_text("half")
    report = {"failed": []}
    roots._clear_temps(mopts, str(root), pair, report)
    assert not leftover.exists() and report == {"failed": []}

    roots._mark_clean(mopts, [str(root)])
    walks = []
    monkeypatch.setattr(safefs, "clear_temps", walks.append)
    roots._clear_temps(mopts, str(root), pair, report)
    assert walks == []
    # The mark went with that sync's start: were it cut short, the next one walks.
    roots._clear_temps(mopts, str(root), pair, report)
    assert walks == [str(root)]


def test_directories_a_write_makes_are_private_until_given_their_mode(tmp_path):
    root = tmp_path / "srv" / "pillar"
    safefs.write_file(root, "a/b/secret.sls", [b"x\n"], 0o644)
    for path in (root, root / "a", root / "a" / "b"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    # Above the root, outside every root: the usual mode.
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "srv").stat().st_mode) == 0o777 & ~umask


def test_set_dir_mode_narrows_keeps_special_bits_and_reports_a_change(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a").chmod(0o2755)
    assert safefs.set_dir_mode(tmp_path, "a", 0o700) is True
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o2700
    assert safefs.set_dir_mode(tmp_path, "a", 0o700) is False
    assert safefs.set_dir_mode(tmp_path, "missing/deeper", 0o700) is False
    assert safefs.set_dir_mode(tmp_path / "gone", "", 0o700) is False
    assert safefs.set_dir_mode(tmp_path, "", 0o711) is True
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o711


def test_set_dir_mode_never_changes_a_directory_through_a_symlink(tmp_path):
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir(mode=0o755)
    elsewhere.chmod(0o755)
    (root / "a").symlink_to(elsewhere)
    with pytest.raises(safefs.SafeFsError, match="not a plain directory"):
        safefs.set_dir_mode(root, "a", 0o777)
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o755


@pytest.mark.parametrize(
    "pair",
    [
        {"kind": "file_roots", "env": "base", "index": 1},
        {"kind": "file_roots", "env": "dev", "index": 0},
        {"kind": "file_roots", "env": "base", "index": "0"},
        {"kind": "extension_modules", "env": "base", "index": 0},
    ],
)
def test_a_pair_names_a_root_of_this_master_s_own_config_only(pair):
    mopts = {"file_roots": {"base": ["/srv/salt"]}, "extension_modules": {"base": ["/x"]}}
    assert roots.paired_root(mopts, {"kind": "file_roots", "env": "base", "index": 0}) == (
        "/srv/salt"
    )
    with pytest.raises(CommandExecutionError, match="no .* root at position"):
        roots.paired_root(mopts, pair)
