"""
Fixtures for the key-plane tests: three masters and their control minions, real daemons.

Each test module sets ``PREFIX`` (daemon ids) and ``PORTS`` (its own publish/ret pair, in
31000-31999); it may set ``DAEMON_EXTRA`` (options for every daemon, e.g. debug logging) and
``MASTER_OPTIONS(index, pillar_dir)`` (options for one master alone: its roots, its key-cache
driver). The
masters bind 127.0.0.4, 127.0.0.5 and 127.0.0.6 on those same ports, each with its own keypair
(``sync_master_key`` must deliver the shared one), ``open_mode``/``auto_accept`` off. Each master
has a control minion connected to master1 only and accepted there with ``salt-key``; the
formula's modules reach them with ``saltutil.sync_all`` from master1's ``file_roots`` (the
repository root), as a user would. master1's config holds the ``multimaster`` section the
``multimaster.master`` state would have written to ``master.d``.

Daemons that the code under test stopped and re-launched as ``-d`` daemons are no longer tracked
by the factories: teardown kills whatever still runs with each daemon's config dir.
"""

import concurrent.futures
import contextlib
import dataclasses
import pathlib

import pytest

from ..harness import KeyAcceptor, devkit, kill_daemons_of, master_overrides, minion_overrides
from . import keytools

HOSTS = ("127.0.0.4", "127.0.0.5", "127.0.0.6")
START_TIMEOUT = 120
MASTER_EXTRA = {"loop_interval": 1, "gather_job_timeout": 5}


@dataclasses.dataclass
class KeyCluster:
    """
    Three started masters (master1 the primary) and their control minions.
    """

    masters: list
    control: list
    ports: object
    section: dict
    prefix: str
    start_minion: object
    minions: list = dataclasses.field(default_factory=list)

    @property
    def primary(self):
        return self.masters[0]

    @property
    def hosts(self):
        return list(HOSTS)

    def run(self, fun, *args, timeout=300):
        """
        ``salt-run -c <master1 config dir> multimaster.<fun> ...`` with ``--out=json``.
        """
        return keytools.salt_run(self.primary, f"multimaster.{fun}", *args, timeout=timeout)

    def snapshots(self):
        return {m.id: keytools.store_snapshot(m) for m in self.masters}

    def key_lists(self):
        return {m.id: keytools.salt_key_list(m) for m in self.masters}

    def control_ids(self):
        return [c.id for c in self.control]

    def minion(self, minion_id):
        return next(m for m in self.minions if m.id == minion_id)


# ``prefix`` and ``ports`` (the test module's PREFIX and PORTS) come from the integration
# conftest one directory up.


@pytest.fixture(scope="module")
def daemon_extra(request):
    return dict(getattr(request.module, "DAEMON_EXTRA", {}))


class PrimaryAcceptor(KeyAcceptor):
    """
    Auth-event callback for the masters: the key a fixture's minion submits to master1 is
    accepted there with ``salt-key -a ID -y`` while the fixture starts it. Later submissions (a
    deleted minion that re-submits its key) and every other master are left alone: acceptance
    is what we test.
    """

    def __init__(self, primary_id):
        super().__init__()
        self.primary_id = primary_id

    def wants(self, master, minion_id):
        """
        Only on master1, and as often as it is reported pending while the fixture starting that
        minion waits for it: a submission the minion retried while ``salt-key -a`` ran can put
        the key back to pending (Salt 3008's ``localfs_key.store`` clears every state dir before
        it writes), and then it must be accepted again.
        """
        return master.id == self.primary_id and minion_id in self.expected


@pytest.fixture(scope="module")
def key_acceptor(prefix):
    return PrimaryAcceptor(_master_id(prefix, 0))


@pytest.fixture(scope="module")
def cleanup():
    """
    An ExitStack unwound at module end (after the fixtures that registered on it).
    """
    with contextlib.ExitStack() as stack:
        yield stack


def _master_id(prefix, index):
    return f"{prefix}-master{index + 1}"


@pytest.fixture(scope="module")
def master_options(request):
    """
    The test module's ``MASTER_OPTIONS(index, pillar_dir)`` (options of master ``index`` alone,
    e.g. its file_roots/pillar_roots), or nothing: master1 serves the repository, all share the
    pillar dir.
    """
    return getattr(request.module, "MASTER_OPTIONS", lambda index, pillar_dir: {})


