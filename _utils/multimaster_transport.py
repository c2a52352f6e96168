"""
Bulk data off the publish bus: a runner *stages* bytes for one control minion and publishes only
a small descriptor (a ticket, the size and the SHA-256); the recipient *pulls* the bytes in
bounded chunks from the master that sent the job, over its own request channel: from that
master's file server (the formula's ``multimaster`` backend serves a ticket to its recipient's
authenticated id only), else through the one runner function that master exposes to its
control minions (``peer_run``, rendered by ``multimaster.master``).

Tickets are random, bound to the recipient's minion id, expire in minutes and are used up when
the last chunk has been served: a replayed ticket, or one presented by another minion, is
refused. Each pull is a runner job Salt keeps: the transport removes each from the job cache
as the next arrives, and the last one when the sender ``settle``s (or prunes) the spent ticket.
The transport moves bytes; what must stay secret is sealed to the recipient before it is staged
(``multimaster_seal``), so a chunk that lands in a job cache or an event is ciphertext.
"""

import base64
import binascii
import bisect
import contextvars
import fcntl
import hashlib
import json
import os
import queue
import re
import threading
import time
from contextlib import contextmanager

import multimaster_jobcache
import multimaster_safefs
import multimaster_saltcompat
import salt.channel.client
import salt.utils.json
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from salt.exceptions import CommandExecutionError, SaltReqTimeoutError

# The runner function a recipient calls on the sending master (``peer_run`` allows only it).
PULL = "multimaster_transfer.pull"
CHUNK = 4 * 1024 * 1024
# Through the file server: at 1 MiB the requests were a tenth of a 200 MB sync; at 4 MiB the
# control minion's job grew by 130 MB (copies of the chunk in Salt's channel and here).
FILESERVER_CHUNK = 2 * 1024 * 1024
TTL = 300
# A leading letter: Salt's argument parser would read an all-digit ticket as a number.
_TICKET_RE = re.compile(r"t[0-9a-f]{48}\Z")
_DIGEST_RE = re.compile(r"[0-9a-f]{64}\Z")


class TransferError(CommandExecutionError):
    """
    A transfer could not be staged, served or received; the message says why.
    """


def outbox(opts):
    """
    The private directory where a master keeps staged transfers.

    opts
        The master's opts.
    """
    return os.path.join(opts["cachedir"], "multimaster", "outbox")


def _paths(opts, ticket):
    base = os.path.join(outbox(opts), ticket)
    return base + ".data", base + ".meta"


