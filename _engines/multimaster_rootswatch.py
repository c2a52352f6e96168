"""
Keep a record of what changes under this master's ``file_roots`` and ``pillar_roots``, so that
``salt-run multimaster.sync_roots`` reads only the directories changed since its last run
(``multimaster_rootswatch``). Named in the master's config:

.. code-block:: yaml

    engines:
      - multimaster_rootswatch: {}

A root on a file system other than a local one, or past the kernel's inotify watch limit, is
read in full at each sync, as without the engine.
"""

import multimaster_rootswatch

__virtualname__ = "multimaster_rootswatch"


def __virtual__():
    if not multimaster_rootswatch.available():
        return False, "multimaster_rootswatch: needs Linux inotify"
    return __virtualname__


def start():
    """
    Watch this master's roots until the master stops.

    CLI Example:

    .. code-block:: bash

        salt-run saltutil.sync_engines   # then restart the master with the engine configured
    """
    multimaster_rootswatch.run(multimaster_rootswatch.roots_of(__opts__), __opts__["cachedir"])
