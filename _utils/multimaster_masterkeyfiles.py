"""
The master's own key files as seen from its host (the control minion): the master key pair (or
the signing pair of failover with signing) this master stores, read, checked for consistency
and installed. The minion keys beside them are ``multimaster_keystore``'s.

With a key cache (3008) the pair is stored under ``<id without _master>`` in the cache's
``master_keys`` bank, which ``localfs_key`` keeps as files in ``pki_dir`` (also in a cluster)
with ``master.pem``/``master.pub`` as links to them; 3006/3007 keep plain
``master.pem``/``master.pub`` in ``pki_dir`` (``multimaster_saltcompat`` says which). An install
holds the key store's lock (``multimaster_keystore.locked``) and stages its files in the store's
private temp dir, whose leftovers ``multimaster_keywrite.repair`` clears; the order of its steps
leaves a pair the master starts with after a crash at any one of them (``_install_files``).
"""

import os

import cryptography.exceptions
import multimaster_keys
import multimaster_keystore
import multimaster_saltcompat
import salt.utils.files
from salt.exceptions import CommandExecutionError


def master_key_name(mopts):
    """
    The base name the master stores its keypair under (``<id without _master>`` on 3008,
    ``master`` before).

    mopts
        The master's opts, as Salt loads them from its config dir
        (``multimaster_keystore.master_opts``).
    """
    return multimaster_saltcompat.master_key_base(mopts)


def master_key_files(mopts, signing=False):
    """
    The master_keys cache names of the pair ``sync_master_key`` manages on this master.

    mopts
        The master's opts, as Salt loads them from its config dir
        (``multimaster_keystore.master_opts``).

    signing
        True for the signing pair (failover with signing), False for the master key pair.
    """
    if signing:
        base = mopts["master_sign_key_name"]
    else:
        base = master_key_name(mopts)
    return f"{base}.pem", f"{base}.pub"


def read_master_key(mopts, signing=False, private=False):
    """
    The master's public (or private) key PEM as stored, or None.

    mopts
        The master's opts, as Salt loads them from its config dir
        (``multimaster_keystore.master_opts``).

    signing
        True for the signing pair (failover with signing), False for the master key pair.
    """
    pem_name, pub_name = master_key_files(mopts, signing)
    name = pem_name if private else pub_name
    if multimaster_saltcompat.key_cache_driver(mopts) is None:
        return _read_text(os.path.join(mopts["pki_dir"], name))
    cache = multimaster_saltcompat.key_cache(mopts)
    value = cache.fetch("master_keys", name)
    if value is None and not signing:
        # A master that has never started under 3008 still has plain master.pem/.pub.
        value = cache.fetch("master_keys", "master.pem" if private else "master.pub")
    return value


def _pair_problem(pem, pub, pem_name, pub_name):
    """
    Why ``pub`` is not the public half of private key ``pem``, or None (never shows the key).
    """
    if pem is None:
        return f"{pem_name}: no private key stored"
    try:
        private_fp = multimaster_keys.private_key_fingerprint(pem)
    except (ValueError, TypeError, cryptography.exceptions.UnsupportedAlgorithm):
        return f"{pem_name}: not a readable unencrypted private key"
    if pub is None:
        return (
            f"{pub_name} is missing (the master serves the public half of {pem_name}): an "
            "interrupted install; re-run sync_master_key"
        )
    fp = multimaster_keys.fingerprint(pub)
    if fp != private_fp:
        return f"{pub_name} ({fp or 'not a public key'}) does not match {pem_name} ({private_fp})"
    return None


def master_key_pair_problems(mopts, signing=False):
    """
    What is wrong with this master's stored key pair (or signing pair), as sentences: no
    private key, or a ``.pub`` that is missing or not the public half of the ``.pem``. ``[]``
    when the pair is consistent.

    mopts
        The master's opts, as Salt loads them from its config dir
        (``multimaster_keystore.master_opts``).
    """
    pem_name, pub_name = master_key_files(mopts, signing)
    problem = _pair_problem(
        read_master_key(mopts, signing, private=True),
        read_master_key(mopts, signing),
        pem_name,
        pub_name,
    )
    return [problem] if problem else []


