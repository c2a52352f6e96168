"""
Roots trees (``file_roots``/``pillar_roots`` paths) as manifests, the difference between two,
and writes confined to one root.

A manifest maps each regular file's path relative to its root to ``{"size", "mode", "sha256"}``,
and each directory that holds one (``""``: the root itself) to its permission bits: a peer's copy
of a tree is never readable wider than the primary's. A directory a sync creates is made 0700 and
given its mode once its files are in.
Symlinks below a root are never followed on either side: one in a source tree is skipped and
reported, and a scan, a read of a staged file and a write each walk the tree one directory at a
time by fd with ``O_NOFOLLOW``, so a symlinked directory (to ``/etc`` or anywhere), even one
swapped in after the scan, is refused rather than read or written through. Only regular files
are opened (``O_NONBLOCK``: a FIFO is refused, not waited on). VCS directories are skipped.
Each file is written atomically (temp file in the same directory, fsync, rename); deletions
remove the directories they leave empty, never the root itself.
"""

import contextlib
import errno
import fcntl
import fnmatch
import hashlib
import itertools
import json
import os
import re
import stat
import time

import salt.utils.atomicfile

VCS_DIRS = frozenset((".git", ".hg", ".svn", ".bzr", "CVS"))
BLOCK = 1024 * 1024
_TMP_PREFIX = ".multimaster-tmp-"
# A file changed this recently is hashed again next time: a second write within one timestamp
# tick would leave its size, mtime and ctime as they were.
_RACY_NS = 2 * 10**9


class RootsError(OSError):
    """
    A path would leave its root, cross a symlink, or is not a safe name; nothing was written.
    The message names the path; ``reason`` says why without it (a pillar file's name is as
    secret as its content), ``errno`` is that of the failure behind it, if any.
    """

    def __init__(self, path, reason, errno_=None):
        super().__init__(f"{path!r}: {reason}")
        self.reason = reason
        self.errno = errno_


def _unsafe_name(name):
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        return "not a plain name"
    if any(ord(char) < 32 or ord(char) == 127 for char in name):
        return "control character in name"
    if name.startswith(_TMP_PREFIX):
        return "temporary file of an interrupted sync"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        # Undecodable bytes (surrogate escapes) cannot travel in a publish or a return.
        return "name not valid UTF-8"
    return None


