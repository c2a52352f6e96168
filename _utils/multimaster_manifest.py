"""
Roots trees (``file_roots``/``pillar_roots`` paths) as manifests, their digests (whole and per
directory) and what a master serves from them. Reading a tree is ``multimaster_rootsread``; a
peer's answer with its own manifests is ``multimaster_rootsanswer``; the plan that makes a peer's
roots equal to the primary's, and the checks of a peer's answers, are ``multimaster_rootsplan``;
applying that plan on the peer is ``multimaster_roots``.

A manifest maps each regular file's path relative to its root to ``{"size", "mode", "sha256"}``,
and each directory that holds one (``""``: the root itself) to its permission bits: a peer's copy
of a tree is never readable wider than the primary's.
Symlinks below a root are never followed: one in a source tree is skipped and reported, and a
scan goes through ``multimaster_safefs``, one directory at a time by fd with ``O_NOFOLLOW``. VCS
directories are skipped.
"""

import contextlib
import fnmatch
import os
import re

import multimaster_rootsread
import multimaster_rootswatch
import multimaster_safefs
import multimaster_transport


def ignored_by(opts):
    """
    A predicate on relative paths: True for those the master's file server never serves
    (``file_ignore_regex``/``file_ignore_glob``, matched as Salt's ``roots`` backend matches
    them). ``sync_roots`` neither copies nor deletes them.

    opts
        The master's opts.
    """
    patterns = list(opts.get("file_ignore_regex") or [])
    regexes = [re.compile(r) for r in patterns]
    globs = list(opts.get("file_ignore_glob") or [])
    if not regexes and not globs:
        return None

    def ignored(rel):
        return any(r.search(rel) for r in regexes) or any(fnmatch.fnmatch(rel, g) for g in globs)

    # What a kept snapshot was read with: other patterns, another tree.
    ignored.key = [patterns, globs]
    return ignored


def manifest(root, ignored=None, cachedir=None, dirs=None, how=None, by_dir=None):
    """
    ``(files, skipped)`` of the tree at ``root``: ``files`` maps relative paths to
    ``{"size", "mode", "sha256"}``; ``skipped`` maps relative paths to the reason (symlink,
    special file, unsafe name). A missing root is an empty tree.

    root
        The root directory (a ``file_roots``/``pillar_roots`` path).

    ignored
        A predicate (from ``ignored_by``): files it matches are left out, not reported.

    cachedir
        The master's cachedir: a file whose device, inode, size, mtime and ctime are those it
        had when it was last hashed there is not read again (``ctime`` cannot be set back, so
        content rewritten with its old size and mtime is hashed again). Where the
        ``multimaster_rootswatch`` engine keeps a record of the root, only the directories
        changed since the last read are read (``multimaster_rootsread``).

    dirs
        A dict to fill with the permission bits of each directory that holds a listed file,
        below it or directly, the root (``""``) included (empty directories are not synced).

    how
        A dict to fill with ``watched``: whether the read went through the roots watch's
        record (for a missing root, which nothing reads: whether the engine runs).

    by_dir
        A dict to fill with the tree's ``dir_digests`` (a read through the record computes
        again only those of the directories it read again).
    """
    if not os.path.isdir(root):
        if how is not None:
            how["watched"] = bool(cachedir) and multimaster_rootswatch.engine_running(cachedir)
        return {}, {}
    (files, skipped, holding, digests_by_dir), watched = multimaster_rootsread.read(
        root, ignored, cachedir
    )
    if how is not None:
        how["watched"] = watched
    if dirs is not None:
        dirs.update(holding)
    if by_dir is not None:
        by_dir.update(digests_by_dir)
    return files, skipped


