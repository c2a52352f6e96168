"""
Salt's job bookkeeping on a master, for unit tests.
"""

import os

import salt.payload


def running(opts, jid, fun):
    """
    The job tracker file Salt's runner client writes before it calls a runner function.
    """
    proc = os.path.join(opts["cachedir"], "proc")
    os.makedirs(proc, exist_ok=True)
    with open(os.path.join(proc, jid), "wb") as handle:
        handle.write(salt.payload.dumps({"fun": fun, "jid": jid, "user": "root", "pid": 1}))
