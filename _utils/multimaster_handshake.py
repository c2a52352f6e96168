"""
Ask a running master which key it serves, by a real minion sign-in (not a file read).

The sign-in runs with a throw-away pki dir (0700, in the minion's cachedir, removed after)
holding this minion's own (accepted) keypair and the *intended* master public key as
``minion_master.pub``: the minion encrypts its token to that key,
so the sign-in only succeeds if the master holds the matching private key and serves the same
public key. With ``sign_pub``, the master's signature over its public key is checked as well
(``master_sign_pubkey``); then Salt accepts any key the signing pair signed, so the key the
sign-in stored is compared with the intended one too.
"""

import os
import shutil
import socket
import tempfile

import salt.crypt
import salt.utils.files


def _private_dir(minion_opts):
    """
    A fresh 0700 directory under the minion's own cachedir (root-only), not in a shared /tmp.
    """
    parent = os.path.join(minion_opts["cachedir"], "multimaster")
    os.makedirs(parent, mode=0o700, exist_ok=True)
    return tempfile.mkdtemp(prefix="handshake-", dir=parent)


def _sign_in(minion_opts, host, port, master_pub=None, sign_pub=None, timeout=10):
    pki = _private_dir(minion_opts)
    try:
        for name in ("minion.pem", "minion.pub"):
            shutil.copy2(os.path.join(minion_opts["pki_dir"], name), os.path.join(pki, name))
        if master_pub:
            with salt.utils.files.fopen(os.path.join(pki, "minion_master.pub"), "w") as fh_:
                fh_.write(master_pub)
        opts = dict(minion_opts)
        ip = socket.gethostbyname(host)
        opts.update(
            pki_dir=pki,
            master=host,
            master_ip=ip,
            master_port=port,
            master_uri=f"tcp://{ip}:{port}",
            verify_master_pubkey_sign=bool(sign_pub),
            always_verify_signature=bool(sign_pub),
            master_finger="",
        )
        if sign_pub:
            name = f"{opts['master_sign_key_name']}.pub"
            with salt.utils.files.fopen(os.path.join(pki, name), "w") as fh_:
                fh_.write(sign_pub)
        auth = salt.crypt.SAuth(opts)
        try:
            creds = auth.sign_in(timeout=timeout, safe=False, tries=1)
        except (SystemExit, Exception) as exc:  # noqa: BLE001 - any failure means "not verified"
            return False, f"sign-in failed: {type(exc).__name__}", None
        finally:
            # SAuth keeps one instance per minion/master pair; drop this one (whatever the key
            # Salt names it by) so the next check signs in afresh.
            for key, instance in list(salt.crypt.SAuth.instances.items()):
                if instance is auth:
                    salt.crypt.SAuth.instances.pop(key, None)
        served = None
        mpub = os.path.join(pki, "minion_master.pub")
        if os.path.isfile(mpub):
            with salt.utils.files.fopen(mpub) as fh_:
                served = fh_.read()
        if not isinstance(creds, dict) or not creds.get("aes"):
            return False, f"sign-in refused: {creds!r}", served
        if sign_pub and not _same_key(served, master_pub):
            # A minion that verifies signatures takes any key the signing pair signed, and
            # Salt then checks the reply against that key: the sign-in alone proves no key.
            return False, "the master serves another key signed by the signing pair", served
        return True, "ok", served
    finally:
        shutil.rmtree(pki, ignore_errors=True)


def _same_key(served, intended):
    """
    Whether ``served`` (what the sign-in stored as the master's key) is ``intended``, compared
    as Salt compares master keys (``clean_key``).
    """
    if not served or not intended:
        return False
    return salt.crypt.clean_key(served) == salt.crypt.clean_key(intended)


def served_key(minion_opts, host, port, timeout=10):
    """
    The public key ``host:port`` serves to this minion on first contact, or None.

    minion_opts
        The opts of the minion signing in (its pki dir holds the key it proves).

    timeout
        Seconds to wait for the master's answer.
    """
    _, _, served = _sign_in(minion_opts, host, port, timeout=timeout)
    return served


def serves(minion_opts, host, port, master_pub, sign_pub=None, timeout=10):
    """
    ``(True, "ok")`` when the master at ``host:port`` proves it holds ``master_pub``'s private key
    (and, with ``sign_pub``, signs it with the matching signing key); else ``(False, reason)``.

    minion_opts
        The opts of the minion signing in (its pki dir holds the key it proves).

    timeout
        Seconds to wait for the master's answer.
    """
    ok, reason, _ = _sign_in(minion_opts, host, port, master_pub, sign_pub, timeout)
    return ok, reason
