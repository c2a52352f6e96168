"""
The minion key store (``multimaster_keystore``) for unit tests: a store in a tmp dir, what it
holds on disk, and another run holding its lock.
"""

import os
import threading

import multimaster_keys
import multimaster_keystore as ks

from tests.support.keyfactory import pub_pem, rsa_private

STATE_DIRS = ("minions", "minions_pre", "minions_rejected", "minions_denied")
PEM = pub_pem(rsa_private())
OTHER = pub_pem(rsa_private(tag=3))
FP, OTHER_FP = (multimaster_keys.fingerprint(p) for p in (PEM, OTHER))


def store_opts(tmp_path):
    """
    The opts of a master with an empty localfs_key store under ``tmp_path``.
    """
    pki = tmp_path / "pki"
    for name in STATE_DIRS:
        (pki / name).mkdir(parents=True)
    (tmp_path / "cache").mkdir()
    return {
        "pki_dir": str(pki),
        "cachedir": str(tmp_path / "cache"),
        "id": "master1",
        "keys.cache_driver": "localfs_key",
        "user": None,
    }


def where(mopts, minion_id):
    """
    The state dirs that hold a file for ``minion_id``, sorted.
    """
    return sorted(
        name
        for name in STATE_DIRS
        if os.path.isfile(os.path.join(mopts["pki_dir"], name, minion_id))
    )


def put(mopts, name, minion_id, text=PEM):
    """
    Write ``text`` as ``minion_id``'s key in state dir ``name``, as ``salt-key`` would.
    """
    with open(os.path.join(mopts["pki_dir"], name, minion_id), "w", encoding="utf-8") as fh:
        fh.write(text)


def link_pending_dir(mopts, tmp_path):
    """
    Replace the store's ``minions_pre`` with a link to a dir outside holding a shadow file and a
    key; returns ``(outside, the link)``.
    """
    outside = tmp_path / "etc"
    outside.mkdir()
    (outside / "shadow").write_text("root:$6$secret:19000:0:99999:7:::\n")
    (outside / "web1").write_text(PEM)
    pre = os.path.join(mopts["pki_dir"], "minions_pre")
    os.rmdir(pre)
    os.symlink(outside, pre)
    return outside, pre


def holding_the_lock(mopts):
    """
    Another run (a thread with its own open file description) holding the store lock until the
    returned event is set.
    """
    held, release = threading.Event(), threading.Event()

    def hold():
        with ks.locked(mopts):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(5)
    return release, thread
