"""
Signing turned on in a running failover set on separate hosts, as in
``test_enable_signing.py`` for a hot set: every minion answers the primary (a failover minion
answers the one master it is connected to, and the step that makes it verify is published
from the primary), each daemon restarts once, and the prepared set then gives each master a
key of its own (``rotate_master_key``): its control minions, failover minions too, are back on
the primary for the runner's last steps (they always fail back there).
"""

from tests.support.hostwatch import answers, read

from .test_enable_signing import (
    MASTER_PKI,
    again_restarts_nothing,
    built,
    figures,
    rotated,
    turned_on,
)

# A bridge and subnet of its own: ``make test`` runs this module beside the other host modules
# (``tests/integration/conftest.py``).
PREFIX = "mf"
SUBNET = "10.0.4"
HOSTS = {"master1": "10.0.4.61", "master2": "10.0.4.230", "minion1": "10.0.4.71"}


def test_signing_is_turned_on_in_a_running_failover_set(host_set):
    master_key = built(host_set, "failover")
    took, pinger = turned_on(host_set, ("master1",))
    assert pinger.answered_by["master2"] == [], "a failover minion talks to one master"
    assert read(host_set["master2"], f"{MASTER_PKI}/master.pub") == master_key
    print(figures("failover", took, pinger))
    again_restarts_nothing(host_set)


def test_the_prepared_failover_set_gives_each_master_its_own_key(host_set):
    master1, master2 = host_set["master1"], host_set["master2"]
    before, after = rotated(host_set)
    assert before not in after.values() and after["master1"] != after["master2"]
    # minion1 left master1 when it restarted, and stays where it went (failback is off).
    assert answers(master1, "minion1") or answers(master2, "minion1")