@contextlib.contextmanager
def locked(opts):
    """
    Hold the exclusive roots lock of the master whose ``opts`` are given (in its cachedir):
    two syncs into one master's roots never interleave.

    opts
        The master's opts.
    """
    directory = os.path.join(opts["cachedir"], "multimaster")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd = os.open(
        os.path.join(directory, "roots.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600
    )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def check_relpath(relpath):
    """
    The components of ``relpath`` when it is a safe path inside a root; raises ``RootsError``.

    relpath
        A path relative to a root, ``/``-separated (no ``..``, no leading ``/``).
    """
    if not isinstance(relpath, str) or not relpath or relpath.startswith("/"):
        raise RootsError(relpath, "not a relative path")
    parts = relpath.split("/")
    for part in parts:
        reason = _unsafe_name(part)
        if reason:
            raise RootsError(relpath, reason)
    return parts


# O_NONBLOCK: a FIFO swapped in for a file must not hang the reader (it is then refused).
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_regular(name, dir_fd=None, expect=None):
    """
    A read-only fd of the regular file ``name`` (in the directory ``dir_fd``), never through a
    symlink, never of a FIFO or device; with ``expect`` (a stat result) only when it is still
    that very file. ``RootsError`` otherwise.

    name
        The file's name (or path, without ``dir_fd``).

    dir_fd
        An fd of the directory holding it.

    expect
        The stat result the file must still match (device and inode).
    """
    fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise RootsError(name, "not a regular file")
        if expect is not None and (info.st_dev, info.st_ino) != (expect.st_dev, expect.st_ino):
            raise RootsError(name, "replaced while it was read")
    except BaseException:
        os.close(fd)
        raise
    return fd


def sha256_fd(fd):
    """
    SHA-256 hex of the open file ``fd``, read in blocks from its start; closes ``fd``.

    fd
        A read-only file descriptor (from ``open_regular``).
    """
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as handle:
        for block in iter(lambda: handle.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_file(path):
    """
    SHA-256 hex of the regular file at ``path``, read in blocks.

    path
        The file (opened without following a symlink).
    """
    return sha256_fd(open_regular(path))


def open_below(root, relpath):
    """
    A read-only fd of the regular file ``relpath`` below ``root``, reached one directory at a
    time without following any symlink: a directory swapped for a link after the scan is
    refused, never read through (``RootsError``).

    root
        The root directory.

    relpath
        The file's path relative to ``root``.
    """
    *dirs, name = check_relpath(relpath)
    dfd = _open_dir(root, dirs, create=False)
    try:
        return open_regular(name, dfd)
    finally:
        os.close(dfd)


def ignored_by(opts):
    """
    A predicate on relative paths: True for those the master's file server never serves
    (``file_ignore_regex``/``file_ignore_glob``, matched as Salt's ``roots`` backend matches
    them). ``sync_roots`` neither copies nor deletes them.

    opts
        The master's opts.
    """
    regexes = [re.compile(r) for r in opts.get("file_ignore_regex") or []]
    globs = list(opts.get("file_ignore_glob") or [])
    if not regexes and not globs:
        return None
    return lambda rel: (
        any(r.search(rel) for r in regexes) or any(fnmatch.fnmatch(rel, g) for g in globs)
    )


def _hash_cache_path(cachedir, root):
    name = hashlib.sha256(os.path.abspath(root).encode()).hexdigest()
    return os.path.join(cachedir, "multimaster", "roots-hashes", f"{name}.json")


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


def _save_hashes(path, hashes):
    """
    Replace the hash cache at ``path`` atomically (in the master's 0700 cachedir); a cache
    that cannot be written only costs the next run its hashing.
    """
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with salt.utils.atomicfile.atomic_open(path, "w") as handle:
            json.dump(hashes, handle, separators=(",", ":"))
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


def manifest(root, ignored=None, cachedir=None, dirs=None):
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
        content rewritten with its old size and mtime is hashed again).

    dirs
        A dict to fill with the permission bits of each directory that holds a listed file,
        below it or directly, the root (``""``) included (empty directories are not synced).
    """
    files, skipped, modes = {}, {}, {}
    if not os.path.isdir(root):
        return files, skipped
    cache_path = _hash_cache_path(cachedir, root) if cachedir else None
    known = _load_hashes(cache_path) if cache_path else {}
    fresh, trusted_before = {}, time.time_ns() - _RACY_NS
    for rel, entry, dfd in _walk(root, skipped, ignored, dirs=modes):
        info = entry.stat(follow_symlinks=False)
        key = _stat_key(info)
        sha = _cached_sha(known.get(rel), key)
        if sha is None:
            try:
                sha = sha256_fd(open_regular(entry.name, dfd, expect=info))
            except OSError as exc:
                skipped[rel] = f"changed during the scan ({exc.strerror or exc})"
                continue
        if max(info.st_mtime_ns, info.st_ctime_ns) < trusted_before:
            fresh[rel] = [*key, sha]
        files[rel] = {
            "size": info.st_size,
            "mode": stat.S_IMODE(info.st_mode) & 0o777,
            "sha256": sha,
        }
    if cache_path and fresh != known:
        _save_hashes(cache_path, fresh)
    if dirs is not None:
        dirs.update(_holding(files, modes))
    return files, skipped


def _holding(files, modes):
    """
    The entries of ``modes`` (``{directory: mode}``) for the directories that hold one of
    ``files``, the root (``""``) among them unless the tree is empty: an empty root is no more
    synced than an empty directory, and equals a missing one.
    """
    wanted = set()
    for relpath in files:
        parts = relpath.split("/")[:-1]
        wanted.update("/".join(parts[:depth]) for depth in range(len(parts) + 1))
    return {directory: mode for directory, mode in modes.items() if directory in wanted}


def _walk(root, skipped, ignored=None, temps=None, dirs=None):
    """
    ``(relpath, entry, dir_fd)`` of each regular file below ``root`` (a ``DirEntry`` read
    through ``dir_fd``, its directory's fd, open while the caller looks at it). Directories
    are entered by fd with ``O_NOFOLLOW``, so one swapped for a symlink during the walk is
    never followed; symlinks, special files and unsafe names go into ``skipped``; VCS
    directories and what ``ignored`` matches are left out. With ``temps`` (a list), the
    relative paths of temporary files an interrupted sync left are added to it; with ``dirs``
    (a dict), the permission bits of each directory entered (``""``: the root).
    """
    stack = [("", os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW))]
    try:
        while stack:
            prefix, dfd = stack.pop()
            try:
                if dirs is not None:
                    dirs[prefix.rstrip("/")] = stat.S_IMODE(os.fstat(dfd).st_mode) & 0o777
                with os.scandir(dfd) as entries:
                    for entry in entries:
                        rel = f"{prefix}{entry.name}"
                        is_dir = entry.is_dir(follow_symlinks=False)
                        if ignored and not is_dir and ignored(rel):
                            continue
                        reason = _unsafe_name(entry.name)
                        if (
                            temps is not None
                            and entry.name.startswith(_TMP_PREFIX)
                            and entry.is_file(follow_symlinks=False)
                        ):
                            temps.append(rel)
                        elif reason:
                            skipped[rel] = reason
                        elif entry.is_symlink():
                            skipped[rel] = "symlink (never followed)"
                        elif is_dir:
                            if entry.name not in VCS_DIRS:
                                _enter(stack, rel, entry.name, dfd, skipped)
                        elif entry.is_file(follow_symlinks=False):
                            yield rel, entry, dfd
                        else:
                            skipped[rel] = "not a regular file"
            finally:
                os.close(dfd)
    finally:
        for _, dfd in stack:
            os.close(dfd)


def _enter(stack, rel, name, dfd, skipped):
    try:
        stack.append((rel + "/", os.open(name, _DIR_FLAGS, dir_fd=dfd)))
    except OSError as exc:
        skipped[rel] = f"changed during the scan ({exc.strerror or exc})"


def manifests(opts, kinds):
    """
    ``{kind: {env: [{"path", "files", "skipped", "digest"}, ...]}}``: the manifest of each root
    of the master whose ``opts`` are given, per kind (``file_roots``/``pillar_roots``), per
    environment, in position order. ``file_roots`` leave out what the file server ignores.
    Hashes are kept in the master's cachedir (``manifest``). Each entry also holds ``dirs``,
    the modes of its directories (``manifest``), which its digest covers.

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
                dirs = {}
                files, skipped = manifest(str(path), ignored, opts.get("cachedir"), dirs)
                out[kind][env].append(
                    {
                        "path": str(path),
                        "files": files,
                        "dirs": dirs,
                        "skipped": skipped,
                        "digest": digest(files, dirs),
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

    files
        The ``files`` part of a manifest.

    dirs
        The directory modes of the manifest (``manifest``'s ``dirs``), when they count.
    """
    return _sha256_json(files if dirs is None else {"files": files, "dirs": dirs})


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
# the peers send whole manifests.
DIR_DIGESTS_LIMIT = 32 * 1024


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


def differing_dirs(files, theirs, dirs=None):
    """
    The sorted directories where the manifest ``files`` and the per-directory digests
    ``theirs`` (``dir_digests`` of the other tree) disagree, including those only one side has.

    files
        The ``files`` part of this side's manifest.

    theirs
        ``{directory: digest}`` of the other side.

    dirs
        This side's directory modes.
    """
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


def plan(source, target):
    """
    What makes ``target`` equal to ``source``: ``{"add", "change", "mode", "delete"}``, sorted
    lists of relative paths (``mode``: content equal, mode differs).

    source
        The files of the primary's root.

    target
        The files of the paired root on a peer.
    """
    add = sorted(path for path in source if path not in target)
    change = sorted(
        path
        for path in source
        if path in target and source[path]["sha256"] != target[path]["sha256"]
    )
    mode = sorted(
        path
        for path in source
        if path in target
        and source[path]["sha256"] == target[path]["sha256"]
        and source[path]["mode"] != target[path]["mode"]
    )
    delete = sorted(path for path in target if path not in source)
    return {"add": add, "change": change, "mode": mode, "delete": delete}


def dir_plan(source, target):
    """
    ``[[directory, mode], ...]``, sorted: the directories of ``source`` that ``target`` lacks
    or holds with another mode, and the mode each must get.

    source
        The directory modes of the primary's root (``manifest``'s ``dirs``).

    target
        Those of the paired root on a peer.
    """
    return [[d, mode] for d, mode in sorted(source.items()) if target.get(d) != mode]


ROOT_KINDS = ("file_roots", "pillar_roots")
_ROOTS_BACKENDS = frozenset(("roots", "rootsfs"))
_GIT_ROLES = ("gitfs", "git_pillar")


def real_layout(opts):
    """
    ``{kind: {env: [real path, ...]}}`` of every ``file_roots``/``pillar_roots`` path of the
    master whose ``opts`` are given (symlinks resolved): what ``overlaps`` compares.

    opts
        The master's opts.
    """
    return {
        kind: {env: [os.path.realpath(str(p)) for p in paths] for env, paths in roots.items()}
        for kind in ROOT_KINDS
        for roots in [opts.get(kind) or {}]
    }


def overlaps(layout):
    """
    ``{(slot, slot): relation}`` for every two roots of ``layout`` (``real_layout``) that are
    not apart: ``same`` directory, the first ``inside`` the second, or the first ``contains``
    the second. A slot is ``(kind, env, position)``. Two masters whose roots overlap alike can
    be mirrored; otherwise a sync of one root would delete the other's files through it.

    layout
        ``{kind: {env: [path, ...]}}``.
    """
    slots = sorted(
        ((kind, env, index), os.path.normpath(path))
        for kind, envs in layout.items()
        for env, paths in envs.items()
        for index, path in enumerate(paths)
    )
    found = {}
    for (one, path), (other, there) in itertools.combinations(slots, 2):
        if path == there:
            found[(one, other)] = "same"
        elif path.startswith(there.rstrip("/") + "/"):
            found[(one, other)] = "inside"
        elif there.startswith(path.rstrip("/") + "/"):
            found[(one, other)] = "contains"
    return found


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
    # Imported here: the transport reads staged files through this module.
    import multimaster_transport  # pylint: disable=import-outside-toplevel

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
            if not sep or _unsafe_name(basehash):
                continue
            branches = {}
            with contextlib.suppress(OSError):
                for checkout in sorted(os.listdir(os.path.join(cache_root, basehash))):
                    git_dir = os.path.join(cache_root, basehash, checkout, ".git")
                    branches.update(_remote_branches(git_dir))
            served.setdefault(role, {})[remote] = branches
    return served


# A directory a sync makes: private until the plan gives it its mode (never wider meanwhile).
NEW_DIR_MODE = 0o700


def _open_dir(root, parts, create):
    """
    An fd of the directory ``parts`` below ``root``, walked without following any symlink;
    missing directories (and the root) are made (``NEW_DIR_MODE``) when ``create``. The root
    itself comes from the master's own config: a symlink there is the administrator's choice
    and is followed.
    """
    if create:
        # The mode is the root's own: directories made above it are outside every root.
        os.makedirs(root, mode=NEW_DIR_MODE, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            if create:
                try:
                    os.mkdir(part, NEW_DIR_MODE, dir_fd=fd)
                    # The new directory's entry is durable before any file goes in it.
                    os.fsync(fd)
                except FileExistsError:
                    pass
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                raise RootsError(
                    "/".join(parts), f"not a plain directory ({exc.strerror})", exc.errno
                ) from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_file(root, relpath, blocks, mode, expect_sha256=None, synced_dirs=None):
    """
    Write ``relpath`` below ``root`` atomically from ``blocks`` (an iterable of bytes) with
    ``mode``; returns the SHA-256 written. Never writes through a symlink or outside ``root``.
    The file is fsync'd before the rename, its directory after it (or later, by ``sync_dirs``,
    when ``synced_dirs`` collects it).

    root
        The destination root directory.

    relpath
        The file's path relative to ``root``.

    blocks
        The content, in bounded pieces.

    mode
        Permission bits (``0o644``, ``0o755`` ...).

    expect_sha256
        When given, the content must hash to it or nothing is renamed into place
        (``RootsError``).

    synced_dirs
        A set to add the file's directory to (a tuple of its parts) instead of fsyncing it
        now: a caller writing many files syncs each directory once.
    """
    *dirs, name = check_relpath(relpath)
    dfd = _open_dir(root, dirs, create=True)
    tmp = f"{_TMP_PREFIX}{os.urandom(6).hex()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
        digest_ = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as handle:
                for block in blocks:
                    digest_.update(block)
                    handle.write(block)
                handle.flush()
                os.fchmod(handle.fileno(), mode & 0o777)
                os.fsync(handle.fileno())
            if expect_sha256 is not None and digest_.hexdigest() != expect_sha256:
                raise RootsError(relpath, "content changed during the sync; run it again")
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except FileNotFoundError:
                pass
            raise
        if synced_dirs is None:
            os.fsync(dfd)
        else:
            synced_dirs.add(tuple(dirs))
        return digest_.hexdigest()
    finally:
        os.close(dfd)


def sync_dirs(root, dirs):
    """
    fsync each directory of ``dirs`` below ``root`` (walked as ``write_file`` walks it): the
    renames ``write_file`` made there are on disk.

    root
        The root directory.

    dirs
        Tuples of path parts below ``root`` (``()`` is the root itself).
    """
    for parts in sorted(dirs):
        fd = _open_dir(root, list(parts), create=False)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def clear_temps(root):
    """
    Remove the temporary files an interrupted sync left below ``root`` (walked without
    following symlinks); returns their relative paths. Call it holding the roots lock: every
    sync writes under it, so no temporary file there is in use.

    root
        The destination root directory.
    """
    if not os.path.isdir(root):
        return []
    temps = []
    for _ in _walk(root, {}, temps=temps):
        pass
    for relpath in temps:
        *dirs, name = relpath.split("/")
        _unlink(root, dirs, name)
    return temps


def _unlink(root, dirs, name):
    try:
        _remove(root, dirs, name, os.unlink)
    except FileNotFoundError:
        pass


def _remove(root, dirs, name, remove):
    # The entry itself (never what a symlink points at), in a directory reached without links.
    dfd = _open_dir(root, dirs, create=False)
    try:
        remove(name, dir_fd=dfd)
    finally:
        os.close(dfd)


def set_mode(root, relpath, mode):
    """
    Set the permission bits of ``relpath`` below ``root`` (a regular file; never a symlink).

    root
        The destination root directory.

    relpath
        The file's path relative to ``root``.

    mode
        Permission bits.
    """
    *dirs, name = check_relpath(relpath)
    dfd = _open_dir(root, dirs, create=False)
    try:
        fd = open_regular(name, dfd)
        try:
            # A hard link put there could be a file outside the root (/etc/shadow): never
            # change a mode another name shares.
            if os.fstat(fd).st_nlink != 1:
                raise RootsError(relpath, "has other hard links; mode left as it is")
            os.fchmod(fd, mode & 0o777)
        finally:
            os.close(fd)
    finally:
        os.close(dfd)


def set_dir_mode(root, directory, mode):
    """
    Give the directory ``directory`` below ``root`` (``""``: the root itself) the permission
    bits ``mode``, keeping its set-id and sticky bits; reached without following a symlink
    below the root. Returns whether they changed: a directory already right is not touched,
    and a missing one is left for the writes to make (False).

    root
        The destination root directory.

    directory
        The directory's path relative to ``root``.

    mode
        Permission bits (``0o700``, ``0o755`` ...).
    """
    try:
        fd = _open_dir(root, check_relpath(directory) if directory else [], create=False)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise
    try:
        current = stat.S_IMODE(os.fstat(fd).st_mode)
        if current & 0o777 == mode & 0o777:
            return False
        os.fchmod(fd, (current & ~0o777) | (mode & 0o777))
        return True
    finally:
        os.close(fd)


def delete_file(root, relpath):
    """
    Remove ``relpath`` below ``root`` (the entry itself, never what a symlink points at), then
    the directories it leaves empty, up to but not including ``root``.

    root
        The destination root directory.

    relpath
        The file's path relative to ``root``.
    """
    *dirs, name = check_relpath(relpath)
    try:
        _unlink(root, dirs, name)
    except RootsError:
        return
    while dirs:
        leaf = dirs.pop()
        try:
            _remove(root, dirs, leaf, os.rmdir)
        except OSError:
            return
