"""
A record of the directories that changed under a master's roots, kept with inotify by the
``multimaster_rootswatch`` engine, so that a manifest reads again only those directories
(``multimaster_manifest.manifest``), not every file of the tree.

The engine watches each directory a scan enters (``multimaster_safefs.walk``) and numbers every
change it sees. A reader asks through a barrier: it writes a request into the engine's
``barrier`` directory, which the same inotify instance watches, so that by the time the engine
answers it has handled every change made before the request (one instance queues its events in
order). An answer names the engine's instance (new at each start) and, per root, its identity
(device and inode), the number before which nothing is known (``reset``: a watch added, an event
queue overflow, a directory moved) and the directories changed since the number the reader
gave, each with whether its whole subtree is to be read again.

A reader reads the whole tree instead when there is no answer within ``ANSWER_WAIT`` (no engine),
the instance is another, the reset is after its own number, the root is another, or the engine
does not watch the root: not on a local file system (inotify does not see another NFS client's
writes) or past the kernel's watch limit.
"""

import ctypes
import ctypes.util
import errno
import json
import logging
import os
import select
import struct
import time

import multimaster_safefs
import salt.utils.atomicfile

log = logging.getLogger(__name__)

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_UNMOUNT = 0x2000
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_ISDIR = 0x40000000
_IN_CLOEXEC = os.O_CLOEXEC
_IN_NONBLOCK = os.O_NONBLOCK

# Everything that changes a directory's listing, a file's content, mode or owner, or the
# directory itself.
WATCHED = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
)
_EVENT = struct.Struct("iIII")

# File systems whose changes this kernel's inotify sees, whoever makes them. Any other (NFS,
# CIFS, FUSE, ...) is read in full at every sync.
LOCAL_FS = frozenset(
    ("ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "zfs", "f2fs", "jfs", "reiserfs")
)

# How long a reader waits for the engine's answer before it reads the whole tree.
ANSWER_WAIT = 2.0
# Answers no reader took (it gave up) are removed after this long.
STALE_ANSWER = 60


def state_dir(cachedir):
    """
    The engine's directory in the master's cachedir: its pid file, the barrier directory it
    watches and the answers it writes.
    """
    return os.path.join(cachedir, "multimaster", "roots-watch")


# --- inotify ---------------------------------------------------------------------------------


def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class Inotify:
    """
    One inotify instance (non-blocking): ``add`` a watch, ``remove`` it, ``read`` the queued
    events as ``(wd, mask, name)``.
    """

    def __init__(self):
        self._libc = _libc()
        self.fd = self._libc.inotify_init1(_IN_CLOEXEC | _IN_NONBLOCK)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")

    def add(self, path, mask):
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), path)
        return wd

    def remove(self, wd):
        self._libc.inotify_rm_watch(self.fd, wd)

    def read(self):
        try:
            data = os.read(self.fd, 1024 * 1024)
        except BlockingIOError:
            return []
        events, offset = [], 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _, length = _EVENT.unpack_from(data, offset)
            start = offset + _EVENT.size
            name = os.fsdecode(data[start : start + length].rstrip(b"\0"))
            events.append((wd, mask, name))
            offset = start + length
        return events

    def close(self):
        os.close(self.fd)


def fs_type(path):
    """
    The file system type of the mount ``path`` is on (``/proc/self/mountinfo``), or None.
    """
    try:
        dev = os.stat(path).st_dev
        with open("/proc/self/mountinfo", encoding="utf-8") as handle:
            mounts = handle.read().splitlines()
    except OSError:
        return None
    wanted = f"{os.major(dev)}:{os.minor(dev)}"
    for line in mounts:
        fields = line.split()
        if len(fields) > 7 and fields[2] == wanted and "-" in fields:
            return fields[fields.index("-") + 1]
    return None


# --- the engine's side -----------------------------------------------------------------------


class _Root:
    """What the engine knows of one root."""

    def __init__(self, path):
        self.path = path
        self.identity = None
        self.reset = 0
        self.watched = False
        # Watched again at the next request once its path is a directory: a root that was
        # missing, removed or moved (not one refused for its file system or the watch limit).
        self.retry = False
        self.why = "not watched yet"
        self.dirty = {}
        self.wds = set()


