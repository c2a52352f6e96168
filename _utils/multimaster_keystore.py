"""
A master's key store as seen from its host (the control minion): read the inventory, apply key
actions crash-safely, read and install master keys, request AES rotation.

Keys go through ``salt.cache.Cache(opts, driver=opts["keys.cache_driver"])`` like Salt's own
``salt-key``. One exception, for the default ``localfs_key`` driver's minion keys: its ``store``
first deletes the id from every state dir and then writes a temp file inside the state dir, so a
crash can lose the id or leave ``minions_pre/tmpXXXX`` that ``salt-key`` lists as a minion. Here
the new state is written first (temp file outside the state dirs, fsync, rename) and the old ones
are removed after; a crash leaves the id in two dirs, where Salt's priority (rejected > pending >
accepted) keeps the safer one, and ``repair`` finishes the job on the next run.
"""

import os
import tempfile

import multimaster_ids
import multimaster_keys
import salt.cache
import salt.config
import salt.crypt
import salt.utils.user
from salt.exceptions import CommandExecutionError

STATE_DIRS = {"accepted": "minions", "pending": "minions_pre", "rejected": "minions_rejected"}
DENIED_DIR = "minions_denied"
# Salt's reading order: the first dir that holds an id wins.
PRIORITY = ("minions_rejected", "minions_pre", "minions")
TMP_DIR = ".multimaster-tmp"


def master_opts(config_dir):
    """
    The options of the master whose config lives in ``config_dir``.
    """
    path = os.path.join(config_dir, "master")
    if not os.path.isfile(path):
        raise CommandExecutionError(f"no master config at {path}")
    return salt.config.master_config(path)


def _cache(mopts):
    return salt.cache.Cache(mopts, driver=mopts["keys.cache_driver"])


def _localfs(mopts):
    return mopts["keys.cache_driver"] == "localfs_key"


def _pki(mopts):
    return mopts["cluster_pki_dir"] if mopts.get("cluster_id") else mopts["pki_dir"]


def master_key_name(mopts):
    """
    The base name 3008 stores the master keypair under (``<id without _master>``).
    """
    return mopts["id"].removesuffix("_master")


def inventory(mopts, with_pubs=False, ids=None, fp_cache=None):
    """
    ``{id: entry}`` (entry as in ``multimaster_keys.plan``) and, with ``with_pubs``, the PEMs as
    ``{id: {"key": pem, "denied": pem}}``. ``ids`` (a set, or a predicate on the id) limits the
    result to those ids.

    ``fp_cache`` (localfs_key only): a ``FingerprintCache`` the caller keeps between runs.
    """
    if _localfs(mopts):
        keys, denied = _scan_localfs(_pki(mopts), ids, with_pubs, fp_cache)
    else:
        keys, denied = _scan_cache(mopts, ids)
    entries, pubs = {}, {}
    for minion_id, (state, fp, pem) in keys.items():
        entries[minion_id] = [state, fp]
        if with_pubs:
            pubs[minion_id] = {"key": pem}
    for minion_id, (_, fp, pem) in denied.items():
        entries.setdefault(minion_id, ["denied", None]).append(fp)
        if with_pubs:
            pubs.setdefault(minion_id, {})["denied"] = pem
    return entries, pubs


def _wanted(ids):
    if ids is None:
        return lambda _: True
    return ids if callable(ids) else ids.__contains__


def _scan_cache(mopts, ids):
    wanted = _wanted(ids)
    cache = _cache(mopts)
    keys, denied = {}, {}
    for minion_id, data in cache.list_all("keys", include_data=True).items():
        if wanted(minion_id):
            pem = data["pub"]
            keys[minion_id] = (data["state"], multimaster_keys.fingerprint(pem), pem)
    for minion_id in cache.list("denied_keys"):
        if wanted(minion_id):
            pems = cache.fetch("denied_keys", minion_id) or []
            if pems:
                denied[minion_id] = ("denied", multimaster_keys.fingerprint(pems[0]), pems[0])
    return keys, denied


class FingerprintCache:
    """
    Fingerprints of key files by ``[inode, mtime_ns, size]``, carried between runs by the
    caller: a file whose stamp is unchanged is not read again (public data only).
    """

    def __init__(self, known=None):
        self.known = known or {}
        self.seen = {}
        self.reads = 0

    def fingerprint(self, path, stamp):
        cached = self.known.get(path)
        if cached and list(cached[:3]) == stamp:
            fp = cached[3]
        else:
            fp = multimaster_keys.fingerprint(_read(path))
            self.reads += 1
        self.seen[path] = stamp + [fp]
        return fp

    @property
    def changed(self):
        return self.reads > 0 or len(self.seen) != len(self.known)


def _read(path):
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def _read_dir(path, state, ids, with_pubs, fp_cache):
    wanted = _wanted(ids)
    found = {}
    try:
        entries = os.scandir(path)
    except FileNotFoundError:
        return found
    with entries:
        for entry in entries:
            # What Salt's localfs_key reads: regular files, no dotfiles.
            if entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
                continue
            if not wanted(entry.name):
                continue
            if with_pubs or fp_cache is None:
                pem = _read(entry.path)
                found[entry.name] = (state, multimaster_keys.fingerprint(pem), pem)
                continue
            st = entry.stat(follow_symlinks=False)
            stamp = [st.st_ino, st.st_mtime_ns, st.st_size]
            found[entry.name] = (state, fp_cache.fingerprint(entry.path, stamp), None)
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


