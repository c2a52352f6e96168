"""
The sign-in that proves which key a master serves copies this minion's private key into a
throw-away pki dir: that dir must be private (0700, under the minion's own cachedir, not a
shared /tmp) and gone afterwards, whatever happens.
"""

import os
import stat

import multimaster_handshake
import pytest

INTENDED = "-----BEGIN PUBLIC KEY-----\nINTENDED\n-----END PUBLIC KEY-----\n"
OTHER = "-----BEGIN PUBLIC KEY-----\nOTHER\n-----END PUBLIC KEY-----\n"


def _opts(tmp_path):
    pki, cache = tmp_path / "pki", tmp_path / "cache"
    pki.mkdir()
    for name in ("minion.pem", "minion.pub"):
        (pki / name).write_text(name)
    return {
        "id": "cm1",
        "pki_dir": str(pki),
        "cachedir": str(cache),
        "master_sign_key_name": "master_sign",
    }


def _signing_master(served):
    """
    An ``SAuth`` whose master serves ``served`` signed by the signing pair: Salt's minion then
    stores that key as ``minion_master.pub`` and signs in (``verify_signing_master``).
    """

    class Accepting:
        instances = {}

        def __init__(self, opts):
            self.pki = opts["pki_dir"]

        def sign_in(self, **kwargs):
            with open(os.path.join(self.pki, "minion_master.pub"), "w") as fh_:
                fh_.write(served)
            return {"aes": "session"}

    return Accepting


@pytest.mark.parametrize(
    ("served", "sign_pub", "expected"),
    [
        (INTENDED, "SIGN", True),
        (INTENDED.strip() + "\r\n", "SIGN", True),
        (OTHER, "SIGN", False),
        (INTENDED, None, True),
    ],
    ids=["signed-intended", "signed-intended-crlf", "signed-other-key", "unsigned"],
)
def test_a_signed_sign_in_proves_the_intended_key_only(
    tmp_path, monkeypatch, served, sign_pub, expected
):
    monkeypatch.setattr(multimaster_handshake.salt.crypt, "SAuth", _signing_master(served))
    ok, reason = multimaster_handshake.serves(
        _opts(tmp_path), "127.0.0.1", 4506, INTENDED, sign_pub
    )
    assert ok is expected, reason
    if not expected:
        assert reason == "the master serves another key signed by the signing pair"


def test_sign_in_dir_is_private_and_removed(tmp_path, monkeypatch):
    pki, cache = tmp_path / "pki", tmp_path / "cache"
    pki.mkdir()
    for name in ("minion.pem", "minion.pub"):
        (pki / name).write_text(name)
    seen = {}

    class Refusing:
        instances = {}

        def __init__(self, opts):
            seen["pki"] = opts["pki_dir"]
            seen["mode"] = stat.S_IMODE(os.stat(opts["pki_dir"]).st_mode)

        def sign_in(self, **kwargs):
            raise RuntimeError("master refused")

    monkeypatch.setattr(multimaster_handshake.salt.crypt, "SAuth", Refusing)
    opts = {
        "id": "cm1",
        "pki_dir": str(pki),
        "cachedir": str(cache),
        "master_sign_key_name": "master_sign",
    }
    ok, reason = multimaster_handshake.serves(opts, "127.0.0.1", 4506, "PUB")
    assert ok is False and "RuntimeError" in reason
    assert seen["pki"].startswith(str(cache / "multimaster") + os.sep)
    assert seen["mode"] == 0o700
    assert not os.path.exists(seen["pki"])