def install_master_key(mopts, pem, pub, signing=False):
    """
    Under the store lock, install the pair (refused unless ``pub`` is the public half of
    ``pem``). localfs_key: regular 0400 files owned by the master's user, written crash-safely
    (see ``_install_files``), ``master.pem``/``master.pub`` kept as links to them. Other drivers:
    through the key cache, in the same order. Call it only with the master stopped: a running
    master keeps its private key in memory.

    mopts
        The master's opts, as Salt loads them from its config dir
        (``multimaster_keystore.master_opts``).

    signing
        True for the signing pair (failover with signing), False for the master key pair.
    """
    pem_name, pub_name = master_key_files(mopts, signing)
    problem = _pair_problem(pem, pub, pem_name, pub_name)
    if problem:
        raise CommandExecutionError(f"refusing to install the master key pair: {problem}")
    with multimaster_keystore.locked(mopts):
        if not multimaster_saltcompat.keys_are_files(mopts):
            cache = multimaster_saltcompat.key_cache(mopts)
            cache.flush("master_keys", pub_name)
            cache.store("master_keys", pem_name, pem)
            cache.store("master_keys", pub_name, pub)
            return
        _install_files(mopts, (pem_name, pem), (pub_name, pub))
        if not signing and multimaster_saltcompat.links_legacy_master_key(mopts):
            _link_legacy(mopts["pki_dir"], pem_name, pub_name)


def _install_files(mopts, private, public):
    """
    Put ``(name, text)`` ``private`` and ``public`` in ``pki_dir`` (where 3008 keeps master keys,
    also in a cluster), mode 0400 and owner as ``localfs_key`` stores them.

    Order: remove the old .pub, replace the .pem, then put the new .pub. A crash at any step
    leaves a master that starts with a consistent pair: with no .pub it serves (and stores
    again) the public half of the .pem it loads (``MasterKeys.get_pub_str``). The other orders
    are worse: a new .pub beside the old .pem (or the reverse) is served while the master signs
    with the other key, and a missing .pem makes the master generate a new pair. Each file is
    staged in the private temp dir and fsync'd, each step is a rename (or unlink) followed by a
    sync of the dir.
    """
    pki = mopts["pki_dir"]
    tmp_dir = multimaster_keystore.private_dir(os.path.join(pki, multimaster_keystore.TMP_DIR))
    uid = multimaster_keystore.master_uid(mopts)
    staged = []
    try:
        for _, text in (private, public):
            staged.append(multimaster_keystore.stage(tmp_dir, text, uid, mode=0o400, sync=True))
        multimaster_keystore.discard([os.path.join(pki, public[0])])
        multimaster_keystore.fsync_dir(pki)
        for (name, _), tmp in zip((private, public), staged, strict=True):
            os.replace(tmp, os.path.join(pki, name))
            multimaster_keystore.fsync_dir(pki)
    finally:
        multimaster_keystore.discard(staged)


def _read_text(path):
    # 3006/3007 keep master.pem/.pub (and the signing pair) as plain files in pki_dir.
    try:
        with salt.utils.files.fopen(path, "r") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _link_legacy(pki, pem_name, pub_name):
    # 3008 keeps master.pem/.pub as compatibility symlinks to <id>.pem/.pub; plain files left by
    # an older layout would shadow nothing but confuse operators, so leave only links.
    for legacy, current in (("master.pem", pem_name), ("master.pub", pub_name)):
        path = os.path.join(pki, legacy)
        if os.path.lexists(path) and not os.path.islink(path):
            os.unlink(path)
        if not os.path.lexists(path):
            os.symlink(os.path.join(pki, current), path)
