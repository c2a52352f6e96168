"""
Minion and master public keys: strict parsing, one fingerprint, inventory entries and digests,
the check of a control minion's inventory return, and the plans that reconcile key states across
masters (pure: no I/O, so the runner's policy is tested here, without daemons).

One fingerprint everywhere: SHA-256 of the DER SubjectPublicKeyInfo, as colon-separated hex.
(``salt-key -F`` and the minion's ``master_finger`` hash different text for the same key; reports
show Salt's ``salt-key -F`` value beside ours.)
"""

import base64
import binascii
import hashlib
import os
import re
from typing import NamedTuple

import multimaster_ids
import salt.utils.crypt
import salt.utils.files
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from salt.exceptions import SaltInvocationError

STATES = ("accepted", "pending", "rejected", "denied")
MIN_BITS = 2048
BUCKETS = 1024
# Bounds on what a control minion may return (a peer's return is never trusted as it comes).
# Ids per store: ten times the largest set benchmarked (bench/README.md).
MAX_ENTRIES = 1_000_000
MAX_PUB_BYTES = 16 * 1024
MAX_NAME_BYTES = 255
# Revoking at most this many keys on a master never needs force=True (small labs).
REVOKE_FLOOR = 5

_PEM_RE = re.compile(
    r"\A\s*-----BEGIN PUBLIC KEY-----\r?\n([A-Za-z0-9+/=\r\n]+)-----END PUBLIC KEY-----\s*\Z"
)
_FP_RE = re.compile(r"[0-9a-f]{2}(?::[0-9a-f]{2}){31}\Z")
_HEX16_RE = re.compile(r"[0-9a-f]{16}\Z")
_HEX64_RE = re.compile(r"[0-9a-f]{64}\Z")
# Ops that only list a key (anyone can submit a pending key, or make Salt store a denied one):
# a bad key there is a warning, never a failure.
_SOFT_OPS = ("pend", "deny")


class InvalidKeyError(SaltInvocationError):
    """
    A public key that is not exactly one RSA SubjectPublicKeyInfo PEM of >= 2048 bits, e=65537.
    """


class ReturnError(ValueError):
    """
    A control minion's return, or an inventory entry in it, is not of the expected shape.
    """


def _der(pem):
    match = _PEM_RE.match(pem) if isinstance(pem, str) else None
    if match is None:
        return None
    try:
        return base64.b64decode("".join(match.group(1).split()), validate=True)
    except (binascii.Error, ValueError):
        return None


def _sha256_hex(der):
    return hashlib.sha256(der).digest().hex(":")


def fingerprint(pem):
    """
    SHA-256 of the DER SubjectPublicKeyInfo of ``pem`` (cheap: no RSA parsing), or None when
    ``pem`` is not one "PUBLIC KEY" PEM block.
    """
    der = _der(pem)
    return None if der is None else _sha256_hex(der)


def private_key_fingerprint(pem):
    """
    The fingerprint of the public half of private key ``pem`` (never returned or logged).
    """
    key = serialization.load_pem_private_key(pem.encode(), password=None)
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _sha256_hex(der)


def salt_finger(pem):
    """
    What ``salt-key -F`` shows for ``pem`` (shown beside ours in reports, never compared).
    """
    return salt.utils.crypt.pem_finger(key=pem.encode(), sum_type="sha256")