def repair_needed(mopts):
    """
    True when an interrupted run left temp files or an id in more than one state dir.
    """
    if not _localfs(mopts):
        return False
    pki = _pki(mopts)
    tmp = os.path.join(pki, TMP_DIR)
    return bool(os.path.isdir(tmp) and os.listdir(tmp)) or bool(_multi_state_ids(pki))


def _multi_state_ids(pki):
    seen, multi = set(), set()
    for name in PRIORITY:
        path = os.path.join(pki, name)
        if os.path.isdir(path):
            for minion_id in os.listdir(path):
                (multi if minion_id in seen else seen).add(minion_id)
    return multi


def repair(mopts):
    """
    Remove temp files of an interrupted run and leave every id in the one state Salt reads.
    Returns the ids that were repaired.
    """
    if not _localfs(mopts):
        return []
    pki = _pki(mopts)
    tmp = os.path.join(pki, TMP_DIR)
    if os.path.isdir(tmp):
        for name in os.listdir(tmp):
            os.unlink(os.path.join(tmp, name))
    multi = sorted(_multi_state_ids(pki))
    for minion_id in multi:
        kept = False
        for name in PRIORITY:
            path = os.path.join(pki, name, minion_id)
            if os.path.isfile(path):
                if kept:
                    os.unlink(path)
                kept = True
    return multi


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _stage(pki, user, pem):
    """
    Write ``pem`` to a temp file outside the state dirs (same filesystem) and return its path.
    """
    tmp_dir = os.path.join(pki, TMP_DIR)
    os.makedirs(tmp_dir, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=tmp_dir)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem.encode())
    uid = salt.utils.user.get_uid(user) if user else None
    if uid is not None:
        os.chown(tmp, uid, -1)
    return tmp


def _others(state):
    if state == "denied":
        return []
    if state is None:
        return list(STATE_DIRS.values()) + [DENIED_DIR]
    return [d for s, d in STATE_DIRS.items() if s != state]


def write(mopts, changes):
    """
    Apply ``changes``, a list of ``(minion_id, state, pem)``: state accepted, pending or rejected
    (the id ends up in that state only), denied (a denied key beside whatever the id holds), or
    None (every key of the id is removed). PEMs must already be canonical and checked.

    localfs_key: every new file is staged and made durable by one sync before any rename, then
    renamed into place and the id's other states removed (a crash leaves at most temp files and
    an id in two dirs, both handled by ``repair``). Other drivers go through the key cache.
    """
    for minion_id, _, _ in changes:
        multimaster_ids.check_id(minion_id, "minion id")
    if not _localfs(mopts):
        _write_cache(mopts, changes)
        return
    pki = _pki(mopts)
    staged = [_stage(pki, mopts.get("user"), pem) if state else None for _, state, pem in changes]
    os.sync()
    touched = set()
    for (minion_id, state, _), tmp in zip(changes, staged, strict=True):
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
        _fsync_dir(os.path.join(pki, name))


def _write_cache(mopts, changes):
    cache = _cache(mopts)
    for minion_id, state, pem in changes:
        if state == "denied":
            cache.store("denied_keys", minion_id, [pem])
        elif state:
            cache.store("keys", minion_id, {"state": state, "pub": pem})
        else:
            cache.flush("keys", minion_id)
            cache.flush("denied_keys", minion_id)


def rotate_aes(mopts):
    """
    Ask the master to rotate its AES key (as ``salt-key -d`` does), so a removed minion stops
    decrypting publishes.
    """
    salt.crypt.dropfile(mopts["cachedir"], mopts["user"], mopts["id"])


def master_key_files(mopts, signing=False):
    """
    The master_keys cache names of the pair ``sync_master_key`` manages on this master.
    """
    if signing:
        base = mopts["master_sign_key_name"]
    else:
        base = master_key_name(mopts)
    return f"{base}.pem", f"{base}.pub"


def read_master_key(mopts, signing=False, private=False):
    """
    The master's public (or private) key PEM as stored, or None.
    """
    pem_name, pub_name = master_key_files(mopts, signing)
    cache = _cache(mopts)
    name = pem_name if private else pub_name
    value = cache.fetch("master_keys", name)
    if value is None and not signing:
        # A master that has never started under 3008 still has plain master.pem/.pub.
        value = cache.fetch("master_keys", "master.pem" if private else "master.pub")
    return value


def install_master_key(mopts, pem, pub, signing=False):
    """
    Store the pair through the key cache (0400, owned by the master's user). Call it only with
    the master stopped: a running master keeps its private key in memory.
    """
    pem_name, pub_name = master_key_files(mopts, signing)
    cache = _cache(mopts)
    cache.store("master_keys", pem_name, pem)
    cache.store("master_keys", pub_name, pub)
    # 3008 keeps master.pem/.pub as compatibility symlinks to <id>.pem/.pub; plain files left by
    # an older layout would shadow nothing but confuse operators, so leave only links.
    if not signing and _localfs(mopts):
        for legacy, current in (("master.pem", pem_name), ("master.pub", pub_name)):
            path = os.path.join(mopts["pki_dir"], legacy)
            if os.path.lexists(path) and not os.path.islink(path):
                os.unlink(path)
            if not os.path.lexists(path):
                os.symlink(os.path.join(mopts["pki_dir"], current), path)
