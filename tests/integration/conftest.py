"""
Fixtures for the integration tests: real salt-master/salt-minion daemons on loopback.

Each test module sets ``PREFIX`` (daemon ids) and ``PORTS`` (its own publish/ret pair). Its
master1 binds 127.0.0.2 and its master2 binds 127.0.0.3 on those same ports, as in Salt's own
multimaster scenario tests. Keys are accepted explicitly with ``salt-key``; master2 gets master1's
keypair before it first starts.
"""

import contextlib

import pytest

from .harness import (
    MASTER_HOSTS,
    START_TIMEOUT,
    KeyAcceptor,
    PillarTree,
    copy_master_keypair,
    kill_daemons_of,
    master_overrides,
    minion_overrides,
    share_minion_key,
)


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
def master1_factory(salt_factories, prefix, ports, pillar_tree, key_acceptor):
    return salt_factories.salt_master_daemon(
        f"{prefix}-master1",
        overrides=master_overrides(MASTER_HOSTS[0], ports, pillar_tree.root),
        on_auth_event_callback=key_acceptor,
    )


@pytest.fixture(scope="module")
def master1(master1_factory):
    with master1_factory.started(start_timeout=START_TIMEOUT):
        yield master1_factory


@pytest.fixture(scope="module")
def master2_factory(salt_factories, prefix, ports, pillar_tree, key_acceptor, master1):
    """
    master2 on 127.0.0.3, same ports, holding master1's keypair (hot minions cache one key).
    """
    factory = salt_factories.salt_master_daemon(
        f"{prefix}-master2",
        overrides=master_overrides(MASTER_HOSTS[1], ports, pillar_tree.root),
        on_auth_event_callback=key_acceptor,
    )
    copy_master_keypair(master1, factory)
    return factory


@pytest.fixture(scope="module")
def master2(master2_factory):
    with master2_factory.started(start_timeout=START_TIMEOUT):
        yield master2_factory


@pytest.fixture(scope="module")
def start_minion(key_acceptor, ports):
    """
    ``start_minion(master, minion_id, share_with=(), **overrides)`` starts a minion that knows
    only ``master``, accepts its key there with ``salt-key``, copies the accepted key to the
    masters in ``share_with``, and returns the factory.

    At module end it stops the factory's process and whatever replaced it: a restart by
    ``multimaster.minion_restarted`` re-launches the minion as a ``-d`` daemon (and may leave a
    watcher waiting) that the factory does not track.
    """
    with contextlib.ExitStack() as stack:

        def start(master, minion_id, /, share_with=(), **overrides):
            overrides = minion_overrides(master.config["interface"], ports, **overrides)
            factory = master.salt_minion_daemon(minion_id, overrides=overrides)
            stack.callback(kill_daemons_of, factory.config_dir)
            stack.callback(factory.terminate)
            key_acceptor.expect(minion_id)
            factory.start(start_timeout=START_TIMEOUT)
            share_minion_key(minion_id, master, share_with)
            return factory

        yield start
