"""
A master's minion key store as seen from its host (the control minion): load the master's
options, read the inventory, apply key actions crash-safely under a lock, record which ids the
store held, request AES rotation, and answer the key plane's peer calls (inventory, ordered key
actions). The master's own key pair is in ``multimaster_masterkeyfiles``.

On 3008, keys go through ``salt.cache.Cache(opts, driver=opts["keys.cache_driver"])`` like Salt's
own ``salt-key``; 3006/3007 keep the same ``pki_dir`` files with no cache in front
(``multimaster_saltcompat`` says which). One exception, for the files of ``localfs_key`` (and of
the older Salts): Salt's ``store`` first deletes
the old key and then writes a temp file inside the target dir, so a crash can lose the key or
leave ``minions_pre/tmpXXXX`` that ``salt-key`` lists as a minion. Here the new file is staged in
a private temp dir (``.multimaster-tmp``), made durable, renamed into place, and only then are the
old states removed; a crash leaves the id in two dirs, where Salt's priority (rejected > pending >
accepted) keeps the safer one, and ``repair`` finishes the job on the next run.

Every write and repair holds the store's lock (``locked``), and so does a master key install
(``multimaster_masterkeyfiles``): two runs (two operators, reactors on several masters) cannot
delete each other's staged files or undo each other's compare-and-set. Salt's own ``salt-key``
takes no lock, so an accept also re-checks at write time that no rejection or denial of the key
landed after the plan.

Reads never follow a symlinked state dir or key file and never return what is not one public
key PEM: a state dir pointing at ``/etc`` is reported (``store_problems``), not read.
"""

import contextlib
import errno
import fcntl
import glob
import hashlib
import json
import logging
import os
import stat
import tempfile
import time

import multimaster_daemon
import multimaster_ids
import multimaster_keys
import multimaster_reactor
import multimaster_saltcompat
import multimaster_seal
import multimaster_transport
import salt.config
import salt.payload
import salt.utils.atomicfile
import salt.utils.files
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
# What each key action leaves in the store (None: no key at all).
TARGET_STATE = {
    "accept": "accepted",
    "pend": "pending",
    "reject": "rejected",
    "deny": "denied",
    "delete": None,
}
# States a rejection overrides (Salt's priority): writing them never removes a rejected key.
_SOFT_STATES = ("accepted", "pending")
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


def _pki(mopts):
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
    with _locked_path(os.path.join(_pki(mopts), LOCK_FILE), timeout) as path:
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
        keys, denied = _scan_localfs(_pki(mopts), ids, with_pubs, fp_cache)
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


def _as_key(text):
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
            keys[minion_id] = (data["state"], *_as_key(data["pub"]))
    for minion_id in cache.list("denied_keys"):
        if wanted(minion_id):
            pems = cache.fetch("denied_keys", minion_id) or []
            if pems:
                denied[minion_id] = ("denied", *_as_key(pems[0]))
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
            fp = (read or (lambda: _read_key(path)))()[0]
            self.reads += 1
        self.seen[path] = stamp + [fp]
        return fp

    @property
    def changed(self):
        """
        True when ``seen`` differs from ``known`` (worth saving for the next run).
        """
        return self.reads > 0 or len(self.seen) != len(self.known)


