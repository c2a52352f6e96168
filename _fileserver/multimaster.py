"""
A file server backend that serves only the formula's staged transfers: the bulk path of
``sync_roots``. A peer's control minion asks its primary's file server (``_serve_file`` on the
request channel the minion already has) for ``multimaster-transfer/<ticket>``, chunk by chunk.
The request costs Salt no runner job, job cache entry or event, unlike a ``peer_run`` pull.

It serves nothing else: no environments, no file list, and only tickets staged for it: a
content stream's, which the recipient alone learns (inside the plan sealed to its key), every
chunk encrypted to it (AES-256-GCM); and the sealed plan's, which a publish carries, to the
recipient's authenticated minion id only. The last chunk uses a ticket up. Enabled by
``multimaster.master``,
which names it in the master's ``fileserver_backend``:

.. code-block:: yaml

    fileserver_backend:
      - roots
      - multimaster
"""

try:
    import multimaster_transport

    HAS_UTILS = True
except ImportError:
    HAS_UTILS = False

__virtualname__ = "multimaster"


def __virtual__():
    if not HAS_UTILS:
        return (False, "multimaster fileserver: utils missing; run salt-run saltutil.sync_all")
    return __virtualname__


def envs():
    """
    No environment of its own: the backend serves transfers, not states.

    CLI Example:

    .. code-block:: bash

        salt-run fileserver.envs backend=multimaster
    """
    return []


def find_file(path, tgt_env="base", **kwargs):  # pylint: disable=unused-argument
    """
    ``{"path", "rel"}`` for a staged transfer's path in any environment, else empty paths (the
    next backend answers): ordinary files are never found here.

    path
        The path asked for: ``multimaster-transfer/<ticket>``.

    tgt_env
        The environment (ignored: a ticket is the same in all).
    """
    if multimaster_transport.fileserver_ticket(__opts__, path) is None:
        return {"path": "", "rel": ""}
    return {"path": path, "rel": path}


def serve_file(load, fnd):  # pylint: disable=unused-argument
    """
    The chunk of the transfer at ``load["loc"]`` (``multimaster_transport.serve_fileserver``).

    load
        The minion's request: ``path``, ``loc``, ``saltenv`` (and ``id`` where Salt adds it).

    fnd
        What ``find_file`` returned.
    """
    return multimaster_transport.serve_fileserver(__opts__, load)


def file_hash(load, fnd):  # pylint: disable=unused-argument
    """
    No hash: a transfer is checked by its own authenticated chunks, not by ``cp.get_file``.
    """
    return {}


def file_list(load):  # pylint: disable=unused-argument
    """
    Nothing listed: transfers are found by their ticket only. Also ``file_list_emptydirs``
    and ``dir_list``.

    CLI Example:

    .. code-block:: bash

        salt-run fileserver.file_list backend=multimaster
        salt-run fileserver.dir_list backend=multimaster
    """
    return []


file_list_emptydirs = dir_list = file_list
