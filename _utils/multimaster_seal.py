"""
Seal a secret, or sign an order, for one recipient control minion, bound to a fresh challenge.

A sealed envelope: RSA-OAEP (SHA-256) wraps a fresh AES-256-GCM key that encrypts the body. A
signed order carries only the SHA-256 digest of the instruction it authorises. Both are signed by
the sending master (RSA-PSS, SHA-256) together with their *binding*: a single-use challenge the
recipient issued, the target master id and config dir, and an expiry of minutes. The recipient
refuses an envelope or order that is not for it, not signed by the master it trusts, bound to
another target, expired, or whose challenge it never issued or has already consumed: a copy
found in a job cache, an event or a log cannot be replayed.

The other way round, a control minion signs its answer to a runner with its own key: Salt
3008 takes a return's minion id from the load's unchecked ``resource_id``, so any minion can
return under a control minion's id. The signature covers the function, the master the minion
speaks for, the runner's nonce for that one publish and the digest of the answer.
"""

import base64
import functools
import hashlib
import json
import os
import re
import time

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from salt.exceptions import CommandExecutionError, SaltException

VERSION = 2
# An envelope or order lives for minutes; a recipient refuses one claiming to live longer.
TTL = 300
MAX_TTL = 900
_OAEP = padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH)
_SEALED = ("v", "purpose", "recipient", "bound", "wrapped_key", "nonce", "ciphertext")
_ORDER = ("v", "purpose", "recipient", "bound", "digest")
_ANSWER = ("v", "master", "failed", "answer", "signature")
_CHALLENGE_RE = re.compile(r"[0-9a-f]{64}\Z")


class SealError(CommandExecutionError):
    """
    The envelope or order is not for us, was tampered with, replayed, expired, or was not
    signed by the expected sender.
    """


def _b64(data):
    return base64.b64encode(data).decode()


def _canonical(data):
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def digest(data):
    """
    SHA-256 hex of the canonical JSON of ``data``: what a signed order authorises.
    """
    return hashlib.sha256(_canonical(data)).hexdigest()


def bind(challenge, target, config_dir, ttl=TTL, **extra):
    """
    The binding of one envelope or order: the recipient's ``challenge``, the ``target`` master id
    and its ``config_dir``, an expiry ``ttl`` seconds from now, and any ``extra`` fields (e.g. the
    intended fingerprint).
    """
    return {
        "challenge": challenge,
        "target": target,
        "config_dir": config_dir,
        "expires": int(time.time()) + int(ttl),
        **extra,
    }


@functools.lru_cache(maxsize=4)
def _private_key(pem):
    # Only this host's own keys come here (its minion's, its master's, the cluster's, read
    # from its root-only pki directories), so the consistency check of the RSA key that
    # loading runs by default (35 ms for a 2048-bit key, 240 ms for a 4096-bit one, in every
    # job that signs or opens) is skipped; a run also signs and opens with one key repeatedly.
    try:
        return serialization.load_pem_private_key(
            pem.encode(), password=None, unsafe_skip_rsa_key_validation=True
        )
    except TypeError:
        # cryptography before 39 has no such option.
        return serialization.load_pem_private_key(pem.encode(), password=None)


def _sign(document, fields, signer_key_pem):
    signer = _private_key(signer_key_pem)
    signed = _canonical({k: document[k] for k in fields})
    document["signature"] = _b64(signer.sign(signed, _PSS, hashes.SHA256()))
    return document


def seal(body, purpose, recipient, recipient_pub_pem, signer_key_pem, bound):
    """
    Seal ``body`` (a JSON-serialisable dict) for ``recipient`` (a minion id) under ``purpose``
    and the binding ``bound`` (see ``bind``). Returns the envelope (a dict of strings).

    recipient_pub_pem
        The recipient control minion's public key (PEM), accepted on this master.

    signer_key_pem
        The sending master's private key (PEM).
    """
    pub = serialization.load_pem_public_key(recipient_pub_pem.encode())
    data_key = AESGCM.generate_key(bit_length=256)
    nonce = os.urandom(12)
    aad = _canonical([purpose, recipient, bound])
    envelope = {
        "v": VERSION,
        "purpose": purpose,
        "recipient": recipient,
        "bound": bound,
        "wrapped_key": _b64(pub.encrypt(data_key, _OAEP)),
        "nonce": _b64(nonce),
        "ciphertext": _b64(AESGCM(data_key).encrypt(nonce, _canonical(body), aad)),
    }
    return _sign(envelope, _SEALED, signer_key_pem)


