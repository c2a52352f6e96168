"""
The roots plane on real daemons: ``sync_roots`` makes master2's and master3's file and pillar
roots (their own config's paths, paired with master1's by environment and position) equal to
master1's: regular files with their modes, deletions, nothing through a symlink, nothing written
on a dry run or a no-op, pillar content nowhere but in the roots, and no large publish.
"""

import os
import shutil
import stat

import pytest

from .. import harness
from . import keytools
from .conftest import START_TIMEOUT

pytestmark = pytest.mark.integration

MARKER = "MMROOTS-" + "5f1d0c9e7a3b4d62a8e1f0b7c6d5e4a3"


@pytest.fixture(scope="module")
def cluster(shared_key_cluster):
    """
    The package's shared key set (its masters serve the roots of ``shared_root_paths``),
    master1 restarted as ``multimaster.master`` restarts it: its request workers load the file
    server backend that serves ``sync_roots`` its content.
    """
    master1 = shared_key_cluster.masters[0]
    master1.terminate()
    master1.start(start_timeout=START_TIMEOUT)
    control = [c.id for c in shared_key_cluster.control]
    harness.wait_for(
        lambda: keytools.pingers(master1, control, timeout=5) == sorted(control),
        120,
        what="the control minions answering master1 again",
    )
    return shared_key_cluster


def paths_of(cluster, index):
    """``(formula, tree, shared pillar, pillar)`` dirs of master ``index``."""
    return cluster.roots[index]


@pytest.fixture(scope="module")
def trees(cluster):
    """
    master1's tree (nested dirs, a 0755 script, a binary, a name with spaces, an empty file,
    a symlink to a file outside, a symlink to /etc, a pillar file with a marker) and stale files
    on master2 and master3.
    """
    _, tree, _, pillar = paths_of(cluster, 0)
    outside = tree.parent / "outside.txt"
    outside.write_text("not in any root\n")
    (tree / "web" / "conf").mkdir(parents=True)
    (tree / "web" / "init.sls").write_text("web-pkg:\n  test.succeed_without_changes\n")
    (tree / "web" / "conf" / "deploy.sh").write_text("#!/bin/sh\necho deploy\n")
    (tree / "web" / "conf" / "deploy.sh").chmod(0o755)
    (tree / "blob.bin").write_bytes(bytes(range(256)) * 64)
    (tree / "with space.sls").write_text("spaced:\n  test.nop\n")
    (tree / "empty.sls").write_bytes(b"")
    (tree / "outside-link").symlink_to(outside)
    (tree / "etc-link").symlink_to("/etc")
    (pillar / "secret.sls").write_text(f"app:\n  password: {MARKER}\n")
    for index in (1, 2):
        _, peer_tree, _, _ = paths_of(cluster, index)
        (peer_tree / "stale" / "deep").mkdir(parents=True)
        (peer_tree / "stale" / "deep" / "old.sls").write_text("old: 1\n")
        (peer_tree / "web").mkdir()
        (peer_tree / "web" / "init.sls").write_text("outdated\n")
    return tree


def snapshot(root):
    """
    ``{relative path: (kind, bytes or target, mode, inode, mtime_ns)}`` of everything under root.
    """
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            info = os.lstat(path)
            rel = os.path.relpath(path, root)
            if stat.S_ISLNK(info.st_mode):
                found[rel] = ("link", os.readlink(path), None, info.st_ino, info.st_mtime_ns)
            elif stat.S_ISDIR(info.st_mode):
                found[rel] = ("dir", None, None, None, None)
            else:
                with open(path, "rb") as handle:
                    data = handle.read()
                found[rel] = (
                    "file",
                    data,
                    stat.S_IMODE(info.st_mode),
                    info.st_ino,
                    info.st_mtime_ns,
                )
    return found


def content(snap):
    """
    The regular files of a snapshot: path, bytes, mode (what a sync must reproduce).
    """
    return {rel: entry[:3] for rel, entry in snap.items() if entry[0] == "file"}


def peer_roots(cluster):
    return [p for index in (1, 2) for p in paths_of(cluster, index)]


