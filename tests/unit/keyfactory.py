"""
Keys made at test time (no key material is stored in the repository).
"""

import functools

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa


@functools.cache
def rsa_private(bits=2048, exponent=65537, tag=0):
    """
    An RSA private key; ``tag`` makes distinct keys of the same size.
    """
    return rsa.generate_private_key(public_exponent=exponent, key_size=bits)


def pub_pem(key):
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


def priv_pem(key):
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def pkcs1_pub_pem(key):
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.PKCS1)
        .decode()
    )


def ec_pub_pem():
    key = ec.generate_private_key(ec.SECP256R1())
    return pub_pem(key)