def order(instruction, purpose, recipient, signer_key_pem, bound):
    """
    Sign the digest of ``instruction`` (which travels beside it, in clear) for ``recipient``
    under ``purpose`` and the binding ``bound``.

    signer_key_pem
        The sending master's private key (PEM).
    """
    document = {
        "v": VERSION,
        "purpose": purpose,
        "recipient": recipient,
        "bound": bound,
        "digest": digest(instruction),
    }
    return _sign(document, _ORDER, signer_key_pem)


def _check(document, fields, purpose, recipient, signer_pub_pem, expect, challenges, epoch=1):
    """
    Verify address, signature, binding, epoch (at least ``epoch``) and expiry, then consume the
    challenge.
    """
    if not isinstance(document, dict) or document.get("v") != VERSION:
        raise SealError(f"unsupported envelope version {getattr(document, 'get', dict)('v')!r}")
    if document.get("purpose") != purpose or document.get("recipient") != recipient:
        raise SealError(f"envelope is not for {recipient!r} / {purpose!r}")
    try:
        signer = serialization.load_pem_public_key(signer_pub_pem.encode())
        signer.verify(
            base64.b64decode(document["signature"]),
            _canonical({k: document[k] for k in fields}),
            _PSS,
            hashes.SHA256(),
        )
    except InvalidSignature:
        raise SealError(
            "envelope signature does not verify with the sending master's key"
        ) from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SealError(f"envelope cannot be verified: {type(exc).__name__}") from None
    bound = document["bound"]
    if not isinstance(bound, dict):
        raise SealError("envelope has no binding")
    for key, value in expect.items():
        if bound.get(key) != value:
            raise SealError(f"envelope is bound to {key} {bound.get(key)!r}, not {value!r}")
    _check_epoch(bound.get("epoch", 1), epoch)
    now = time.time()
    expires = bound.get("expires")
    if not isinstance(expires, int) or expires <= now:
        raise SealError("envelope has expired")
    if expires > now + MAX_TTL:
        raise SealError(f"envelope claims to live more than {MAX_TTL}s")
    challenges.consume(bound.get("challenge"))
    return bound


def _check_epoch(theirs, ours):
    if isinstance(theirs, bool) or not isinstance(theirs, int) or theirs < ours:
        raise SealError(
            f"the order comes from a master at epoch {theirs!r}, older than this set's epoch "
            f"{ours}: that master is no longer the primary (multimaster.promote)"
        )


def unseal(
    envelope, purpose, recipient, recipient_key_pem, signer_pub_pem, expect, challenges, epoch=1
):
    """
    Verify and open an envelope made by ``seal``. ``expect``: binding fields that must match
    (e.g. ``{"target": ..., "config_dir": ...}``); ``challenges``: the recipient's
    ``ChallengeStore``, whose challenge the envelope consumes. Returns ``(body, bound)``; raises
    ``SealError`` naming what failed, never the content.

    purpose
        What the envelope must be for (``master_key``, ``roots`` ...).

    recipient_key_pem
        Our own private key (PEM).

    signer_pub_pem
        The public key (PEM) of the master we trust (``minion_master.pub``).
    """
    bound = _check(envelope, _SEALED, purpose, recipient, signer_pub_pem, expect, challenges, epoch)
    try:
        key = _private_key(recipient_key_pem)
        data_key = key.decrypt(base64.b64decode(envelope["wrapped_key"]), _OAEP)
        plain = AESGCM(data_key).decrypt(
            base64.b64decode(envelope["nonce"]),
            base64.b64decode(envelope["ciphertext"]),
            _canonical([purpose, recipient, bound]),
        )
    except (InvalidTag, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SealError(f"envelope cannot be opened: {type(exc).__name__}") from None
    return json.loads(plain), bound


def check_order(
    document, instruction, purpose, recipient, signer_pub_pem, expect, challenges, epoch=1
):
    """
    Verify a signed order made by ``order`` for ``instruction``; consumes its challenge.
    Returns the binding; raises ``SealError``.

    document
        The signed order.

    purpose
        What the order must be for.

    recipient
        Our own minion id.

    signer_pub_pem
        The public key (PEM) of the master we trust.

    expect
        Binding fields that must match.

    challenges
        Our ``ChallengeStore``.

    epoch
        The set's epoch here: an order bound to an older one is refused.
    """
    if not isinstance(document, dict) or document.get("digest") != digest(instruction):
        raise SealError("the instruction does not match the signed order")
    return _check(document, _ORDER, purpose, recipient, signer_pub_pem, expect, challenges, epoch)


def _json_key(key):
    # JSON keys are strings: an integer key comes back from a JSON job cache as its text.
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (int, float)):
        return json.dumps(key)
    raise SealError(f"an answer holds a key of type {type(key).__name__}, which JSON cannot carry")


