"""
Roots trees as manifests: they skip what must not move and never read through a symlink, the
hash cache trusts only what cannot have changed unseen, and per-directory digests name the
directories that differ.
"""

import json
import os
import pathlib
import subprocess
import time

import multimaster_manifest as manifest
import multimaster_rootsread as rootsread
import multimaster_safefs as safefs
import pytest


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "src"
    (src / "nested" / "deep").mkdir(parents=True)
    (src / "top.sls").write_text("base: {'*': [web]}\n")
    (src / "nested" / "deep" / "run.sh").write_text("#!/bin/sh\n")
    (src / "nested" / "deep" / "run.sh").chmod(0o755)
    (src / "blob.bin").write_bytes(bytes(range(256)) * 10)
    (src / "with space.sls").write_text("x: 1\n")
    (src / "empty").write_bytes(b"")
    (src / ".git").mkdir()
    (src / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / "outside").write_text("secret\n")
    (src / "link-out").symlink_to(tmp_path / "outside")
    (src / "etc").symlink_to("/etc")
    (src / "new\nline").write_text("x\n")
    return src


def test_manifest_lists_regular_files_and_reports_what_it_skips(tree):
    files, skipped = manifest.manifest(tree)
    assert sorted(files) == ["blob.bin", "empty", "nested/deep/run.sh", "top.sls", "with space.sls"]
    assert files["nested/deep/run.sh"]["mode"] == 0o755
    assert files["empty"]["size"] == 0
    assert skipped == {
        "link-out": "symlink (never followed)",
        "etc": "symlink (never followed)",
        "new\nline": "control character in name",
    }


def test_a_missing_root_is_an_empty_tree(tmp_path):
    assert manifest.manifest(tmp_path / "nope") == ({}, {})


def test_digest_is_equal_for_equal_trees_only(tree, tmp_path):
    files, _ = manifest.manifest(tree)
    dst = tmp_path / "dst"
    for rel, info in files.items():
        with open(tree / rel, "rb") as handle:
            safefs.write_file(dst, rel, [handle.read()], info["mode"])
    copied, _ = manifest.manifest(dst)
    assert manifest.digest(copied) == manifest.digest(files)
    safefs.set_mode(dst, "top.sls", 0o600)
    assert manifest.digest(manifest.manifest(dst)[0]) != manifest.digest(files)


def test_a_symlinked_root_is_the_administrators_choice_and_followed(tmp_path):
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real)
    safefs.write_file(link, "x", [b"x"], 0o644)
    assert (real / "x").read_bytes() == b"x"
    assert sorted(manifest.manifest(link)[0]) == ["x"]


# --- what is synced, what is served from git ---------------------------------------------------


@pytest.mark.parametrize(
    ("opts", "kinds", "noted"),
    [
        ({}, ["file_roots", "pillar_roots"], []),
        ({"fileserver_backend": ["rootsfs", "gitfs"]}, ["file_roots", "pillar_roots"], []),
        ({"fileserver_backend": ["gitfs"]}, ["pillar_roots"], ["file_roots"]),
        # The formula's transfer backend serves no files: gitfs alone still serves them.
        ({"fileserver_backend": ["gitfs", "multimaster"]}, ["pillar_roots"], ["file_roots"]),
        ({"ext_pillar": [{"git": ["main https://x/p.git"]}]}, ["file_roots"], ["pillar_roots"]),
        ({"ext_pillar": [{"cmd_yaml": "cat /x"}]}, ["file_roots", "pillar_roots"], []),
    ],
)
def test_roots_served_from_git_are_not_synced(opts, kinds, noted):
    synced, notes = manifest.synced_kinds(opts)
    assert synced == kinds
    assert [note.split(":")[0] for note in notes] == noted
    assert all("nothing to sync" in note for note in notes)


def git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_served_commits_read_loose_and_packed_refs(tmp_path):
    """
    The commits a master's gitfs checkout holds per remote, as gitfs lays out its cache:
    ``remote_map.txt`` names each remote's hash directory; refs may be loose or packed.
    """
    origin = tmp_path / "origin"
    origin.mkdir()
    git("init", "-q", "-b", "main", cwd=origin)
    (origin / "top.sls").write_text("base: {}\n")
    git("add", ".", cwd=origin)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one", cwd=origin)
    git("branch", "prod", cwd=origin)
    cache = tmp_path / "cache"
    checkout = cache / "gitfs" / "AbC+=" / "_"
    git("clone", "-q", str(origin), str(checkout), cwd=tmp_path)
    (cache / "gitfs" / "remote_map.txt").write_text(
        f"# gitfs_remote map as of now\nAbC+= = file://{origin}\n../evil = file:///x\n"
    )

    def rev(name):
        out = subprocess.run(
            ["git", "rev-parse", name], cwd=checkout, check=True, capture_output=True, text=True
        )
        return out.stdout.strip()

    first = rev("origin/main")
    served = manifest.served_commits({"cachedir": str(cache)})  # a fresh clone: packed refs
    assert served == {"gitfs": {f"file://{origin}": {"main": first, "prod": first}}}

    (origin / "top.sls").write_text("base: {'*': [web]}\n")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "two", cwd=origin)
    git("fetch", "-q", "origin", cwd=checkout)  # a fetch writes the moved ref loose
    assert (checkout / ".git" / "refs" / "remotes" / "origin" / "main").exists()
    second = rev("origin/main")
    assert second != first
    served = manifest.served_commits({"cachedir": str(cache)})
    assert served == {"gitfs": {f"file://{origin}": {"main": second, "prod": first}}}
    assert manifest.served_commits({"cachedir": str(tmp_path / "none")}) == {}


