"""
Roots trees: manifests skip what must not move, plans mirror the source, and writes stay inside
the root whatever names or symlinks an attacker arranged.
"""

import json
import os
import pathlib
import stat
import subprocess
import time

import multimaster_roots as roots
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
    files, skipped = roots.manifest(tree)
    assert sorted(files) == ["blob.bin", "empty", "nested/deep/run.sh", "top.sls", "with space.sls"]
    assert files["nested/deep/run.sh"]["mode"] == 0o755
    assert files["empty"]["size"] == 0
    assert skipped == {
        "link-out": "symlink (never followed)",
        "etc": "symlink (never followed)",
        "new\nline": "control character in name",
    }


def test_a_missing_root_is_an_empty_tree(tmp_path):
    assert roots.manifest(tmp_path / "nope") == ({}, {})


def test_plan_mirrors_the_source():
    entry = {"size": 1, "mode": 0o644, "sha256": "a" * 64}
    source = {"same": entry, "new": entry, "edited": entry, "chmod": dict(entry, mode=0o755)}
    target = {"same": entry, "edited": dict(entry, sha256="b" * 64), "chmod": entry, "stale": entry}
    assert roots.plan(source, target) == {
        "add": ["new"],
        "change": ["edited"],
        "mode": ["chmod"],
        "delete": ["stale"],
    }


def test_digest_is_equal_for_equal_trees_only(tree, tmp_path):
    files, _ = roots.manifest(tree)
    dst = tmp_path / "dst"
    for rel, info in files.items():
        with open(tree / rel, "rb") as handle:
            safefs.write_file(dst, rel, [handle.read()], info["mode"])
    copied, _ = roots.manifest(dst)
    assert roots.digest(copied) == roots.digest(files)
    safefs.set_mode(dst, "top.sls", 0o600)
    assert roots.digest(roots.manifest(dst)[0]) != roots.digest(files)


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


def test_a_symlinked_root_is_the_administrators_choice_and_followed(tmp_path):
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real)
    safefs.write_file(link, "x", [b"x"], 0o644)
    assert (real / "x").read_bytes() == b"x"
    assert sorted(roots.manifest(link)[0]) == ["x"]


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
    synced, notes = roots.synced_kinds(opts)
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
    served = roots.served_commits({"cachedir": str(cache)})  # a fresh clone: packed refs
    assert served == {"gitfs": {f"file://{origin}": {"main": first, "prod": first}}}

    (origin / "top.sls").write_text("base: {'*': [web]}\n")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "two", cwd=origin)
    git("fetch", "-q", "origin", cwd=checkout)  # a fetch writes the moved ref loose
    assert (checkout / ".git" / "refs" / "remotes" / "origin" / "main").exists()
    second = rev("origin/main")
    assert second != first
    served = roots.served_commits({"cachedir": str(cache)})
    assert served == {"gitfs": {f"file://{origin}": {"main": second, "prod": first}}}
    assert roots.served_commits({"cachedir": str(tmp_path / "none")}) == {}


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
    found = roots.manifests(opts, ["file_roots", "pillar_roots"])
    served = found["file_roots"]["base"][0]
    assert set(served["files"]) == {"web/init.sls"} and served["skipped"] == {}
    pillar = found["pillar_roots"]["base"][0]
    assert set(pillar["files"]) == {"web/init.sls", "web/init.pyc", ".venv/lib.py"}
    assert pillar["skipped"] == {".venv/bin/python": "symlink (never followed)"}
    assert roots.ignored_by({}) is None


def test_a_batch_of_writes_syncs_each_directory_once_and_never_through_a_link(tmp_path):
    synced = set()
    for rel in ("a/b/one.sls", "a/b/two.sls", "top.sls"):
        safefs.write_file(tmp_path, rel, [b"x"], 0o644, synced_dirs=synced)
    assert synced == {("a", "b"), ()}
    safefs.sync_dirs(tmp_path, synced)
    (tmp_path / "a" / "b").rename(tmp_path / "a" / "moved")
    (tmp_path / "a" / "b").symlink_to("/etc")
    with pytest.raises(safefs.SafeFsError, match="not a plain directory"):
        safefs.sync_dirs(tmp_path, {("a", "b")})


