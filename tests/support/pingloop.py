"""
Pings one minion once a second from the master of the host this runs on, in one process, and
prints ``<time.monotonic() at the ping's start> <1 if it answered, else 0>`` per ping.

``hostwatch.Pinger`` runs it on each master. A ``salt-run`` per ping costs about a CPU-second
of start-up; two masters pinged each second then keep both of a loaded machine's cores busy and
slow the very restarts the pings measure. Here a ping is the one ``manage.up`` makes, with a new
client each time: a master that restarted has a new event socket.

Usage: ``python pingloop.py <minion id> [timeout]``
"""

import sys
import time

import salt.client

MASTER_CONFIG = "/etc/salt/master"


def answered(minion, timeout):
    """
    Whether ``minion`` answers ``test.ping`` within ``timeout`` seconds (plus a find_job round
    as short); a master that is down or restarting is no answer.
    """
    try:
        with salt.client.get_local_client(MASTER_CONFIG) as client:
            pub = client.run_job(minion, "test.ping", (), "glob", "", timeout, "", listen=True)
            if not pub:
                return False
            for ret in client.get_cli_event_returns(
                pub["jid"],
                pub["minions"],
                timeout,
                minion,
                "glob",
                gather_job_timeout=timeout,
            ):
                # test.ping's answer is True; a row Salt makes up for a silent minion is not.
                if ((ret or {}).get(minion) or {}).get("ret") is True:
                    return True
    except Exception:  # noqa: BLE001 - any failure of a ping is a ping not answered
        return False
    return False


def main(minion, timeout=2.0):
    while True:
        began = time.monotonic()
        print(f"{began:.3f} {int(answered(minion, timeout))}", flush=True)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - began)))


if __name__ == "__main__":
    main(sys.argv[1], *map(float, sys.argv[2:3]))