def canonical(pem, where="key"):
    """
    Return the canonical PEM of ``pem`` after strict checks, else raise ``InvalidKeyError``.

    Refused: trailing junk, two PEMs, PKCS#1 ``RSA PUBLIC KEY``, private keys, EC keys, RSA below
    2048 bits, public exponent other than 65537. The canonical text re-encodes the same DER, so
    its fingerprint is the input's fingerprint.

    where
        What the key is, for the error message (e.g. ``key of web1``).
    """
    der = _der(pem)
    if der is None:
        raise InvalidKeyError(
            f"{where}: not exactly one '-----BEGIN PUBLIC KEY-----' PEM block "
            "(SubjectPublicKeyInfo) with nothing around it"
        )
    try:
        key = serialization.load_der_public_key(der)
    except ValueError as exc:
        raise InvalidKeyError(f"{where}: unreadable public key: {exc}") from None
    if not isinstance(key, rsa.RSAPublicKey):
        raise InvalidKeyError(f"{where}: {type(key).__name__} is not an RSA public key")
    if key.key_size < MIN_BITS:
        raise InvalidKeyError(f"{where}: RSA key of {key.key_size} bits; expected >= {MIN_BITS}")
    if key.public_numbers().e != 65537:
        raise InvalidKeyError(f"{where}: public exponent {key.public_numbers().e}; expected 65537")
    out = key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
    if (
        key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        != der
    ):
        raise InvalidKeyError(f"{where}: DER encoding is not canonical")
    return out


def peer_keys(peers_dir):
    """
    ``{peer id: canonical PEM, or None when invalid}`` of the ``<id>.pub`` files in a Salt
    cluster's ``cluster_pki_dir/peers``; a symlink there is not read.
    """
    keys = {}
    if not os.path.isdir(peers_dir):
        return keys
    for name in sorted(os.listdir(peers_dir)):
        path = os.path.join(peers_dir, name)
        if not name.endswith(".pub") or os.path.islink(path) or not os.path.isfile(path):
            continue
        with salt.utils.files.fopen(path, "r") as handle:
            text = handle.read()
        try:
            keys[name[: -len(".pub")]] = canonical(text, path)
        except InvalidKeyError:
            keys[name[: -len(".pub")]] = None
    return keys


def is_fingerprint(value):
    """
    True when ``value`` has the shape of our fingerprint: 32 lowercase hex bytes, colon-separated.
    """
    return isinstance(value, str) and _FP_RE.match(value) is not None


def shown(value):
    """
    ``value`` for an error message: short and cheap, whatever a peer or a caller sent (no repr of
    a 100,000-item mapping).
    """
    if isinstance(value, (dict, list, tuple)) and len(value) > 8:
        return f"a {type(value).__name__} of {len(value)} items"
    text = repr(value)
    return text if len(text) <= 70 else text[:67] + "..."


# --- inventory entries -----------------------------------------------------------------------


class Entry(NamedTuple):
    """
    One id's key record on one master: ``state`` (accepted, pending or rejected; denied when only
    a denied key exists), ``fp`` (the key's fingerprint; None for a denied key alone, or a file
    that is not a public key) and ``denied_fp`` (the fingerprint of a denied key stored for the
    id, if any).
    """

    state: str
    fp: str | None
    denied_fp: str | None = None

    @classmethod
    def from_wire(cls, value, where="entry"):
        """
        The entry of ``value``: ``[state, fp]``, ``[state, fp, denied_fp]``,
        ``["denied", None, denied_fp]`` (a list or tuple, so also an ``Entry``). Raises
        ``ReturnError`` naming ``where`` and the problem for anything else.
        """
        if not isinstance(value, (list, tuple)) or len(value) not in (2, 3):
            raise ReturnError(f"{where}: {shown(value)} is not a list of 2 or 3 items")
        state, fp, denied_fp = (*value, None)[:3]
        if not isinstance(state, str) or state not in STATES:
            raise ReturnError(f"{where}: state {shown(state)} is not one of {', '.join(STATES)}")
        for name, field in (("fingerprint", fp), ("denied fingerprint", denied_fp)):
            if field is not None and not is_fingerprint(field):
                raise ReturnError(f"{where}: {name} {shown(field)} is not a SHA-256 fingerprint")
        if state == "denied" and (len(value) != 3 or fp is not None):
            raise ReturnError(
                f"{where}: a denied entry is ['denied', None, denied_fp], not {shown(value)}"
            )
        return cls(state, fp, denied_fp)

    def to_wire(self):
        """
        The list ``key_inventory`` reports for this entry (what ``from_wire`` reads).
        """
        if self.denied_fp is None and self.state != "denied":
            return [self.state, self.fp]
        return [self.state, self.fp, self.denied_fp]

    @property
    def has_denied(self):
        """
        True when a denied key is stored for the id on this master.
        """
        return self.state == "denied" or self.denied_fp is not None


