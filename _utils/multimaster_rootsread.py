"""
Reading one roots tree (a ``file_roots``/``pillar_roots`` path) into its manifest, per-directory
digests and directory modes (``multimaster_manifest.manifest`` is the public entry): a walk that
hashes again only the files whose stat changed (the hash cache), or, where the
``multimaster_rootswatch`` engine keeps a record of the root, a read of only the directories it
names as changed since the last read (the snapshot). Both live in the master's 0700 cachedir.
"""

import hashlib
import json
import os
import re
import stat
import time

import multimaster_rootswatch
import multimaster_safefs
import salt.utils.atomicfile

# A file changed this recently is hashed again next time: a second write within one timestamp
# tick would leave its size, mtime and ctime as they were.
_RACY_NS = 2 * 10**9


def read(root, ignored, cachedir):
    """
    ``((files, skipped, holding, by_dir), watched)`` of the tree at ``root`` (an existing
    directory): read through the roots watch's record where an engine watches it (``watched``),
    else by a walk with the hash cache. ``holding``: the modes of the directories that hold a
    file; ``by_dir``: the tree's ``dir_digests``.

    root
        The root directory.

    ignored
        A predicate on relative paths (``multimaster_manifest.ignored_by``) or None.

    cachedir
        The master's cachedir, or None for a walk that keeps nothing.
    """
    found = _read_with_record(root, ignored, cachedir) if cachedir else None
    if found is not None:
        return found, True
    return _read_with_hash_cache(root, ignored, cachedir), False


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
# A read that went over at most this many directories leaves the snapshot as it was, and the
# next read goes over them again: writing the snapshot of 30,000 files costs 70 ms, reading a
# few directories again costs next to nothing.
_FEW_DIRS = 32


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
    record's number, unless the read went over no more than ``_FEW_DIRS`` directories.
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
    if todo.get("") or snapshot.get("by_dir") is None or len(todo) > _FEW_DIRS:
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
        {rel: r for rel, r in records.items() if not reread(dir_of(rel))},
        {rel: why for rel, why in skipped.items() if not reread(dir_of(rel))},
        {d: m for d, m in modes.items() if not reread(d)},
    )


def _dir_digests_reusing(files, holding, known, reread):
    """
    ``dir_digests(files, holding)``, with the digest ``known`` holds for each directory that
    was not read again (``reread``): its files and mode are those ``known`` was computed from.
    """
    keys = set(holding)
    keys.update(dir_of(relpath) for relpath in files)
    stale = {d for d in keys if reread(d) or d not in (known or {})}
    groups = {directory: {} for directory in stale}
    for relpath, entry in files.items():
        group = groups.get(dir_of(relpath))
        if group is not None:
            group[relpath] = entry
    out = {d: known[d] for d in keys if d not in stale}
    out.update(
        (d, sha256_json({"files": group, "mode": holding.get(d)})) for d, group in groups.items()
    )
    return out


def _holding(files, modes):
    """
    The entries of ``modes`` (``{directory: mode}``) for the directories that hold one of
    ``files``, the root (``""``) among them unless the tree is empty: an empty root is no more
    synced than an empty directory, and equals a missing one.
    """
    wanted = set()
    for directory in {dir_of(relpath) for relpath in files}:
        parts = directory.split("/") if directory else []
        wanted.update("/".join(parts[:depth]) for depth in range(len(parts) + 1))
    return {directory: mode for directory, mode in modes.items() if directory in wanted}


def sha256_json(document):
    """The SHA-256 of ``document`` as canonical JSON."""
    return hashlib.sha256(
        json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def dir_of(relpath):
    """The directory (relative to the root, ``""`` for the root) that holds ``relpath``."""
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
        groups.setdefault(dir_of(relpath), {})[relpath] = entry
    return {
        directory: sha256_json({"files": group, "mode": dirs.get(directory)})
        for directory, group in groups.items()
    }
