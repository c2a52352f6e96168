"""
Roots trees (``file_roots``/``pillar_roots`` paths) as manifests, their digests (whole and per
directory), what a master serves from them, and a peer's answer with its own manifests. The plan
that makes a peer's roots equal to the primary's, and the checks of a peer's answers, are
``multimaster_rootsplan``; applying that plan on the peer is ``multimaster_roots``.

A manifest maps each regular file's path relative to its root to ``{"size", "mode", "sha256"}``,
and each directory that holds one (``""``: the root itself) to its permission bits: a peer's copy
of a tree is never readable wider than the primary's.
Symlinks below a root are never followed: one in a source tree is skipped and reported, and a
scan goes through ``multimaster_safefs``, one directory at a time by fd with ``O_NOFOLLOW``. VCS
directories are skipped.
"""

import contextlib
import fnmatch
import hashlib
import json
import logging
import os
import re
import stat
import time

import multimaster_daemon
import multimaster_rootswatch
import multimaster_safefs
import multimaster_seal
import multimaster_transport
import salt.utils.atomicfile
from salt.exceptions import CommandExecutionError

log = logging.getLogger(__name__)

# A file changed this recently is hashed again next time: a second write within one timestamp
# tick would leave its size, mtime and ctime as they were.
_RACY_NS = 2 * 10**9


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


def per_root_path(cachedir, kept, root, suffix=".json"):
    """
    The file in ``<cachedir>/multimaster/<kept>`` that holds what is kept of ``root``: named
    by the SHA-256 of its absolute path.
    """
    name = hashlib.sha256(os.path.abspath(root).encode()).hexdigest()
    return os.path.join(cachedir, "multimaster", kept, name + suffix)


def _hash_cache_path(cachedir, root):
    return per_root_path(cachedir, "roots-hashes", root)


def _load_hashes(path):
    """
    ``{relpath: [dev, ino, size, mtime_ns, ctime_ns, sha256]}`` from a hash cache; an
    unreadable or malformed one is an empty cache (everything is hashed again).
    """
    try:
        with open(path, encoding="utf-8") as handle:
            hashes = json.load(handle)
    except (OSError, ValueError):
        return {}
    return hashes if isinstance(hashes, dict) else {}


def save_json(path, document):
    """
    Replace the cache file at ``path`` (a hash cache, a snapshot or the roots base, in the
    master's 0700 cachedir) atomically; one that cannot be written only costs the next run
    its reading.
    """
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        # One string, then one write: json.dump writes each of its many chunks on its own.
        text = json.dumps(document, separators=(",", ":"))
        with salt.utils.atomicfile.atomic_open(path, "w") as handle:
            handle.write(text)
    except OSError:
        pass


def _stat_key(info):
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def _cached_sha(cached, key):
    """
    The SHA-256 a hash cache entry holds for a file whose stat key is ``key``; None when the
    entry is for another state of the file or not well formed (then the file is read again).
    """
    if not isinstance(cached, list) or len(cached) != 6 or cached[:5] != key:
        return None
    sha = cached[5]
    return sha if isinstance(sha, str) and _SHA256_HEX.fullmatch(sha) else None


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
        changed since the last read are read (``_read_with_record``).

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
    read = _read_with_record(root, ignored, cachedir) if cachedir else None
    if how is not None:
        how["watched"] = read is not None
    if read is None:
        read = _read_with_hash_cache(root, ignored, cachedir)
    files, skipped, holding, digests_by_dir = read
    if dirs is not None:
        dirs.update(holding)
    if by_dir is not None:
        by_dir.update(digests_by_dir)
    return files, skipped


def _scanned(rel, entry, dfd, known, skipped):
    """
    The record ``[dev, ino, size, mtime_ns, ctime_ns, sha256, mode]`` of the file ``entry``
    (``rel``), its hash taken from ``known`` where its stat key is the one recorded there;
    None (and the reason in ``skipped``) when it changed while it was read.
    """
    info = entry.stat(follow_symlinks=False)
    key = _stat_key(info)
    sha = _cached_sha(known.get(rel), key)
    if sha is None:
        try:
            sha = multimaster_safefs.sha256_fd(
                multimaster_safefs.open_regular(entry.name, dfd, expect=info)
            )
        except OSError as exc:
            skipped[rel] = f"changed during the scan ({exc.strerror or exc})"
            return None
    return [*key, sha, stat.S_IMODE(info.st_mode) & 0o777]


