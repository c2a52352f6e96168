"""
Filesystem primitives confined to one directory tree: every path below a root is reached one
directory at a time by fd with ``O_NOFOLLOW``, so a symlinked directory (to ``/etc`` or
anywhere), even one swapped in after a scan, is refused rather than read or written through.
Only regular files are opened (``O_NONBLOCK``: a FIFO is refused, not waited on). Each file is
written atomically (temp file in the same directory, fsync, rename); deletions remove the
directories they leave empty, never the root itself. Names that are not plain, printable UTF-8
(or that are a sync's temporary files) are refused or skipped, never interpreted.
"""

import errno
import hashlib
import os
import re
import stat

VCS_DIRS = frozenset((".git", ".hg", ".svn", ".bzr", "CVS"))
BLOCK = 1024 * 1024
_TMP_PREFIX = ".multimaster-tmp-"


class SafeFsError(OSError):
    """
    A path would leave its root, cross a symlink, or is not a safe name; nothing was written.
    The message names the path; ``reason`` says why without it (a pillar file's name is as
    secret as its content), ``errno`` is that of the failure behind it, if any.
    """

    def __init__(self, path, reason, errno_=None):
        super().__init__(f"{path!r}: {reason}")
        self.reason = reason
        self.errno = errno_


_CONTROL = re.compile("[\x00-\x1f\x7f]")


def unsafe_name(name):
    """
    Why ``name`` is not a safe single path component (a sentence), or None when it is.

    name
        One directory entry's name.
    """
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        return "not a plain name"
    if _CONTROL.search(name):
        return "control character in name"
    if name.startswith(_TMP_PREFIX):
        return "temporary file of an interrupted sync"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        # Undecodable bytes (surrogate escapes) cannot travel in a publish or a return.
        return "name not valid UTF-8"
    return None


def check_relpath(relpath):
    """
    The components of ``relpath`` when it is a safe path inside a root; raises ``SafeFsError``.

    relpath
        A path relative to a root, ``/``-separated (no ``..``, no leading ``/``).
    """
    if not isinstance(relpath, str) or not relpath or relpath.startswith("/"):
        raise SafeFsError(relpath, "not a relative path")
    parts = relpath.split("/")
    for part in parts:
        reason = unsafe_name(part)
        if reason:
            raise SafeFsError(relpath, reason)
    return parts