def _encoded(value):
    """
    The canonical JSON of ``value`` (keys sorted as JSON text, no spaces), in pieces.
    """
    if isinstance(value, str):
        yield _JSON_STRING(value)
    elif value is None or isinstance(value, (bool, int, float)):
        yield json.dumps(value)
    elif isinstance(value, dict):
        yield "{"
        items = sorted(((_json_key(k), v) for k, v in value.items()), key=lambda kv: kv[0])
        for index, (key, item) in enumerate(items):
            yield ("," if index else "") + _JSON_STRING(key) + ":"
            yield from _encoded(item)
        yield "}"
    elif isinstance(value, (list, tuple)):
        yield "["
        for index, item in enumerate(value):
            if index:
                yield ","
            yield from _encoded(item)
        yield "]"
    else:
        raise SealError(f"an answer holds a {type(value).__name__}, which JSON cannot carry")


_JSON_STRING = json.encoder.encode_basestring_ascii


def answer_digest(answer):
    """
    SHA-256 hex of the canonical JSON of ``answer``, hashed as it is encoded (an inventory of
    10,000 keys is never held twice). Integer keys count as their JSON text: a return read back
    from a JSON job cache has the same digest as the one the minion sent.
    """
    sha = hashlib.sha256()
    for piece in _encoded(answer):
        sha.update(piece.encode())
    return sha.hexdigest()


def _answer_statement(function, master, nonce, failed, answer):
    return _canonical(
        {
            "purpose": "answer",
            "v": VERSION,
            "function": function,
            "master": master,
            "nonce": nonce,
            "failed": failed,
            "digest": answer_digest(answer),
        }
    )


def sign_answer(answer, function, master, nonce, signer_key_pem, failed=False):
    """
    ``answer`` (JSON data) as a control minion returns it to a runner: with its signature over
    ``function``, the ``master`` id it speaks for (None when it cannot tell), the runner's
    ``nonce`` and the digest of ``answer``.

    failed
        ``answer`` is the reason the function failed (a sentence).

    signer_key_pem
        The control minion's own private key (PEM).
    """
    if not isinstance(nonce, str) or not _CHALLENGE_RE.match(nonce):
        raise SealError(f"answer_nonce: got {str(nonce)[:80]!r}; expected 64 hex characters")
    signer = _private_key(signer_key_pem)
    statement = _answer_statement(function, master, nonce, bool(failed), answer)
    return {
        "v": VERSION,
        "master": master,
        "failed": bool(failed),
        "answer": answer,
        "signature": _b64(signer.sign(statement, _PSS, hashes.SHA256())),
    }


def answer_signed(function, call, nonce, minion_opts, speaks_for, log):
    """
    What a control minion returns for ``function`` when a runner sent ``nonce``: the answer of
    ``call()``, or why it failed, signed with its own key (``sign_answer``). A refusal keeps its
    sentence; anything else is named by its type, its text going to the minion's log only.

    minion_opts
        The control minion's opts (its ``id`` and ``pki_dir``).

    speaks_for
        Returns the id of the master the minion serves, or None.

    log
        The logger of the minion's module, for the failure's traceback.
    """
    try:
        answer, failed = call(), False
    except SaltException as exc:
        answer, failed = str(exc), True
    except Exception as exc:  # pylint: disable=broad-except
        log.exception("multimaster: %s failed", function)
        answer = (
            f"{function} failed on {minion_opts['id']}: {type(exc).__name__} (its minion log has "
            "the details)"
        )
        failed = True
    return sign_answer(
        answer,
        function,
        speaks_for(),
        nonce,
        own_file(minion_opts, "minion.pem"),
        failed=failed,
    )