def _racy(record, trusted_before):
    return max(record[3], record[4]) >= trusted_before


def _as_files(records):
    return {rel: {"size": r[2], "mode": r[6], "sha256": r[5]} for rel, r in records.items()}


def _read_with_hash_cache(root, ignored, cachedir):
    """
    ``(files, skipped, holding, by_dir)`` of the whole tree (``holding``: the modes of the
    directories that hold a file, ``by_dir``: its ``dir_digests``), hashes kept in
    ``cachedir``.
    """
    skipped, modes, records = {}, {}, {}
    cache_path = _hash_cache_path(cachedir, root) if cachedir else None
    known = _load_hashes(cache_path) if cache_path else {}
    trusted_before = time.time_ns() - _RACY_NS
    for rel, entry, dfd in multimaster_safefs.walk(root, skipped, ignored, dirs=modes):
        record = _scanned(rel, entry, dfd, known, skipped)
        if record is not None:
            records[rel] = record
    fresh = {rel: r[:6] for rel, r in records.items() if not _racy(r, trusted_before)}
    if cache_path and fresh != known:
        save_json(cache_path, fresh)
    files = _as_files(records)
    holding = _holding(files, modes)
    return files, skipped, holding, dir_digests(files, holding)


# --- reading what changed, from the record the roots watch keeps ------------------------------

# Beyond this many changed directories a read walks the whole tree (still hashing only what
# changed): dropping each one's entries from the snapshot would cost more.
_MOST_DIRS = 256


def _snapshot_path(cachedir, root):
    return per_root_path(cachedir, "roots-snapshots", root)


def _load_snapshot(path):
    try:
        with open(path, encoding="utf-8") as handle:
            snapshot = json.load(handle)
    except (OSError, ValueError):
        return {}
    fields = {"instance": str, "seq": int, "records": dict, "skipped": dict, "modes": dict}
    if not isinstance(snapshot, dict) or any(
        not isinstance(snapshot.get(k), t) for k, t in fields.items()
    ):
        return {}
    by_dir = snapshot.get("by_dir")
    if not isinstance(by_dir, dict) or not all(
        isinstance(v, str) and _SHA256_HEX.fullmatch(v) for v in by_dir.values()
    ):
        snapshot["by_dir"] = None
    return snapshot


def _read_with_record(root, ignored, cachedir):
    """
    ``(files, skipped, holding, by_dir)`` (as ``_read_with_hash_cache``) of the tree at
    ``root`` from the snapshot of its last read, with the directories the roots watch's record
    names as changed since read again (all of it where the record cannot say:
    ``multimaster_rootswatch.usable``), and only their digests computed again; None where no
    engine watches the root. The snapshot (the master's 0700 cachedir) is then brought to the
    record's number.
    """
    path = _snapshot_path(cachedir, root)
    snapshot = _load_snapshot(path)
    answer = multimaster_rootswatch.changes_since(cachedir, snapshot.get("seq", 0))
    try:
        info = os.stat(root)
    except OSError:
        return None
    identity = [info.st_dev, info.st_ino]
    watched = ((answer or {}).get("roots") or {}).get(root)
    if not isinstance(watched, dict) or not watched.get("watched"):
        return None
    ignore_key = getattr(ignored, "key", None)
    changed = None
    if snapshot.get("ignore") == ignore_key and snapshot.get("identity") == identity:
        changed = multimaster_rootswatch.usable(
            answer, root, snapshot["seq"], snapshot["instance"], identity
        )
    trusted_before = time.time_ns() - _RACY_NS
    before, racy = _snapshot_records(snapshot)
    todo = _to_read(changed)
    if not todo and snapshot.get("by_dir") is not None:
        return _as_snapshot_stands(snapshot, before)
    # A stat key says whether a file is the one hashed, whatever the record says; the key of
    # one written too recently (racy) may also be that of its next write.
    known = {rel: r[:6] for rel, r in before.items() if rel not in racy} or _load_hashes(
        _hash_cache_path(cachedir, root)
    )
    if changed is None:
        records, skipped, modes = {}, {}, {}
    else:
        records, skipped, modes = _dropped(
            before, dict(snapshot["skipped"]), dict(snapshot["modes"]), todo
        )
    for below, subtree in todo.items():
        for rel, entry, dfd in multimaster_safefs.walk(
            root, skipped, ignored, dirs=modes, below=below, recursive=subtree
        ):
            record = _scanned(rel, entry, dfd, known, skipped)
            if record is not None:
                records[rel] = record
    files = _as_files(records)
    holding = _holding(files, modes)
    by_dir = _dir_digests_reusing(files, holding, snapshot.get("by_dir"), _reread_by(todo))
    # Nothing read again: the snapshot still stands at its number (later ones name nothing
    # of this root).
    if todo or snapshot.get("by_dir") is None:
        save_json(
            path,
            {
                "instance": answer["instance"],
                "seq": answer["seq"],
                "identity": identity,
                "ignore": ignore_key,
                "records": records,
                "skipped": skipped,
                "modes": modes,
                "by_dir": by_dir,
                "racy": sorted(r for r, v in records.items() if _racy(v, trusted_before)),
            },
        )
    return files, skipped, holding, by_dir