def test_what_the_file_server_ignores_is_neither_listed_nor_reported(tmp_path):
    """
    ``file_ignore_regex``/``file_ignore_glob`` (matched on relative paths, as Salt's roots
    backend does): ignored files are not in the manifest of ``file_roots`` (so never copied,
    never deleted on a peer) and not reported as skipped either; ``pillar_roots`` ignore them.
    """
    root = tmp_path / "srv"
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "bin" / "python").symlink_to("/usr/bin/python3")
    (root / ".venv" / "lib.py").write_text("x\n")
    (root / "web").mkdir()
    (root / "web" / "init.sls").write_text("web: {}\n")
    (root / "web" / "init.pyc").write_bytes(b"\0")
    opts = {
        "file_roots": {"base": [str(root)]},
        "pillar_roots": {"base": [str(root)]},
        "file_ignore_regex": [r"^\.venv(/|$)"],
        "file_ignore_glob": ["*.pyc"],
    }
    found = manifest.manifests(opts, ["file_roots", "pillar_roots"])
    served = found["file_roots"]["base"][0]
    assert set(served["files"]) == {"web/init.sls"} and served["skipped"] == {}
    pillar = found["pillar_roots"]["base"][0]
    assert set(pillar["files"]) == {"web/init.sls", "web/init.pyc", ".venv/lib.py"}
    assert pillar["skipped"] == {".venv/bin/python": "symlink (never followed)"}
    assert manifest.ignored_by({}) is None


def test_the_note_names_the_backends_that_serve_files():
    _, notes = manifest.synced_kinds(
        {"fileserver_backend": ["gitfs", "multimaster"]}, ["file_roots"]
    )
    assert notes == ["file_roots: masters serve files from ['gitfs']: nothing to sync"]


@pytest.fixture
def hash_reads(monkeypatch):
    """The files ``manifest`` opens to hash (their fds' paths), in order."""
    read = []
    real = safefs.sha256_fd
    monkeypatch.setattr(
        safefs, "sha256_fd", lambda fd: read.append(os.readlink(f"/proc/self/fd/{fd}")) or real(fd)
    )
    return read


@pytest.fixture
def counted_hashing(hash_reads, monkeypatch):
    """``hash_reads``, with files older than now trusted to the cache."""
    monkeypatch.setattr(rootsread, "_RACY_NS", 0)
    return hash_reads


def test_an_unchanged_file_is_hashed_once_per_master_cachedir(tree, tmp_path, counted_hashing):
    cache = tmp_path / "cache"
    first = manifest.manifest(tree, cachedir=str(cache))
    assert len(counted_hashing) == 5
    counted_hashing.clear()
    assert manifest.manifest(tree, cachedir=str(cache)) == first
    assert counted_hashing == []
    # Another master's cachedir knows nothing of it.
    assert manifest.manifest(tree, cachedir=str(tmp_path / "other")) == first
    assert len(counted_hashing) == 5


def test_content_rewritten_with_its_old_size_and_mtime_is_hashed_again(
    tree, tmp_path, counted_hashing
):
    cache = str(tmp_path / "cache")
    before = manifest.manifest(tree, cachedir=cache)[0]["top.sls"]
    time.sleep(0.05)  # past the kernel's timestamp tick (coarse: up to 10 ms)
    path = tree / "top.sls"
    info = path.stat()
    path.write_text("base: {'*': [evil]}\n"[: info.st_size].ljust(info.st_size))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert path.stat().st_size == info.st_size and path.stat().st_mtime_ns == info.st_mtime_ns
    after = manifest.manifest(tree, cachedir=cache)[0]["top.sls"]
    assert after["sha256"] != before["sha256"]
    assert after["sha256"] == safefs.sha256_file(str(path))


def test_a_file_changed_just_now_is_not_trusted_to_the_cache(tree, tmp_path, hash_reads):
    cache = str(tmp_path / "cache")
    manifest.manifest(tree, cachedir=cache)
    hash_reads.clear()
    manifest.manifest(tree, cachedir=cache)
    assert len(hash_reads) == 5


def test_a_damaged_hash_cache_is_ignored_and_replaced(tree, tmp_path, counted_hashing):
    cache = tmp_path / "cache"
    truth = manifest.manifest(tree)
    path = pathlib.Path(rootsread._hash_cache_path(str(cache), str(tree)))
    for damaged in ("not json", "[1, 2]", '{"top.sls": "x", "empty": [1]}'):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(damaged)
        assert manifest.manifest(tree, cachedir=str(cache)) == truth
        assert len(json.loads(path.read_text())) == 5