def _read_key(path, dir_fd=None):
    """
    ``_as_key`` of the regular file ``path`` (relative to ``dir_fd`` if given): never through a
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
        return _as_key(handle.read(MAX_KEY_BYTES + 1))


def _key_entries(path):
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
    for entry, dir_fd in _key_entries(path):
        if not wanted(entry.name):
            continue
        if with_pubs or fp_cache is None:
            found[entry.name] = (state, *_read_key(entry.name, dir_fd))
            continue
        fp = fp_cache.fingerprint(
            os.path.join(path, entry.name),
            _stamp(entry.stat(follow_symlinks=False)),
            lambda name=entry.name, fd=dir_fd: _read_key(name, fd),
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
        path = os.path.join(_pki(mopts), name)
        if os.path.islink(path):
            problems.append(
                f"{path} is a symbolic link (to {os.readlink(path)}): its keys are not read and "
                "nothing is written; make it a directory"
            )
        elif os.path.lexists(path) and not os.path.isdir(path):
            problems.append(f"{path} is not a directory: its keys are not read")
    return problems


def _check_store(mopts):
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
    held = {i: e[1] for i, e in entries.items() if e[0] in _SOFT_STATES and e[1]}
    try:
        directory = _master_owned_dir(mopts, os.path.dirname(held_path(mopts)))
        with _locked_path(os.path.join(directory, HELD_LOCK), HELD_LOCK_TIMEOUT):
            record = _read_held(mopts)
            merged = _merge_held(record, held, _wanted(ids), now)
            if merged != record:
                _write_held(mopts, merged)
    except (OSError, CommandExecutionError) as exc:
        log.warning("multimaster: cannot record the keys %s holds: %s", _pki(mopts), exc)
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


# --- repair ----------------------------------------------------------------------------------


def _tmp_dirs(mopts):
    # The store's, and pki_dir's where multimaster_masterkeyfiles stages master keys (a cluster
    # store lives elsewhere).
    return sorted({os.path.join(_pki(mopts), TMP_DIR), os.path.join(mopts["pki_dir"], TMP_DIR)})


def _real_dir(path):
    return os.path.isdir(path) and not os.path.islink(path)


def repair_needed(mopts):
    """
    True when an interrupted run left temp files or an id in more than one state dir.

    mopts
        The master's opts, as Salt loads them from its config dir (``master_opts``).
    """
    if not _localfs(mopts):
        return False
    staged = any(_real_dir(tmp) and os.listdir(tmp) for tmp in _tmp_dirs(mopts))
    return staged or bool(_multi_state_ids(_pki(mopts)))


def _multi_state_ids(pki):
    seen, multi = set(), set()
    for name in PRIORITY:
        for entry, _ in _key_entries(os.path.join(pki, name)):
            (multi if entry.name in seen else seen).add(entry.name)
    return multi


def repair(mopts):
    """
    Under the store lock: remove temp files of an interrupted run and leave every id in the one
    state Salt reads (rejected > pending > accepted). Returns the ids that were repaired.

    mopts
        The master's opts, as Salt loads them from its config dir (``master_opts``).
    """
    with locked(mopts):
        return _repair(mopts)


def _repair(mopts):
    if not _localfs(mopts):
        return []
    # Safe only under the lock: every staged file of a live run is renamed before it lets go.
    for tmp in _tmp_dirs(mopts):
        if _real_dir(tmp):
            for name in os.listdir(tmp):
                os.unlink(os.path.join(tmp, name))
    pki = _pki(mopts)
    multi = sorted(_multi_state_ids(pki))
    for minion_id in multi:
        kept = False
        for name in PRIORITY:
            path = os.path.join(pki, name, minion_id)
            if _is_regular(path):
                if kept:
                    os.unlink(path)
                kept = True
    return multi


# --- writes ----------------------------------------------------------------------------------


def _is_regular(path):
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


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
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode())
            os.fchmod(fd, mode)
            if uid is not None:
                os.fchown(fd, uid, -1)
            if sync:
                handle.flush()
                os.fsync(fd)
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def discard(paths):
    """
    Remove whichever of ``paths`` exist (None entries skipped): staged files a run gives up.
    """
    for path in paths:
        if path and os.path.lexists(path):
            os.unlink(path)


def _others(state):
    """
    The dirs a write of ``state`` clears for the id: none for a denied key (it sits beside),
    every dir for None, and never a rejected key for accepted or pending.
    """
    if state == "denied":
        return []
    if state is None:
        return [*STATE_DIRS.values(), DENIED_DIR]
    kept = {state, "rejected"} if state in _SOFT_STATES else {state}
    return [d for s, d in STATE_DIRS.items() if s not in kept]


def _blocked(state, pem, rejected, denied_fp):
    """
    Why writing ``state`` must not go ahead, or None: a rejected key (``salt-key -r`` after the
    plan) blocks accepting and pending it; a denied copy of this very key blocks accepting it
    (deny wins). A denied key that differs is a spoof record and blocks nothing.
    """
    if state in _SOFT_STATES and rejected:
        return "rejected after the plan"
    if state == "accepted" and denied_fp and denied_fp == multimaster_keys.fingerprint(pem):
        return "denied after the plan"
    return None


def _blocked_file(pki, minion_id, state, pem):
    if state not in _SOFT_STATES:
        return None
    denied = os.path.join(pki, DENIED_DIR, minion_id)
    return _blocked(
        state,
        pem,
        _is_regular(os.path.join(pki, STATE_DIRS["rejected"], minion_id)),
        _read_key(denied)[0] if _is_regular(denied) else None,
    )


def _check_ids(changes):
    for minion_id, _, _ in changes:
        multimaster_ids.check_id(minion_id, "minion id")


def write(mopts, changes):
    """
    Under the store lock, apply ``changes``, a list of ``(minion_id, state, pem)``: state
    accepted, pending or rejected (the id ends up in that state only, except that a rejected
    key is never removed by accepting or pending), denied (a denied key beside whatever the id
    holds), or None (every key of the id is removed). PEMs must already be canonical and checked.

    An accept or pend is skipped when the id is rejected at write time, an accept also when
    this very key is denied. Returns the skipped changes as ``[{"id", "state", "reason"}]``.

    localfs_key: every new file is staged and made durable by one sync before any rename, then
    renamed into place and the id's other states removed (a crash leaves at most temp files and
    an id in two dirs, both handled by ``repair``). Other drivers go through the key cache.

    mopts
        The master's opts, as Salt loads them from its config dir (``master_opts``).
    """
    _check_ids(changes)
    with locked(mopts):
        skipped = _write(mopts, changes)
    return [
        {"id": changes[i][0], "state": changes[i][1], "reason": reason}
        for i, reason in sorted(skipped.items())
    ]


def _write(mopts, changes):
    """
    ``write`` without the lock and the id checks; returns ``{index in changes: reason}`` of the
    skipped ones.
    """
    if not _localfs(mopts):
        return _write_cache(mopts, changes)
    _check_store(mopts)
    pki = _pki(mopts)
    tmp_dir, uid = private_dir(os.path.join(pki, TMP_DIR)), master_uid(mopts)
    staged = []
    try:
        for _, state, pem in changes:
            staged.append(stage(tmp_dir, pem, uid) if state else None)
        os.sync()
        return _move_all(pki, changes, staged)
    finally:
        discard(staged)


def _move_all(pki, changes, staged):
    skipped, touched = {}, set()
    for index, ((minion_id, state, pem), tmp) in enumerate(zip(changes, staged, strict=True)):
        reason = _blocked_file(pki, minion_id, state, pem)
        if reason:
            skipped[index] = reason
            continue
        if state:
            target = STATE_DIRS.get(state, DENIED_DIR)
            os.makedirs(os.path.join(pki, target), mode=0o750, exist_ok=True)
            os.replace(tmp, os.path.join(pki, target, minion_id))
            touched.add(target)
        for other in _others(state):
            path = os.path.join(pki, other, minion_id)
            if os.path.isfile(path):
                os.unlink(path)
                touched.add(other)
    for name in touched:
        fsync_dir(os.path.join(pki, name))
    return skipped


def _torn_ids(mopts, cache, changes):
    """
    The ids of ``changes`` whose ``keys`` record ``mmap_key`` holds but does not list: a write
    killed between the record and its index (seen after ``kill -9``). ``store`` would update
    the record in place and leave it unlisted, so ``salt-key -L`` and every inventory miss it.
    """
    if mopts.get(multimaster_saltcompat.KEY_CACHE_OPTION) != "mmap_key":
        return set()
    listed = set(cache.list("keys"))
    return {
        minion_id
        for minion_id, state, _ in changes
        if state and minion_id not in listed and cache.fetch("keys", minion_id) is not None
    }


def _write_cache(mopts, changes):
    cache = _cache(mopts)
    skipped = {}
    torn = _torn_ids(mopts, cache, changes)
    for index, (minion_id, state, pem) in enumerate(changes):
        reason = _blocked_cache(cache, minion_id, state, pem)
        if reason:
            skipped[index] = reason
        elif state == "denied":
            cache.store("denied_keys", minion_id, [pem])
        elif state:
            if minion_id in torn:
                cache.flush("keys", minion_id)
            cache.store("keys", minion_id, {"state": state, "pub": pem})
        else:
            cache.flush("keys", minion_id)
            cache.flush("denied_keys", minion_id)
    return skipped


def _blocked_cache(cache, minion_id, state, pem):
    if state not in _SOFT_STATES:
        return None
    held = cache.fetch("keys", minion_id) or {}
    denied = cache.fetch("denied_keys", minion_id) or [None]
    return _blocked(state, pem, held.get("state") == "rejected", _as_key(denied[0])[0])


# --- key actions -----------------------------------------------------------------------------


def apply_actions(mopts, checked):
    """
    Apply planned key actions with compare-and-set, all under the store lock. ``checked`` is a
    list of ``(action, pem)``: action ``{"id", "op" (accept|pend|reject|deny|delete), "fp",
    "expect"}`` and pem the already validated canonical PEM (None for delete).

    Repairs what an interrupted run left, reads the current entries of those ids, skips every
    action whose id's entry is no longer ``expect`` (compared as lists), writes the rest (an
    accept is still skipped when the key is rejected or denied at write time), rotates the AES
    key when an accepted key was rejected or deleted, and records what those ids hold now
    (``note_held``).

    Returns ``{"done": [{"id", "op"}], "skipped": [{"id", "op", "reason"}], "repaired": [id],
    "rotated": bool}``.

    mopts
        The master's opts, as Salt loads them from its config dir (``master_opts``).
    """
    changes = [_change(action, pem) for action, pem in checked]
    _check_ids(changes)
    with locked(mopts):
        _check_store(mopts)
        repaired = _repair(mopts)
        current, _ = inventory(mopts, ids={minion_id for minion_id, _, _ in changes})
        todo, skipped = _as_planned(checked, changes, current)
        blocked = _write(mopts, [change for _, change, _ in todo])
        done = [item for index, item in enumerate(todo) if index not in blocked]
        skipped += [_skip(todo[index][0], reason) for index, reason in sorted(blocked.items())]
        rotated = any(_revokes(action["op"], held) for action, _, held in done)
        if rotated:
            rotate_aes(mopts)
        written = {minion_id for minion_id, _, _ in changes}
        note_held(mopts, inventory(mopts, ids=written)[0], written)
    return {
        "done": [{"id": action["id"], "op": action["op"]} for action, _, _ in done],
        "skipped": skipped,
        "repaired": repaired,
        "rotated": rotated,
    }


def _change(action, pem):
    if action.get("op") not in TARGET_STATE:
        raise CommandExecutionError(f"unknown key action {action.get('op')!r}")
    return action.get("id"), TARGET_STATE[action["op"]], pem


def _as_planned(checked, changes, current):
    """
    ``([(action, change, held)], skipped)``: the actions whose id still holds the planned entry.
    """
    todo, skipped = [], []
    for (action, _), change in zip(checked, changes, strict=True):
        held = current.get(action["id"])
        if _wire(held) != _wire(action.get("expect")):
            skipped.append(_skip(action, f"changed since planned: {held}"))
        else:
            todo.append((action, change, held))
    return todo, skipped


def _wire(entry):
    # A denied file that is not a key reads as [state, fp, None]; the planner sends [state, fp].
    if entry is None:
        return None
    entry = list(entry)
    return entry[:2] if len(entry) == 3 and entry[2] is None else entry


def _skip(action, reason):
    return {"id": action["id"], "op": action["op"], "reason": reason}


def _revokes(op, held):
    return op in ("reject", "delete") and bool(held) and held[0] == "accepted"


def rotate_aes(mopts):
    """
    Ask the master to rotate its AES key (as ``salt-key -d`` does), so a removed minion stops
    decrypting publishes.

    mopts
        The master's opts, as Salt loads them from its config dir (``master_opts``).
    """
    multimaster_saltcompat.rotate_aes(mopts)


# --- peer side (run by a control minion) ---

# How many ids a return lists; counts are always complete.
SAMPLE = 50
# The largest transfer of key actions accepted: key actions for a large fleet.
ACTIONS_LIMIT = 256 * 1024 * 1024


def _inventory_filter(buckets, ids):
    """
    Which entries an inventory returns: a set of ids, a bucket test, or None for all.
    """
    if ids is not None:
        return {multimaster_ids.check_id(i, "minion id") for i in ids}
    if buckets is not None:
        chosen = {int(b) for b in buckets}
        return lambda minion_id: multimaster_keys.bucket_of(minion_id) in chosen
    return None


def peer_inventory(minion_opts, master, mopts, buckets=None, ids=None, with_pubs=False):
    """
    What ``multimaster_peer.key_inventory`` answers for ``master`` (its opts ``mopts``): digests
    only without ``buckets``/``ids``, else the entries in them (and their public keys with
    ``with_pubs``); always a fresh challenge (``binding``). Records the accepted and pending
    ids it read as held.
    """
    alive = multimaster_daemon.master_alive(master, mopts)
    wanted = _inventory_filter(buckets, ids)
    full_scan = wanted is None
    with _fingerprint_cache(minion_opts, mopts, full_scan) as fp_cache:
        entries, pubs = inventory(mopts, with_pubs=with_pubs, ids=wanted, fp_cache=fp_cache)
    # What the key reactor on this master checks a delete event against.
    note_held(mopts, entries, wanted)
    ret = {"alive": alive, "binding": multimaster_seal.binding(minion_opts, master)}
    if full_scan:
        total, per_bucket = multimaster_keys.digests(entries)
        ret.update(
            digest=total, buckets=per_bucket, count=len(entries), repair=repair_needed(mopts)
        )
        return ret
    ret.update(entries=entries, pubs=pubs)
    return ret


@contextlib.contextmanager
def _fingerprint_cache(minion_opts, mopts, full_scan):
    """
    Fingerprints of this master's key files from the last full scan, kept in this minion's
    cachedir (public data only): a re-run reads only the files that changed.
    """
    name = hashlib.sha256(mopts["pki_dir"].encode()).hexdigest()[:16]
    path = os.path.join(minion_opts["cachedir"], "multimaster", f"fingerprints-{name}.p")
    try:
        with salt.utils.files.fopen(path, "rb") as handle:
            known = salt.payload.load(handle)
    except (OSError, ValueError, TypeError):
        known = {}
    cache = FingerprintCache(known if isinstance(known, dict) else {})
    yield cache
    if full_scan and cache.changed:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with salt.utils.atomicfile.atomic_open(path, "wb") as handle:
            salt.payload.dump(cache.seen, handle)


def checked_action(action):
    """
    ``(action, canonical pem)`` after checking id, op and that the key is canonical and has the
    planned fingerprint; raises before anything is written.
    """
    if not isinstance(action, dict):
        raise CommandExecutionError(f"key action {action!r} is not a mapping")
    multimaster_ids.check_id(action.get("id"), "minion id")
    if action.get("op") not in TARGET_STATE:
        raise CommandExecutionError(f"unknown key action {action.get('op')!r}")
    if action["op"] == "delete":
        return action, None
    pem = multimaster_keys.canonical(action.get("pub"), f"key of {action['id']!r}")
    if multimaster_keys.fingerprint(pem) != action.get("fp"):
        raise multimaster_keys.InvalidKeyError(
            f"key of {action['id']!r}: fingerprint {multimaster_keys.fingerprint(pem)} "
            f"does not match the planned {action.get('fp')}"
        )
    return action, pem


def _pulled_actions(transfer, pull):
    instruction = multimaster_transport.pulled_json(transfer, ACTIONS_LIMIT, "key actions", pull)
    actions = instruction.get("actions") if isinstance(instruction, dict) else None
    if not isinstance(actions, list):
        raise CommandExecutionError("key actions: the pulled transfer holds no action list")
    return actions


def apply_ordered_actions(minion_opts, master, mopts, transfer, order, pull):
    """
    What ``multimaster_peer.apply_key_actions`` answers: the actions pulled with ``pull``,
    applied only under a valid ``order``, every one checked first; counts and samples.
    """
    actions = _pulled_actions(transfer, pull)
    multimaster_seal.check_order_for(
        minion_opts, master, order, {"actions": actions}, "key_actions"
    )
    checked = [checked_action(action) for action in actions]
    start = time.monotonic()
    done = apply_actions(mopts, checked)
    log.info("multimaster: %d key change(s) in %.2fs", len(done["done"]), time.monotonic() - start)
    counts = {}
    for item in done["done"]:
        counts[item["op"]] = counts.get(item["op"], 0) + 1
    # Counts and a sample: a 10,000-key return would cost more on the wire than the work itself.
    return {
        "changes": counts,
        "ids": sorted(item["id"] for item in done["done"])[:SAMPLE],
        "skipped": done["skipped"][:SAMPLE],
        "skipped_count": len(done["skipped"]),
        "repaired": done["repaired"][:SAMPLE],
        "rotated": done["rotated"],
    }