def bucket_of(minion_id):
    """
    The digest bucket of an id: inventories are compared bucket by bucket.

    minion_id
        The minion id.
    """
    return int.from_bytes(hashlib.sha256(minion_id.encode()).digest()[:4], "big") % BUCKETS


def digests(entries):
    """
    ``entries``: ``{id: entry}`` (an ``Entry`` or its wire form). Returns
    ``(total, {bucket: digest})``: equal digests mean equal entries; only non-empty buckets are
    listed (bounded size at any count).
    """
    lines = {}
    for minion_id in sorted(entries):
        entry = entries[minion_id]
        wire = entry.to_wire() if isinstance(entry, Entry) else entry
        row = " ".join(str(field) for field in wire)
        lines.setdefault(bucket_of(minion_id), []).append(f"{minion_id} {row}\n")
    per_bucket = {
        bucket: hashlib.sha256("".join(rows).encode()).hexdigest()[:16]
        for bucket, rows in lines.items()
    }
    total = hashlib.sha256(
        "".join(f"{b}:{d}\n" for b, d in sorted(per_bucket.items())).encode()
    ).hexdigest()
    return total, per_bucket


# --- control-minion returns ------------------------------------------------------------------


def check_inventory_return(ret, kind, max_entries=None):
    """
    Check a control minion's ``key_inventory`` return before the runner uses it: a compromised
    or buggy peer must not steer the plan with a malformed or oversized answer.

    ret
        The return. Kind ``digests``: ``{"alive": bool, "digest": 64 hex digits, "buckets":
        {bucket: 16 hex digits}, "count": int >= 0, "repair": bool}``, at most ``BUCKETS``
        buckets, each an int (or a string of digits) below ``BUCKETS``. Kind ``entries``:
        ``{"alive": bool, "entries": {id: entry}, "pubs": {id: {"key": pem, "denied": pem}}}``
        (see ``Entry.from_wire``; a PEM is a str of at most ``MAX_PUB_BYTES``, pubs only for
        listed ids).

    kind
        ``"digests"`` or ``"entries"``.

    max_entries
        The most ids an ``entries`` return may list (default ``MAX_ENTRIES``).

    Returns only the checked fields, normalised (buckets as ints, entries as ``Entry``); raises
    ``ReturnError`` naming the first problem. Ids are checked to be key file names (a str of
    1-255 bytes without '/' or NUL), not against the formula's id rule: one odd file must not
    hide a whole master, and ``plan`` reports such ids.
    """
    if not isinstance(ret, dict):
        raise ReturnError(f"the return is not a mapping: {shown(ret)}")
    if kind == "digests":
        return _checked_digests(ret)
    if kind == "entries":
        return _checked_entries(ret, MAX_ENTRIES if max_entries is None else max_entries)
    raise ValueError(f"unknown inventory kind {kind!r}; expected 'digests' or 'entries'")


def _field(ret, name, ok, expected):
    value = ret.get(name)
    if not ok(value):
        raise ReturnError(f"{name}: got {shown(value)}; expected {expected}")
    return value


def _is_bool(value):
    return isinstance(value, bool)


def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _matches(pattern):
    return lambda value: isinstance(value, str) and pattern.match(value) is not None


def _checked_digests(ret):
    return {
        "alive": _field(ret, "alive", _is_bool, "true or false"),
        "digest": _field(ret, "digest", _matches(_HEX64_RE), "64 hex digits"),
        "buckets": _checked_buckets(ret),
        "count": _field(ret, "count", _is_count, "an integer >= 0"),
        "repair": _field(ret, "repair", _is_bool, "true or false"),
    }