def manifests(opts, kinds):
    """
    ``{kind: {env: [{"path", "files", "skipped", "digest"}, ...]}}``: the manifest of each root
    of the master whose ``opts`` are given, per kind (``file_roots``/``pillar_roots``), per
    environment, in position order. ``file_roots`` leave out what the file server ignores.
    Hashes are kept in the master's cachedir (``manifest``). Each entry also holds ``dirs``,
    the modes of its directories (``manifest``), which its digest covers, ``dir_digests``
    (the digest is ``digest``'s, taken over them) and ``watched``, whether it was read
    through the roots watch's record.

    opts
        The master's opts (its own config: roots never come from an argument).

    kinds
        Which roots.
    """
    out = {}
    for kind in kinds:
        out[kind] = {}
        ignored = ignored_by(opts) if kind == "file_roots" else None
        for env, paths in (opts.get(kind) or {}).items():
            out[kind][env] = []
            for path in paths:
                dirs, how, by_dir = {}, {}, {}
                files, skipped = manifest(
                    str(path), ignored, opts.get("cachedir"), dirs, how, by_dir
                )
                out[kind][env].append(
                    {
                        "path": str(path),
                        "files": files,
                        "dirs": dirs,
                        "dir_digests": by_dir,
                        "skipped": skipped,
                        "digest": root_digest(by_dir),
                        "watched": how.get("watched", False),
                    }
                )
    return out


def digest(files, dirs=None):
    """
    One SHA-256 for a manifest's files (and directory modes): equal trees have equal digests.
    It is taken over the tree's ``dir_digests``, so that a read that computes only the changed
    directories' digests again gets the whole tree's at the cost of one more.

    files
        The ``files`` part of a manifest.

    dirs
        The directory modes of the manifest (``manifest``'s ``dirs``), when they count.
    """
    return root_digest(multimaster_rootsread.dir_digests(files, dirs))


def root_digest(by_dir):
    """
    The digest of a whole tree from its ``dir_digests`` (``digest``'s).

    by_dir
        ``{directory: digest}``.
    """
    return multimaster_rootsread.sha256_json(by_dir)


def digests(roots):
    """
    ``{kind: {env: [digest, ...]}}`` of a roots report (``manifests`` or a peer's summary):
    what two masters compare to know whether their roots are equal.

    roots
        ``{kind: {env: [{"digest", ...}, ...]}}``.
    """
    return {
        kind: {env: [r["digest"] for r in rs] for env, rs in envs.items()}
        for kind, envs in roots.items()
    }


# The most a publish may carry of one master's per-directory digests (JSON bytes): beyond it
# they are staged for each peer to pull (a peer without them would have to seal its whole
# manifest, and a Salt 3008 minion trims a return over max_event_size, 1 MiB).
DIR_DIGESTS_LIMIT = 32 * 1024
# The most a peer pulls of staged per-directory digests (JSON bytes).
DIR_DIGESTS_PULL_LIMIT = 64 * 1024 * 1024


def differing_dirs(files, theirs, dirs=None, mine=None):
    """
    The sorted directories where the manifest ``files`` and the per-directory digests
    ``theirs`` (``dir_digests`` of the other tree) disagree, including those only one side has.

    files
        The ``files`` part of this side's manifest.

    theirs
        ``{directory: digest}`` of the other side.

    dirs
        This side's directory modes.

    mine
        This side's ``dir_digests``, where they are known (``manifests`` has them): then
        ``files`` and ``dirs`` are not read.
    """
    if mine is None:
        mine = multimaster_rootsread.dir_digests(files, dirs)
    return sorted(d for d in set(mine) | set(theirs) if mine.get(d) != theirs.get(d))


def within(files, dirs):
    """
    The entries of the manifest ``files`` that sit directly in one of ``dirs``.

    files
        The ``files`` part of a manifest.

    dirs
        Directories relative to the root (``""`` is the root).
    """
    dirs = set(dirs)
    return {
        relpath: entry
        for relpath, entry in files.items()
        if multimaster_rootsread.dir_of(relpath) in dirs
    }


def modes_within(modes, dirs):
    """
    The entries of the directory modes ``modes`` for the directories ``dirs``.

    modes
        ``{directory: mode}`` (``manifest``'s ``dirs``).

    dirs
        Directories relative to the root (``""`` is the root).
    """
    dirs = set(dirs)
    return {directory: mode for directory, mode in modes.items() if directory in dirs}


ROOT_KINDS = ("file_roots", "pillar_roots")
_ROOTS_BACKENDS = frozenset(("roots", "rootsfs"))
_GIT_ROLES = ("gitfs", "git_pillar")


