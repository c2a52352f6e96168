"""
A master's minion key store as seen from its host (the control minion), read side: load the
master's options, read the inventory, report a store that cannot be read safely, record which ids
the store held, and the store's lock and the staging helpers every write shares. Changing the
store (crash-safe writes, repair, key actions and the key plane's peer calls) is
``multimaster_keywrite``'s; the master's own key pair is in ``multimaster_masterkeyfiles``.

On 3008, keys go through ``salt.cache.Cache(opts, driver=opts["keys.cache_driver"])`` like Salt's
own ``salt-key``; 3006/3007 keep the same ``pki_dir`` files with no cache in front
(``multimaster_saltcompat`` says which).

Every write and repair holds the store's lock (``locked``), and so does a master key install
(``multimaster_masterkeyfiles``): two runs (two operators, reactors on several masters) cannot
delete each other's staged files or undo each other's compare-and-set. Files are staged in a
private temp dir (``.multimaster-tmp``, ``private_dir`` and ``stage``) and made durable before
they are renamed into place.

Reads never follow a symlinked state dir or key file and never return what is not one public
key PEM: a state dir pointing at ``/etc`` is reported (``store_problems``), not read.
"""

import contextlib
import errno
import fcntl
import glob
import json
import logging
import os
import stat
import tempfile
import time

import multimaster_keys
import multimaster_reactor
import multimaster_saltcompat
import salt.config
import salt.utils.user
from salt.exceptions import CommandExecutionError

log = logging.getLogger(__name__)

STATE_DIRS = {"accepted": "minions", "pending": "minions_pre", "rejected": "minions_rejected"}
DENIED_DIR = "minions_denied"
# Salt's reading order: the first dir that holds an id wins.
PRIORITY = ("minions_rejected", "minions_pre", "minions")
TMP_DIR = ".multimaster-tmp"
LOCK_FILE = ".multimaster.lock"
# A public key PEM is under 2 KiB: a larger file is not a key and is never read whole.
MAX_KEY_BYTES = 16 * 1024
# States a rejection overrides (Salt's priority): writing them never removes a rejected key.
SOFT_STATES = ("accepted", "pending")
# The record of the ids this store held (``note_held``): in the master's cachedir (a read of the
# store writes it, and nothing but keys belongs in the pki dir), with a lock of its own, so a
# read records it without waiting for a write to end.
HELD_FILE = "held_keys.json"
HELD_LOCK = ".held_keys.lock"
HELD_LOCK_TIMEOUT = 10
# An id a read found gone stays "held before" this long, so the key reactor still propagates
# its deletion when a read of another run got there first (salt-key -D deletes many ids at
# once, and their reactions queue).
HELD_GRACE = 300


def master_opts(config_dir):
    """
    The options of the master whose config lives in ``config_dir``, loaded the way
    ``salt-master -c config_dir`` loads them: the ``master`` file where there is one (a pip
    install ships none), ``master.d/*.conf``, and Salt's defaults for the rest.
    """
    if not os.path.isdir(config_dir):
        raise CommandExecutionError(
            f"no master config directory {config_dir} on this host (set config_dir of this "
            "master in pillar multimaster:masters to where its salt-master reads its config)"
        )
    return salt.config.master_config(os.path.join(config_dir, "master"))


def own_master_options(config_dir, skip=()):
    """
    The options the master's own config sets (its ``master`` file and ``master.d/*.conf``
    merged as Salt merges them), without the ``master.d`` files named in ``skip``: what the
    operator set, apart from what the formula renders.

    skip
        Base names of ``master.d`` files to leave out (the formula's own).
    """
    path = os.path.join(config_dir, "master")
    own = salt.config.load_config(path, "SALT_MASTER_CONFIG", path, exit_on_config_errors=False)
    included = sorted(
        name
        for name in glob.glob(os.path.join(config_dir, "master.d", "*.conf"))
        if os.path.basename(name) not in skip
    )
    own.update(salt.config.include_config(included, path, False, exit_on_config_errors=False))
    return own


def _cache(mopts):
    return multimaster_saltcompat.key_cache(mopts)