def _checked_buckets(ret):
    buckets = _field(
        ret,
        "buckets",
        lambda value: isinstance(value, dict) and len(value) <= BUCKETS,
        f"a mapping of at most {BUCKETS} buckets",
    )
    checked = {}
    for key, digest in buckets.items():
        bucket = _bucket(key)
        if bucket in checked:
            raise ReturnError(f"bucket {shown(key)} appears twice")
        if not _matches(_HEX16_RE)(digest):
            raise ReturnError(f"bucket {bucket}: got {shown(digest)}; expected 16 hex digits")
        checked[bucket] = digest
    return checked


def _bucket(key):
    # Salt's serialisers may hand int keys back as strings.
    if isinstance(key, str) and key.isascii() and key.isdecimal() and len(key) <= 4:
        key = int(key)
    if not isinstance(key, int) or isinstance(key, bool) or not 0 <= key < BUCKETS:
        raise ReturnError(f"bucket {shown(key)}: expected a number below {BUCKETS}")
    return key


def _checked_entries(ret, max_entries):
    alive = _field(ret, "alive", _is_bool, "true or false")
    entries = _field(
        ret,
        "entries",
        lambda value: isinstance(value, dict) and len(value) <= max_entries,
        f"a mapping of at most {max_entries} ids",
    )
    pubs = _field(ret, "pubs", lambda value: isinstance(value, dict), "a mapping")
    checked = {
        _file_name(minion_id): Entry.from_wire(entry, f"entry of {minion_id!r}")
        for minion_id, entry in entries.items()
    }
    return {
        "alive": alive,
        "entries": checked,
        "pubs": {
            _listed(minion_id, checked): _pems(minion_id, pems) for minion_id, pems in pubs.items()
        },
    }


def _file_name(minion_id):
    try:
        size = len(minion_id.encode("utf-8")) if isinstance(minion_id, str) else 0
    except UnicodeEncodeError:
        size = 0
    if not 0 < size <= MAX_NAME_BYTES or "/" in minion_id or "\0" in minion_id:
        raise ReturnError(
            f"id {shown(minion_id)}: not a key file name "
            f"(1-{MAX_NAME_BYTES} bytes of UTF-8, no '/' or NUL)"
        )
    return minion_id


def _listed(minion_id, entries):
    if minion_id not in entries:
        raise ReturnError(f"pubs of {shown(minion_id)}: no entry for that id")
    return minion_id


def _pems(minion_id, pems):
    where = f"pubs of {minion_id!r}"
    if not isinstance(pems, dict):
        raise ReturnError(f"{where}: got {shown(pems)}; expected {{'key': pem, 'denied': pem}}")
    for kind, pem in pems.items():
        if kind not in ("key", "denied"):
            raise ReturnError(f"{where}: unknown kind {shown(kind)}; expected 'key' or 'denied'")
        if not isinstance(pem, str) or len(pem.encode("utf-8", "replace")) > MAX_PUB_BYTES:
            raise ReturnError(f"{where}: {kind} is not a text of at most {MAX_PUB_BYTES} bytes")
    return dict(pems)


# --- plans -----------------------------------------------------------------------------------


def plan(inventories, order, prune=False):
    """
    Reconcile key states across masters.

    inventories
        ``{master_id: {minion_id: entry}}`` for every master that answered; an entry is an
        ``Entry`` or its wire form (``Entry.from_wire``; another shape raises ``ReturnError``).

    order
        Master ids, primary first.

    prune
        Delete keys accepted on peers but unknown to the primary.

    Policy, per id. The primary's accepted key becomes accepted everywhere; rejected anywhere
    becomes rejected everywhere; pending keys are copied as pending where the id is unknown,
    never accepted; accepted on a peer but unknown to the primary is drift (deleted only with
    ``prune``). Two different keys for one id (accepted, pending or rejected, on any masters,
    including a file that is not a key) is a conflict: nothing changes. A denied key equal to
    the id's key (or with no key to compare) is a denial: its id is never accepted. A denied key
    that differs from the id's key is a spoof record (Salt stores another key offered for an
    accepted id as denied by itself): reported, and the id's key still propagates. Denied keys
    are copied as denied where the id has none. An id that breaks the id rule, or a key file
    that is not a public key, is a failure when accepted or rejected somewhere, and a warning
    when only pending (anyone can submit a pending key): nothing changes for it either way.

    Returns ``{"actions": {master: [action]}, "conflicts": {id: {master: fp}}, "pending":
    {id: [master]}, "drift": {id: [master]}, "denied": {id: {master: denied_fp}}, "spoofed":
    {id: {master: denied_fp}}, "invalid": {id: reason}, "invalid_keys": {id: reason},
    "warnings": {id: reason}}``. An action is ``{"id", "op" (accept|pend|reject|deny|delete),
    "fp", "expect"}``; ``expect`` is the wire entry the master held when planned (or None), for
    compare-and-set on apply. Masters follow ``order``.
    """
    masters = [m for m in order if m in inventories]
    result = _new_result(masters, "pending", "drift")
    for minion_id, held in _by_id(inventories, masters).items():
        _plan_id(result, minion_id, held, order[0], prune)
    return result