def test_the_note_names_the_backends_that_serve_files():
    _, notes = roots.synced_kinds({"fileserver_backend": ["gitfs", "multimaster"]}, ["file_roots"])
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
    monkeypatch.setattr(roots, "_RACY_NS", 0)
    return hash_reads


def test_an_unchanged_file_is_hashed_once_per_master_cachedir(tree, tmp_path, counted_hashing):
    cache = tmp_path / "cache"
    first = roots.manifest(tree, cachedir=str(cache))
    assert len(counted_hashing) == 5
    counted_hashing.clear()
    assert roots.manifest(tree, cachedir=str(cache)) == first
    assert counted_hashing == []
    # Another master's cachedir knows nothing of it.
    assert roots.manifest(tree, cachedir=str(tmp_path / "other")) == first
    assert len(counted_hashing) == 5


def test_content_rewritten_with_its_old_size_and_mtime_is_hashed_again(
    tree, tmp_path, counted_hashing
):
    cache = str(tmp_path / "cache")
    before = roots.manifest(tree, cachedir=cache)[0]["top.sls"]
    time.sleep(0.05)  # past the kernel's timestamp tick (coarse: up to 10 ms)
    path = tree / "top.sls"
    info = path.stat()
    path.write_text("base: {'*': [evil]}\n"[: info.st_size].ljust(info.st_size))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert path.stat().st_size == info.st_size and path.stat().st_mtime_ns == info.st_mtime_ns
    after = roots.manifest(tree, cachedir=cache)[0]["top.sls"]
    assert after["sha256"] != before["sha256"]
    assert after["sha256"] == safefs.sha256_file(str(path))


def test_a_file_changed_just_now_is_not_trusted_to_the_cache(tree, tmp_path, hash_reads):
    cache = str(tmp_path / "cache")
    roots.manifest(tree, cachedir=cache)
    hash_reads.clear()
    roots.manifest(tree, cachedir=cache)
    assert len(hash_reads) == 5


def test_a_damaged_hash_cache_is_ignored_and_replaced(tree, tmp_path, counted_hashing):
    cache = tmp_path / "cache"
    truth = roots.manifest(tree)
    path = pathlib.Path(roots._hash_cache_path(str(cache), str(tree)))
    for damaged in ("not json", "[1, 2]", '{"top.sls": "x", "empty": [1]}'):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(damaged)
        assert roots.manifest(tree, cachedir=str(cache)) == truth
        assert len(json.loads(path.read_text())) == 5


def test_a_no_op_manifest_does_not_rewrite_the_cache(tree, tmp_path, counted_hashing):
    cache = str(tmp_path / "cache")
    roots.manifest(tree, cachedir=cache)
    path = pathlib.Path(roots._hash_cache_path(cache, str(tree)))
    inode = path.stat().st_ino
    roots.manifest(tree, cachedir=cache)
    assert path.stat().st_ino == inode
    (tree / "empty").unlink()
    roots.manifest(tree, cachedir=cache)
    assert "empty" not in json.loads(path.read_text())


def test_directory_digests_name_only_the_directories_that_differ(tree, tmp_path):
    primary = roots.manifest(tree)[0]
    peer = dict(primary)
    assert roots.differing_dirs(peer, roots.dir_digests(primary)) == []
    peer["nested/deep/run.sh"] = {**peer["nested/deep/run.sh"], "mode": 0o644}
    peer["stale/old.sls"] = {"size": 1, "mode": 0o644, "sha256": "0" * 64}
    del peer["top.sls"]
    assert roots.differing_dirs(peer, roots.dir_digests(primary)) == ["", "nested/deep", "stale"]
    assert sorted(roots.within(peer, ["stale", "nested/deep"])) == [
        "nested/deep/run.sh",
        "stale/old.sls",
    ]