def _localfs(mopts):
    return multimaster_saltcompat.keys_are_files(mopts)


def store_dir(mopts):
    """
    The directory of this master's key store: ``cluster_pki_dir`` in a cluster, else
    ``pki_dir``.
    """
    return mopts["cluster_pki_dir"] if mopts.get("cluster_id") else mopts["pki_dir"]


# --- lock ------------------------------------------------------------------------------------


@contextlib.contextmanager
def locked(mopts, timeout=60):
    """
    Hold the exclusive lock of this master's key store (``<pki>/.multimaster.lock``, pki being
    ``cluster_pki_dir`` in a cluster) while the block runs; yields the lock file's path. Raises
    ``CommandExecutionError`` naming the lock file when another run holds it for more than
    ``timeout`` seconds. Not re-entrant: a second ``locked`` in the same run waits for itself.

    mopts
        The master's opts, as Salt loads them from its config dir (``master_opts``).
    """
    with _locked_path(os.path.join(store_dir(mopts), LOCK_FILE), timeout) as path:
        yield path


@contextlib.contextmanager
def _locked_path(path, timeout):
    fd = _open_lock(path)
    try:
        _flock(fd, path, timeout)
        yield path
    finally:
        os.close(fd)  # releases the lock


def _open_lock(path):
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    # O_NOFOLLOW: a planted link must not make us create or lock another file.
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise CommandExecutionError(
            f"cannot open the key store lock {path} (never through a link): {exc.strerror}"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CommandExecutionError(f"the key store lock {path} is not a regular file")
    return fd


def _flock(fd, path, timeout):
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise CommandExecutionError(
                    f"another run holds the key store lock {path}; gave up after {timeout}s"
                ) from None
            time.sleep(0.05)


# --- inventory -------------------------------------------------------------------------------


def inventory(mopts, with_pubs=False, ids=None, fp_cache=None):
    """
    ``{id: entry}`` (entry as in ``multimaster_keys.plan``) and, with ``with_pubs``, the PEMs as
    ``{id: {"key": pem, "denied": pem}}``. ``ids`` (a set, or a predicate on the id) limits the
    result to those ids.

    A file that is not one public key PEM (or is larger than ``MAX_KEY_BYTES``) is listed with
    fingerprint None and its content is never returned. A state dir that is a symbolic link is
    not read (see ``store_problems``); key files are never read through a link.

    ``fp_cache`` (localfs_key only): a ``FingerprintCache`` the caller keeps between runs.

    mopts
        The master's opts, as Salt loads them from its config dir (``master_opts``).
    """
    if _localfs(mopts):
        keys, denied = _scan_localfs(store_dir(mopts), ids, with_pubs, fp_cache)
    else:
        keys, denied = _scan_cache(mopts, ids)
    entries, pubs = {}, {}
    for minion_id, (state, fp, pem) in keys.items():
        entries[minion_id] = [state, fp]
        if with_pubs and pem is not None:
            pubs[minion_id] = {"key": pem}
    for minion_id, (_, fp, pem) in denied.items():
        entries.setdefault(minion_id, ["denied", None]).append(fp)
        if with_pubs and pem is not None:
            pubs.setdefault(minion_id, {})["denied"] = pem
    return entries, pubs


def key_entry(mopts, minion_id):
    """
    ``(state, pem, denied)`` of ``minion_id`` in this master's key store: its state (None when
    it has none but a denial), the PEM of that key (None unless it is one public key PEM) and
    whether a denied key is held for the id.

    mopts
        The master's opts, as Salt loads them from its config dir (``master_opts``).
    """
    entries, pubs = inventory(mopts, with_pubs=True, ids={minion_id})
    entry = entries.get(minion_id)
    if entry is None:
        return None, None, False
    state = None if entry[0] == "denied" else entry[0]
    return state, pubs.get(minion_id, {}).get("key"), len(entry) > 2


def _wanted(ids):
    if ids is None:
        return lambda _: True
    return ids if callable(ids) else ids.__contains__


def as_key(text):
    """
    ``(fingerprint, pem)`` of ``text``, or ``(None, None)`` when it is not one public key PEM of
    at most ``MAX_KEY_BYTES``: nothing else is ever returned.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str) or len(text) > MAX_KEY_BYTES:
        return None, None
    fp = multimaster_keys.fingerprint(text)
    return fp, text if fp else None


def _scan_cache(mopts, ids):
    wanted = _wanted(ids)
    cache = _cache(mopts)
    keys, denied = {}, {}
    for minion_id, data in cache.list_all("keys", include_data=True).items():
        if wanted(minion_id):
            keys[minion_id] = (data["state"], *as_key(data["pub"]))
    for minion_id in cache.list("denied_keys"):
        if wanted(minion_id):
            pems = cache.fetch("denied_keys", minion_id) or []
            if pems:
                denied[minion_id] = ("denied", *as_key(pems[0]))
    return keys, denied


def _stamp(st):
    # ctime too: a rewrite in place that restores mtime and size (os.utime) still moves ctime.
    return [st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size]


class FingerprintCache:
    """
    Fingerprints of key files by ``[inode, mtime_ns, ctime_ns, size]``, carried between runs by
    the caller: a file whose stamp is unchanged is not read again (public data only).
    """

    def __init__(self, known=None):
        self.known = known or {}
        self.seen = {}
        self.reads = 0

    def fingerprint(self, path, stamp, read=None):
        """
        The fingerprint of the key file at ``path`` whose stamp is ``stamp``, read (by ``read()``
        returning ``(fp, pem)``; default: opening ``path``, never through a link) only when the
        stamp differs from the known one.
        """
        cached = self.known.get(path)
        if cached and list(cached[:-1]) == stamp:
            fp = cached[-1]
        else:
            fp = (read or (lambda: read_key(path)))()[0]
            self.reads += 1
        self.seen[path] = stamp + [fp]
        return fp

    @property
    def changed(self):
        """
        True when ``seen`` differs from ``known`` (worth saving for the next run).
        """
        return self.reads > 0 or len(self.seen) != len(self.known)


def read_key(path, dir_fd=None):
    """
    ``as_key`` of the regular file ``path`` (relative to ``dir_fd`` if given): never through a
    link, never more than ``MAX_KEY_BYTES`` + 1 bytes read.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, None
        raise
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, None
        return as_key(handle.read(MAX_KEY_BYTES + 1))


def key_entries(path):
    """
    ``(entry, dir_fd)`` for the regular, non-dot files of state dir ``path`` (what localfs_key
    reads). Nothing for a missing dir; a symlinked one is never followed (a warning).
    """
    try:
        dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        log.warning("multimaster: %s is not a directory (a link?); its keys are not read", path)
        return
    try:
        with os.scandir(dir_fd) as entries:
            for entry in entries:
                if not entry.name.startswith(".") and entry.is_file(follow_symlinks=False):
                    yield entry, dir_fd
    finally:
        os.close(dir_fd)


def _read_dir(path, state, ids, with_pubs, fp_cache):
    wanted = _wanted(ids)
    found = {}
    for entry, dir_fd in key_entries(path):
        if not wanted(entry.name):
            continue
        if with_pubs or fp_cache is None:
            found[entry.name] = (state, *read_key(entry.name, dir_fd))
            continue
        fp = fp_cache.fingerprint(
            os.path.join(path, entry.name),
            _stamp(entry.stat(follow_symlinks=False)),
            lambda name=entry.name, fd=dir_fd: read_key(name, fd),
        )
        found[entry.name] = (state, fp, None)
    return found


def _scan_localfs(pki, ids, with_pubs, fp_cache):
    """
    ``localfs_key.list_all`` equivalent with plain reads: at 10,000 keys its per-file path
    checks cost seconds. Salt's reading priority applies when an id sits in two state dirs.
    """
    keys = {}
    for name in reversed(PRIORITY):
        state = next(s for s, d in STATE_DIRS.items() if d == name)
        keys.update(_read_dir(os.path.join(pki, name), state, ids, with_pubs, fp_cache))
    denied = _read_dir(os.path.join(pki, DENIED_DIR), "denied", ids, with_pubs, fp_cache)
    return keys, denied


def store_problems(mopts):
    """
    Why this master's key store cannot be fully read or written, as sentences (``[]`` when
    fine): a state dir that is a symbolic link or not a directory. Its keys are left out of
    the inventory and nothing is written to the store until it is fixed. localfs_key only.

    mopts
        The master's opts, as Salt loads them from its config dir (``master_opts``).
    """
    if not _localfs(mopts):
        return []
    problems = []
    for name in (*PRIORITY, DENIED_DIR):
        path = os.path.join(store_dir(mopts), name)
        if os.path.islink(path):
            problems.append(
                f"{path} is a symbolic link (to {os.readlink(path)}): its keys are not read and "
                "nothing is written; make it a directory"
            )
        elif os.path.lexists(path) and not os.path.isdir(path):
            problems.append(f"{path} is not a directory: its keys are not read")
    return problems


def check_store(mopts):
    """
    Raise ``CommandExecutionError`` with the ``store_problems`` when there are any.
    """
    problems = store_problems(mopts)
    if problems:
        raise CommandExecutionError("; ".join(problems))


# --- what this store held --------------------------------------------------------------------


def note_held(mopts, entries, ids=None, now=None):
    """
    Record which ids this master's store holds accepted or pending, as a read just found them:
    ``entries`` as ``inventory`` returns them, ``ids`` the ids that read covered (a set or a
    predicate, as for ``inventory``; None: all). The key reactor propagates a deletion only for
    an id recorded here (``held_before``), so a forged delete event for an id this master never
    held deletes nothing anywhere. An id recorded before that the read finds gone stays, marked
    gone, for ``HELD_GRACE`` seconds.

    The record (``held_path``) is public data, rewritten atomically under a lock of its own,
    owned by the master's user. Bookkeeping only: a failure is logged, never raised. Returns
    whether the record is up to date.

    mopts
        The master's opts, as Salt loads them from its config dir (``master_opts``).
    """
    now = time.time() if now is None else now
    held = {i: e[1] for i, e in entries.items() if e[0] in SOFT_STATES and e[1]}
    try:
        directory = _master_owned_dir(mopts, os.path.dirname(held_path(mopts)))
        with _locked_path(os.path.join(directory, HELD_LOCK), HELD_LOCK_TIMEOUT):
            record = _read_held(mopts)
            merged = _merge_held(record, held, _wanted(ids), now)
            if merged != record:
                _write_held(mopts, merged)
    except (OSError, CommandExecutionError) as exc:
        log.warning("multimaster: cannot record the keys %s holds: %s", store_dir(mopts), exc)
        return False
    return True


def held_path(mopts):
    """
    Where ``note_held`` keeps its record: ``<cachedir>/multimaster/held_keys.json`` of the
    master.

    mopts
        The master's opts (``master_opts``, or a master's own ``__opts__``).
    """
    return os.path.join(mopts["cachedir"], "multimaster", HELD_FILE)


def held_before(mopts, minion_id, now=None):
    """
    The fingerprint of ``minion_id``'s key as a read of this master's store last found it held
    (accepted or pending), unless a read has found it gone for longer than ``HELD_GRACE``
    seconds; None when it was never recorded (see ``note_held``).

    mopts
        The master's opts (``master_opts``, or a master's own ``__opts__``).
    """
    now = time.time() if now is None else now
    fp, gone = _read_held(mopts).get(minion_id, (None, None))
    return fp if gone is None or now - gone <= HELD_GRACE else None


def _merge_held(record, held, covered, now):
    """
    ``record`` (``{id: [fingerprint, gone since or None]}``) after a read that found ``held``
    (``{id: fingerprint}``) among the ids ``covered`` says it read.
    """
    merged = {}
    for minion_id, (fp, gone) in record.items():
        if gone is None and covered(minion_id) and minion_id not in held:
            gone = now
        if gone is None or now - gone <= HELD_GRACE:
            merged[minion_id] = [fp, gone]
    merged.update({minion_id: [fp, None] for minion_id, fp in held.items()})
    return merged


def _read_held(mopts):
    """
    The record, never through a link; empty when there is none or what is there is not one.
    """
    record = multimaster_reactor.read_record(held_path(mopts), "a record of held keys")
    return {i: list(entry) for i, entry in record.items() if _is_held_entry(entry)}


def _is_held_entry(entry):
    if not isinstance(entry, list) or len(entry) != 2:
        return False
    fp, gone = entry
    moment = isinstance(gone, (int, float)) and not isinstance(gone, bool)
    return multimaster_keys.is_fingerprint(fp) and (gone is None or moment)


def _write_held(mopts, record):
    path = held_path(mopts)
    text = json.dumps(record, sort_keys=True)
    tmp = stage(os.path.dirname(path), text, master_uid(mopts), prefix=HELD_FILE + ".")
    try:
        os.replace(tmp, path)
    except BaseException:
        discard([tmp])
        raise


def _master_owned_dir(mopts, path):
    """
    ``path`` as a directory only the master's user can enter, owned by that user when this
    process could make it so (a control minion running as root creates it for a master that
    runs as another user, and that master keeps its own files there too).
    """
    os.makedirs(path, mode=0o700, exist_ok=True)
    uid = master_uid(mopts)
    if uid is not None and os.geteuid() == 0 and os.stat(path).st_uid != uid:
        os.chown(path, uid, -1)
    return path


# --- staging (the store's writes and the master key install) ---------------------------------


def fsync_dir(path):
    """
    Make the entries of directory ``path`` (a rename or unlink just done in it) durable.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def private_dir(path):
    """
    ``path`` as a real directory only its owner can enter (it also stages private keys:
    ``multimaster_masterkeyfiles``).
    """
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise CommandExecutionError(f"{path} is not a directory")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def master_uid(mopts):
    """
    The uid of the user the master runs as (its ``user`` option), or None when it sets none.
    """
    user = mopts.get("user")
    return salt.utils.user.get_uid(user) if user else None


def stage(tmp_dir, text, uid, mode=0o600, sync=False, prefix="tmp"):
    """
    Write ``text`` to a new file in ``tmp_dir`` (same filesystem as its target: the rename is
    atomic) named ``<prefix>XXXXXXXX``, with ``mode``, owned by ``uid``; returns its path.
    """
    fd, tmp = tempfile.mkstemp(dir=tmp_dir, prefix=prefix)
    try:
        _fill(fd, text, uid, mode, sync)
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def _fill(fd, text, uid, mode, sync=False):
    # Closes fd.
    with os.fdopen(fd, "wb") as handle:
        handle.write(text.encode())
        os.fchmod(fd, mode)
        if uid is not None:
            os.fchown(fd, uid, -1)
        if sync:
            handle.flush()
            os.fsync(fd)


_STAGE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def staged_files(tmp_dir, texts, uid, mode=0o600):
    """
    ``stage`` for each of ``texts`` in turn (None gives None), yielding each path once it is
    written: one fd of ``tmp_dir`` and one random prefix for the whole batch, where ``stage``
    resolves the path and draws a name per file (a first sync writes 100,000 keys).
    """
    prefix = f"tmp{os.urandom(6).hex()}-"
    dir_fd = os.open(tmp_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for index, text in enumerate(texts):
            if text is None:
                yield None
                continue
            name = f"{prefix}{index}"
            _write_new(dir_fd, name, text, uid, mode)
            yield os.path.join(tmp_dir, name)
    finally:
        os.close(dir_fd)


def _write_new(dir_fd, name, text, uid, mode):
    fd = os.open(name, _STAGE_FLAGS, mode, dir_fd=dir_fd)
    try:
        _fill(fd, text, uid, mode)
    except BaseException:
        os.unlink(name, dir_fd=dir_fd)
        raise


def discard(paths):
    """
    Remove whichever of ``paths`` exist (None entries skipped): staged files a run gives up.
    """
    for path in paths:
        if path and os.path.lexists(path):
            os.unlink(path)
