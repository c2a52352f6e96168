"""
What a master's reactors remember between two events: the reactions running or just done, per
kind of event and minion id, so that a repeat of the same event costs nothing.

Any accepted minion can put ``salt/key`` and ``salt/minion/<id>/start`` events on a master's
bus, as many as it likes and with any id in them (a pretagged minion event passes Salt's event
blacklist). The reactor runs one reaction per event in a small pool of threads
(``reactor_worker_threads``) that every reactor of the master shares, and a reaction costs a
publish. So a reaction first claims its kind and id here (``claimed``): while a reaction that
saw the same state of the id (``seen``) runs, or for ``window`` seconds after it finished, a
repeat does nothing. A real change of the id (another key, another state) is not a repeat.

The record is one small JSON file in the master's cachedir (``multimaster/reactions.json``),
read and rewritten under an exclusive lock (the reactor's threads and any other process of the
master share it) and replaced atomically. Each write drops the entries that hold nothing back
any more, so the file never holds more than the ids that reacted within the window.
"""

import contextlib
import fcntl
import json
import logging
import os
import time

import salt.utils.atomicfile

log = logging.getLogger(__name__)

RECORD = "reactions.json"
LOCK = ".reactions.lock"
# A claim whose reaction never finished (its process died) holds repeats back this long: longer
# than any reaction takes (a key reaction waits at most a few control-minion calls).
STALE = 900


def record_path(opts):
    """
    Where the master of ``opts`` keeps the record.

    opts
        The master's opts (its ``cachedir``).
    """
    return os.path.join(opts["cachedir"], "multimaster", RECORD)


@contextlib.contextmanager
def claimed(opts, kind, minion_id, seen, window, clock=None):
    """
    Claim the reaction to a ``kind`` event for ``minion_id`` that saw ``seen`` (JSON data: the
    state of the id the reaction acts on). Yields True when this reaction goes ahead, False when
    a reaction that saw the same runs, or finished less than ``window`` seconds ago.

    A claimed reaction that ends is recorded as done at that moment; one that raises is
    forgotten, so the next event for the id tries again.

    opts
        The master's opts (its ``cachedir``).

    clock
        The time source (seconds since the epoch; default ``time.time``).
    """
    clock = clock or time.time
    key = f"{kind}/{minion_id}"
    seen = json.loads(json.dumps(seen))
    token = _update(opts, lambda record, now: _claim(record, key, seen, now), clock)
    try:
        yield token is not None
    except BaseException:
        if token:
            _update(opts, lambda record, now: _forget(record, key, token), clock)
        raise
    if token:
        _update(opts, lambda record, now: _done(record, key, token, now + window), clock)


def repeats(entry, seen, now):
    """
    True when ``entry`` (the record's entry for an id) holds a reaction that saw ``seen`` back
    at ``now``.
    """
    return bool(entry) and entry.get("seen") == seen and entry.get("until", 0) > now


def _claim(record, key, seen, now):
    if repeats(record.get(key), seen, now):
        return None
    token = os.urandom(8).hex()
    record[key] = {"seen": seen, "token": token, "until": now + STALE}
    return token


def _done(record, key, token, until):
    if record.get(key, {}).get("token") == token:
        record[key]["until"] = until


def _forget(record, key, token):
    if record.get(key, {}).get("token") == token:
        del record[key]


def _update(opts, change, clock):
    """
    Under the record's lock: read it, apply ``change(record, now)``, drop the entries that hold
    nothing back, and write it if that changed it. Returns what ``change`` returned.
    """
    path = record_path(opts)
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd = os.open(
        os.path.join(directory, LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        now = clock()
        record = _read(path)
        before = json.dumps(record, sort_keys=True)
        result = change(record, now)
        kept = {key: entry for key, entry in record.items() if entry.get("until", 0) > now}
        # A repeat changes nothing: it costs a read, not a write.
        if json.dumps(kept, sort_keys=True) != before:
            with salt.utils.atomicfile.atomic_open(path, "w") as handle:
                json.dump(kept, handle)
        return result
    finally:
        os.close(fd)


def _read(path):
    record = read_record(path, "a record of reactions")
    return {key: entry for key, entry in record.items() if _is_entry(entry)}


def _is_entry(entry):
    until = entry.get("until") if isinstance(entry, dict) else None
    return isinstance(until, (int, float)) and not isinstance(until, bool)


def read_record(path, what):
    """
    The JSON mapping in the file at ``path``, never read through a link; empty (and logged,
    naming ``what`` it should have been) when there is none or it is not one: the record is
    rebuilt.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, encoding="utf-8") as handle:
            record = json.load(handle)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("multimaster: %s is not %s (%s); ignored", path, what, exc)
        return {}
    return record if isinstance(record, dict) else {}
