"""
The sign-in that proves which key a master serves copies this minion's private key into a
throw-away pki dir: that dir must be private (0700, under the minion's own cachedir, not a
shared /tmp) and gone afterwards, whatever happens.
"""

import os
import stat

import multimaster_handshake


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