def test_a_no_op_manifest_does_not_rewrite_the_cache(tree, tmp_path, counted_hashing):
    cache = str(tmp_path / "cache")
    manifest.manifest(tree, cachedir=cache)
    path = pathlib.Path(rootsread._hash_cache_path(cache, str(tree)))
    inode = path.stat().st_ino
    manifest.manifest(tree, cachedir=cache)
    assert path.stat().st_ino == inode
    (tree / "empty").unlink()
    manifest.manifest(tree, cachedir=cache)
    assert "empty" not in json.loads(path.read_text())


def test_directory_digests_name_only_the_directories_that_differ(tree, tmp_path):
    primary = manifest.manifest(tree)[0]
    peer = dict(primary)
    assert manifest.differing_dirs(peer, rootsread.dir_digests(primary)) == []
    peer["nested/deep/run.sh"] = {**peer["nested/deep/run.sh"], "mode": 0o644}
    peer["stale/old.sls"] = {"size": 1, "mode": 0o644, "sha256": "0" * 64}
    del peer["top.sls"]
    assert manifest.differing_dirs(peer, rootsread.dir_digests(primary)) == [
        "",
        "nested/deep",
        "stale",
    ]
    assert sorted(manifest.within(peer, ["stale", "nested/deep"])) == [
        "nested/deep/run.sh",
        "stale/old.sls",
    ]


def test_a_directory_swapped_for_a_symlink_during_the_scan_is_not_read_through(
    tmp_path, monkeypatch
):
    # A local user who can write below the primary's roots swaps sub/ for a link to a secret
    # directory right after the scan has seen sub/ as a directory.
    root, secret = tmp_path / "root", tmp_path / "secret"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "ok").write_text("ok\n")
    secret.mkdir()
    (secret / "hostname").write_text("TOP SECRET\n")
    real_enter = safefs._enter

    def swap_then_enter(stack, rel, name, dfd, skipped):
        (root / "sub").rename(tmp_path / "moved")
        (root / "sub").symlink_to(secret)
        real_enter(stack, rel, name, dfd, skipped)

    monkeypatch.setattr(safefs, "_enter", swap_then_enter)
    files, skipped = manifest.manifest(root)
    assert files == {}
    assert skipped["sub"].startswith("changed during the scan")


def test_a_name_that_is_not_utf8_is_skipped_and_reported(tmp_path):
    os.makedirs(tmp_path / "root")
    with open(os.path.join(os.fsencode(tmp_path / "root"), b"caf\xe9.sls"), "w") as handle:
        handle.write("x: 1\n")
    files, skipped = manifest.manifest(tmp_path / "root")
    assert files == {} and list(skipped.values()) == ["name not valid UTF-8"]
    json.dumps(rootsread.dir_digests(files))


@pytest.mark.parametrize("sha", [None, "0" * 63, "Z" * 64, 7])
def test_a_malformed_hash_cache_entry_is_not_trusted(tree, tmp_path, counted_hashing, sha):
    cache = str(tmp_path / "cache")
    files, _ = manifest.manifest(tree, cachedir=cache)
    path = rootsread._hash_cache_path(cache, str(tree))
    with open(path, encoding="utf-8") as handle:
        hashes = json.load(handle)
    hashes["top.sls"][5] = sha
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(hashes, handle)
    counted_hashing.clear()
    again, _ = manifest.manifest(tree, cachedir=cache)
    assert [os.path.basename(p) for p in counted_hashing] == ["top.sls"]
    assert again == files


def test_a_manifest_carries_the_modes_of_the_directories_that_hold_files(tmp_path):
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "a" / "b" / "f.sls").write_text("x\n")
    for path, mode in ((root, 0o750), (root / "a", 0o700), (root / "a" / "b", 0o711)):
        path.chmod(mode)
    dirs = {}
    files, _ = manifest.manifest(root, dirs=dirs)
    assert dirs == {"": 0o750, "a": 0o700, "a/b": 0o711}
    assert manifest.digest(files, dirs) != manifest.digest(files, dict(dirs, a=0o755))
    # An empty root is no more synced than an empty directory: it equals a missing one.
    (root / "a" / "b" / "f.sls").unlink()
    dirs = {}
    assert manifest.manifest(root, dirs=dirs) == ({}, {}) and dirs == {}


@pytest.mark.parametrize("name", ["a\x01b", "tab\there", "del\x7f", "esc\x1b[0m", "\x1f"])
def test_a_name_with_a_control_character_is_unsafe(name):
    assert safefs.unsafe_name(name) == "control character in name"


@pytest.mark.parametrize("name", ["café-ü.sls", "top.sls", "a b", "~x"])
def test_a_printable_name_is_safe(name):
    assert safefs.unsafe_name(name) is None