@contextmanager
def _locked(opts):
    directory = outbox(opts)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(directory, ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield directory
    finally:
        os.close(fd)


def _write_private(path, data):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _read_meta(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _remove(*paths):
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _prune(opts, directory, spent_only=False):
    """
    Remove spent tickets and, unless ``spent_only``, expired ones, forgetting the jobs of
    their last pull; and, unless ``spent_only``, files no ticket owns any more (a staging or a
    serve cut short: a data file without its meta, a meta's temp file).
    """
    now = time.time()
    names = os.listdir(directory)
    for name in names:
        if name.endswith(".meta"):
            meta = _read_meta(os.path.join(directory, name))
            spent = meta is not None and meta.get("spent")
            if spent or (not spent_only and (meta is None or meta.get("expires", 0) <= now)):
                multimaster_jobcache.forget_jobs(opts, (meta or {}).get("jids", []))
                _remove(*_paths(opts, name[: -len(".meta")]))
    if not spent_only:
        owned = {name[: -len(".meta")] for name in names if name.endswith(".meta")}
        for name in names:
            ticket = name.split(".", 1)[0]
            if name != ".lock" and not name.endswith(".meta") and ticket not in owned:
                _remove(os.path.join(directory, name))


def settle(opts):
    """
    Forget the pull jobs of every transfer whose last chunk has been served: what a sender runs
    once the recipients' jobs returned (the last pull's job holds the last chunk).

    opts
        The sending master's opts.
    """
    if os.path.isdir(outbox(opts)):
        with _locked(opts) as directory:
            _prune(opts, directory, spent_only=True)


def stage(opts, recipient, data, ttl=TTL, fileserver=False):
    """
    Stage ``data`` for ``recipient``; returns the descriptor to publish:
    ``{"ticket", "size", "sha256"}``.

    opts
        The sending master's opts (its ``cachedir`` holds the outbox).

    recipient
        The minion id that may pull it (a control minion).

    data
        The bytes to move (seal secrets first).

    ttl
        Seconds the ticket stays valid (default 300), counted again from each chunk served: a
        long stream does not expire while its recipient pulls it.

    fileserver
        Also serve it through the master's file server, to a request whose authenticated id
        is ``recipient`` only (a request without one is answered ``NEEDS_ID``, the ticket
        untouched, and the recipient pulls by ``peer_run``). For data sealed to the
        recipient: its ticket travels in a publish.

    Nothing is staged on a master that accepts unsigned minion ids (``ids_signed``).
    """
    require_signed_ids(opts)
    ticket = "t" + os.urandom(24).hex()
    data_path, meta_path = _paths(opts, ticket)
    with _locked(opts) as directory:
        _prune(opts, directory)
        _write_private(data_path, data)
        meta = {
            "recipient": recipient,
            "expires": int(time.time()) + int(ttl),
            "ttl": int(ttl),
            "size": len(data),
            "next": 0,
            "fileserver": _BY_ID if fileserver else False,
        }
        _write_private(meta_path, json.dumps(meta).encode())
    return {"ticket": ticket, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


# A transfer the file server serves only to a request that carries the recipient's id (its
# ticket was published), and what it answers a request whose id it cannot trust.
_BY_ID = "by-id"
NEEDS_ID = "ticket is served to an authenticated minion id only: this request's is not"


def ids_signed(opts):
    """
    Whether the master trusts the id in a request: at ``minimum_auth_version`` 3 (the default
    of the pinned 3006, 3007 and 3008) Salt refuses older requests, and each one is encrypted
    with that minion's own session key, names the same id outside and in, and carries a token
    signed with its key. A master that lets older requests in takes their id on the word of
    the AES key every minion holds: on ``peer_run`` as on the file server, any minion could
    name itself a ticket's recipient.

    opts
        The master's opts.
    """
    try:
        return int(opts.get("minimum_auth_version") or 0) >= 3
    except (TypeError, ValueError):
        return False


UNSIGNED_IDS = (
    "this master accepts requests whose minion id is not signed (minimum_auth_version {!r}, "
    "expected 3, Salt's default): a ticket cannot be bound to its recipient here"
)


def require_signed_ids(opts):
    """
    Raise ``CommandExecutionError`` (naming the setting, its value and what is expected) on a
    master that accepts unsigned minion ids.

    opts
        The master's opts.
    """
    if not ids_signed(opts):
        raise CommandExecutionError(UNSIGNED_IDS.format(opts.get("minimum_auth_version")))


def stage_files(opts, recipient, members, key=None, ttl=TTL, fileserver=False):
    """
    Stage the concatenation of files for ``recipient`` without copying them: each chunk is read
    from the files when it is served (exactly each file's listed size: a file that changed in
    between fails the recipient's per-file check). With ``key`` every chunk is encrypted
    (AES-256-GCM, nonce from its offset). Returns ``{"ticket", "size", "sha256": None}``.

    opts
        The sending master's opts.

    recipient
        The minion id that may pull it.

    members
        ``[(root, path relative to it, size), ...]`` in stream order: each file is read
        through ``multimaster_safefs.open_below``, so no symlink below its root is followed.

    key
        32 bytes to encrypt the stream with (seal it to the recipient separately), or ``None``.

    ttl
        Seconds the ticket stays valid (default 300), counted again from each chunk served: a
        long stream does not expire while its recipient pulls it.

    fileserver
        Also serve it through the master's file server (``serve_file``): only for a ticket the
        recipient alone learns (inside an envelope sealed to it), never one a publish carries.
    """
    require_signed_ids(opts)
    ticket = "t" + os.urandom(24).hex()
    data_path, meta_path = _paths(opts, ticket)
    listed = [[str(root), str(relpath), int(member_size)] for root, relpath, member_size in members]
    size = sum(member_size for _, _, member_size in listed)
    with _locked(opts) as directory:
        _prune(opts, directory)
        # The member list never changes: it stays apart from the meta each chunk rewrites.
        _write_private(data_path, json.dumps(listed).encode())
        meta = {
            "recipient": recipient,
            "expires": int(time.time()) + int(ttl),
            "ttl": int(ttl),
            "size": size,
            "next": 0,
            "members": True,
            "key": key.hex() if key else None,
            "fileserver": bool(fileserver),
        }
        _write_private(meta_path, json.dumps(meta).encode())
    return {"ticket": ticket, "size": size, "sha256": None}


def _nonce(offset):
    return offset.to_bytes(12, "big")


# The member lists this process read last, by path: a stream of one transfer is served by the
# same few request workers, chunk after chunk.
_MEMBER_LISTS = {}


def _member_list(path):
    """
    ``(members, starts)`` of the member list at ``path``: ``[[root, relpath, size], ...]``
    and each member's offset in the stream.
    """
    info = os.stat(path)
    key = (info.st_ino, info.st_mtime_ns)
    cached = _MEMBER_LISTS.get(path)
    if cached and cached[0] == key:
        return cached[1]
    with open(path, encoding="utf-8") as handle:
        members = json.load(handle)
    starts, total = [], 0
    for *_, size in members:
        starts.append(total)
        total += size
    while len(_MEMBER_LISTS) >= 4:
        _MEMBER_LISTS.pop(next(iter(_MEMBER_LISTS)))
    _MEMBER_LISTS[path] = (key, (members, starts))
    return members, starts


def _read_members(members, starts, offset, count):
    """
    ``count`` bytes of the concatenated ``members`` (which start at ``starts``) from
    ``offset`` (a short file is padded with zeros, a grown one truncated: the recipient's
    per-file SHA-256 catches both).
    """
    out = bytearray()
    index = bisect.bisect_right(starts, offset) - 1
    while count > 0 and 0 <= index < len(members):
        root, relpath, size = members[index]
        within = offset - starts[index]
        take = min(size - within, count)
        if take > 0:
            with os.fdopen(multimaster_safefs.open_below(root, relpath), "rb") as handle:
                handle.seek(within)
                data = handle.read(take)
            out += data.ljust(take, b"\0")
            offset += take
            count -= take
        index += 1
    return bytes(out)


def _chunk(meta, data_path, offset, size):
    if not meta.get("members"):
        with open(data_path, "rb") as handle:
            handle.seek(offset)
            return handle.read(size)
    members, starts = _member_list(data_path)
    return _read_members(members, starts, offset, min(size, meta["size"] - offset))


def record_pull(opts, requester, jid):
    """
    Store the load of this pull's runner job now, naming its one minion, the requester
    (``multimaster_jobcache.record_runner_load``). The load carries no chunk (the chunk goes to
    the job's return, which the transport forgets).

    opts
        The sending master's opts.

    requester
        The id of the minion asking.

    jid
        The job id of this pull.
    """
    fun = "runner." + PULL
    multimaster_jobcache.record_runner_load(opts, jid, fun, requester, user=requester)


def serve(opts, requester, ticket, offset, jid=None, raw=False):
    """
    The next chunk of a staged transfer for ``requester``: ``{"data" (base64), "offset",
    "size"}``, with ``"done": True`` on the last chunk, which uses the ticket up (an empty
    transfer answers ``{"done": True, ...}`` alone); or ``{"error": ...}`` when the ticket is
    malformed, unknown, used up, expired, not issued to the requester, or the offset is not the
    next one.

    opts
        The sending master's opts.

    requester
        The id of the minion asking (Salt authenticated it on the request channel).

    ticket
        The ticket from the descriptor.

    offset
        Where the chunk starts: 0, then the end of the previous chunk (0 of an empty transfer
        uses it up at once).

    jid
        The job id of this pull (a runner job Salt stores); earlier pulls of the same transfer
        are removed from the job cache as the next one arrives, the last one by ``settle``.

    raw
        Asked through the file server (``serve_file``): only a ticket staged for it is served,
        the chunk goes as bytes (``"bytes"`` instead of base64 ``"data"``), and ``requester``
        may be ``None`` where Salt's request carries no id (the ticket is the recipient's
        secret then).
    """
    error = _request_error(opts, ticket, offset)
    if error:
        return error
    data_path, meta_path = _paths(opts, ticket)
    with _locked(opts):
        meta = _read_meta(meta_path)
        error = _ticket_error(meta, requester, offset, raw, data_path, meta_path)
        if error:
            return error
        multimaster_jobcache.forget_jobs(opts, meta.get("jids", []))
        if offset == meta["size"]:
            _remove(data_path, meta_path)
            return {"done": True, "offset": offset, "size": meta["size"]}
        try:
            chunk = _chunk(meta, data_path, offset, FILESERVER_CHUNK if raw else CHUNK)
        except OSError as exc:
            # Never the path: a pillar file's name is not for the job cache.
            reason = exc.strerror or "a file is no longer a regular file below its root"
            return {"error": f"cannot read the staged data: {reason}"}
        key = meta.get("key")
        done = _advance(meta, data_path, meta_path, offset + len(chunk), jid)
    return _chunk_answer(chunk, key, ticket, offset, meta["size"], raw, done)


def _request_error(opts, ticket, offset):
    """
    Why a pull of ``ticket`` at ``offset`` is refused before its ticket is read, else None.
    """
    if not isinstance(ticket, str) or not _TICKET_RE.match(ticket):
        return {"error": "malformed ticket"}
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        return {"error": f"offset {offset!r} is not a non-negative integer"}
    if not ids_signed(opts):
        return {"error": UNSIGNED_IDS.format(opts.get("minimum_auth_version"))}
    return None


def _ticket_error(meta, requester, offset, raw, data_path, meta_path):
    """
    Why the staged ticket ``meta`` does not serve ``requester`` the chunk at ``offset``, else
    None; an expired ticket is removed.
    """
    if meta is None or meta.get("spent"):
        return {"error": "unknown or used ticket: refusing a replay"}
    if raw and not meta.get("fileserver"):
        return {"error": "ticket is not served through the file server"}
    if raw and meta["fileserver"] == _BY_ID and requester is None:
        return {"error": NEEDS_ID}
    if meta["recipient"] != requester and not (raw and requester is None):
        return {"error": f"ticket was not issued to {requester!r}"}
    if meta["expires"] <= time.time():
        _remove(data_path, meta_path)
        return {"error": "ticket expired"}
    if offset != meta["next"]:
        return {"error": f"offset {offset} is not the next one ({meta['next']})"}
    return None


def _advance(meta, data_path, meta_path, next_offset, jid):
    """
    Store in the ticket's ``meta`` where the next chunk starts and this pull's job; True when
    the chunk served was the last one, which uses the ticket up.
    """
    meta["next"] = next_offset
    meta["jids"] = [jid] if jid else []
    meta["expires"] = max(meta["expires"], int(time.time()) + int(meta.get("ttl", 0)))
    done = meta["next"] >= meta["size"]
    if done:
        # Used up: only what settle needs stays (this pull's job, to forget).
        _remove(data_path)
        meta = {k: meta[k] for k in ("recipient", "expires", "size", "jids")} | {"spent": True}
    tmp = meta_path + ".tmp"
    _remove(tmp)
    _write_private(tmp, json.dumps(meta).encode())
    os.replace(tmp, meta_path)
    return done


def _chunk_answer(chunk, key, ticket, offset, size, raw, done):
    """
    The answer carrying ``chunk``, encrypted when the transfer has a ``key``.
    """
    if key:
        chunk = AESGCM(bytes.fromhex(key)).encrypt(_nonce(offset), chunk, ticket.encode())
    if raw:
        answer = {"bytes": chunk, "offset": offset, "size": size}
    else:
        # Base64: Salt's runner return path turns bytes that happen to be UTF-8 into str.
        answer = {"data": base64.b64encode(chunk).decode(), "offset": offset, "size": size}
    return {**answer, "done": True} if done else answer


# The file server backend (_fileserver/multimaster.py) that serves transfers staged for it,
# and where it finds one: ``<prefix><ticket>`` in any environment.
BACKEND = "multimaster"
FILESERVER_PREFIX = "multimaster-transfer/"
_FILESERVER_PATH_RE = re.compile(re.escape(FILESERVER_PREFIX) + r"(t[0-9a-f]{48})\Z")


def fileserver_ticket(opts, path):
    """
    The ticket a file-server ``path`` names, when a transfer staged for the file server holds
    it; else ``None``.

    opts
        The master's opts.

    path
        The path a minion asked the file server for.
    """
    match = _FILESERVER_PATH_RE.match(str(path))
    if not match:
        return None
    meta = _read_meta(_paths(opts, match.group(1))[1])
    return match.group(1) if meta is not None and meta.get("fileserver") else None


def serve_fileserver(opts, load):
    """
    The file server's answer to ``load`` (``{"path", "loc", "id"?}``): the chunk of the staged
    transfer the path names, at ``loc``, as ``serve`` with ``raw``.

    opts
        The master's opts.

    load
        The minion's ``_serve_file`` request.
    """
    ticket = fileserver_ticket(opts, load.get("path"))
    if ticket is None:
        return {"error": "unknown or used ticket: refusing a replay"}
    return serve(opts, load.get("id"), ticket, load.get("loc"), raw=True)


def check_descriptor(descriptor):
    """
    The descriptor a publish carried, checked; returns it. Raises ``TransferError``.

    descriptor
        ``{"ticket", "size", "sha256"}`` as ``stage`` made it.
    """
    if (
        not isinstance(descriptor, dict)
        or not _TICKET_RE.match(str(descriptor.get("ticket")))
        or not isinstance(descriptor.get("size"), int)
        or descriptor["size"] < 0
        or not (descriptor.get("sha256") is None or _DIGEST_RE.match(str(descriptor["sha256"])))
    ):
        raise TransferError(f"malformed transfer descriptor {descriptor!r:.200}")
    return descriptor


def _decoded(answer):
    """
    The chunk of an answer: base64 ``data`` (a runner's return) or raw ``bytes`` (the file
    server's, which Salt's request channel hands over as str when they happen to be UTF-8).
    """
    if "bytes" in answer:
        data = answer["bytes"]
        if isinstance(data, str):
            return data.encode()
        return data if isinstance(data, bytes) else None
    data = answer.get("data")
    if not isinstance(data, str):
        return None
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


def chunks(descriptor, pull, key=None):
    """
    Yield the plaintext chunks of a staged transfer in order, decrypting with ``key`` when the
    stream is encrypted. Checks each answer; raises ``TransferError`` naming what went wrong.
    The next chunk is pulled while the caller handles this one (the sending master serves a
    pull while the recipient writes): at most one chunk waits.

    descriptor
        ``{"ticket", "size", "sha256"}`` from the publish.

    pull
        ``pull(ticket, offset)`` -> the sending master's answer (``serve``'s return).

    key
        The stream key (32 bytes) for an encrypted stream, else ``None``.
    """
    check_descriptor(descriptor)
    return _prefetched(_pulled_chunks(descriptor, pull, key))


def _prefetched(items):
    """
    Yield from the generator ``items`` while a worker thread already produces the next item;
    an error the worker meets is raised here, in stream order. The worker runs in a copy of
    this context, so that Salt's loader globals (``__salt__`` of the pull) resolve there too.
    Closing this generator stops the worker.
    """
    slots = queue.Queue(maxsize=1)
    stop = threading.Event()
    end = object()

    def offer(entry):
        while not stop.is_set():
            try:
                slots.put(entry, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def produce():
        try:
            for item in items:
                if not offer((item, None)):
                    return
            offer((end, None))
        except Exception as exc:  # pylint: disable=broad-except
            offer((end, exc))
        finally:
            items.close()

    worker = threading.Thread(target=contextvars.copy_context().run, args=(produce,), daemon=True)
    worker.start()
    try:
        while True:
            item, error = slots.get()
            if item is end:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        worker.join()


def _pulled_chunks(descriptor, pull, key):
    """
    The chunks of ``chunks``, pulled and checked one after the other.
    """
    size, offset, done = descriptor["size"], 0, False
    if not size:
        done = _answer(pull(descriptor["ticket"], 0)).get("done")
    while offset < size:
        answer = _answer(pull(descriptor["ticket"], offset))
        chunk, done = _decoded(answer), answer.get("done")
        if chunk is None:
            raise TransferError(f"malformed chunk at offset {offset}")
        if key is not None:
            try:
                chunk = AESGCM(key).decrypt(_nonce(offset), chunk, descriptor["ticket"].encode())
            except InvalidTag:
                raise TransferError(f"chunk at offset {offset} fails authentication") from None
        if not chunk:
            raise TransferError(f"transfer ended at {offset} of {size} bytes")
        offset += len(chunk)
        yield chunk
    if offset != size or not done:
        raise TransferError(f"transfer of {size} bytes was not completed")


def _answer(answer):
    """
    The sending master's answer to a pull, checked for a refusal.
    """
    # Salt answers {} when peer_run does not allow the pull; a string when it timed out.
    if not isinstance(answer, dict) or not answer:
        raise TransferError(
            f"the master refused the pull ({answer!r:.200}): is peer_run for {PULL} "
            "rendered by multimaster.master on it?"
        )
    if "error" in answer:
        raise TransferError(f"the master refused the pull: {answer['error']}")
    return answer


def fetch(descriptor, pull, limit=None):
    """
    Pull a staged transfer and return its bytes, checked against the descriptor's size and
    SHA-256. Raises ``TransferError`` naming what went wrong.

    descriptor
        ``{"ticket", "size", "sha256"}`` from the publish.

    pull
        ``pull(ticket, offset)`` -> the sending master's answer (``serve``'s return).

    limit
        The largest size accepted (bytes); ``None`` for any.
    """
    check_descriptor(descriptor)
    if limit is not None and descriptor["size"] > limit:
        raise TransferError(f"transfer of {descriptor['size']} bytes exceeds the limit of {limit}")
    data = b"".join(chunks(descriptor, pull))
    if descriptor["sha256"] is None or hashlib.sha256(data).hexdigest() != descriptor["sha256"]:
        raise TransferError("transfer does not match its descriptor (size or SHA-256)")
    return data


class Reader:
    """
    File-like ``read(n)`` over a stream of chunks: hands out each file's bytes in bounded
    pieces, so a large tree never sits in memory.
    """

    def __init__(self, stream):
        self._stream = iter(stream)
        self._buffer = b""
        self._at = 0

    def read(self, count):
        """
        Up to ``count`` bytes; fewer only at the end of the stream.

        count
            How many bytes.
        """
        # Read from an offset into the chunk: cutting off what was read would copy the rest of
        # a 1 MB chunk for each 2 KB file.
        while len(self._buffer) - self._at < count:
            try:
                more = next(self._stream)
            except StopIteration:
                break
            self._buffer, self._at = self._buffer[self._at :] + more, 0
        data = self._buffer[self._at : self._at + count]
        self._at += len(data)
        return data

    def blocks(self, size, block=1024 * 1024):
        """
        Yield exactly ``size`` bytes in pieces of at most ``block``; raises ``TransferError``
        when the stream ends early.

        size
            How many bytes (one file's size).

        block
            The largest piece.
        """
        while size > 0:
            data = self.read(min(block, size))
            if not data:
                raise TransferError("the stream ended inside a file")
            size -= len(data)
            yield data


# --- peer side (run by a control minion) ---

PULL_TIMEOUT = 60


def puller(salt_functions):
    """
    ``pull(ticket, offset)``: one chunk of a transfer staged for this minion, from the master
    that sent this job (``peer_run`` on the request channel of the minion connection that
    received it). Made in the job's thread: the transport pulls from a worker thread, where
    Salt 3006/3007 resolve no loader global (``__salt__``), so the function is looked up here.
    """
    runner = salt_functions["publish.runner"]

    def pull(ticket, offset):
        return runner(PULL, arg=[f"ticket={ticket}", f"offset={offset}"], timeout=PULL_TIMEOUT)

    return pull


class ContentPull:
    """
    ``pull(ticket, offset)`` for a roots plan or content stream: through the file server of
    the master that sent this job (``_serve_file`` on this minion's request channel to it: no
    runner job there, one key load per ``REQUESTS_PER_CHANNEL`` here), or through its
    ``peer_run`` pull (``peer_run``, from ``puller``) when that file server does not serve
    transfers (its ``fileserver_backend`` does not name ``multimaster`` yet, or it has not been
    restarted since) or refuses a published ticket to a request whose id it cannot trust
    (``NEEDS_ID``). ``via`` says which; ``close`` when the stream is done.
    """

    # Requests per channel: Salt's request channel keeps what it received while it is open
    # (a channel kept for a 200 MB stream grew the minion by 220 MB in bench_sync_roots); a new
    # one is handed the key the first loaded (multimaster_saltcompat.reuse_minion_key).
    REQUESTS_PER_CHANNEL = 16

    def __init__(self, minion_opts, peer_run):
        # Made in the job's thread, called from the transport's worker thread (see puller).
        self.via = "fileserver"
        self._opts = dict(minion_opts)
        self._peer_run = peer_run
        self._channel = None
        self._requests = 0
        self._key = None

    def _fileserver_pull(self, ticket, offset):
        if self._requests == self.REQUESTS_PER_CHANNEL:
            self.close()
        if self._channel is None:
            self._channel = salt.channel.client.ReqChannel.factory(self._opts)
            multimaster_saltcompat.reuse_minion_key(self._channel, self._key)
            self._requests = 0
        self._requests += 1
        load = {
            "cmd": "_serve_file",
            "path": FILESERVER_PREFIX + ticket,
            "loc": offset,
            "saltenv": "base",
        }
        try:
            return self._channel.send(load, timeout=PULL_TIMEOUT)
        except SaltReqTimeoutError:
            return {"error": f"the file server did not answer within {PULL_TIMEOUT} s"}
        finally:
            self._key = self._key or multimaster_saltcompat.minion_key_of(self._channel)

    def __call__(self, ticket, offset):
        if self.via == "fileserver":
            answer = self._fileserver_pull(ticket, offset)
            if (
                isinstance(answer, dict)
                and answer.get("error") != NEEDS_ID
                and {"error", "offset", "done"} & set(answer)
            ):
                return answer
            # Salt's answer for a path no backend has (a master not restarted since its
            # backends named ``multimaster``, or a worker of it that has not loaded the
            # backend: a stream can meet one mid-way), or a Salt that signs no id into the
            # request for a ticket that needs one: the same ticket, from this offset on, by
            # peer_run, which serves it to its recipient alone.
            self.via = "peer_run"
        return self._peer_run(ticket, offset)

    def close(self):
        """
        Close the request channel, if one was opened.
        """
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def content_puller(minion_opts, salt_functions):
    """
    A ``ContentPull`` over the file server of the master that sent this job, its ``peer_run``
    pull (``puller``) the fallback; ``close`` it when done (or use it in ``with``). Made in the
    job's thread.
    """
    return ContentPull(minion_opts, puller(salt_functions))


def pulled_json(transfer, limit, what, pull):
    """
    The JSON document of the transfer ``transfer`` pulled with ``pull``, at most ``limit``
    bytes; ``what`` names it in the refusal.
    """
    try:
        return salt.utils.json.loads(fetch(transfer, pull, limit))
    except ValueError:
        raise CommandExecutionError(f"{what}: the pulled transfer is not JSON") from None