def _as_snapshot_stands(snapshot, records):
    """
    What ``_read_with_record`` returns when nothing changed since the ``snapshot`` (its
    well-formed ``records``): the snapshot as it is.
    """
    by_dir, modes = snapshot["by_dir"], snapshot["modes"]
    holding = {directory: modes[directory] for directory in by_dir if directory in modes}
    return _as_files(records), dict(snapshot["skipped"]), holding, by_dir


def _snapshot_records(snapshot):
    """``(records, racy)`` of a snapshot: its well-formed file records, the too-recent ones."""
    records = {
        rel: r
        for rel, r in (snapshot.get("records") or {}).items()
        if isinstance(r, list) and len(r) == 7
    }
    return records, set(snapshot.get("racy") or []) if records else set()


def _to_read(changed):
    """
    ``{directory: subtree}`` to read again: the changed ones (the whole tree where ``changed``
    is None or names more than ``_MOST_DIRS``), none inside a subtree read in full. A file
    written too recently to trust its stat needs no read of its own: a later write to it is in
    the record, and a read of its directory hashes it again (``racy``).
    """
    if changed is None:
        return {"": True}
    todo = {d: bool(s) for d, s in changed.items() if isinstance(d, str)}
    if len(todo) > _MOST_DIRS:
        return {"": True}
    subtrees = sorted(d for d, s in todo.items() if s)
    if "" in subtrees:
        return {"": True}
    return {
        d: s
        for d, s in todo.items()
        if not any(d != t and (d + "/").startswith(t + "/") for t in subtrees)
    }


def _reread_by(todo):
    """A predicate: is a directory (relative path) read again by the read of ``todo``?"""
    if todo.get(""):
        return lambda directory: True
    flat = {d for d, s in todo.items() if not s}
    subtrees = {d for d, s in todo.items() if s}
    prefixes = tuple(d + "/" for d in subtrees)

    def reread(directory):
        return directory in flat or directory in subtrees or directory.startswith(prefixes)

    return reread


def _dropped(records, skipped, modes, todo):
    """``records``, ``skipped`` and ``modes`` without what ``todo`` reads again."""
    if todo.get(""):
        return {}, {}, {}
    reread = _reread_by(todo)
    return (
        {rel: r for rel, r in records.items() if not reread(_dir_of(rel))},
        {rel: why for rel, why in skipped.items() if not reread(_dir_of(rel))},
        {d: m for d, m in modes.items() if not reread(d)},
    )


