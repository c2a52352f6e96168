"""
Fixtures for the integration tests: real salt-master/salt-minion daemons on loopback.

Each test module sets ``PREFIX`` (daemon ids) and ``PORTS`` (its own publish/ret pair). Its
master1 binds 127.0.0.2 and its master2 binds 127.0.0.3 on those same ports, as in Salt's own
multimaster scenario tests. Keys are accepted explicitly with ``salt-key``; master2 gets master1's
keypair before it first starts. Every daemon is made, started and stopped through the module's
``daemons`` (a ``kit.DaemonSet``).
"""

import pytest
from xdist.scheduler import LoadScopeScheduling

from .harness import (
    MASTER_HOSTS,
    START_TIMEOUT,
    KeyAcceptor,
    PillarTree,
    copy_master_keypair,
    minion_overrides,
    share_minion_key,
)
from .kit import DaemonSet

# What ``make test`` hands out whole to one of its two pytest-xdist workers: the separate hosts
# (they share one bridge and its addresses), the key modules (a package-scoped set, run in the
# order their conftest gives), and every other module alone (its module-scoped daemons).
WHOLE_PACKAGES = ("tests/integration/hosts/", "tests/integration/keys/")
# Host modules on a bridge and subnet of their own (``PREFIX``, ``SUBNET``): units of their own.
OWN_BRIDGE = ("tests/integration/hosts/test_enable_signing_failover.py",)


def work_unit(nodeid):
    """
    The package in ``WHOLE_PACKAGES`` that holds test ``nodeid``, else its module's path (also
    for a module in ``OWN_BRIDGE``).
    """
    path = nodeid.split("::", 1)[0]
    if path in OWN_BRIDGE:
        return path
    return next((package for package in WHOLE_PACKAGES if path.startswith(package)), path)


class WorkUnitScheduling(LoadScopeScheduling):
    """
    pytest-xdist's ``loadscope`` scheduling with ``work_unit`` s as its scopes: each worker
    gets whole units, in collection order, the next one as it finishes the last.
    """

    def _split_scope(self, nodeid):
        return work_unit(nodeid)


def pytest_xdist_make_scheduler(config, log):
    """Under ``-n``: the workers take whole work units (``WorkUnitScheduling``)."""
    return WorkUnitScheduling(config, log)


@pytest.fixture(scope="session")
def salt_factories_config(tmp_path_factory):
    """
    Keep every daemon's root under this run's pytest temp dir. Stop daemons with SIGKILL: the
    factories' graceful stop waits up to 2 s per process, one after another (a master has about
    twenty), and nothing here needs a clean exit (no coverage data to flush). A test that stops
    a daemon mid-test (to restart it, or to take its host down) stops it the same way: as a host
    that dies would.
    """
    return {
        "root_dir": tmp_path_factory.mktemp("daemons"),
        "start_timeout": START_TIMEOUT,
        "slow_stop": False,
    }


@pytest.fixture(scope="module")
def daemons(salt_factories):
    """
    The module's ``kit.DaemonSet``: every master and minion the module's fixtures make or start
    through it is stopped at module end, with whatever replaced it.
    """
    with DaemonSet(salt_factories) as daemon_set:
        yield daemon_set


@pytest.fixture(scope="module")
def prefix(request):
    return request.module.PREFIX


@pytest.fixture(scope="module")
def ports(request):
    return request.module.PORTS


@pytest.fixture(scope="module")
def pillar_tree(tmp_path_factory, prefix):
    """
    The pillar_roots shared by this module's masters (top.sls + one SLS per minion).
    """
    return PillarTree(tmp_path_factory.mktemp(f"{prefix}-pillar"))


@pytest.fixture(scope="module")
def key_acceptor():
    return KeyAcceptor()


@pytest.fixture(scope="module")
def master1_factory(daemons, prefix, ports, pillar_tree, key_acceptor):
    return daemons.master(
        f"{prefix}-master1", MASTER_HOSTS[0], ports, pillar_tree.root, auth=key_acceptor
    )


@pytest.fixture(scope="module")
def master1(daemons, master1_factory):
    daemons.start(master1_factory, timeout=START_TIMEOUT)
    return master1_factory


@pytest.fixture(scope="module")
def master2_factory(daemons, prefix, ports, pillar_tree, key_acceptor, master1):
    """
    master2 on 127.0.0.3, same ports, holding master1's keypair (hot minions cache one key).
    """
    factory = daemons.master(
        f"{prefix}-master2", MASTER_HOSTS[1], ports, pillar_tree.root, auth=key_acceptor
    )
    copy_master_keypair(master1, factory)
    return factory


@pytest.fixture(scope="module")
def master2(daemons, master2_factory):
    daemons.start(master2_factory, timeout=START_TIMEOUT)
    return master2_factory


@pytest.fixture(scope="module")
def start_minion(daemons, key_acceptor, ports):
    """
    ``start_minion(master, minion_id, share_with=(), **overrides)`` starts a minion that knows
    only ``master``, accepts its key there with ``salt-key``, copies the accepted key to the
    masters in ``share_with``, and returns the factory.

    At module end ``daemons`` stops the factory's process and whatever replaced it: a restart by
    ``multimaster.minion_restarted`` re-launches the minion as a ``-d`` daemon (and may leave a
    watcher waiting) that the factory does not track.
    """

    def start(master, minion_id, /, share_with=(), **overrides):
        overrides = minion_overrides(master.config["interface"], ports, **overrides)
        factory = daemons.minion(master, minion_id, overrides, acceptor=key_acceptor)
        daemons.start(factory, timeout=START_TIMEOUT)
        share_minion_key(minion_id, master, share_with)
        return factory

    return start