def real_layout(opts):
    """
    ``{kind: {env: [real path, ...]}}`` of every ``file_roots``/``pillar_roots`` path of the
    master whose ``opts`` are given (symlinks resolved): what ``multimaster_rootsplan.overlaps``
    compares.

    opts
        The master's opts.
    """
    return {
        kind: {env: [os.path.realpath(str(p)) for p in paths] for env, paths in roots.items()}
        for kind in ROOT_KINDS
        for roots in [opts.get(kind) or {}]
    }


def synced_kinds(opts, kinds=ROOT_KINDS):
    """
    ``(kinds, notes)``: which of ``kinds`` this master serves from its roots directories, and
    a note for each one served from git instead (there is nothing to copy then: every master
    fetches the same remotes, and ``status`` compares the commits they serve).

    opts
        The master's opts.

    kinds
        ``file_roots`` and/or ``pillar_roots``.
    """
    synced, notes = [], []
    backends = opts.get("fileserver_backend") or ["roots"]
    git_pillar = any(isinstance(e, dict) and "git" in e for e in opts.get("ext_pillar") or [])
    for kind in kinds:
        if kind == "file_roots" and not _ROOTS_BACKENDS.intersection(backends):
            # The formula's own backend serves transfers, not files: not worth naming here.
            serving = [name for name in backends if name != multimaster_transport.BACKEND]
            notes.append(f"file_roots: masters serve files from {serving}: nothing to sync")
        elif kind == "pillar_roots" and git_pillar:
            notes.append("pillar_roots: masters take pillar from git_pillar: nothing to sync")
        else:
            synced.append(kind)
    return synced, notes


def _read_ref(git_dir, ref):
    try:
        with open(os.path.join(git_dir, ref), encoding="ascii") as handle:
            return handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _remote_branches(git_dir):
    """
    ``{branch: sha}`` of the remote-tracking refs of ``origin`` in ``git_dir`` (loose refs win
    over ``packed-refs``, as git reads them).
    """
    prefix = "refs/remotes/origin/"
    refs = {}
    with contextlib.suppress(OSError, UnicodeDecodeError):
        with open(os.path.join(git_dir, "packed-refs"), encoding="ascii") as handle:
            for line in handle:
                sha, _, name = line.strip().partition(" ")
                if name.startswith(prefix) and len(sha) == 40:
                    refs[name[len(prefix) :]] = sha
    loose = os.path.join(git_dir, prefix)
    for directory, _dirs, names in os.walk(loose):
        for name in names:
            branch = os.path.relpath(os.path.join(directory, name), loose)
            sha = _read_ref(git_dir, prefix + branch)
            if sha and len(sha) == 40:
                refs[branch] = sha
    refs.pop("HEAD", None)
    return dict(sorted(refs.items()))


def served_commits(opts):
    """
    ``{role: {remote: {branch: sha}}}``: the commits this master's gitfs and git_pillar
    checkouts hold for each remote (read from ``remote_map.txt`` and the refs in its cachedir;
    no git library needed). Empty when the master serves nothing from git.

    opts
        The master's opts.
    """
    served = {}
    for role in _GIT_ROLES:
        cache_root = os.path.join(opts["cachedir"], role)
        try:
            with open(os.path.join(cache_root, "remote_map.txt"), encoding="utf-8") as handle:
                lines = [line.strip() for line in handle if not line.startswith("#")]
        except OSError:
            continue
        for line in lines:
            basehash, sep, remote = line.partition(" = ")
            if not sep or multimaster_safefs.unsafe_name(basehash):
                continue
            branches = {}
            with contextlib.suppress(OSError):
                for checkout in sorted(os.listdir(os.path.join(cache_root, basehash))):
                    git_dir = os.path.join(cache_root, basehash, checkout, ".git")
                    branches.update(_remote_branches(git_dir))
            served.setdefault(role, {})[remote] = branches
    return served


# What ``manifests`` reads of a master's opts.
MANIFEST_OPTS = ("file_roots", "pillar_roots", "file_ignore_regex", "file_ignore_glob", "cachedir")


# How many skipped entries and failures a return lists; counts are always complete.
SAMPLE = 50