def _new_result(masters, *extra):
    keys = ("conflicts", "denied", "spoofed", "invalid", "invalid_keys", "warnings") + extra
    return {"actions": {m: [] for m in masters}, **{key: {} for key in keys}}


def _entry(value, master, minion_id):
    # An Entry was checked when made (check_inventory_return): at 100,000 ids, checking again
    # would double the planning time.
    if value is None or type(value) is Entry:
        return value
    return Entry.from_wire(value, f"{master}: entry of {minion_id!r}")


def _by_id(inventories, masters):
    """
    ``{id: {master: Entry or None}}``, every answering master listed for every id, ids sorted.
    """
    held = {}
    for master in masters:
        for minion_id, value in inventories[master].items():
            row = held.setdefault(minion_id, dict.fromkeys(masters))
            row[master] = _entry(value, master, minion_id)
    return dict(sorted(held.items(), key=lambda item: str(item[0])))


def _keys(held):
    return {m: e.fp for m, e in held.items() if e and e.state != "denied"}


def _plan_id(result, minion_id, held, primary, prune):
    if _settled(minion_id, held) or _screened(result, minion_id, held):
        return
    fp = next(iter(_keys(held).values()), None)
    real, denied = _denials(result, minion_id, held, fp)
    if denied:
        _copy_denied(result, minion_id, held, real or denied, denied)
    states = {m: e.state for m, e in held.items() if e and e.state != "denied"}
    if "rejected" in states.values():
        _add_all(result, minion_id, held, "reject", fp, _not_in(held, states, "rejected"))
    elif states.get(primary) == "accepted":
        if not real:
            _add_all(result, minion_id, held, "accept", fp, _not_in(held, states, "accepted"))
    else:
        # Drift is known only when the primary answered.
        if primary in held:
            _drift(result, minion_id, held, fp, states, prune)
        _pending(result, minion_id, held, fp, states)


def _settled(minion_id, held):
    """
    True for most ids: the same accepted or rejected key on every master, nothing denied, a
    valid id: nothing to do or report.
    """
    entries = set(held.values())
    if len(entries) != 1:
        return False
    entry = entries.pop()
    return (
        entry is not None
        and entry.state in ("accepted", "rejected")
        and entry.fp is not None
        and entry.denied_fp is None
        and multimaster_ids.is_valid_id(minion_id)
    )


def _not_in(held, states, state):
    return [m for m in held if states.get(m) != state]


def _screened(result, minion_id, held):
    """
    Report an id the plan leaves alone (a bad id, a file that is not a key, two keys) and
    return True. Problems seen only on pending keys are warnings, not failures.
    """
    keys = _keys(held)
    firm = [m for m, e in held.items() if e and e.state in ("accepted", "rejected")]
    if not multimaster_ids.is_valid_id(minion_id):
        reason = _id_problem(minion_id)
        if firm:
            result["invalid"][minion_id] = f"{reason} (accepted or rejected on {', '.join(firm)})"
        else:
            _warn(result, minion_id, f"{reason}; not accepted anywhere, never copied")
        return True
    not_keys = [m for m, fp in keys.items() if fp is None]
    if set(not_keys) & set(firm):
        result["invalid_keys"][minion_id] = (
            f"key of {minion_id!r} on {', '.join(not_keys)} is not one "
            "'-----BEGIN PUBLIC KEY-----' PEM block"
        )
        return True
    if len(set(keys.values())) > 1:
        result["conflicts"][minion_id] = keys
        return True
    if not_keys:
        _warn(result, minion_id, f"pending key on {', '.join(not_keys)} is not a public key")
        return True
    return False


