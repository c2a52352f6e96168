"""
The cluster's shared AES key (``cluster_pki_dir/.aes``) on masters with an isolated filesystem.

Salt 3008.3 encrypts every publish of a master cluster with this key and hands it to a minion
when it signs in; a joining master receives it from its peer once. But a master also makes a
new one by itself (a ``salt-key -d``/``-r`` there, or ``publish_session`` seconds after the
last), and tells its peers only to re-read their own file: its ``rotate_cluster_aes_key`` event
carries no key. With no shared filesystem the peers keep the old key, and a minion that signed
in to one master cannot read what another publishes ("Payload decryption failed").

The formula hands the newest key to every peer. Newest is the key with the latest stamp (the
file's mtime, kept when it is copied), ties broken by digest: masters that rotate at the same
time all end with the same key, whatever order the copies arrive in.
"""

import base64
import binascii
import hashlib
import logging
import os
import tempfile

import salt.utils.event
import salt.utils.files
import salt.utils.user
from salt.exceptions import CommandExecutionError

log = logging.getLogger(__name__)

AES_FILE = ".aes"
# What Salt's Crypticle.generate_key_string(192) writes: 24 key bytes and a 32-byte HMAC key.
AES_KEY_BYTES = 56
# Salt's EventMonitor re-reads the key file for this tag when a peer (``__peer_id``) sent it.
RELOAD_TAG = "rotate_cluster_aes_key"


def aes_path(mopts):
    """
    Where the master of ``mopts`` keeps the cluster's AES key.

    mopts
        The master's opts (its ``cluster_pki_dir``).
    """
    return os.path.join(mopts["cluster_pki_dir"], AES_FILE)


def _digest(key):
    return hashlib.sha256(key.encode()).hexdigest()


def read_aes(mopts):
    """
    ``(key, held)`` of the master of ``mopts``: the key text and ``{"stamp", "digest"}``; both
    None when it has no key yet (its salt-master never started as a cluster master). The key
    never leaves the caller: only ``held`` is reported.
    """
    path = aes_path(mopts)
    try:
        with salt.utils.files.fopen(path, "r") as handle:
            key = handle.read().strip()
            stamp = os.fstat(handle.fileno()).st_mtime
    except FileNotFoundError:
        return None, None
    return key, {"stamp": stamp, "digest": _digest(key)}


def held_aes(mopts):
    """
    ``{"stamp", "digest"}`` of the key the master of ``mopts`` holds (None: no key yet). Public:
    a SHA-256 digest of a random key says nothing of it.
    """
    return read_aes(mopts)[1]


def newer(offered, held):
    """
    Does the key described by ``offered`` (``{"stamp", "digest"}``) replace the one described by
    ``held`` (None: no key)? The later stamp wins, the greater digest on a tie.
    """
    if held is None:
        return True
    return (offered["stamp"], offered["digest"]) > (held["stamp"], held["digest"])


def check_key(key):
    """
    ``key`` as Salt's cluster writes it (base64 of 56 bytes), or ``CommandExecutionError`` that
    does not quote it.
    """
    try:
        valid = isinstance(key, str) and len(base64.b64decode(key, validate=True)) == AES_KEY_BYTES
    except (binascii.Error, ValueError):
        valid = False
    if not valid:
        raise CommandExecutionError(
            f"cluster AES key: not a key as Salt writes it (base64 of {AES_KEY_BYTES} bytes)"
        )
    return key


def install_aes(mopts, key, stamp):
    """
    Make ``key`` the cluster's AES key of the master of ``mopts`` if it is newer than the one
    held (``newer``): written beside the live file (0600, the master's user), its mtime set to
    ``stamp``, renamed over it. Returns True when it was installed. The running master picks it
    up on ``reload`` only.
    """
    offered = {"stamp": stamp, "digest": _digest(check_key(key))}
    if not newer(offered, held_aes(mopts)):
        return False
    path = aes_path(mopts)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".aes-")
    try:
        with os.fdopen(fd, "w") as handle:
            os.fchmod(fd, 0o600)
            user = mopts.get("user")
            if user:
                os.fchown(fd, salt.utils.user.get_uid(user), -1)
            handle.write(key)
            handle.flush()
            os.fsync(fd)
        os.utime(tmp, (stamp, stamp))
        os.rename(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    return True


def reload(mopts, sender):
    """
    Make the running salt-master of ``mopts`` re-read its key file: the event Salt's own
    ``EventMonitor`` handles when a peer rotated (``__peer_id``: ``sender``, the master that
    handed the key on). True once the master's bus took it.
    """
    try:
        with salt.utils.event.get_master_event(mopts, mopts["sock_dir"], listen=False) as bus:
            return bool(bus.fire_event({"__peer_id": sender}, RELOAD_TAG))
    except Exception as exc:  # pylint: disable=broad-except
        log.warning("multimaster: the master did not take %s: %s", RELOAD_TAG, exc)
        return False
