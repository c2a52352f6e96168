"""
Hot multi-master delivered by the formula: a minion that knows only master1 gets
``multimaster.minion`` from master1 and then answers both masters.
"""

import pathlib

import pytest
import yaml

from .harness import (
    MASTER_HOSTS,
    Ports,
    assert_states_ok,
    changed_states,
    master_entry,
    multimaster_pillar,
    read_pid,
    state_by_id,
    state_returns,
    tree_snapshot,
    wait_for,
    wait_for_ping,
)

pytestmark = pytest.mark.integration

PREFIX = "hot"
PORTS = Ports(publish=30110, ret=30111)
MINION = "hot-minion"
RESTART_STATE = "multimaster-minion-service-restarted"
CONFIG_STATE = "multimaster-minion-config-file-managed"


@pytest.fixture(scope="module")
def hot_pillar(master1, master2, ports):
    return multimaster_pillar(
        [master_entry(master1, MASTER_HOSTS[0]), master_entry(master2, MASTER_HOSTS[1])], ports
    )


@pytest.fixture(scope="module")
def minion(master1, master2, start_minion, pillar_tree, hot_pillar):
    """
    A minion of master1 only, with the formula's modules synced as a user would.
    """
    pillar_tree.set(MINION, hot_pillar)
    factory = start_minion(master1, MINION, share_with=[master2])
    ret = master1.salt_cli(timeout=120).run("saltutil.sync_all", minion_tgt=MINION)
    assert ret.returncode == 0, ret
    assert "modules.multimaster" in ret.data["modules"]
    return factory


@pytest.fixture(scope="module")
def minion_conf(minion):
    return pathlib.Path(minion.config_dir) / "minion.d" / "multimaster.conf"


@pytest.fixture(scope="module")
def hot_applied(master1, minion):
    """
    The first ``state.apply multimaster.minion`` from master1, and the minion's pid before it.
    """
    pid = read_pid(minion.config["pidfile"])
    assert pid, "the minion should be running"
    ret = master1.salt_cli(timeout=120).run("state.apply", "multimaster.minion", minion_tgt=MINION)
    return ret, pid


def test_hot_minion_answers_every_master(master1, master2, minion, minion_conf, hot_applied):
    """
    The highstate that makes the minion hot returns its result although it restarts the minion;
    the minion comes back with both masters in its config and answers test.ping from each.
    """
    ret, old_pid = hot_applied
    states = assert_states_ok(ret)
    assert state_by_id(states, CONFIG_STATE)["changes"]
    assert state_by_id(states, RESTART_STATE)["changes"], "a changed config must restart the minion"

    config = yaml.safe_load(minion_conf.read_text())
    assert config["master"] == list(MASTER_HOSTS)
    assert config["master_type"] == "str"
    assert (config["publish_port"], config["master_port"]) == (PORTS.publish, PORTS.ret)

    pidfile = minion.config["pidfile"]
    wait_for(lambda: read_pid(pidfile) not in (None, old_pid), 60, what="the minion to restart")
    wait_for_ping(master1.salt_cli(), MINION, timeout=60)
    wait_for_ping(master2.salt_cli(), MINION, timeout=60)


def test_second_apply_changes_nothing(master1, minion, hot_applied):
    """
    Applying ``multimaster.minion`` again reports no changes and does not restart the minion.
    """
    assert_states_ok(hot_applied[0])
    wait_for_ping(master1.salt_cli(), MINION, timeout=60)
    pid = read_pid(minion.config["pidfile"])
    ret = master1.salt_cli(timeout=120).run("state.apply", "multimaster.minion", minion_tgt=MINION)
    states = assert_states_ok(ret)
    assert changed_states(states) == {}
    assert read_pid(minion.config["pidfile"]) == pid


def test_test_mode_reports_and_changes_nothing(
    master1, minion, minion_conf, hot_applied, pillar_tree, hot_pillar
):
    """
    With a pillar change pending, ``test=True`` reports the config diff and the restart it
    would do, while the file on disk and the running minion stay as they were.
    """
    assert_states_ok(hot_applied[0])
    wait_for_ping(master1.salt_cli(), MINION, timeout=60)
    pid = read_pid(minion.config["pidfile"])
    before = tree_snapshot(minion_conf.parent)
    changed = {"multimaster": dict(hot_pillar["multimaster"], minion={"retry_dns": 7})}
    with pillar_tree.changed(MINION, changed):
        ret = master1.salt_cli(timeout=120).run(
            "state.apply", "multimaster.minion", "test=True", minion_tgt=MINION
        )
    states = state_returns(ret)
    config_state = state_by_id(states, CONFIG_STATE)
    assert config_state["result"] is None
    assert "retry_dns" in str(config_state["changes"])
    restart_state = state_by_id(states, RESTART_STATE)
    assert restart_state["result"] is None
    assert "would be restarted" in restart_state["comment"]
    assert tree_snapshot(minion_conf.parent) == before
    assert read_pid(minion.config["pidfile"]) == pid
