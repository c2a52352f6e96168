"""
Sealed delivery of secrets (_utils/multimaster_seal.py).
"""

import copy

import pytest

from . import helpers  # noqa: F401  (puts _utils on sys.path)
from .keyfactory import priv_pem, pub_pem, rsa_private

import multimaster_seal  # noqa: E402  isort: skip

RECIPIENT = rsa_private(tag=10)
SENDER = rsa_private(tag=11)
STRANGER = rsa_private(tag=12)
SECRET = {"pem": "PRIVATE-MARKER-" + "x" * 64, "pub": "pub"}


def sealed():
    return multimaster_seal.seal(
        SECRET, "master_key", "master2", pub_pem(RECIPIENT), priv_pem(SENDER)
    )


def test_round_trip_and_no_plaintext_in_the_envelope():
    envelope = sealed()
    assert "PRIVATE-MARKER" not in repr(envelope)
    body = multimaster_seal.unseal(
        envelope, "master_key", "master2", priv_pem(RECIPIENT), pub_pem(SENDER)
    )
    assert body == SECRET


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda e: e.update(recipient="master3"), "not for"),
        (lambda e: e.update(purpose="master_sign"), "not for"),
        (lambda e: e.update(ciphertext=e["ciphertext"][:-8] + "AAAAAAA="), "signature"),
        (lambda e: e.update(v=2), "version"),
    ],
    ids=["other-recipient", "other-purpose", "tampered", "version"],
)
def test_tampered_or_misaddressed_envelopes_are_refused(change, words):
    envelope = copy.deepcopy(sealed())
    change(envelope)
    with pytest.raises(multimaster_seal.SealError, match=words):
        multimaster_seal.unseal(
            envelope, "master_key", "master2", priv_pem(RECIPIENT), pub_pem(SENDER)
        )


def test_wrong_signer_or_wrong_recipient_key_is_refused():
    envelope = sealed()
    with pytest.raises(multimaster_seal.SealError, match="signature"):
        multimaster_seal.unseal(
            envelope, "master_key", "master2", priv_pem(RECIPIENT), pub_pem(STRANGER)
        )
    with pytest.raises(multimaster_seal.SealError, match="cannot be opened"):
        multimaster_seal.unseal(
            envelope, "master_key", "master2", priv_pem(STRANGER), pub_pem(SENDER)
        )
