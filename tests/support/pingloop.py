"""
Pings minions once a second from the master of the host this runs on, in one process, and
prints a line per ping: ``<time.monotonic() at its start> <1 if every minion answered, else 0>
<the ids that answered, comma-separated, or ->``.

``hostwatch.Pinger`` runs it on each master. A ``salt-run`` or ``salt`` per ping costs about a
CPU-second of start-up; a ping each second then keeps a core of a loaded machine busy and slows
the very restarts the pings measure. Here a ping is the one ``manage.up`` makes (a find_job round
as long as the timeout for a silent minion), with a new client each time: a master that
restarted has a new event socket.

Usage: ``python pingloop.py <id>[,<id>...] [timeout]``
"""

import sys
import time

import salt.client

MASTER_CONFIG = "/etc/salt/master"


def answering(minions, timeout):
    """
    The ids among ``minions`` that answer ``test.ping`` within ``timeout`` seconds; none while
    the master is down or restarting.
    """
    found = set()
    try:
        with salt.client.get_local_client(MASTER_CONFIG) as client:
            pub = client.run_job(minions, "test.ping", (), "list", "", timeout, "", listen=True)
            if not pub:
                return found
            for ret in client.get_cli_event_returns(
                pub["jid"], pub["minions"], timeout, minions, "list", gather_job_timeout=timeout
            ):
                # test.ping's answer is True; a row Salt makes up for a silent minion is not.
                found.update(m for m, row in (ret or {}).items() if row.get("ret") is True)
    except Exception:  # noqa: BLE001 - any failure of a ping is a ping not answered
        return found
    return found


def main(minions, timeout=2.0):
    while True:
        began = time.monotonic()
        found = answering(minions, timeout)
        print(
            f"{began:.3f} {int(found >= set(minions))} {','.join(sorted(found)) or '-'}",
            flush=True,
        )
        time.sleep(max(0.0, 1.0 - (time.monotonic() - began)))


if __name__ == "__main__":
    main(sys.argv[1].split(","), *map(float, sys.argv[2:3]))
