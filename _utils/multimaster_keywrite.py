"""
Changing a master's minion key store from its host (the control minion): apply key actions
crash-safely under the store's lock, repair what an interrupted run left, request AES rotation,
and answer the key plane's peer calls (inventory, ordered key actions). Reading the store, its
lock and the staging helpers are ``multimaster_keystore``'s.

For the files of ``localfs_key`` (and of the older Salts), Salt's ``store`` first deletes the old
key and then writes a temp file inside the target dir, so a crash can lose the key or leave
``minions_pre/tmpXXXX`` that ``salt-key`` lists as a minion. Here the new file is staged in a
private temp dir (``.multimaster-tmp``), made durable, renamed into place, and only then are the
old states removed; a crash leaves the id in two dirs, where Salt's priority (rejected > pending >
accepted) keeps the safer one, and ``repair`` finishes the job on the next run. Other drivers go
through the key cache (``multimaster_saltcompat.key_cache``).

Salt's own ``salt-key`` takes no lock, so an accept also re-checks at write time that no
rejection or denial of the key landed after the plan.
"""

import contextlib
import hashlib
import logging
import os
import stat
import time

import multimaster_daemon
import multimaster_ids
import multimaster_keys
import multimaster_keystore
import multimaster_saltcompat
import multimaster_seal
import multimaster_transport
import salt.payload
import salt.utils.atomicfile
import salt.utils.files
from salt.exceptions import CommandExecutionError

log = logging.getLogger(__name__)

# What each key action leaves in the store (None: no key at all).
TARGET_STATE = {
    "accept": "accepted",
    "pend": "pending",
    "reject": "rejected",
    "deny": "denied",
    "delete": None,
}


# --- repair ----------------------------------------------------------------------------------


def _tmp_dirs(mopts):
    # The store's, and pki_dir's where multimaster_masterkeyfiles stages master keys (a cluster
    # store lives elsewhere).
    return sorted(
        {
            os.path.join(multimaster_keystore.store_dir(mopts), multimaster_keystore.TMP_DIR),
            os.path.join(mopts["pki_dir"], multimaster_keystore.TMP_DIR),
        }
    )


def _real_dir(path):
    return os.path.isdir(path) and not os.path.islink(path)


def repair_needed(mopts):
    """
    True when an interrupted run left temp files or an id in more than one state dir.

    mopts
        The master's opts, as Salt loads them from its config dir
        (``multimaster_keystore.master_opts``).
    """
    if not multimaster_saltcompat.keys_are_files(mopts):
        return False
    staged = any(_real_dir(tmp) and os.listdir(tmp) for tmp in _tmp_dirs(mopts))
    return staged or bool(_multi_state_ids(multimaster_keystore.store_dir(mopts)))


def _multi_state_ids(pki):
    seen, multi = set(), set()
    for name in multimaster_keystore.PRIORITY:
        for entry, _ in multimaster_keystore.key_entries(os.path.join(pki, name)):
            (multi if entry.name in seen else seen).add(entry.name)
    return multi


def repair(mopts):
    """
    Under the store lock: remove temp files of an interrupted run and leave every id in the one
    state Salt reads (rejected > pending > accepted). Returns the ids that were repaired.

    mopts
        The master's opts, as Salt loads them from its config dir
        (``multimaster_keystore.master_opts``).
    """
    with multimaster_keystore.locked(mopts):
        return _repair(mopts)


def _repair(mopts):
    if not multimaster_saltcompat.keys_are_files(mopts):
        return []
    # Safe only under the lock: every staged file of a live run is renamed before it lets go.
    for tmp in _tmp_dirs(mopts):
        if _real_dir(tmp):
            for name in os.listdir(tmp):
                os.unlink(os.path.join(tmp, name))
    pki = multimaster_keystore.store_dir(mopts)
    multi = sorted(_multi_state_ids(pki))
    for minion_id in multi:
        kept = False
        for name in multimaster_keystore.PRIORITY:
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


def _others(state):
    """
    The dirs a write of ``state`` clears for the id: none for a denied key (it sits beside),
    every dir for None, and never a rejected key for accepted or pending.
    """
    if state == "denied":
        return []
    if state is None:
        return [*multimaster_keystore.STATE_DIRS.values(), multimaster_keystore.DENIED_DIR]
    kept = {state, "rejected"} if state in multimaster_keystore.SOFT_STATES else {state}
    return [d for s, d in multimaster_keystore.STATE_DIRS.items() if s not in kept]


def _blocked(state, pem, rejected, denied_fp):
    """
    Why writing ``state`` must not go ahead, or None: a rejected key (``salt-key -r`` after the
    plan) blocks accepting and pending it; a denied copy of this very key blocks accepting it
    (deny wins). A denied key that differs is a spoof record and blocks nothing.
    """
    if state in multimaster_keystore.SOFT_STATES and rejected:
        return "rejected after the plan"
    if state == "accepted" and denied_fp and denied_fp == multimaster_keys.fingerprint(pem):
        return "denied after the plan"
    return None


