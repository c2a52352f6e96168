"""
What differs between the Salt lines the tool runs on (3006 LTS, 3007, 3008), decided from the
running Salt itself (its options and signatures), never from a version string. The rest of the
code asks these questions and nothing else about the Salt it runs under.

- Keys: 3008 puts a key cache in front of the key store (``keys.cache_driver``: ``localfs_key``
  keeps the ``pki_dir/minions*`` PEM files, ``mmap_key`` keeps none); 3006/3007 have no cache
  option and keep the same files, read and written directly.
- Master key pair: 3008 stores it as ``<id without _master>.pem/.pub`` with ``master.pem/.pub``
  as links to them; 3006/3007 store ``master.pem/.pub`` as the files themselves.
- The native master cluster (``cluster_id``) exists from 3007.
- How Salt itself is installed: onedir (3006+ packages, its own Python, ``salt-pip``), a distro
  package (the system Python), or pip (whatever Python runs it).
- 3008 loads the minion's private key once per request channel (``AsyncAuth`` per event loop);
  a channel can be handed the key an earlier one loaded.
- 3008's ``pillar.get`` masks pillar values outside a template render unless ``unmask=True``;
  older Salts never mask and do not take the argument.
"""

import functools
import inspect
import os
import sys

import salt
import salt.cache
import salt.config
import salt.crypt
import salt.modules.pillar
import salt.version
from salt.exceptions import CommandExecutionError

KEY_CACHE_OPTION = "keys.cache_driver"
LEGACY_MASTER_KEY = "master"


def salt_version():
    """
    The running Salt's version string (for messages only).
    """
    return salt.version.__version__


def has_key_cache():
    """
    True when the running Salt puts a key cache in front of the key store (3008 and newer).
    """
    return KEY_CACHE_OPTION in salt.config.VALID_OPTS


def can_replace_voters():
    """
    True when the running Salt's Raft leader can demote a silent voter
    (``cluster_auto_replace_voters``, 3008.3 and newer).
    """
    return "cluster_auto_replace_voters" in salt.config.VALID_OPTS


def can_cluster():
    """
    True when the running Salt has the native master cluster (3007 and newer).
    """
    return "cluster_id" in salt.config.VALID_OPTS


def key_cache_driver(opts):
    """
    The key cache driver of the master whose options are ``opts``; None when its Salt has no
    key cache (the keys are plain files in ``pki_dir``).
    """
    return opts.get(KEY_CACHE_OPTION)


def keys_are_files(opts):
    """
    True when the master keeps its keys as PEM files under ``pki_dir`` (``localfs_key``, or a
    Salt before the key cache), read and written directly; False for a cache-only driver.
    """
    return key_cache_driver(opts) in (None, "localfs_key")


def key_cache(opts):
    """
    The master's key cache (``salt.cache.Cache`` on its driver); an error on a Salt without one.
    """
    driver = key_cache_driver(opts)
    if driver is None:
        raise CommandExecutionError(
            f"Salt {salt_version()} has no key cache: its keys are files in {opts['pki_dir']}"
        )
    return salt.cache.Cache(opts, driver=driver)


def master_key_base(opts):
    """
    The base name the master stores its key pair under: ``<id without _master>`` with a key
    cache, ``master`` before it.
    """
    if key_cache_driver(opts) is None:
        return LEGACY_MASTER_KEY
    return opts["id"].removesuffix("_master")


def links_legacy_master_key(opts):
    """
    True when ``master.pem/.pub`` are links to the stored pair rather than the pair itself.
    """
    return master_key_base(opts) != LEGACY_MASTER_KEY


def rotate_aes(opts):
    """
    Drop the file that makes the master rotate its AES key at its next maintenance pass (3007
    and newer name the master in it; 3006 does not take the argument).
    """
    if "master_id" in inspect.signature(salt.crypt.dropfile).parameters:
        salt.crypt.dropfile(opts["cachedir"], opts["user"], opts["id"])
    else:
        salt.crypt.dropfile(opts["cachedir"], opts["user"])


@functools.cache
def _pillar_masks():
    return "unmask" in inspect.signature(salt.modules.pillar.get).parameters


def pillar_section(salt_funcs, key):
    """
    ``pillar.get(key, {})`` through the loader's ``__salt__`` with values in clear (a caller
    that returns any of it redacts it first).
    """
    if _pillar_masks():
        return salt_funcs["pillar.get"](key, {}, unmask=True)
    return salt_funcs["pillar.get"](key, {})


def salt_install():
    """
    How the running Salt is installed: ``onedir`` (Salt's own relocatable Python; its pip is
    ``salt-pip``), ``package`` (a distro package on the system Python, e.g. Debian's
    ``python3-salt``) or ``pip`` (pip-installed into some Python, a virtualenv or not).
    """
    if hasattr(sys, "RELENV"):  # what salt.utils.package.bundled() checks (3007+)
        return "onedir"
    path = os.path.realpath(os.path.dirname(salt.__file__))
    system = ("/usr/lib/python3", "/usr/lib64/python3")
    return "package" if path.startswith(system) else "pip"


def minion_key_of(channel):
    """
    The minion's private key a request channel has loaded to sign its requests, where its
    Salt keeps it on the channel's auth (3008); else None.

    channel
        A ``salt.channel.client.ReqChannel`` that has sent a request.
    """
    return getattr(getattr(channel, "auth", None), "_private_key", None)


def reuse_minion_key(channel, key):
    """
    Hand a new request channel the private key ``minion_key_of`` took from an earlier channel
    of the same minion, so that it does not load and check the PEM again (35 ms in 3008). Only
    where the channel's auth keeps one and has not loaded it yet; elsewhere nothing changes.

    channel
        A new ``salt.channel.client.ReqChannel``.

    key
        What ``minion_key_of`` returned for an earlier channel, or None.
    """
    auth = getattr(channel, "auth", None)
    if key is not None and getattr(auth, "_private_key", False) is None:
        auth._private_key = key
