"""
Failover delivered by the formula: a minion made ``mode: failover`` by ``multimaster.minion``
talks to master1, and moves to master2 when master1 stops.
"""

import time

import pytest

from .harness import (
    MASTER_HOSTS,
    Ports,
    assert_states_ok,
    master_entry,
    multimaster_pillar,
    ping,
    read_pid,
    wait_for,
    wait_for_ping,
)

pytestmark = pytest.mark.integration

PREFIX = "fo"
PORTS = Ports(publish=30120, ret=30121)
MINION = "fo-minion"
ALIVE_INTERVAL = 3
# Salt's bound (4 x master_alive_interval) plus a margin for what follows the minion's move:
# its sign-in to master2 and the ping's own CLI start (each 1-3 s on this 2-core machine).
FAILOVER_MARGIN = 10
FAILOVER_BOUND = 4 * ALIVE_INTERVAL + FAILOVER_MARGIN


@pytest.fixture(scope="module")
def failover_minion(master1, master2, start_minion, pillar_tree, ports):
    """
    A minion of master1 that ``multimaster.minion`` (applied from master1) turned into a
    failover minion over [master1, master2]; it has restarted and answers master1.
    """
    pillar_tree.set(
        MINION,
        multimaster_pillar(
            [master_entry(master1, MASTER_HOSTS[0]), master_entry(master2, MASTER_HOSTS[1])],
            ports,
            mode="failover",
            failover={"alive_interval": ALIVE_INTERVAL, "failback": False},
        ),
    )
    minion = start_minion(master1, MINION, share_with=[master2])
    cli = master1.salt_cli(timeout=120)
    assert cli.run("saltutil.sync_all", minion_tgt=MINION).returncode == 0
    pid = read_pid(minion.config["pidfile"])
    ret = cli.run("state.apply", "multimaster.minion", minion_tgt=MINION)
    assert_states_ok(ret)
    wait_for(
        lambda: read_pid(minion.config["pidfile"]) not in (None, pid),
        60,
        what="the minion to restart as a failover minion",
    )
    wait_for_ping(master1.salt_cli(), MINION, timeout=60)
    return minion


def test_failover_to_master2_when_master1_stops(
    master1, master2, failover_minion, event_listener, record_property
):
    """
    With master1 stopped, the failover minion answers test.ping from master2 within a few alive
    intervals. The measured times are printed and recorded.
    """
    assert not ping(master2.salt_cli(), MINION), "a failover minion talks to one master at a time"
    stopping_at = time.time()
    with master1.stopped():
        stopped = time.time() - stopping_at
        wait_for_ping(master2.salt_cli(), MINION, timeout=FAILOVER_BOUND)
        answered = time.time() - stopping_at
        # The minion fires its start event at the master it fails over to; it may reach the
        # listener after the ping's answer, so wait for it.
        matched = event_listener.wait_for_events(
            [(master2.id, f"salt/minion/{MINION}/start")], timeout=60, after_time=stopping_at
        )
        reconnected = min(
            (e.stamp.timestamp() - stopping_at for e in matched.matches), default=None
        )
    assert reconnected is not None, "no start event from the minion on master2"
    record_property("failover_reconnect_seconds", round(reconnected, 1))
    record_property("failover_answer_seconds", round(answered, 1))
    print(
        f"\nfailover (alive_interval {ALIVE_INTERVAL}s): stopping master1 took {stopped:.1f}s; "
        f"the minion signed in to master2 {reconnected:.1f}s and answered test.ping from it "
        f"{answered:.1f}s after the stop began (bound {FAILOVER_BOUND}s)"
    )
    assert answered <= FAILOVER_BOUND