def _blocked_file(pki, minion_id, state, pem):
    if state not in multimaster_keystore.SOFT_STATES:
        return None
    denied = os.path.join(pki, multimaster_keystore.DENIED_DIR, minion_id)
    return _blocked(
        state,
        pem,
        _is_regular(os.path.join(pki, multimaster_keystore.STATE_DIRS["rejected"], minion_id)),
        multimaster_keystore.read_key(denied)[0] if _is_regular(denied) else None,
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
        The master's opts, as Salt loads them from its config dir
        (``multimaster_keystore.master_opts``).
    """
    _check_ids(changes)
    with multimaster_keystore.locked(mopts):
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
    if not multimaster_saltcompat.keys_are_files(mopts):
        return _write_cache(mopts, changes)
    multimaster_keystore.check_store(mopts)
    pki = multimaster_keystore.store_dir(mopts)
    tmp_dir, uid = (
        multimaster_keystore.private_dir(os.path.join(pki, multimaster_keystore.TMP_DIR)),
        multimaster_keystore.master_uid(mopts),
    )
    staged = []
    try:
        texts = [pem if state else None for _, state, pem in changes]
        for path in multimaster_keystore.staged_files(tmp_dir, texts, uid):
            staged.append(path)
        os.sync()
        return _move_all(pki, changes, staged)
    finally:
        multimaster_keystore.discard(staged)


def _move_all(pki, changes, staged):
    """
    Rename each staged file into place (its entry in ``staged`` set to None once moved) and
    clear the id's other states; returns ``{index in changes: reason}`` of the blocked ones.
    """
    skipped, touched, made = {}, set(), set()
    for index, (minion_id, state, pem) in enumerate(changes):
        reason = _blocked_file(pki, minion_id, state, pem)
        if reason:
            skipped[index] = reason
            continue
        if state:
            target = multimaster_keystore.STATE_DIRS.get(state, multimaster_keystore.DENIED_DIR)
            if target not in made:
                os.makedirs(os.path.join(pki, target), mode=0o750, exist_ok=True)
                made.add(target)
            os.replace(staged[index], os.path.join(pki, target, minion_id))
            staged[index] = None
            touched.add(target)
        for other in _others(state):
            path = os.path.join(pki, other, minion_id)
            if os.path.isfile(path):
                os.unlink(path)
                touched.add(other)
    for name in touched:
        multimaster_keystore.fsync_dir(os.path.join(pki, name))
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
    cache = multimaster_saltcompat.key_cache(mopts)
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
    if state not in multimaster_keystore.SOFT_STATES:
        return None
    held = cache.fetch("keys", minion_id) or {}
    denied = cache.fetch("denied_keys", minion_id) or [None]
    return _blocked(
        state, pem, held.get("state") == "rejected", multimaster_keystore.as_key(denied[0])[0]
    )


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
    (``multimaster_keystore.note_held``).

    Returns ``{"done": [{"id", "op"}], "skipped": [{"id", "op", "reason"}], "repaired": [id],
    "rotated": bool}``.

    mopts
        The master's opts, as Salt loads them from its config dir
        (``multimaster_keystore.master_opts``).
    """
    changes = [_change(action, pem) for action, pem in checked]
    _check_ids(changes)
    with multimaster_keystore.locked(mopts):
        multimaster_keystore.check_store(mopts)
        repaired = _repair(mopts)
        current, _ = multimaster_keystore.inventory(
            mopts, ids={minion_id for minion_id, _, _ in changes}
        )
        todo, skipped = _as_planned(checked, changes, current)
        blocked = _write(mopts, [change for _, change, _ in todo])
        done = [item for index, item in enumerate(todo) if index not in blocked]
        skipped += [_skip(todo[index][0], reason) for index, reason in sorted(blocked.items())]
        rotated = any(_revokes(action["op"], held) for action, _, held in done)
        if rotated:
            rotate_aes(mopts)
        multimaster_keystore.note_held(
            mopts, _entries_after(current, done), {minion_id for minion_id, _, _ in changes}
        )
    return {
        "done": [{"id": action["id"], "op": action["op"]} for action, _, _ in done],
        "skipped": skipped,
        "repaired": repaired,
        "rotated": rotated,
    }


def _entries_after(current, done):
    """
    What the ids read into ``current`` (under the lock, before the writes) hold once ``done``
    (``[(action, change, held)]``) is written: the writes' own outcome, so that recording it
    reads no written file back (a denial sits beside the id's state and changes none).
    """
    entries = dict(current)
    for action, (minion_id, state, _), _ in done:
        if state is None:
            entries.pop(minion_id, None)
        elif state != "denied":
            entries[minion_id] = [state, action["fp"]]
    return entries


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
        if _still_planned(action, _wire(held)):
            todo.append((action, change, held))
        else:
            skipped.append(_skip(action, f"changed since planned: {held}"))
    return todo, skipped


def _still_planned(action, held):
    """
    True when ``held`` (wire form) is the entry planned on, or when an accept planned on no
    entry meets the very key it accepts as pending: a minion that lists this master signed in
    with it meanwhile, as every minion does with a master added into a reserved slot.
    """
    if held == _wire(action.get("expect")):
        return True
    return (
        action["op"] == "accept"
        and action.get("expect") is None
        and held == ["pending", action.get("fp")]
    )


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
        The master's opts, as Salt loads them from its config dir
        (``multimaster_keystore.master_opts``).
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
        entries, pubs = multimaster_keystore.inventory(
            mopts, with_pubs=with_pubs, ids=wanted, fp_cache=fp_cache
        )
    # What the key reactor on this master checks a delete event against.
    multimaster_keystore.note_held(mopts, entries, wanted)
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
    cache = multimaster_keystore.FingerprintCache(known if isinstance(known, dict) else {})
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
