"""
Applying a roots plan on the receiving peer (run by a control minion): the sealed plan opened,
its content stream pulled, and each paired root's deletes, writes and modes done under the
master's roots lock. The manifests are ``multimaster_manifest``, the plan itself
``multimaster_rootsplan``.

A directory a sync creates is made 0700 and given its mode once its files are in. Symlinks below
a root are never followed: a write, a delete and a mode change each go through
``multimaster_safefs``, one directory at a time by fd with ``O_NOFOLLOW``; a file's content is
checked against its planned sha256 before it is renamed into place.
"""

import contextlib
import fcntl
import os

import multimaster_manifest
import multimaster_rootsread
import multimaster_safefs
import multimaster_seal
import multimaster_transport
from salt.exceptions import CommandExecutionError

# The largest sealed roots plan accepted.
PLAN_LIMIT = 64 * 1024 * 1024


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


def roots_of(mopts, kind):
    """
    ``{env: [path, ...]}`` of this master's ``kind`` (its own config; never an argument).
    """
    roots = mopts.get(kind) or {}
    return {env: [str(path) for path in paths] for env, paths in roots.items()}


def paired_root(mopts, pair):
    """
    This master's root for ``pair`` (kind, env, position), from its own config.
    """
    kind, env, index = pair.get("kind"), pair.get("env"), pair.get("index")
    paths = roots_of(mopts, kind).get(env) if kind in multimaster_manifest.ROOT_KINDS else None
    if not paths or not isinstance(index, int) or not 0 <= index < len(paths):
        raise CommandExecutionError(f"no {kind} root at position {index!r} of env {env!r} here")
    return paths[index]


def _failure(root, pair, what, exc):
    """
    One line of the apply report: the root, and for ``file_roots`` ``what`` failed (a quoted
    path, or what the step was) and the error; for ``pillar_roots`` only why, without a path
    (the names of pillar files never leave the sealed manifests and plan: a return lands in
    job caches).
    """
    if pair.get("kind") == "pillar_roots":
        reason = getattr(exc, "reason", None) or exc.strerror or "refused"
        return f"{root}: a pillar file or directory: {reason}"
    return f"{root}: {what}: {exc}"


def _delete_all(root, pair, report):
    for path in pair.get("delete") or []:
        try:
            multimaster_safefs.delete_file(root, path)
            report["deleted"] += 1
        except OSError as exc:
            report["failed"].append(_failure(root, pair, repr(path), exc))


def _write_all(reader, root, pair, report):
    with multimaster_safefs.Batch() as batch:
        for entry in pair.get("write") or []:
            _write_one(reader, root, pair, entry, batch, report)
        try:
            multimaster_safefs.make_durable(root, batch)
        except OSError as exc:
            report["failed"].append(_failure(root, pair, "syncing the directories written", exc))


def _write_one(reader, root, pair, entry, batch, report):
    blocks = reader.blocks(entry["size"])
    try:
        multimaster_safefs.write_file(
            root, entry["path"], blocks, entry["mode"], entry["sha256"], batch
        )
        report["written"] += 1
        report["bytes"] += entry["size"]
    except OSError as exc:
        report["failed"].append(_failure(root, pair, repr(entry["path"]), exc))
    # Keep the stream aligned: what a refused write did not read belongs to this file.
    for _ in blocks:
        pass


def _set_dir_modes(root, pair, report):
    """
    Give the directories of ``pair`` their planned modes (those that exist: the writes make
    the others, private until the next call).
    """
    for directory, mode in pair.get("dirs") or []:
        try:
            report["dir_modes"] += multimaster_safefs.set_dir_mode(root, directory, mode)
        except OSError as exc:
            report["failed"].append(_failure(root, pair, repr(directory), exc))


def _set_file_modes(root, pair, report):
    for path, mode in pair.get("mode") or []:
        try:
            multimaster_safefs.set_mode(root, path, mode)
            report["modes"] += 1
        except OSError as exc:
            report["failed"].append(_failure(root, pair, repr(path), exc))