# O_NONBLOCK: a FIFO swapped in for a file must not hang the reader (it is then refused).
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_regular(name, dir_fd=None, expect=None):
    """
    A read-only fd of the regular file ``name`` (in the directory ``dir_fd``), never through a
    symlink, never of a FIFO or device; with ``expect`` (a stat result) only when it is still
    that very file. ``SafeFsError`` otherwise.

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
            raise SafeFsError(name, "not a regular file")
        if expect is not None and (info.st_dev, info.st_ino) != (expect.st_dev, expect.st_ino):
            raise SafeFsError(name, "replaced while it was read")
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
    refused, never read through (``SafeFsError``).

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


def walk(root, skipped, ignored=None, temps=None, dirs=None, below="", recursive=True):
    """
    ``(relpath, entry, dir_fd)`` of each regular file below ``root`` (a ``DirEntry`` read
    through ``dir_fd``, its directory's fd, open while the caller looks at it). Directories
    are entered by fd with ``O_NOFOLLOW``, so one swapped for a symlink during the walk is
    never followed; symlinks, special files and unsafe names go into ``skipped``; VCS
    directories and what ``ignored`` matches are left out.

    root
        The directory to walk (itself opened following a symlink: it comes from config).

    skipped
        A dict to fill with ``{relpath: reason}`` of what is not walked or yielded.

    ignored
        A predicate on relative file paths: True leaves the file out, unreported.

    temps
        A list to add the relative paths of the temporary files an interrupted write left to.

    dirs
        A dict to fill with the permission bits of each directory entered (``""``: the root).

    below
        Walk only the directory at this relative path (reached without following a symlink;
        a missing one, or one that is not a plain directory, yields nothing).

    recursive
        False: only the files directly in that directory.
    """
    if below:
        try:
            start = _open_dir(root, check_relpath(below), create=False)
        except OSError:
            return
        stack = [(f"{below}/", start)]
    else:
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
                        reason = unsafe_name(entry.name)
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
                            if recursive and entry.name not in VCS_DIRS:
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
                raise SafeFsError(
                    "/".join(parts), f"not a plain directory ({exc.strerror})", exc.errno
                ) from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


class Batch:
    """
    What a batch of ``write_file`` calls leaves for ``make_durable``: the directories whose
    entries changed (tuples of path parts below the root, ``()`` the root itself), and whether
    a new file was renamed in before its content was on disk. It also holds the directory the
    last write went to, open: a plan writes a directory's files one after the other, so the
    directory is walked to once, not once per file (each walk is a few syscalls per level,
    which cost most while the apply's own writes keep the file system busy). Close it when the
    batch is done (``with Batch() as batch``).
    """

    def __init__(self):
        self.dirs = set()
        self.unsynced = False
        self._open = None

    def dir_fd(self, root, parts):
        """
        An fd of the directory ``parts`` below ``root`` (``_open_dir``, made where missing),
        kept open for the next write to the same directory.
        """
        key = (root, tuple(parts))
        if self._open is not None and self._open[0] == key:
            return self._open[1]
        self.close()
        fd = _open_dir(root, parts, create=True)
        self._open = (key, fd)
        return fd

    def close(self):
        """Close the directory kept open."""
        if self._open is not None:
            os.close(self._open[1])
            self._open = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def write_file(root, relpath, blocks, mode, expect_sha256=None, batch=None):
    """
    Write ``relpath`` below ``root`` atomically from ``blocks`` (an iterable of bytes) with
    ``mode``; returns the SHA-256 written. Never writes through a symlink or outside ``root``.
    The file is fsync'd before the rename, its directory after it. In a ``batch``, the
    directory is synced later by ``make_durable``, and so is a new file's content: a file that
    replaces one always has its content on disk before the rename, so a crash never leaves an
    empty file where a good one was (a new file a crash cut short differs from the primary's,
    and the next sync writes it again).

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
        (``SafeFsError``).

    batch
        A ``Batch`` that collects what is left to sync (a caller writing many files syncs
        them once, at the end) and keeps the directory written to open for the next file.
    """
    *dirs, name = check_relpath(relpath)
    dfd = batch.dir_fd(root, dirs) if batch is not None else _open_dir(root, dirs, create=True)
    tmp = f"{_TMP_PREFIX}{os.urandom(6).hex()}"
    deferred = batch is not None and not _exists(name, dfd)
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
                if not deferred:
                    os.fsync(handle.fileno())
            if expect_sha256 is not None and digest_.hexdigest() != expect_sha256:
                raise SafeFsError(relpath, "content changed during the sync; run it again")
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except FileNotFoundError:
                pass
            raise
        if batch is None:
            os.fsync(dfd)
        else:
            batch.dirs.add(tuple(dirs))
            batch.unsynced = batch.unsynced or deferred
        return digest_.hexdigest()
    finally:
        if batch is None:
            os.close(dfd)


def _exists(name, dir_fd):
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def make_durable(root, batch):
    """
    Put on disk what the ``write_file`` calls of ``batch`` below ``root`` left: one ``sync``
    when a new file's content is not there yet (it takes the directories too), else an fsync
    of each directory (walked as ``write_file`` walks it).

    root
        The root directory.

    batch
        The ``Batch`` those writes filled.
    """
    if batch.unsynced:
        os.sync()
        return
    for parts in sorted(batch.dirs):
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
    for _ in walk(root, {}, temps=temps):
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
                raise SafeFsError(relpath, "has other hard links; mode left as it is")
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
    except SafeFsError:
        return
    while dirs:
        leaf = dirs.pop()
        try:
            _remove(root, dirs, leaf, os.rmdir)
        except OSError:
            return
