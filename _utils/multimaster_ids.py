"""
Strict id hygiene for multimaster.

Salt's own ``valid_id`` lets through ids such as ``-rf``, ``m*``, ``a,b``, ``.hidden`` or ids with a
newline: harmless as file names, dangerous once they reach a target expression or a command line.
Every id the formula reads from pillar or a key store, or writes anywhere, passes ``check_id``.
"""

import re

from salt.exceptions import SaltInvocationError

MAX_ID_BYTES = 64

# First character alphanumeric or underscore (no leading '.' or '-'); then a conservative set with
# no glob characters, commas, whitespace, control characters or path separators.
_ID_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")


def is_valid_id(value):
    """
    Return True when ``value`` is a safe minion or master id.
    """
    return (
        isinstance(value, str)
        and len(value.encode("utf-8")) <= MAX_ID_BYTES
        and _ID_RE.match(value) is not None
    )


def _refusal(value, where):
    return (
        f"{where}: {value!r} is not a valid id; expected 1-{MAX_ID_BYTES} bytes of letters, "
        "digits, '_', '.', '-', not starting with '.' or '-'"
    )


def check_id(value, where="id"):
    """
    Return ``value`` when it is a safe id, else raise ``SaltInvocationError`` naming ``where``.
    """
    if not is_valid_id(value):
        raise SaltInvocationError(_refusal(value, where))
    return value


def problems(named):
    """
    One message, as ``check_id`` words it, per value of ``named`` (``{where: value}``) that is
    not a safe id; values that are None (an optional setting left out) are not checked.
    """
    return [
        _refusal(value, where)
        for where, value in named.items()
        if value is not None and not is_valid_id(value)
    ]
