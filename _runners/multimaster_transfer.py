"""
The one runner function a master exposes to its control minions (``peer_run``, rendered by the
``multimaster.master`` state): serve a chunk of a transfer the ``multimaster`` runner staged for
the asking minion. Not for operators: a ticket is bound to one control minion and used up by it.
"""

import salt.utils.user

try:
    import multimaster_transport

    HAS_UTILS = True
except ImportError:
    HAS_UTILS = False

__virtualname__ = "multimaster_transfer"


def __virtual__():
    if not HAS_UTILS:
        return (False, "multimaster_transfer: utils missing; run salt-run saltutil.sync_all")
    return __virtualname__


def pull(ticket, offset=0):
    """
    The chunk of the transfer ``ticket`` that starts at ``offset``, if it was staged for the
    minion asking (on ``peer_run`` Salt sets ``id`` to the requesting minion, authenticated on
    its request channel). Returns ``{"data", "offset", "size"}`` or ``{"error": ...}``.

    ticket
        The ticket from the published descriptor.

    offset
        Where the chunk starts: 0, then the end of the previous chunk.

    CLI Example:

    .. code-block:: bash

        salt master2 publish.runner multimaster_transfer.pull arg='["ticket=t...", "offset=0"]'
    """
    # On peer_run Salt runs this as the master's own user. Called by an eauth user (salt-api,
    # an ACL such as ``multimaster.*`` matches this function too), ``id`` would be the
    # master's own, which may be its control minion's: never serve that caller.
    if globals().get("__user__") != salt.utils.user.get_specific_user():
        return {"error": "multimaster_transfer.pull serves control minions through peer_run only"}
    # This pull is a runner job Salt keeps in the job cache; the transport removes its chunk
    # jobs as the transfer proceeds (they are plumbing, and may be large).
    jid = globals().get("__jid__")
    multimaster_transport.record_pull(__opts__, __opts__["id"], jid)
    return multimaster_transport.serve(__opts__, __opts__["id"], ticket, offset, jid)
