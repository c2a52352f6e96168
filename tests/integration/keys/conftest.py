"""
Fixtures for the key-plane tests: three masters and their control minions, real daemons.

Each test module sets ``PREFIX`` (daemon ids) and ``PORTS`` (its own publish/ret pair, in
31000-31999); it may set ``DAEMON_EXTRA`` (options for every daemon, e.g. debug logging),
``MASTER_OPTIONS(index, pillar_dir)`` (options for one master alone: its roots, its key-cache
driver) and ``MASTER_D_OPTIONS`` (options every master's ``master.d`` file sets over what
``multimaster.master`` renders there). The masters bind 127.0.0.4, 127.0.0.5 and 127.0.0.6 on those
same ports, each with its own keypair (``sync_master_key`` must deliver the shared one),
``open_mode``/``auto_accept`` off. Each master has a control minion connected to master1 only and
accepted there with ``salt-key``; the formula's modules reach them with ``saltutil.sync_all`` from
master1's ``file_roots`` (the formula's parts, ``harness.served_formula``), as a user would.
master1's config holds the ``multimaster`` section the ``multimaster.master`` state would have
written to ``master.d``.

``test_policy``, ``test_roots`` and ``test_faults`` share one such set for the whole package
(``shared_key_cluster``, prefix ``ks``): it is made once, serves the roots those modules need
(``shared_root_paths``), and those modules run last, policy first (it expects stores without bulk
keys) and faults last (it leaves thousands of keys behind). ``test_join`` and ``test_mmap``
configure their masters differently and keep sets of their own.

Daemons that the code under test stopped and re-launched as ``-d`` daemons are no longer tracked
by the factories: teardown (the integration conftest's ``daemons``, a ``kit.DaemonSet``) kills
whatever still runs with each daemon's config dir.
"""

import dataclasses
import pathlib

import pytest

from .. import kit
from ..harness import KeyAcceptor, Ports, devkit, minion_overrides
from . import keytools

HOSTS = ("127.0.0.4", "127.0.0.5", "127.0.0.6")
START_TIMEOUT = 120
MASTER_EXTRA = {"loop_interval": 1, "gather_job_timeout": 5}
SHARED_PREFIX = "ks"
SHARED_PORTS = Ports(publish=31110, ret=31111)
# Debug logs: test_roots checks that its pillar marker reaches no log even at debug level.
SHARED_DAEMON_EXTRA = {"log_level": "debug", "log_level_logfile": "debug"}
# The shared set's modules, in the order they run (after the other key modules).
SHARED_MODULES = ("test_policy.py", "test_roots.py", "test_faults.py")


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
    # index -> (formula, tree, shared pillar, pillar) dirs of each master: the shared set's
    # roots (``shared_root_paths``), empty for a set with the default roots.
    roots: dict = dataclasses.field(default_factory=dict)

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


@pytest.fixture(scope="module")
def master_d_options(request):
    return dict(getattr(request.module, "MASTER_D_OPTIONS", {}))


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


def start_key_masters(
    daemons, pillar_dir, prefix, ports, daemon_extra, master_options, key_acceptor, master_d=None
):
    """
    master1..3 made and started (at once), each with its own keypair; master1 knows the set
    (``multimaster:``). Returns the factories and the ``multimaster`` section.
    """
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
        devkit.write_config(
            conf, {**devkit.multimaster_master_options(section), **(master_d or {})}
        )
    devkit.write_multimaster_pillar(pillar_dir, section)
    daemons.start(*factories, timeout=START_TIMEOUT)
    return factories, section


def start_key_cluster(key_masters, daemons, prefix, ports, daemon_extra, key_acceptor):
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


@pytest.fixture(scope="module")
def key_masters(
    daemons,
    tmp_path_factory,
    prefix,
    ports,
    daemon_extra,
    master_options,
    master_d_options,
    key_acceptor,
):
    """
    The test module's master1..3 (``start_key_masters``).
    """
    pillar_dir = tmp_path_factory.mktemp(f"{prefix}-pillar")
    return start_key_masters(
        daemons,
        pillar_dir,
        prefix,
        ports,
        daemon_extra,
        master_options,
        key_acceptor,
        master_d=master_d_options,
    )


@pytest.fixture(scope="module")
def key_cluster(key_masters, daemons, prefix, ports, daemon_extra, key_acceptor):
    """
    The test module's masters with their control minions (``start_key_cluster``).
    """
    return start_key_cluster(key_masters, daemons, prefix, ports, daemon_extra, key_acceptor)


def shared_root_paths(index, pillar_dir):
    """
    ``(formula, tree, shared pillar, pillar)`` dirs of the shared set's master ``index``:
    master1's shared pillar dir is the set's (the control minions' ``multimaster`` pillar lives
    there).
    """
    base = pillar_dir.parent / f"{SHARED_PREFIX}-roots" / f"master{index + 1}"
    shared = pillar_dir if index == 0 else base / "pillar-shared"
    return base / "formula", base / "tree", shared, base / "pillar"


def shared_master_options(roots):
    """
    ``MASTER_OPTIONS`` of the shared set: each master's file and pillar roots made (the formula
    copied into master1's), recorded in ``roots`` (index -> paths). The factories put their own
    state and pillar trees first in every master's roots.
    """

    def options(index, pillar_dir):
        formula, tree, shared, pillar = roots[index] = shared_root_paths(index, pillar_dir)
        for path in (formula, tree, shared, pillar):
            path.mkdir(parents=True, exist_ok=True)
        if index == 0:
            devkit.copy_formula(formula)
        return {
            "file_roots": {"base": [str(formula), str(tree)]},
            "pillar_roots": {"base": [str(shared), str(pillar)]},
        }

    return options


@pytest.fixture(scope="package")
def shared_daemons(salt_factories):
    """
    The shared set's ``kit.DaemonSet``, stopped when the package's last test is done.
    """
    with kit.DaemonSet(salt_factories) as daemon_set:
        yield daemon_set


@pytest.fixture(scope="package")
def shared_key_cluster(shared_daemons, tmp_path_factory):
    """
    One key cluster for ``SHARED_MODULES`` (see the module docstring), with the roots of
    ``shared_root_paths`` in ``roots``.
    """
    acceptor = PrimaryAcceptor(_master_id(SHARED_PREFIX, 0))
    roots = {}
    pillar_dir = tmp_path_factory.mktemp(f"{SHARED_PREFIX}-pillar")
    masters = start_key_masters(
        shared_daemons,
        pillar_dir,
        SHARED_PREFIX,
        SHARED_PORTS,
        SHARED_DAEMON_EXTRA,
        shared_master_options(roots),
        acceptor,
    )
    cluster = start_key_cluster(
        masters, shared_daemons, SHARED_PREFIX, SHARED_PORTS, SHARED_DAEMON_EXTRA, acceptor
    )
    cluster.roots = roots
    return cluster


def pytest_collection_modifyitems(items):
    """
    The modules of the shared set run after the other key modules, in ``SHARED_MODULES``
    order: the set is started once, when the first of them begins, and stops at package end.
    """
    here = [i for i, item in enumerate(items) if "integration/keys/" in item.nodeid]
    block = [items[i] for i in here]

    def rank(item):
        name = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
        return SHARED_MODULES.index(name) + 1 if name in SHARED_MODULES else 0

    ordered = sorted(block, key=rank)  # stable: each module keeps its own order
    for i, item in zip(here, ordered, strict=True):
        items[i] = item