def _clean_mark(mopts, root):
    return multimaster_rootsread.per_root_path(mopts["cachedir"], "roots-clean", root, "")


def _clear_temps(mopts, root, pair, report):
    """
    Remove the temporary files an interrupted sync left below ``root``. Only a sync that
    stopped before its end leaves any, and only a sync that reached it left the root's clean
    mark: with the mark there is nothing to look for (a walk of 30,000 files is most of a
    small apply). The mark goes before this sync writes, and comes back at its end
    (``_mark_clean``).
    """
    try:
        os.unlink(_clean_mark(mopts, root))
        return
    except OSError:
        pass
    try:
        multimaster_safefs.clear_temps(root)
    except OSError as exc:
        report["failed"].append(_failure(root, pair, "leftover temporary files", exc))


def _mark_clean(mopts, roots):
    """
    Mark each of ``roots`` as left by a sync that reached its end: no temporary file of it
    is left (``_clear_temps``). A mark that cannot be made costs the next sync a walk.
    """
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(_clean_mark(mopts, "/")), mode=0o700, exist_ok=True)
        for root in roots:
            flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW
            os.close(os.open(_clean_mark(mopts, root), flags, 0o600))


def _clear_file_list_cache(mopts):
    # What ``salt-run fileserver.clear_file_list_cache backend=roots`` does: the master sees
    # new files at once instead of after fileserver_list_cache_time.
    cache = os.path.join(mopts["cachedir"], "file_lists", "roots")
    with contextlib.suppress(OSError):
        for name in os.listdir(cache):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(cache, name))


def _opened_plan(minion_opts, master, plan, pull):
    """
    The body of the roots plan ``plan`` (a transfer descriptor), pulled with ``pull`` and
    unsealed.
    """
    envelope = multimaster_transport.pulled_json(plan, PLAN_LIMIT, "roots plan", pull)
    body, _ = multimaster_seal.unsealed_for(minion_opts, master, envelope, "roots")
    return body


def _apply_pairs(mopts, reader, resolved, report):
    # Deletions first: a file the primary turned into a directory (or the reverse) is out of
    # the way before its replacement is written.
    for root, pair in resolved:
        _clear_temps(mopts, root, pair, report)
        _delete_all(root, pair, report)
        _set_dir_modes(root, pair, report)
    for root, pair in resolved:
        _write_all(reader, root, pair, report)
    for root, pair in resolved:
        _set_dir_modes(root, pair, report)
        _set_file_modes(root, pair, report)
    if reader.read(1):
        report["failed"].append("the content stream is longer than the plan")


def apply_plan(minion_opts, salt_functions, master, mopts, plan):
    """
    What ``multimaster_peer.apply_roots`` answers: the sealed plan ``plan`` opened, its content
    stream pulled (``salt_functions`` is the control minion's ``__salt__``: its ``peer_run``
    pull) and applied to this master's paired roots under its roots lock; counts, bytes, the
    path the content came by (``via``) and a sample of failures.
    """
    # One request channel for the plan and the content: each new one loads this minion's key.
    pull = multimaster_transport.content_puller(minion_opts, salt_functions)
    with contextlib.closing(pull):
        body = _opened_plan(minion_opts, master, plan, pull)
        pairs = body.get("pairs") or []
        resolved = [(paired_root(mopts, pair), pair) for pair in pairs]
        key = bytes.fromhex(body["key"])
        report = {"written": 0, "bytes": 0, "modes": 0, "dir_modes": 0, "deleted": 0, "failed": []}
        stream = multimaster_transport.chunks(
            multimaster_transport.check_descriptor(body.get("content")), pull, key
        )
        reader = multimaster_transport.Reader(stream)
        with contextlib.closing(stream), locked(mopts):
            _apply_pairs(mopts, reader, resolved, report)
            if not report["failed"]:
                _mark_clean(mopts, [root for root, _ in resolved])
    _clear_file_list_cache(mopts)
    report["failed"] = report["failed"][: multimaster_manifest.SAMPLE]
    report["via"] = pull.via
    return report
