"""
``multimaster.master`` renders a second master's config from pillar: started from it, the master
binds the interface and ports the pillar names and serves minions there.
"""

import pathlib

import psutil
import pytest
import yaml

from .harness import (
    MASTER_HOSTS,
    START_TIMEOUT,
    Ports,
    assert_states_ok,
    changed_states,
    copy_master_keypair,
    master_entry,
    multimaster_pillar,
    served_formula,
    state_by_id,
    state_returns,
    tree_snapshot,
    wait_for_ping,
)

pytestmark = pytest.mark.integration

PREFIX = "cfg"
PORTS = Ports(publish=30130, ret=30131)
CONFIG_STATE = "multimaster-master-config-file-managed"


@pytest.fixture(scope="module")
def master2_factory(salt_factories, key_acceptor, master1):
    """
    master2 as a fresh host has it: the factory's defaults (127.0.0.1, random ports), plus the
    primary's keypair. Everything multimaster needs must come from the formula's master.d file.
    """
    factory = salt_factories.salt_master_daemon(
        f"{PREFIX}-master2",
        overrides={"open_mode": False, "auto_accept": False, "worker_threads": 3},
        on_auth_event_callback=key_acceptor,
    )
    assert factory.config["interface"] != MASTER_HOSTS[1]
    assert "master.d/*.conf" in factory.config["default_include"]
    copy_master_keypair(master1, factory)
    return factory


@pytest.fixture(scope="module")
def master_pillar(master1, master2_factory, ports, pillar_tree):
    return multimaster_pillar(
        [master_entry(master1, MASTER_HOSTS[0]), master_entry(master2_factory, MASTER_HOSTS[1])],
        ports,
        manage_services=False,
        master={
            "file_roots": {"base": [str(served_formula())]},
            "pillar_roots": {"base": [str(pillar_tree.root)]},
        },
    )


@pytest.fixture(scope="module")
def control_minion(master1, master2_factory, start_minion, pillar_tree, master_pillar):
    """
    master2's control minion (its id is master2's ``minion_id``), connected to master1.
    """
    pillar_tree.set(master2_factory.id, master_pillar)
    minion = start_minion(master1, master2_factory.id)
    ret = master1.salt_cli(timeout=120).run("saltutil.sync_all", minion_tgt=minion.id)
    assert ret.returncode == 0, ret
    return minion


@pytest.fixture(scope="module")
def master_conf(master2_factory):
    return pathlib.Path(master2_factory.config_dir) / "master.d" / "multimaster.conf"


@pytest.fixture(scope="module")
def master_applied(master1, control_minion):
    """
    The first ``state.apply multimaster.master`` on master2's control minion.
    """
    return master1.salt_cli(timeout=120).run(
        "state.apply", "multimaster.master", minion_tgt=control_minion.id
    )


@pytest.fixture(scope="module")
def master2(daemons, master2_factory, master_applied):
    assert_states_ok(master_applied)
    daemons.start(master2_factory, timeout=START_TIMEOUT)
    return master2_factory


def listening(pid):
    """
    The TCP (address, port) pairs that process ``pid`` and its children listen on.
    """
    parent = psutil.Process(pid)
    found = set()
    for proc in [parent, *parent.children(recursive=True)]:
        try:
            connections = proc.net_connections(kind="tcp")
        except psutil.Error:
            continue
        found.update(
            (c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN
        )
    return found


def test_master_renders_config_from_pillar(master_applied, master_conf):
    """
    The state writes master.d/multimaster.conf in the pillar's config_dir with the pillar's
    interface and ports, and master.d/multimaster-set.conf with the ``multimaster`` section
    the runners read.
    """
    states = assert_states_ok(master_applied)
    assert any(st["changes"] for st in states.values())
    config = yaml.safe_load(master_conf.read_text())
    assert config["interface"] == MASTER_HOSTS[1]
    assert (config["publish_port"], config["ret_port"]) == (PORTS.publish, PORTS.ret)
    assert "multimaster" not in config
    section = yaml.safe_load((master_conf.parent / "multimaster-set.conf").read_text())
    assert [m["id"] for m in section["multimaster"]["masters"]] == [
        f"{PREFIX}-master1",
        f"{PREFIX}-master2",
    ]


def test_started_master_listens_where_pillar_said(master2, start_minion):
    """
    Started from that config, master2 binds 127.0.0.3 on the pillar's publish and ret ports,
    and a minion pointed there is served by it.
    """
    expected = {(MASTER_HOSTS[1], PORTS.publish), (MASTER_HOSTS[1], PORTS.ret)}
    assert expected <= listening(master2.pid)
    minion = start_minion(master2, f"{PREFIX}-minion", master=MASTER_HOSTS[1])
    wait_for_ping(master2.salt_cli(), minion.id, timeout=60)


def test_second_apply_changes_nothing(master1, master2, control_minion):
    """
    Once applied (and the master started on it, so key files exist and are checked), a second
    ``multimaster.master`` reports no changes.
    """
    ret = master1.salt_cli(timeout=120).run(
        "state.apply", "multimaster.master", minion_tgt=control_minion.id
    )
    assert changed_states(assert_states_ok(ret)) == {}


def test_test_mode_reports_and_changes_nothing(
    master1, master2, control_minion, master_conf, pillar_tree, master_pillar
):
    """
    With a pillar change pending, ``test=True`` reports that master.d would change and leaves it
    untouched. master.d can hold secrets (``master:config``): the return shows no diff, and a
    secret planted there appears nowhere in it.
    """
    before = tree_snapshot(master_conf.parent)
    section = master_pillar["multimaster"]
    marker = "secret-marker-5f1c2e"
    master = dict(section["master"], interface="0.0.0.0")
    master["config"] = dict(master.get("config", {}), ext_pillar_token=marker)
    changed = {"multimaster": dict(section, master=master)}
    # The per-master interface wins over master:interface; change the global one for master2.
    changed["multimaster"]["masters"] = [dict(m) for m in section["masters"]]
    changed["multimaster"]["masters"][1].pop("interface")
    with pillar_tree.changed(control_minion.id, changed):
        ret = master1.salt_cli(timeout=120).run(
            "state.apply", "multimaster.master", "test=True", minion_tgt=control_minion.id
        )
    states = state_returns(ret)
    config_state = state_by_id(states, CONFIG_STATE)
    assert config_state["result"] is None
    assert config_state["changes"] == {"diff": "<secret: not shown>"}
    assert marker not in ret.stdout + ret.stderr
    assert tree_snapshot(master_conf.parent) == before