def test_a_peer_manifest_cut_to_the_differing_directories_plans_as_the_whole_one(tree):
    dirs = {}
    files = roots.manifest(tree, dirs=dirs)[0]
    local = {
        "file_roots": {"base": [{"path": str(tree), "files": files, "dirs": dirs, "skipped": {}}]}
    }
    theirs = dict(files)
    theirs["nested/deep/run.sh"] = {**theirs["nested/deep/run.sh"], "sha256": "1" * 64}
    theirs["gone/old.sls"] = {"size": 1, "mode": 0o644, "sha256": "0" * 64}
    del theirs["blob.bin"]
    their_dirs = dict(dirs, nested=0o777, gone=0o755)
    whole = {"file_roots": {"base": [theirs]}}
    modes = {"file_roots": {"base": [their_dirs]}}
    sent = roots.published_dir_digests(local)
    cut, cut_modes, partial = roots.narrowed(whole, modes, sent)
    assert partial == {"file_roots": {"base": [["", "gone", "nested", "nested/deep"]]}}
    assert "top.sls" in cut["file_roots"]["base"][0]  # same directory as the missing blob
    assert "with space.sls" in cut["file_roots"]["base"][0]
    assert cut_modes["file_roots"]["base"][0] == roots.modes_within(
        their_dirs, partial["file_roots"]["base"][0]
    )
    assert roots.sync_plan(local, cut, cut_modes, partial) == roots.sync_plan(local, whole, modes)
    pairs, _ = roots.sync_plan(local, cut, cut_modes, partial)
    assert [w["path"] for w in pairs[0]["write"]] == ["blob.bin", "nested/deep/run.sh"]
    assert pairs[0]["delete"] == ["gone/old.sls"]
    assert pairs[0]["dirs"] == [["nested", dirs["nested"]]]
    # Digests the publish cannot carry, or garbage in their place: the whole manifest.
    assert roots.narrowed(whole, modes, None) == (
        whole,
        modes,
        {"file_roots": {"base": [None]}},
    )
    garbage = {"file_roots": {"base": [{"x": 1}]}}
    assert roots.narrowed(whole, modes, garbage)[0] == whole


def test_a_peer_s_directory_list_that_does_not_match_its_manifests_is_refused():
    files = {"file_roots": {"base": [{}]}}
    assert roots.partial_check(None, files) is None
    for bad in ({}, {"file_roots": {"base": []}}, {"file_roots": {"base": [[1]]}}):
        with pytest.raises(roots.RootsRefused):
            roots.partial_check(bad, files)


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
    files, skipped = roots.manifest(root)
    assert files == {}
    assert skipped["sub"].startswith("changed during the scan")


def test_a_name_that_is_not_utf8_is_skipped_and_reported(tmp_path):
    os.makedirs(tmp_path / "root")
    with open(os.path.join(os.fsencode(tmp_path / "root"), b"caf\xe9.sls"), "w") as handle:
        handle.write("x: 1\n")
    files, skipped = roots.manifest(tmp_path / "root")
    assert files == {} and list(skipped.values()) == ["name not valid UTF-8"]
    json.dumps(roots.dir_digests(files))


@pytest.mark.parametrize("sha", [None, "0" * 63, "Z" * 64, 7])
def test_a_malformed_hash_cache_entry_is_not_trusted(tree, tmp_path, counted_hashing, sha):
    cache = str(tmp_path / "cache")
    files, _ = roots.manifest(tree, cachedir=cache)
    path = roots._hash_cache_path(cache, str(tree))
    with open(path, encoding="utf-8") as handle:
        hashes = json.load(handle)
    hashes["top.sls"][5] = sha
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(hashes, handle)
    counted_hashing.clear()
    again, _ = roots.manifest(tree, cachedir=cache)
    assert [os.path.basename(p) for p in counted_hashing] == ["top.sls"]
    assert again == files


def test_temporary_files_an_interrupted_sync_left_are_cleared(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / ".multimaster-tmp-0123456789ab").write_text("half")
    (tmp_path / "a" / "keep.sls").write_text("x\n")
    (tmp_path / ".multimaster-tmp-link").symlink_to(tmp_path / "a" / "keep.sls")
    assert safefs.clear_temps(tmp_path) == ["a/.multimaster-tmp-0123456789ab"]
    assert sorted(os.listdir(tmp_path / "a")) == ["keep.sls"]
    assert (tmp_path / "a" / "keep.sls").read_text() == "x\n"