@pytest.fixture(scope="module")
def key_masters(
    salt_factories,
    tmp_path_factory,
    prefix,
    ports,
    daemon_extra,
    master_options,
    key_acceptor,
):
    """
    master1..3 started, each with its own keypair; master1 knows the set (``multimaster:``).
    """
    pillar_dir = tmp_path_factory.mktemp(f"{prefix}-pillar")
    factories = [
        salt_factories.salt_master_daemon(
            _master_id(prefix, index),
            overrides=master_overrides(
                HOSTS[index],
                ports,
                pillar_dir,
                serve_repo=index == 0,  # the formula is served by the primary
                **MASTER_EXTRA,
                **daemon_extra,
                **master_options(index, pillar_dir),
            ),
            on_auth_event_callback=key_acceptor,
        )
        for index in range(3)
    ]
    masters = [
        devkit.master_entry(
            factory.id, HOSTS[index], factory.config_dir, minion_id=f"{prefix}-cm{index + 1}"
        )
        for index, factory in enumerate(factories)
    ]
    section = devkit.multimaster_section(masters, ports)
    # Config dirs are only known once the factories exist: the section goes to each master's
    # master.d (where the multimaster.master state puts it) before it first starts, and to the
    # control minions' pillar (where multimaster_peer reads its own paths).
    for factory in factories:
        conf = pathlib.Path(factory.config_dir) / "master.d" / "multimaster.conf"
        devkit.write_config(conf, devkit.multimaster_master_options(section))
    devkit.write_multimaster_pillar(pillar_dir, section)
    try:
        _in_parallel(lambda f: f.start(start_timeout=START_TIMEOUT), factories)
        yield factories, section
    finally:
        _stop_all(factories)


def _in_parallel(fun, items):
    """
    ``[fun(item) ...]`` run in threads (daemon start-up is mostly waiting).
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(fun, items))


def _stop_all(factories):
    """
    Stop the factories' processes and whatever replaced them: the code under test may have
    stopped a factory's daemon and started its own (``-d``, found by its config dir).
    """

    def stop(factory):
        with contextlib.suppress(Exception):
            factory.terminate()
        kill_daemons_of(factory.config_dir)

    _in_parallel(stop, list(factories))


@pytest.fixture(scope="module")
def key_cluster(key_masters, prefix, ports, daemon_extra, key_acceptor, cleanup):
    """
    The masters plus one control minion per master (on master1, accepted there), with the
    formula's modules synced to the minions and the runner synced to master1.
    """
    factories, section = key_masters
    master1 = factories[0]

    def start_minion(minion_id, master_hosts=(HOSTS[0],), accept=True, wait=True, **extra):
        hosts = list(master_hosts)
        overrides = minion_overrides(HOSTS[0], ports, **daemon_extra, **extra)
        overrides["master"] = hosts if len(hosts) > 1 else hosts[0]
        if not wait:
            # No start event to wait for (a key left pending): only the process is checked.
            overrides["pytest-minion"] = {"master-id": None}
        factory = master1.salt_minion_daemon(minion_id, overrides=overrides)
        created.append(factory)
        if accept:
            key_acceptor.expect(minion_id)
        try:
            factory.start(start_timeout=START_TIMEOUT)
        finally:
            key_acceptor.expected.discard(minion_id)
        started.append(factory)
        return factory

    started, created = [], []
    cleanup.callback(_stop_all, created)
    control = _in_parallel(start_minion, [m["minion_id"] for m in section["masters"]])
    ret = keytools.run_cli(
        "salt",
        master1.config_dir,
        "--timeout=120",
        "--static",
        "-L",
        ",".join(c.id for c in control),
        "saltutil.sync_all",
        timeout=240,
    )
    assert ret.returncode == 0, ret
    for minion in control:
        assert "modules.multimaster" in ret.data[minion.id]["modules"], ret
    ret = keytools.run_cli("salt-run", master1.config_dir, "saltutil.sync_all", timeout=120)
    assert ret.returncode == 0, ret
    assert "runners.multimaster" in ret.data["runners"], ret
    return KeyCluster(
        masters=factories,
        control=control,
        ports=ports,
        section=section,
        prefix=prefix,
        start_minion=start_minion,
        minions=started,
    )
