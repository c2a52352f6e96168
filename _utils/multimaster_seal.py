"""
Seal a secret to one recipient: RSA-OAEP (SHA-256) wraps a fresh AES-256-GCM key that encrypts
the body, and the sender signs the whole envelope (RSA-PSS, SHA-256).

The envelope may travel as a publish argument: without the recipient's private key it is noise,
and without the sender's signature it is refused. What it carries is never logged or returned.
"""

import base64
import json
import os

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from salt.exceptions import CommandExecutionError

VERSION = 1
_OAEP = padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH)
_SIGNED = ("v", "purpose", "recipient", "wrapped_key", "nonce", "ciphertext")


class SealError(CommandExecutionError):
    """
    The envelope is not for us, was tampered with, or was not signed by the expected sender.
    """


def _b64(data):
    return base64.b64encode(data).decode()


def _signed_bytes(envelope):
    return json.dumps({k: envelope[k] for k in _SIGNED}, sort_keys=True).encode()


def seal(body, purpose, recipient, recipient_pub_pem, signer_key_pem):
    """
    Seal ``body`` (a JSON-serialisable dict) for ``recipient`` (an id, bound into the envelope
    with ``purpose``). Returns the envelope (a dict of strings).
    """
    pub = serialization.load_pem_public_key(recipient_pub_pem.encode())
    signer = serialization.load_pem_private_key(signer_key_pem.encode(), password=None)
    data_key = AESGCM.generate_key(bit_length=256)
    nonce = os.urandom(12)
    aad = f"{purpose}:{recipient}".encode()
    envelope = {
        "v": VERSION,
        "purpose": purpose,
        "recipient": recipient,
        "wrapped_key": _b64(pub.encrypt(data_key, _OAEP)),
        "nonce": _b64(nonce),
        "ciphertext": _b64(AESGCM(data_key).encrypt(nonce, json.dumps(body).encode(), aad)),
    }
    envelope["signature"] = _b64(signer.sign(_signed_bytes(envelope), _PSS, hashes.SHA256()))
    return envelope


def unseal(envelope, purpose, recipient, recipient_key_pem, signer_pub_pem):
    """
    Verify and open an envelope made by ``seal``. Raises ``SealError`` (naming what failed,
    never the content) unless it is for ``recipient`` and ``purpose``, signed by the holder of
    ``signer_pub_pem``, and intact.
    """
    try:
        if envelope.get("v") != VERSION:
            raise SealError(f"unsupported envelope version {envelope.get('v')!r}")
        if envelope.get("purpose") != purpose or envelope.get("recipient") != recipient:
            raise SealError(f"envelope is not for {recipient!r} / {purpose!r}")
        signer = serialization.load_pem_public_key(signer_pub_pem.encode())
        signer.verify(
            base64.b64decode(envelope["signature"]),
            _signed_bytes(envelope),
            _PSS,
            hashes.SHA256(),
        )
        key = serialization.load_pem_private_key(recipient_key_pem.encode(), password=None)
        data_key = key.decrypt(base64.b64decode(envelope["wrapped_key"]), _OAEP)
        plain = AESGCM(data_key).decrypt(
            base64.b64decode(envelope["nonce"]),
            base64.b64decode(envelope["ciphertext"]),
            f"{purpose}:{recipient}".encode(),
        )
    except InvalidSignature:
        raise SealError(
            "envelope signature does not verify with the sending master's key"
        ) from None
    except (InvalidTag, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SealError(f"envelope cannot be opened: {type(exc).__name__}") from None
    return json.loads(plain)