def _id_problem(minion_id):
    try:
        multimaster_ids.check_id(minion_id, "minion id")
    except SaltInvocationError as exc:
        return str(exc)
    return None


def _warn(result, minion_id, reason):
    previous = result["warnings"].get(minion_id)
    result["warnings"][minion_id] = f"{previous}; {reason}" if previous else reason


def _denials(result, minion_id, held, fp):
    """
    Sort the id's denied keys into denials (of the id's own key ``fp``, or with no key to
    compare) and spoof records (another key: an unauthenticated client can make Salt store
    one); report both. Returns ``(denials, every denied key)`` as ``{master: denied_fp}``.
    """
    denied = {m: e.denied_fp for m, e in held.items() if e and e.has_denied}
    real = {m: d for m, d in denied.items() if fp is None or d == fp}
    spoofed = {m: d for m, d in denied.items() if m not in real}
    for key, found in (("denied", real), ("spoofed", spoofed)):
        if found:
            result[key][minion_id] = found
    return real, denied


def _copy_denied(result, minion_id, held, source, denied):
    # A master stores one denied key per id: copy it only when there is exactly one to copy.
    missing = [m for m in held if m not in denied]
    fps = set(source.values())
    if len(fps) == 1 and None not in fps:
        _add_all(result, minion_id, held, "deny", fps.pop(), missing)
    elif missing:
        shown = sorted(fps, key=str)
        _warn(result, minion_id, f"denied keys {shown} differ or are not keys: not copied")


def _drift(result, minion_id, held, fp, states, prune):
    drifting = [m for m, s in states.items() if s == "accepted"]
    if drifting:
        result["drift"][minion_id] = drifting
        if prune:
            _add_all(result, minion_id, held, "delete", fp, drifting)


def _pending(result, minion_id, held, fp, states):
    pending = [m for m, s in states.items() if s == "pending"]
    if pending:
        result["pending"][minion_id] = pending
        # Listed everywhere so an operator can accept it on any master; never accepted here.
        _add_all(result, minion_id, held, "pend", fp, [m for m in held if m not in states])


def _add_all(result, minion_id, held, op, fp, masters):
    for master in masters:
        entry = held[master]
        result["actions"][master].append(
            {"id": minion_id, "op": op, "fp": fp, "expect": entry.to_wire() if entry else None}
        )


def one_id_plan(op, minion_id, fingerprint, inventories, order, keep_revocations=False):
    """
    The plan of the runner's ``accept``/``reject``/``delete`` of one id, on every master.

    op
        ``"accept"``, ``"reject"`` or ``"delete"``.

    minion_id
        The id (refused unless it passes the id rule).

    fingerprint
        None, or the fingerprint every key held for the id must have (any case).

    inventories, order
        As for ``plan``.

    keep_revocations
        A ``delete`` removes only accepted and pending keys, and none where the id also has a
        denied key: rejected and denied records stay (reported in ``warnings``). What the key
        reactor sends: an event may be forged, a revocation is never undone on its word.

    ``accept``: accepted on every master where it is not, also where it was unknown or only
    pending on one master; refused when the key is rejected anywhere or that very key is denied
    anywhere (deny wins; a spoof record of another key does not block). ``reject``: rejected on
    every master, also where unknown. ``delete``: every state and denied key removed wherever
    held. Refused when the id has no key, when its key file is not a public key (delete it),
    or when masters hold two keys for it (``conflicts``).

    Returns the keys of ``plan`` except ``pending``/``drift``, plus ``"refused"``: the reason
    nothing may change, or None.
    """
    if op not in ("accept", "reject", "delete"):
        raise ValueError(f"unknown key operation {op!r}; expected accept, reject or delete")
    masters = [m for m in order if m in inventories]
    result = {**_new_result(masters), "refused": _id_problem(minion_id)}
    if result["refused"] is None:
        held = {m: _entry(inventories[m].get(minion_id), m, minion_id) for m in masters}
        result["refused"] = _one_id_refusal(result, op, minion_id, fingerprint, held)
        if result["refused"] is None:
            _one_id_actions(result, op, minion_id, held, keep_revocations)
    return result