def test_dry_run_plans_and_changes_nothing(cluster, trees):
    before = {str(p): snapshot(p) for p in peer_roots(cluster)}
    ret = cluster.run("sync_roots", "test=True")
    assert ret.returncode == 0, ret
    planned = ret.data["masters"][cluster.masters[1].id]["planned"]
    # Paths are listed up to a sample (the formula copy master1 serves fills it); counts are
    # complete: the tree's outdated init.sls, its stale file and its two symlinks exactly.
    counts = planned["counts"]
    assert (counts["changed"], counts["deleted"], counts["skipped"]) == (1, 1, 2), counts
    assert counts["added"] >= 4, counts
    assert any(p.endswith("tree/web/init.sls") for p in planned["changed"]), planned
    assert any(p.endswith("stale/deep/old.sls") for p in planned["deleted"])
    assert {str(p): snapshot(p) for p in peer_roots(cluster)} == before


def test_sync_mirrors_files_modes_and_deletions_without_following_symlinks(cluster, trees):
    ret = cluster.run("sync_roots")
    assert ret.returncode == 0, ret
    report = ret.data["masters"][cluster.masters[1].id]
    skipped = report["changes"]["skipped"]
    assert set(skipped.values()) == {"symlink (never followed)"}, skipped
    # The content came through master1's file server (its multimaster backend), not peer_run.
    assert {ret.data["masters"][m.id]["via"] for m in cluster.masters[1:]} == {"fileserver"}
    source = [content(snapshot(p)) for p in paths_of(cluster, 0)]
    for index in (1, 2):
        for src, dst in zip(source, paths_of(cluster, index), strict=True):
            assert content(snapshot(dst)) == src, dst
    _, peer_tree, _, _ = paths_of(cluster, 1)
    assert stat.S_IMODE(os.stat(peer_tree / "web" / "conf" / "deploy.sh").st_mode) == 0o755
    assert not (peer_tree / "stale").exists()
    assert not (peer_tree / "etc-link").exists() and not (peer_tree / "outside-link").exists()
    # master2's fileserver serves the new files at once (no restart, no cache wait).
    listed = keytools.run_cli("salt-run", cluster.masters[1].config_dir, "fileserver.file_list")
    assert "web/conf/deploy.sh" in listed.stdout, listed


def test_a_no_op_rewrites_nothing(cluster, trees):
    assert cluster.run("sync_roots").returncode == 0
    before = {str(p): snapshot(p) for p in peer_roots(cluster)}
    ret = cluster.run("sync_roots")
    assert ret.returncode == 0, ret
    assert all(
        r["result"] is True and r["changed"] is False for r in ret.data["masters"].values()
    ), ret
    assert {str(p): snapshot(p) for p in peer_roots(cluster)} == before


def test_one_change_and_one_deletion_propagate(cluster, trees):
    assert cluster.run("sync_roots").returncode == 0
    (trees / "web" / "init.sls").write_text("web-pkg:\n  test.succeed_with_changes\n")
    (trees / "empty.sls").unlink()
    ret = cluster.run("sync_roots")
    assert ret.returncode == 0, ret
    counts = ret.data["masters"][cluster.masters[2].id]["changes"]["counts"]
    assert (counts["added"], counts["changed"], counts["deleted"]) == (0, 1, 1), counts
    _, peer_tree, _, _ = paths_of(cluster, 2)
    assert (peer_tree / "web" / "init.sls").read_text().endswith("succeed_with_changes\n")
    assert not (peer_tree / "empty.sls").exists()