def open_answer(document, function, nonce, signer_pub_pem):
    """
    Verify an answer made by ``sign_answer`` for ``function`` and ``nonce`` with the control
    minion's public key (PEM, as accepted on this master). Returns ``(master, failed,
    answer)``; raises ``SealError`` when ``document`` is not a signed answer, or does not
    verify (another signer, function, nonce, master or answer).
    """
    if (
        not isinstance(document, dict)
        or set(document) != set(_ANSWER)
        or document["v"] != VERSION
        or not isinstance(document["failed"], bool)
        or not isinstance(document["signature"], str)
    ):
        raise SealError("not a signed answer")
    try:
        statement = _answer_statement(
            function, document["master"], nonce, document["failed"], document["answer"]
        )
        serialization.load_pem_public_key(signer_pub_pem.encode()).verify(
            base64.b64decode(document["signature"]), statement, _PSS, hashes.SHA256()
        )
    except (InvalidSignature, ValueError, TypeError):
        raise SealError("the signature does not verify") from None
    return document["master"], document["failed"], document["answer"]


class ChallengeStore:
    """
    Single-use challenges a recipient issues, one file each (named by the challenge, holding its
    expiry) in a private directory: consuming one is an ``unlink`` that succeeds once.
    """

    def __init__(self, directory, ttl=MAX_TTL):
        self.directory = directory
        self.ttl = ttl

    def issue(self):
        """
        A fresh challenge (64 hex characters), valid for ``ttl`` seconds.
        """
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        self._prune()
        challenge = os.urandom(32).hex()
        path = os.path.join(self.directory, challenge)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(str(int(time.time()) + self.ttl))
        return challenge

    def consume(self, challenge):
        """
        Use up ``challenge``; raise ``SealError`` when it was never issued, is used or expired.
        """
        if not isinstance(challenge, str) or not _CHALLENGE_RE.match(challenge):
            raise SealError("envelope carries no valid challenge")
        path = os.path.join(self.directory, challenge)
        try:
            with open(path, encoding="ascii") as handle:
                expires = int(handle.read().strip() or 0)
            os.unlink(path)
        except (OSError, ValueError):
            raise SealError("challenge unknown or already used: refusing a replay") from None
        if expires <= time.time():
            raise SealError("challenge expired")

    def _prune(self):
        now = time.time()
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            try:
                with open(path, encoding="ascii") as handle:
                    if int(handle.read().strip() or 0) <= now:
                        os.unlink(path)
            except (OSError, ValueError):
                continue


# --- peer side (run by a control minion) ---


def own_file(minion_opts, name):
    """
    The text of ``name`` in this control minion's pki dir (``minion.pem``,
    ``minion_master.pub``).
    """
    with open(os.path.join(minion_opts["pki_dir"], name), encoding="utf-8") as handle:
        return handle.read()


def challenges(minion_opts):
    """
    This control minion's store of single-use challenges.
    """
    return ChallengeStore(os.path.join(minion_opts["cachedir"], "multimaster", "challenges"))


def expected(master):
    """
    What an order or envelope for ``master`` must be bound to.
    """
    return {"target": master["id"], "config_dir": master["config_dir"]}


def binding(minion_opts, master):
    """
    A fresh challenge and what the runner must bind its next order to, with the set's epoch
    here (a runner of an older one refuses to act: ``multimaster_control.call``).
    """
    return {
        "challenge": challenges(minion_opts).issue(),
        "target": master["id"],
        "config_dir": master["config_dir"],
        "epoch": master.get("epoch", 1),
    }


def unsealed_for(minion_opts, master, envelope, purpose):
    """
    ``(body, bound)`` of an envelope sealed to this control minion by the master it trusts
    (``minion_master.pub``), bound to ``master`` and a challenge of ours.
    """
    return unseal(
        envelope,
        purpose,
        minion_opts["id"],
        own_file(minion_opts, "minion.pem"),
        own_file(minion_opts, "minion_master.pub"),
        expected(master),
        challenges(minion_opts),
        master.get("epoch", 1),
    )


def check_order_for(minion_opts, master, document, instruction, purpose):
    """
    Check an order signed by the master this control minion trusts, bound to ``master`` and a
    challenge of ours (see ``check_order``).
    """
    return check_order(
        document,
        instruction,
        purpose,
        minion_opts["id"],
        own_file(minion_opts, "minion_master.pub"),
        expected(master),
        challenges(minion_opts),
        master.get("epoch", 1),
    )