class Watcher:
    """
    The record of one master's roots: watches every directory of each root, numbers changes,
    and answers readers' barrier requests (``changes_since``).
    """

    def __init__(self, roots, directory):
        self.instance = os.urandom(16).hex()
        self.seq = 0
        self.inotify = Inotify()
        self.wds = {}
        self.barrier = os.path.join(directory, "barrier")
        self.answers = os.path.join(directory, "answers")
        for path in (directory, self.barrier, self.answers):
            os.makedirs(path, mode=0o700, exist_ok=True)
        self.barrier_wd = self.inotify.add(self.barrier, IN_CLOSE_WRITE | IN_ONLYDIR)
        self.roots = {path: _Root(path) for path in dict.fromkeys(roots)}
        for root in self.roots.values():
            self._watch_root(root)

    def _bump(self):
        self.seq += 1
        return self.seq

    def _forget_watches(self, root):
        for wd in root.wds:
            holders = self.wds.get(wd, {})
            holders.pop(root.path, None)
            if not holders:
                self.wds.pop(wd, None)
                self.inotify.remove(wd)
        root.wds.clear()

    def _watch_root(self, root):
        """
        (Re)watch every directory of ``root``; what readers knew before is void (``reset``).
        """
        self._forget_watches(root)
        root.reset, root.dirty, root.watched = self._bump(), {}, False
        root.retry = not os.path.isdir(root.path)
        if root.retry:
            root.why = "not a directory"
            return
        kind = fs_type(root.path)
        if kind not in LOCAL_FS:
            root.why = f"file system {kind or 'unknown'} (inotify may miss its changes)"
            return
        try:
            info = os.stat(root.path)
            self._watch_tree(root, "", root.path)
        except OSError as exc:
            self._forget_watches(root)
            root.retry = exc.errno in (errno.ENOENT, errno.ENOTDIR)
            root.why = f"cannot watch: {exc.strerror or exc.errno}"
            if exc.errno == errno.ENOSPC:
                root.why += " (raise fs.inotify.max_user_watches)"
            log.warning("multimaster: roots watch of %s: %s", root.path, root.why)
            return
        root.identity, root.watched, root.why = [info.st_dev, info.st_ino], True, None

    def _watch_tree(self, root, rel, path):
        """
        Watch ``path`` (``rel`` below the root) and every directory below it that a scan
        enters.
        """
        stack = [(rel, path)]
        while stack:
            rel, path = stack.pop()
            # The root itself comes from config and is followed, as a scan follows it.
            mask = WATCHED | IN_ONLYDIR | (IN_DONT_FOLLOW if rel else 0)
            try:
                wd = self.inotify.add(path, mask)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR) and rel:
                    continue  # gone meanwhile: its parent's event says so
                raise
            # One directory of two roots (one inside the other) is one watch: both hear it.
            self.wds.setdefault(wd, {})[root.path] = (root, rel)
            root.wds.add(wd)
            try:
                entries = list(os.scandir(path))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                if (
                    entry.is_dir(follow_symlinks=False)
                    and entry.name not in multimaster_safefs.VCS_DIRS
                    and not multimaster_safefs.unsafe_name(entry.name)
                ):
                    stack.append((f"{rel}/{entry.name}" if rel else entry.name, entry.path))

    def _mark(self, root, rel, subtree=False):
        before = root.dirty.get(rel)
        root.dirty[rel] = [self._bump(), subtree or bool(before and before[1])]

    def handle(self, wd, mask, name):
        """Take one event into the record."""
        if mask & IN_Q_OVERFLOW:
            log.warning("multimaster: roots watch: inotify queue overflow; rescanning all")
            for root in self.roots.values():
                root.reset, root.dirty = self._bump(), {}
            return
        if wd == self.barrier_wd:
            if mask & IN_CLOSE_WRITE and name:
                self._answer(name)
            return
        for root, rel in list(self.wds.get(wd, {}).values()):
            if mask & IN_IGNORED:
                self.wds.pop(wd, None)
                root.wds.discard(wd)
            self._take(root, rel, mask, name)

    def _take(self, root, rel, mask, name):
        """Take one event on the directory ``rel`` of ``root`` into its record."""
        child = f"{rel}/{name}" if rel and name else name
        if not rel and mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT | IN_IGNORED):
            self._lose(root, "the root was removed, moved or unmounted")
        elif mask & IN_ISDIR and mask & (IN_MOVED_FROM | IN_MOVED_TO):
            # Watches follow a moved directory's inode, not its path: watch the root anew.
            self._watch_root(root)
        elif mask & IN_ISDIR and mask & IN_CREATE:
            self._mark(root, rel)
            self._watch_new_dir(root, child)
        elif mask & IN_ISDIR and mask & IN_DELETE:
            self._mark(root, rel)
            self._mark(root, child, subtree=True)
        elif name and mask & IN_ISDIR and mask & IN_ATTRIB:
            self._mark(root, child)
        elif mask & (WATCHED & ~(IN_DELETE_SELF | IN_MOVE_SELF)):
            self._mark(root, rel)

    def _watch_new_dir(self, root, child):
        name = child.rpartition("/")[2]
        if multimaster_safefs.unsafe_name(name) or name in multimaster_safefs.VCS_DIRS:
            return
        try:
            self._watch_tree(root, child, os.path.join(root.path, child))
        except OSError as exc:
            # No path below the root: a pillar directory's name is never logged.
            self._lose(root, f"cannot watch a new directory: {exc.strerror or exc.errno}")
            return
        # Files made in it before its watch are found by reading it all.
        self._mark(root, child, subtree=True)

    def _lose(self, root, why):
        self._forget_watches(root)
        root.reset, root.dirty, root.watched, root.why = self._bump(), {}, False, why
        root.retry = True
        log.info("multimaster: roots watch of %s stopped: %s", root.path, why)

    def _answer(self, token):
        """
        Answer the barrier request ``token`` (its file holds ``{"since": n}``) into
        ``answers/<token>.json``, then remove the request.
        """
        request = os.path.join(self.barrier, token)
        if multimaster_safefs.unsafe_name(token) or token.startswith("."):
            return
        try:
            with open(request, encoding="utf-8") as handle:
                since = json.load(handle).get("since")
            os.unlink(request)
        except (OSError, ValueError, AttributeError):
            return
        if not isinstance(since, int):
            return
        for root in self.roots.values():
            if root.retry and os.path.isdir(root.path):
                self._watch_root(root)
        answer = {"instance": self.instance, "seq": self.seq, "roots": {}}
        for root in self.roots.values():
            answer["roots"][root.path] = {
                "identity": root.identity,
                "reset": root.reset,
                "watched": root.watched,
                "why": root.why,
                "dirty": {d: s[1] for d, s in root.dirty.items() if s[0] > since},
            }
        path = os.path.join(self.answers, f"{token}.json")
        with salt.utils.atomicfile.atomic_open(path, "w") as handle:
            json.dump(answer, handle, separators=(",", ":"))
        self._remove_stale_answers()

    def _remove_stale_answers(self):
        cutoff = time.time() - STALE_ANSWER
        for entry in os.scandir(self.answers):
            try:
                if entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)
            except OSError:
                pass

    def step(self, timeout=1.0):
        """Wait up to ``timeout`` for events and take them in."""
        ready, _, _ = select.select([self.inotify.fd], [], [], timeout)
        if ready:
            for wd, mask, name in self.inotify.read():
                self.handle(wd, mask, name)

    def close(self):
        self.inotify.close()