def _one_id_refusal(result, op, minion_id, fingerprint, held):
    """
    Why ``op`` must not go ahead for this id (details reported in ``result``), or None.
    """
    keys = _keys(held)
    refusal = _fingerprint_refusal(minion_id, fingerprint, keys)
    if refusal or op == "delete":
        return refusal
    if len(set(keys.values())) > 1:
        result["conflicts"][minion_id] = keys
        return f"{minion_id}: masters hold different keys for it {keys}; one fingerprint per id"
    if not keys:
        return f"{minion_id}: no key for this id on any reachable master"
    fp = next(iter(keys.values()))
    if fp is None:
        return f"{minion_id}: the key held on {', '.join(keys)} is not a public key; delete it"
    real, _ = _denials(result, minion_id, held, fp)
    if op == "accept":
        bad = {m: e.state for m, e in held.items() if e and e.state == "rejected"}
        bad.update({m: "denied" for m in real})
        if bad:
            return f"{minion_id}: rejected or denied on {bad}; deny wins"
    return None


def _fingerprint_refusal(minion_id, fingerprint, keys):
    if not fingerprint:
        return None
    wanted = fingerprint.strip().lower() if isinstance(fingerprint, str) else fingerprint
    if not is_fingerprint(wanted):
        return (
            f"{fingerprint!r} is not a fingerprint; expected SHA-256 of the DER public key as "
            "32 colon-separated hex bytes"
        )
    fps = set(keys.values())
    if fps - {wanted}:
        return f"{minion_id}: held keys {sorted(fps, key=str)} do not match {wanted}"
    return None


def _one_id_actions(result, op, minion_id, held, keep_revocations=False):
    if op == "delete":
        targets = [m for m, e in held.items() if e]
        if keep_revocations:
            kept = [m for m in targets if _revoked(held[m])]
            if kept:
                _warn(result, minion_id, f"rejected or denied on {', '.join(kept)}: kept")
            targets = [m for m in targets if m not in kept]
        _add_all(result, minion_id, held, "delete", None, targets)
        return
    state = "accepted" if op == "accept" else "rejected"
    fp = next(iter(_keys(held).values()))
    targets = [m for m, e in held.items() if not e or e.state != state]
    _add_all(result, minion_id, held, op, fp, targets)


def _revoked(entry):
    """
    True for what a delete that keeps revocations leaves: a rejected or denied key, or a key
    beside a denied one.
    """
    return entry.state not in ("accepted", "pending") or entry.has_denied


# --- what a plan needs before it is applied --------------------------------------------------


def attach_pubs(plan, pubs):
    """
    A copy of ``plan`` whose non-delete actions carry the canonical PEM of their key (``pub``).

    plan
        From ``plan`` or ``one_id_plan``.

    pubs
        ``{master: {id: {"key": pem, "denied": pem}}}`` as ``check_inventory_return`` gives
        them; a key is looked up by its fingerprint on any master.

    An id whose key (for accept or reject) is not canonical, or that no master reported, goes
    to ``invalid_keys`` and loses every action (a failure). A pending or denied key that is not
    canonical only goes to ``warnings``: it is never copied, the id's other actions go ahead.
    """
    checked = {}
    for action in _non_deletes(plan):
        slot = _slot(action)
        if slot not in checked:
            checked[slot] = _canonical_pem(pubs, *slot)
    hard, soft = {}, {}
    for action in _non_deletes(plan):
        reason = checked[_slot(action)][1]
        if reason and action["op"] in _SOFT_OPS:
            soft[_slot(action)] = reason
        elif reason:
            hard.setdefault(action["id"], reason)
    out = {**plan, "invalid_keys": {**plan.get("invalid_keys", {}), **hard}}
    out["warnings"] = dict(plan.get("warnings", {}))
    for (minion_id, _, _), reason in soft.items():
        if minion_id not in hard:
            _warn(out, minion_id, f"{reason}; never copied")
    out["actions"] = {
        master: [_with_pub(a, checked) for a in actions if _kept(a, checked, hard)]
        for master, actions in plan["actions"].items()
    }
    return out


