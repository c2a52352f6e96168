"""
Minion and master public keys: strict parsing, one fingerprint, inventory digests, and the plan
that reconciles key states across masters.

One fingerprint everywhere: SHA-256 of the DER SubjectPublicKeyInfo, as colon-separated hex.
(``salt-key -F`` and the minion's ``master_finger`` hash different text for the same key; reports
show Salt's ``salt-key -F`` value beside ours.)
"""

import base64
import binascii
import hashlib
import re

import multimaster_ids
import salt.utils.crypt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from salt.exceptions import SaltInvocationError

STATES = ("accepted", "pending", "rejected", "denied")
MIN_BITS = 2048
BUCKETS = 1024

_PEM_RE = re.compile(
    r"\A\s*-----BEGIN PUBLIC KEY-----\r?\n([A-Za-z0-9+/=\r\n]+)-----END PUBLIC KEY-----\s*\Z"
)


class InvalidKeyError(SaltInvocationError):
    """
    A public key that is not exactly one RSA SubjectPublicKeyInfo PEM of >= 2048 bits, e=65537.
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


def bucket_of(minion_id):
    """
    The digest bucket of an id: inventories are compared bucket by bucket.
    """
    return int.from_bytes(hashlib.sha256(minion_id.encode()).digest()[:4], "big") % BUCKETS


def digests(entries):
    """
    ``entries``: ``{id: entry}`` (see ``plan``). Returns ``(total, {bucket: digest})``: equal
    digests mean equal entries; only non-empty buckets are listed (bounded size at any count).
    """
    lines = {}
    for minion_id in sorted(entries):
        row = " ".join(str(field) for field in entries[minion_id])
        lines.setdefault(bucket_of(minion_id), []).append(f"{minion_id} {row}\n")
    per_bucket = {
        bucket: hashlib.sha256("".join(rows).encode()).hexdigest()[:16]
        for bucket, rows in lines.items()
    }
    total = hashlib.sha256(
        "".join(f"{b}:{d}\n" for b, d in sorted(per_bucket.items())).encode()
    ).hexdigest()
    return total, per_bucket


def plan(inventories, order, prune=False):
    """
    Reconcile key states across masters.

    ``inventories``: ``{master_id: {minion_id: entry}}`` for every master that answered, where an
    entry is ``[state, fp]`` for a key in the keys bank (accepted, pending or rejected),
    ``[state, fp, denied_fp]`` when a denied key exists beside it, ``["denied", None, denied_fp]``
    for a denied key alone. ``order``: master ids, primary first.

    Policy: the primary's accepted keys become accepted everywhere; rejected anywhere becomes
    rejected everywhere; a denied key is denied everywhere and its id is never accepted by the
    tool; pending keys are copied as pending where the id is unknown, never accepted; accepted on
    a peer but unknown to the primary is drift (deleted only with ``prune``); two different keys
    for one id (accepted, pending or rejected, on any masters) is a conflict: nothing changes.

    Returns ``{"actions": {master: [action]}, "conflicts": {id: {master: fp}},
    "pending": {id: [master]}, "drift": {id: [master]}, "denied": {id: {master: fp}},
    "invalid": [id]}`` where an action is ``{"id", "op" (accept|pend|reject|deny|delete), "fp",
    "expect"}``; ``expect`` is the entry the master held when planned (compare-and-set on apply).
    """
    primary = order[0]
    masters = [m for m in order if m in inventories]
    result = {
        "actions": {m: [] for m in masters},
        "conflicts": {},
        "pending": {},
        "drift": {},
        "denied": {},
        "invalid": [],
    }
    ids = set()
    for entries in inventories.values():
        ids.update(entries)
    for minion_id in sorted(ids):
        if not multimaster_ids.is_valid_id(minion_id):
            result["invalid"].append(minion_id)
            continue
        held = {m: inventories[m].get(minion_id) for m in masters}
        keys = {m: e[1] for m, e in held.items() if e and e[0] != "denied"}
        if len(set(keys.values())) > 1:
            result["conflicts"][minion_id] = keys
            continue
        fp = next(iter(keys.values()), None)
        states = {m: e[0] for m, e in held.items() if e and e[0] != "denied"}
        denied = {m: e[2] for m, e in held.items() if e and len(e) > 2}
        if denied:
            result["denied"][minion_id] = denied
            denied_fp = next(iter(denied.values()))
            if len(set(denied.values())) == 1:
                for master in masters:
                    if master not in denied:
                        _add(result, master, minion_id, "deny", denied_fp, held)
        if "rejected" in states.values():
            for master in masters:
                if states.get(master) != "rejected":
                    _add(result, master, minion_id, "reject", fp, held)
            continue
        if states.get(primary) == "accepted":
            if not denied:
                for master in masters:
                    if states.get(master) != "accepted":
                        _add(result, master, minion_id, "accept", fp, held)
            continue
        drifting = [m for m, s in states.items() if s == "accepted"]
        if drifting and primary in inventories:
            result["drift"][minion_id] = drifting
            if prune:
                for master in drifting:
                    _add(result, master, minion_id, "delete", fp, held)
        pending = [m for m, s in states.items() if s == "pending"]
        if pending:
            result["pending"][minion_id] = pending
            # Listed everywhere so an operator can accept it on any master; never accepted here.
            for master in masters:
                if master not in states:
                    _add(result, master, minion_id, "pend", fp, held)
    return result


def _add(result, master, minion_id, op, fp, held):
    result["actions"][master].append({"id": minion_id, "op": op, "fp": fp, "expect": held[master]})