def run(roots, cachedir, running=lambda: True):
    """
    The engine's loop: keep the record of ``roots`` for readers in ``cachedir`` while
    ``running()``.
    """
    directory = state_dir(cachedir)
    watcher = Watcher(roots, directory)
    pid_path = os.path.join(directory, "engine.pid")
    with salt.utils.atomicfile.atomic_open(pid_path, "w") as handle:
        handle.write(f"{os.getpid()}\n")
    try:
        while running():
            watcher.step()
    finally:
        watcher.close()


# --- the reader's side -----------------------------------------------------------------------


def engine_running(cachedir):
    """Whether the engine of the master whose ``cachedir`` is given runs (its pid file)."""
    return _engine_alive(state_dir(cachedir))


def _engine_alive(directory):
    try:
        with open(os.path.join(directory, "engine.pid"), encoding="utf-8") as handle:
            pid = int(handle.read().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


def changes_since(cachedir, since, wait=ANSWER_WAIT):
    """
    The engine's answer for readers whose record is at ``since`` (module docstring), or None
    when no engine answers within ``wait`` seconds.

    cachedir
        The master's cachedir.

    since
        The ``seq`` of the answer the reader last used (0: none).
    """
    directory = state_dir(cachedir)
    if not _engine_alive(directory):
        return None
    token = os.urandom(16).hex()
    request = os.path.join(directory, "barrier", token)
    answer_path = os.path.join(directory, "answers", f"{token}.json")
    try:
        with open(request, "x", encoding="utf-8") as handle:
            json.dump({"since": int(since)}, handle)
        deadline, pause = time.monotonic() + wait, 0.001
        while time.monotonic() < deadline:
            try:
                with open(answer_path, encoding="utf-8") as handle:
                    answer = json.load(handle)
            except FileNotFoundError:
                time.sleep(pause)
                pause = min(pause * 2, 0.02)
                continue
            os.unlink(answer_path)
            return answer if _well_formed(answer) else None
    except (OSError, ValueError):
        return None
    finally:
        _unlink_quietly(request)
    return None


def _unlink_quietly(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _well_formed(answer):
    return (
        isinstance(answer, dict)
        and isinstance(answer.get("instance"), str)
        and isinstance(answer.get("seq"), int)
        and isinstance(answer.get("roots"), dict)
    )


def usable(answer, root, since, instance, identity):
    """
    The changed directories ``{dir: subtree}`` of ``root`` in ``answer`` for a reader whose
    record of the root is at ``since`` of ``instance`` with ``identity``, or None when the
    reader must read the whole tree (module docstring).
    """
    entry = (answer or {}).get("roots", {}).get(root)
    if (
        not isinstance(entry, dict)
        or answer.get("instance") != instance
        or not entry.get("watched")
        or entry.get("identity") != identity
        or not isinstance(entry.get("reset"), int)
        or entry["reset"] > since
        or not isinstance(entry.get("dirty"), dict)
    ):
        return None
    return entry["dirty"]


def available():
    """True where this kernel has inotify (Linux)."""
    try:
        Inotify().close()
    except (OSError, AttributeError):
        return False
    return True


def roots_of(opts):
    """
    Every ``file_roots`` and ``pillar_roots`` path of the master whose ``opts`` are given (not
    those naming ``__env__``, which no one root stands for).
    """
    paths = []
    for kind in ("file_roots", "pillar_roots"):
        for env_paths in (opts.get(kind) or {}).values():
            paths.extend(str(p) for p in env_paths or [] if "__env__" not in str(p))
    return list(dict.fromkeys(paths))