def ids_without_pubs(plan, pubs):
    """
    The ids of ``plan``'s non-delete actions whose key (of that kind, with that fingerprint) no
    master in ``pubs`` reported: what to fetch before ``attach_pubs``.
    """
    return {a["id"] for a in _non_deletes(plan) if not _reported(pubs, *_slot(a))}


def _reported(pubs, minion_id, kind, fp):
    return any(fingerprint(held.get(minion_id, {}).get(kind)) == fp for held in pubs.values())


def _non_deletes(plan):
    for actions in plan["actions"].values():
        yield from (a for a in actions if a["op"] != "delete")


def _slot(action):
    return action["id"], "denied" if action["op"] == "deny" else "key", action["fp"]


def _canonical_pem(pubs, minion_id, kind, fp):
    """
    ``(canonical pem, None)`` of the ``kind`` key of ``minion_id`` with fingerprint ``fp``, or
    ``(None, reason)``.
    """
    what = f"{'denied key' if kind == 'denied' else 'key'} of {minion_id!r}"
    for held in pubs.values():
        pem = held.get(minion_id, {}).get(kind)
        if pem is not None and fingerprint(pem) == fp:
            try:
                return canonical(pem, what), None
            except InvalidKeyError as exc:
                return None, str(exc)
    return None, f"{what}: no master reported a public key with fingerprint {fp}"


def _kept(action, checked, hard):
    if action["id"] in hard:
        return False
    return action["op"] == "delete" or checked[_slot(action)][1] is None


def _with_pub(action, checked):
    if action["op"] == "delete":
        return dict(action)
    return {**action, "pub": checked[_slot(action)][0]}


def revocations(plan, inventories):
    """
    ``{master: count}`` for every master of ``plan``: how many keys it holds as accepted (per
    ``inventories``, as given to the planner) the plan would reject or delete.
    """
    counts = {}
    for master, actions in plan["actions"].items():
        held = inventories.get(master, {})
        counts[master] = len(
            {
                a["id"]
                for a in actions
                if a["op"] in ("reject", "delete") and _state(held.get(a["id"])) == "accepted"
            }
        )
    return counts


def _state(entry):
    return entry[0] if entry else None


def revoke_refusal(plan, inventories, max_share=0.1, force=False, floor=REVOKE_FLOOR, totals=None):
    """
    Why ``plan`` must not be applied without ``force``, or None: on some master it would revoke
    (reject or delete) more than ``max_share`` of its accepted keys and more than ``floor``
    keys. A compromised or broken peer reporting every id as rejected must not revoke the fleet.

    plan, inventories
        The plan and the inventories it was made from.

    max_share
        The largest share (0-1) of a master's accepted keys one run may revoke.

    force
        Never refuse.

    floor
        Revoking at most this many keys on a master is never refused (small labs).

    totals
        ``{master: count}`` of keys a master holds in all, for inventories that hold only the
        buckets that differ: the larger of it and the accepted keys seen is the base.
    """
    if force:
        return None
    problems = []
    for master, count in revocations(plan, inventories).items():
        accepted = sum(1 for e in inventories.get(master, {}).values() if _state(e) == "accepted")
        base = max(accepted, (totals or {}).get(master, 0))
        if count > floor and count > max_share * base:
            problems.append(
                f"the plan would revoke {count} of the {base} accepted keys on {master} "
                f"({count / base:.0%}, more than {max_share:.0%})"
            )
    return "; ".join(problems) or None
