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
by the factories: teardown (the integration conftest's ``daemons``, a ``kit.DaemonSet``) kills
whatever still runs with each daemon's config dir.
"""

import dataclasses
import pathlib

import pytest

from .. import kit
from ..harness import KeyAcceptor, devkit, minion_overrides
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


# ``prefix``, ``ports`` (the test module's PREFIX and PORTS) and ``daemons`` come from the
# integration conftest one directory up.


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
    daemons,
    tmp_path_factory,
    prefix,
    ports,
    daemon_extra,
    master_options,
    key_acceptor,
):
    """
    master1..3 started (at once), each with its own keypair; master1 knows the set
    (``multimaster:``).
    """
    pillar_dir = tmp_path_factory.mktemp(f"{prefix}-pillar")
    factories = [
        daemons.master(
            _master_id(prefix, index),
            HOSTS[index],
            ports,
            pillar_dir,
            auth=key_acceptor,
            serve_repo=index == 0,  # the formula is served by the primary
            **MASTER_EXTRA,
            **daemon_extra,
            **master_options(index, pillar_dir),
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
    daemons.start(*factories, timeout=START_TIMEOUT)
    return factories, section


@pytest.fixture(scope="module")
def key_cluster(key_masters, daemons, prefix, ports, daemon_extra, key_acceptor):
    """
    The masters plus one control minion per master (on master1, accepted there, started at
    once), with the formula's modules synced to the minions and the runner synced to master1.
    """
    factories, section = key_masters
    master1 = factories[0]

    def start_minion(minion_id, master_hosts=(HOSTS[0],), accept=True, wait=True, **extra):
        hosts = list(master_hosts)
        overrides = minion_overrides(HOSTS[0], ports, **daemon_extra, **extra)
        overrides["master"] = hosts if len(hosts) > 1 else hosts[0]
        acceptor = key_acceptor if accept else None
        # wait=False: no start event to wait for (a key left pending): only the process is checked.
        factory = daemons.minion(master1, minion_id, overrides, acceptor=acceptor, wait=wait)
        try:
            daemons.start(factory, timeout=START_TIMEOUT)
        finally:
            key_acceptor.expected.discard(minion_id)
        started.append(factory)
        return factory

    started = []
    control = kit.in_threads(start_minion, [m["minion_id"] for m in section["masters"]])
    kit.sync_minions(master1, control, salt_timeout=120, timeout=240, check=True)
    kit.sync_runners(master1, timeout=120, check=True)
    return KeyCluster(
        masters=factories,
        control=control,
        ports=ports,
        section=section,
        prefix=prefix,
        start_minion=start_minion,
        minions=started,
    )