def _dir_digests_reusing(files, holding, known, reread):
    """
    ``dir_digests(files, holding)``, with the digest ``known`` holds for each directory that
    was not read again (``reread``): its files and mode are those ``known`` was computed from.
    """
    keys = set(holding)
    keys.update(_dir_of(relpath) for relpath in files)
    stale = {d for d in keys if reread(d) or d not in (known or {})}
    groups = {directory: {} for directory in stale}
    for relpath, entry in files.items():
        group = groups.get(_dir_of(relpath))
        if group is not None:
            group[relpath] = entry
    out = {d: known[d] for d in keys if d not in stale}
    out.update(
        (d, _sha256_json({"files": group, "mode": holding.get(d)})) for d, group in groups.items()
    )
    return out


def _holding(files, modes):
    """
    The entries of ``modes`` (``{directory: mode}``) for the directories that hold one of
    ``files``, the root (``""``) among them unless the tree is empty: an empty root is no more
    synced than an empty directory, and equals a missing one.
    """
    wanted = set()
    for directory in {_dir_of(relpath) for relpath in files}:
        parts = directory.split("/") if directory else []
        wanted.update("/".join(parts[:depth]) for depth in range(len(parts) + 1))
    return {directory: mode for directory, mode in modes.items() if directory in wanted}


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