def test_a_file_turned_directory_and_back_converges_in_one_run(cluster, trees):
    """
    A path that changed kind on the primary (file to directory, directory to file) is mirrored
    in one run, and a temporary file an interrupted sync left on a peer is cleared.
    """
    (trees / "flip").mkdir()
    (trees / "flip" / "inner.sls").write_text("flip: 1\n")
    (trees / "flop.sls").write_text("flop: 1\n")
    assert cluster.run("sync_roots").returncode == 0
    shutil.rmtree(trees / "flip")
    (trees / "flip").write_text("flip: 2\n")
    (trees / "flop.sls").unlink()
    (trees / "flop.sls").mkdir()
    (trees / "flop.sls" / "inner.sls").write_text("flop: 2\n")
    _, peer_tree, _, _ = paths_of(cluster, 1)
    # What a sync cut short leaves: its temporary file, and no clean mark of the root.
    leftover = peer_tree / "web" / ".multimaster-tmp-0123456789ab"
    leftover.write_text("half a file\n")
    peer_cache = cluster.masters[1].config["cachedir"]
    shutil.rmtree(os.path.join(peer_cache, "multimaster", "roots-clean"), ignore_errors=True)
    ret = cluster.run("sync_roots")
    assert ret.returncode == 0, ret
    source = content(snapshot(paths_of(cluster, 0)[1]))
    for index in (1, 2):
        assert content(snapshot(paths_of(cluster, index)[1])) == source
    assert not leftover.exists()


def test_status_names_the_paths_that_differ(cluster, trees):
    """
    ``status`` gives each root's digest per master; after a change on master2 it reports the
    roots unequal (exit 1) and names the root and the paths (changed, extra); ``sync_roots``
    makes them equal again.
    """
    assert cluster.run("sync_roots").returncode == 0
    # This module's masters keep their own master keys (no join here): status exits 1 for
    # that whatever the roots; only its roots part is under test.
    ret = cluster.run("status")
    assert ret.data["roots_equal"] is True, str(ret)
    m1, m2, _ = cluster.masters
    _, tree, _, _ = paths_of(cluster, 0)
    _, peer_tree, _, _ = paths_of(cluster, 1)
    digests = [d for envs in ret.data["roots"]["file_roots"].values() for d in envs.values()]
    tree_root = next(d for d in digests if d[m1.id].endswith(str(tree)))
    assert tree_root[m2.id].split()[0] == tree_root[m1.id].split()[0], tree_root

    (peer_tree / "web" / "init.sls").write_text("edited on master2\n")
    (peer_tree / "extra.sls").write_text("only on master2\n")
    try:
        ret = cluster.run("status")
        assert ret.returncode == 1 and ret.data["roots_equal"] is False, str(ret)
        [(root, per_master)] = ret.data["roots_differ"].items()
        assert root.startswith("file_roots base "), root
        assert per_master[m2.id] == {"changed": ["web/init.sls"], "extra": ["extra.sls"]}
        assert per_master[cluster.masters[2].id] == {}, per_master
    finally:
        assert cluster.run("sync_roots").returncode == 0
    ret = cluster.run("status")
    assert ret.data["roots_equal"] is True and "roots_differ" not in ret.data, str(ret)


def test_a_master_host_down_is_reported_and_the_rerun_converges(cluster, trees, event_listener):
    """
    master3's host does not answer (its control minion is stopped): ``sync_roots`` exits 1
    naming master3, master2 is synced all the same (with progress events on master1's bus);
    master3's host back, a re-run converges it.
    """
    _, m2, m3 = cluster.masters
    assert cluster.run("sync_roots").returncode == 0
    (trees / "down.sls").write_text("written while master3 is away\n")
    control3 = cluster.control[2]
    control3.terminate()
    try:
        with keytools.EventCapture(event_listener) as capture:
            ret = cluster.run("sync_roots", "timeout=15")
        assert ret.returncode == 1, ret
        assert ret.data["masters"][m3.id]["result"] is False, ret.data
        assert ret.data["masters"][m2.id]["result"] is True, ret.data
        assert (paths_of(cluster, 1)[1] / "down.sls").exists()
        assert not (paths_of(cluster, 2)[1] / "down.sls").exists()
        progress = [data for _, tag, data in capture.dumps() if tag.endswith("/progress")]
        assert any(m2.id in data for data in progress), progress
    finally:
        control3.start(start_timeout=120)
    ret = cluster.run("sync_roots")
    assert ret.returncode == 0, ret
    assert ret.data["masters"][m3.id]["result"] is True, ret.data
    assert (paths_of(cluster, 2)[1] / "down.sls").read_text() == "written while master3 is away\n"