def test_overlaps_names_how_two_roots_share_directories():
    layout = {
        "file_roots": {"base": ["/srv/salt", "/srv/other"], "dev": ["/srv/salt"]},
        "pillar_roots": {"base": ["/srv/salt/pillar"]},
    }
    assert roots.overlaps(layout) == {
        (("file_roots", "base", 0), ("file_roots", "dev", 0)): "same",
        (("file_roots", "base", 0), ("pillar_roots", "base", 0)): "contains",
        (("file_roots", "dev", 0), ("pillar_roots", "base", 0)): "contains",
    }
    assert roots.overlaps({"file_roots": {"base": ["/srv/salt", "/srv/salted"]}}) == {}


def test_a_peer_whose_roots_nest_unlike_the_primary_s_is_refused():
    # The primary keeps pillar beside the states; the peer inside them: syncing the peer's
    # file_roots would delete its pillar files as extra, and the pillar sync write them back.
    apart = {"file_roots": {"base": ["/p/salt"]}, "pillar_roots": {"base": ["/p/pillar"]}}
    nested = {"file_roots": {"base": ["/q/salt"]}, "pillar_roots": {"base": ["/q/salt/pillar"]}}
    summary = {"m1": {"real": apart}, "m2": {"real": nested}}
    with pytest.raises(roots.RootsRefused) as refused:
        roots.check_overlaps("m1", summary)
    message = str(refused.value)
    assert "'/q/salt/pillar'" in message and "the second inside the first on m2" in message
    assert "apart on m1" in message and "nothing written" in message
    # Nested alike on both sides mirrors fine; so do roots apart on the peer (the demo lab's
    # primary serves the formula checkout, which holds its second root).
    roots.check_overlaps("m1", {"m1": {"real": nested}, "m2": {"real": nested}})
    roots.check_overlaps("m1", {"m1": {"real": nested}, "m2": {"real": apart}})


def test_a_manifest_carries_the_modes_of_the_directories_that_hold_files(tmp_path):
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "a" / "b" / "f.sls").write_text("x\n")
    for path, mode in ((root, 0o750), (root / "a", 0o700), (root / "a" / "b", 0o711)):
        path.chmod(mode)
    dirs = {}
    files, _ = roots.manifest(root, dirs=dirs)
    assert dirs == {"": 0o750, "a": 0o700, "a/b": 0o711}
    assert roots.digest(files, dirs) != roots.digest(files, dict(dirs, a=0o755))
    # An empty root is no more synced than an empty directory: it equals a missing one.
    (root / "a" / "b" / "f.sls").unlink()
    dirs = {}
    assert roots.manifest(root, dirs=dirs) == ({}, {}) and dirs == {}


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


def test_the_directory_plan_names_what_is_missing_or_of_another_mode():
    source = {"": 0o700, "a": 0o700, "a/b": 0o755}
    target = {"": 0o755, "a": 0o700, "stale": 0o777}
    assert roots.dir_plan(source, target) == [["", 0o700], ["a/b", 0o755]]


@pytest.mark.parametrize(
    "modes",
    [None, {}, {"file_roots": {"base": []}}, {"file_roots": {"base": [{"a": "0755"}]}}],
)
def test_a_peer_s_directory_modes_that_do_not_match_its_manifests_are_refused(modes):
    files = {"file_roots": {"base": [{}]}}
    assert roots.modes_check({"file_roots": {"base": [{"": 0o700}]}}, files)
    with pytest.raises(roots.RootsRefused, match="directory modes"):
        roots.modes_check(modes, files)


def test_differences_name_file_roots_paths_and_count_pillar_ones():
    entry = {"size": 1, "mode": 0o644, "sha256": "0" * 64}
    files = {"a.sls": entry, "b.sls": entry, "d/c.sls": entry}
    theirs = {"a.sls": {**entry, "sha256": "1" * 64}, "b.sls": {**entry, "mode": 0o600}, "x": entry}
    modes, their_modes = {"": 0o755, "d": 0o755}, {"": 0o700}
    assert roots.differences(files, modes, theirs, their_modes, shown=50) == {
        "missing": ["d/c.sls"],
        "changed": ["a.sls"],
        "mode": ["b.sls"],
        "extra": ["x"],
        "dir_mode": [""],
    }
    assert roots.differences(files, modes, theirs, their_modes, shown=50, named=False) == {
        "missing": 1,
        "changed": 1,
        "mode": 1,
        "extra": 1,
        "dir_mode": 1,
    }
    assert roots.differences(files, modes, files, modes, shown=50) == {}