def _sha256_json(document):
    return hashlib.sha256(
        json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


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
    return root_digest(dir_digests(files, dirs))


def root_digest(by_dir):
    """
    The digest of a whole tree from its ``dir_digests`` (``digest``'s).

    by_dir
        ``{directory: digest}``.
    """
    return _sha256_json(by_dir)


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


def _dir_of(relpath):
    return relpath.rpartition("/")[0]


def dir_digests(files, dirs=None):
    """
    ``{directory: digest}`` of a manifest's files grouped by the directory that holds them
    (``""`` for the root), each with that directory's mode: two trees differ only in the
    directories whose digests differ.

    files
        The ``files`` part of a manifest.

    dirs
        Its directory modes (``manifest``'s ``dirs``).
    """
    dirs = dirs or {}
    groups = {directory: {} for directory in dirs}
    for relpath, entry in files.items():
        groups.setdefault(_dir_of(relpath), {})[relpath] = entry
    return {
        directory: _sha256_json({"files": group, "mode": dirs.get(directory)})
        for directory, group in groups.items()
    }


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
        mine = dir_digests(files, dirs)
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
    return {relpath: entry for relpath, entry in files.items() if _dir_of(relpath) in dirs}


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


# --- a peer's answer (run by a control minion) ---

# How many skipped entries and failures a return lists; counts are always complete.
SAMPLE = 50


def summarized_manifests(mopts, kinds):
    """
    ``(roots, files, modes, by_dir)`` of this master's ``kinds``: per kind, env and position
    the root's path, digest, file count and skipped entries (``_summary``); and the file
    manifests, directory modes and per-directory digests in the same shape.
    """
    found = manifests(mopts, kinds)
    roots = {
        kind: {env: [_summary(kind, r) for r in rs] for env, rs in envs.items()}
        for kind, envs in found.items()
    }
    files, modes, by_dir = (
        {
            kind: {env: [r[part] for r in rs] for env, rs in envs.items()}
            for kind, envs in found.items()
        }
        for part in ("files", "dirs", "dir_digests")
    )
    return roots, files, modes, by_dir


def _summary(kind, root):
    """
    What a return may say of one root's manifest: its path, digest, file count, whether it was
    read through the roots watch's record and how many entries were skipped, with a sample of
    those (path and why) for ``file_roots`` only: the names of pillar files are for sealed
    manifests.
    """
    summary = {
        "path": root["path"],
        "digest": root["digest"],
        "count": len(root["files"]),
        "skipped_count": len(root["skipped"]),
        "watched": root.get("watched", False),
    }
    if kind != "pillar_roots":
        summary["skipped"] = dict(list(root["skipped"].items())[:SAMPLE])
    return summary


# The most one answer carries of a peer's manifests where they are cut to directories (JSON
# bytes of their entries): sealed and base64-encoded they stay well under Salt's
# max_event_size (1 MiB), past which a Salt 3008 minion trims a return.
ANSWER_LIMIT = 384 * 1024


class AnswerBudget:
    """
    How much of the differing directories' manifests one answer may carry (``limit`` JSON
    bytes): the directories after the first that does not fit are left out, and counted in
    ``left``, for the runner's next round. The first directory of an answer always fits (a
    round always makes progress).
    """

    def __init__(self, limit=None):
        self.room = ANSWER_LIMIT if limit is None else limit
        self.taken = 0
        self.left = 0

    def take(self, where, files):
        """
        The leading directories of ``where`` (sorted) whose entries of ``files`` still fit.
        """
        # Only the directories asked for are costed: a no-op asks for none of 30,000 files.
        cost = dict.fromkeys(where, 0)
        if cost:
            for relpath, entry in files.items():
                directory = _dir_of(relpath)
                if directory in cost:
                    cost[directory] += len(relpath) + len(json.dumps(entry)) + 8
        kept = []
        for directory in where:
            need = cost.get(directory, 0) + len(directory) + 8
            if self.left or (self.taken and need > self.room):
                self.left += 1
                continue
            self.room -= need
            self.taken += 1
            kept.append(directory)
        return kept


def narrowed(files, modes, dirs, budget=None, by_dir=None):
    """
    ``(files, modes, partial)`` in the shape of ``files``: each root's manifest and directory
    modes cut down to the directories whose digests differ from the primary's ``dirs`` (the
    directories themselves in ``partial``), as many as ``budget`` (an ``AnswerBudget``) lets
    one answer carry; or whole (``None`` in ``partial``) where ``dirs`` says nothing usable.
    ``by_dir``: this side's per-directory digests in the same shape, where they are known.
    """
    budget = budget or AnswerBudget(float("inf"))
    cut_files, cut_modes, partial = {}, {}, {}
    for kind, envs in files.items():
        for env, roots in envs.items():
            theirs = dirs.get(kind, {}).get(env) if isinstance(dirs, dict) else None
            for index, manifest in enumerate(roots):
                mine = modes[kind][env][index]
                their_digests = (
                    theirs[index] if isinstance(theirs, list) and index < len(theirs) else None
                )
                if not isinstance(their_digests, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in their_digests.items()
                ):
                    cut, where = manifest, None
                else:
                    own = by_dir[kind][env][index] if by_dir else None
                    where = budget.take(
                        differing_dirs(manifest, their_digests, mine, own), manifest
                    )
                    cut = within(manifest, where)
                    mine = modes_within(mine, where)
                cut_files.setdefault(kind, {}).setdefault(env, []).append(cut)
                cut_modes.setdefault(kind, {}).setdefault(env, []).append(mine)
                partial.setdefault(kind, {}).setdefault(env, []).append(where)
    return cut_files, cut_modes, partial


def staged_dir_digests(dirs, master_id, pull):
    """
    The primary's per-directory digests as ``roots_manifest`` got them in ``dirs``: as they
    are, or, for ``{"staged": {master id: transfer descriptor}}``, those staged for
    ``master_id``, pulled with ``pull``. None when none were staged for it or the pull fails
    (the peer then seals its whole manifest, as without digests).

    dirs
        The ``dirs`` argument of ``roots_manifest``.

    master_id
        The id of the master this control minion serves.

    pull
        ``pull(ticket, offset)`` (``multimaster_transport.ContentPull`` in a job).
    """
    staged = dirs.get("staged") if isinstance(dirs, dict) else None
    if not isinstance(staged, dict):
        return dirs
    descriptor = staged.get(master_id)
    if descriptor is None:
        return None
    try:
        return multimaster_transport.pulled_json(
            descriptor, DIR_DIGESTS_PULL_LIMIT, "directory digests", pull
        )
    except CommandExecutionError as exc:
        log.warning("multimaster: the primary's directory digests could not be pulled: %s", exc)
        return None


def digests_from_deltas(dirs, mine, theirs, by_dir):
    """
    The primary's per-directory digests of the roots of ``by_dir``, with no pull: a root whose
    digest is the primary's is equal to it, and one at the base of its ``delta`` (beside the
    staged digests in ``dirs``: ``multimaster_rootsbase``) differs from it in the delta's
    directories only. None when a root is neither: the peer pulls the full digests.

    dirs
        The ``dirs`` argument of ``roots_manifest``.

    mine
        This master's root digests (``digests``).

    theirs
        The primary's (``roots_manifest``'s ``unless``).

    by_dir
        ``{kind: {env: [dir_digests, ...]}}`` of this master's published roots that differ.
    """
    deltas = dirs.get("delta") if isinstance(dirs, dict) else None
    if not isinstance(deltas, dict):
        return None
    out = {}
    for kind, envs in by_dir.items():
        for env, roots in envs.items():
            for index, own in enumerate(roots):
                digest = mine[kind][env][index]
                if digest == _nth(theirs, kind, env, index):
                    known = own
                else:
                    known = _delta_applied(_nth(deltas, kind, env, index), digest, own)
                if known is None:
                    return None
                out.setdefault(kind, {}).setdefault(env, []).append(known)
    return out


def _nth(tree, kind, env, index):
    """``tree[kind][env][index]`` of a publish's argument; None where it has no such entry."""
    envs = tree.get(kind) if isinstance(tree, dict) else None
    roots = envs.get(env) if isinstance(envs, dict) else None
    return roots[index] if isinstance(roots, list) and index < len(roots) else None


def _delta_applied(delta, digest, own):
    """
    The primary's per-directory digests of a root from its ``delta``, where this master's root
    (``digest``, per-directory ``own``) is at the delta's base; else None.
    """
    if not isinstance(delta, dict) or delta.get("base") != digest:
        return None
    changed = delta.get("dirs")
    if not isinstance(changed, dict) or not all(
        isinstance(v, str) or v is None for v in changed.values()
    ):
        return None
    return {d: v for d, v in {**own, **changed}.items() if v is not None}


def peer_manifest(
    minion_opts, master, mopts, kinds, full=False, nonce=None, unless=None, dirs=None, pull=None
):
    """
    What ``multimaster_peer.roots_manifest`` answers for ``master`` (its opts ``mopts``): the
    summaries and real paths of its roots, a fresh challenge and, with ``full``, the manifests
    of the kinds that differ from ``unless``, cut to ``dirs`` and sealed to the master that
    asked, bound to its ``nonce``. ``pull``: the job's ``multimaster_transport.puller``, where
    ``dirs`` were staged (``staged_dir_digests``) and their ``delta`` does not give them
    (``digests_from_deltas``). ``restart_pending`` answers what
    ``master_settled`` would, so that a sync needs no settle round of its own
    (``multimaster_control.settled_round``).
    """
    roots, files, modes, by_dir = summarized_manifests(
        mopts, [kind for kind in kinds if kind in ROOT_KINDS]
    )
    ret = {
        "roots": roots,
        "real": real_layout(mopts),
        "binding": multimaster_seal.binding(minion_opts, master),
        "restart_pending": multimaster_daemon.host_restart_pending(mopts, minion_opts["pidfile"]),
    }
    mine, theirs = digests(roots), unless if isinstance(unless, dict) else {}
    differing = {kind: envs for kind, envs in files.items() if mine[kind] != theirs.get(kind)}
    if full and differing:
        published = {kind: by_dir[kind] for kind in differing if kind != "pillar_roots"}
        known = digests_from_deltas(dirs, mine, theirs, published)
        if known is None:
            # Through the primary's file server, as the content comes (peer_run where it can't).
            with multimaster_transport.ContentPull(minion_opts, pull) as fetch:
                known = staged_dir_digests(dirs, master["id"], fetch)
        dirs = known
        budget = AnswerBudget()
        files, modes, partial = narrowed(differing, modes, dirs, budget, by_dir)
        ret["sealed"] = multimaster_seal.seal(
            {"files": files, "dir_modes": modes, "dirs": partial, "left": budget.left},
            "roots_manifest",
            master["id"],
            multimaster_seal.own_file(minion_opts, "minion_master.pub"),
            multimaster_seal.own_file(minion_opts, "minion.pem"),
            multimaster_seal.bind(nonce, master["id"], master["config_dir"]),
        )
    return ret