def test_a_symlinked_directory_on_a_peer_is_not_written_through(cluster, trees, tmp_path):
    _, peer_tree, _, _ = paths_of(cluster, 1)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(peer_tree / "web")
    (peer_tree / "web").symlink_to(elsewhere)
    try:
        ret = cluster.run("sync_roots")
        assert ret.returncode != 0, ret
        assert "not a plain directory" in str(ret.data["masters"][cluster.masters[1].id])
        assert list(elsewhere.iterdir()) == []
    finally:
        (peer_tree / "web").unlink()
    assert cluster.run("sync_roots").returncode == 0


def test_pillar_content_is_only_in_the_roots(cluster, trees, event_listener):
    """
    The marker planted in a master1 pillar_roots file reaches master2's and master3's pillar
    roots, and appears nowhere else on disk: job caches, logs at debug, proc/, caches of every
    daemon, nor in the run's output or the largest publish.
    """
    with keytools.EventCapture(event_listener) as capture:
        ret = cluster.run("sync_roots", "roots=pillar")
    assert ret.returncode == 0, ret
    for index in (1, 2):
        assert MARKER in (paths_of(cluster, index)[3] / "secret.sls").read_text()
    scanner = keytools.SecretScanner(MARKER)
    hits = []
    for daemon in [*cluster.masters, *cluster.control]:
        hits += scanner.scan_tree(daemon.config["root_dir"], skip_dirs=())
    roots = {str(p) for index in range(3) for p in paths_of(cluster, index)}
    hits = [h for h in hits if not any(h[0].startswith(r + os.sep) for r in roots)]
    assert not hits, hits
    assert scanner.find((ret.stdout + ret.stderr).encode()) is None
    leaked = [tag for _, tag, data in capture.dumps() if MARKER in data]
    assert not leaked, leaked
    # Every minion receives the publish: it names no pillar directory and carries no pillar
    # digest (one of a small file would confirm a guessed secret).
    published = keytools.last_job_kwargs(
        cluster.primary, "multimaster_peer.roots_manifest", cluster.control[1].id
    )
    assert published["kinds"] == ["pillar_roots"], published
    assert published["unless"] == {} and not published["dirs"], published


def test_no_roots_publish_exceeds_64_kb(cluster, trees):
    before = keytools.job_loads(cluster.primary)
    (trees / "big.bin").write_bytes(os.urandom(3 * 1024 * 1024))
    try:
        ret = cluster.run("sync_roots")
        assert ret.returncode == 0, ret
        loads = {j: v for j, v in keytools.job_loads(cluster.primary).items() if j not in before}
        published, pulled = keytools.largest_publish(loads)
        print(
            f"\nsync_roots moving 3 MB: largest publish {published} bytes; largest pull job "
            f"kept in the job cache {pulled} bytes"
        )
        assert 0 < published <= 64 * 1024, loads
        assert pulled < 4096, loads  # the pull jobs that carried chunks are gone
    finally:
        (trees / "big.bin").unlink()


def test_a_tree_of_thousands_of_directories_syncs_one_change(cluster, trees):
    """
    5,000 directories: master1's per-directory digests are over what a publish carries, so
    they are staged for each peer to pull; after one change each peer seals one directory's
    manifest, where its whole manifest of 10,000 files would be over what its minion returns
    untrimmed (1 MiB).
    """
    many = trees / "many"
    for n in range(5000):
        directory = many / f"r{n % 100:03d}" / f"s{n // 100:02d}"
        directory.mkdir(parents=True)
        for name in ("init.sls", "map.jinja"):
            (directory / name).write_text(f"{n}-{name}: {{}}\n")
    try:
        assert cluster.run("sync_roots").returncode == 0
        (many / "r007" / "s03" / "init.sls").write_text("changed: {}\n")
        ret = cluster.run("sync_roots")
        assert ret.returncode == 0, ret
        for index in (1, 2):
            counts = ret.data["masters"][cluster.masters[index].id]["changes"]["counts"]
            assert (counts["added"], counts["changed"], counts["deleted"]) == (0, 1, 0), counts
            _, peer_tree, _, _ = paths_of(cluster, index)
            assert (peer_tree / "many" / "r007" / "s03" / "init.sls").read_text() == (
                "changed: {}\n"
            )
    finally:
        # The set's later modules (test_faults) do not read the roots: no sync to clean up.
        shutil.rmtree(many)
