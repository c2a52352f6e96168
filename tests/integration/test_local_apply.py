"""
Image builds: ``salt-call --local state.apply multimaster.minion`` on a host where no
salt-minion runs succeeds and only writes the minion's config (no restart, no daemon).
"""

import pathlib

import pytest
import yaml

from .harness import (
    FILE_IGNORE_REGEX,
    MASTER_HOSTS,
    PillarTree,
    Ports,
    assert_states_ok,
    multimaster_pillar,
    served_formula,
    state_by_id,
    tree_snapshot,
)

pytestmark = pytest.mark.integration

MINION = "local-minion"
PORTS = Ports(publish=30150, ret=30151)  # only written to the config; nothing listens


@pytest.fixture(scope="module")
def local_minion(salt_factories, tmp_path_factory):
    """
    A minion config (never started) serving the formula (``served_formula``), with its pillar.
    """
    pillar = PillarTree(tmp_path_factory.mktemp("local-pillar"))
    masters = [{"id": f"master{i}", "host": host} for i, host in enumerate(MASTER_HOSTS, 1)]
    pillar.set(MINION, multimaster_pillar(masters, PORTS))
    return salt_factories.salt_minion_daemon(
        MINION,
        overrides={
            "file_client": "local",
            "file_roots": {"base": [str(served_formula())]},
            "pillar_roots": {"base": [str(pillar.root)]},
            "file_ignore_regex": FILE_IGNORE_REGEX,
        },
    )


def test_local_apply_only_writes_config(local_minion):
    """
    After ``saltutil.sync_all``, the state succeeds; the restart state finds no running minion
    and changes nothing; the only file added to the config dir is minion.d/multimaster.conf
    (the cache dir gets the synced modules, as with any masterless run).
    """
    conf_dir = pathlib.Path(local_minion.config_dir)
    before = tree_snapshot(conf_dir)
    assert not local_minion.is_running()

    cli = local_minion.salt_call_cli(timeout=120)
    # Masterless, custom modules are synced explicitly (an image build's first step).
    assert cli.run("--local", "saltutil.sync_all").returncode == 0
    ret = cli.run("--local", "state.apply", "multimaster.minion")
    states = assert_states_ok(ret)

    restart = state_by_id(states, "multimaster-minion-service-restarted")
    assert restart["changes"] == {}
    assert "no running daemon" in restart["comment"]
    after = tree_snapshot(conf_dir)
    assert set(after) - set(before) == {"minion.d/multimaster.conf"}
    assert {path: after[path] for path in before} == before
    config = yaml.safe_load((conf_dir / "minion.d" / "multimaster.conf").read_text())
    assert config["master"] == list(MASTER_HOSTS)
    assert not local_minion.is_running()
