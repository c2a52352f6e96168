"""
Keys made at test time (no key material is stored in the repository), by the dev toolkit shared
with the lab, the bench and the integration tests.
"""

import functools
import hashlib

from toolkit import devkit

# The unit tests' names for the toolkit's PEM encoders.
pub_pem = devkit.public_pem
priv_pem = devkit.private_pem
pkcs1_pub_pem = devkit.pkcs1_public_pem
ec_pub_pem = devkit.ec_public_pem


@functools.cache
def rsa_private(bits=2048, exponent=65537, tag=0):
    """
    An RSA private key, made once per argument set (RSA key generation is slow); ``tag`` makes
    distinct keys of the same size.
    """
    return devkit.new_rsa_key(bits, exponent)


def fp(tag):
    """
    A fingerprint-shaped string (32 colon-separated hex bytes) named by ``tag``.
    """
    return hashlib.sha256(tag.encode()).digest().hex(":")
