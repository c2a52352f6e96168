"""
Mode cluster applied for real on a masterless control minion (``salt-call --local`` style): the
cluster options land in their own 0600 ``master.d`` file that Salt's own config loader reads, the
secret appears in no state return, a short secret writes nothing, and ``multimaster.haproxy``
installs a configuration HAProxy accepts and refuses one it does not, leaving the live file as it
was.
"""

import stat

import pytest
import salt.config

from .test_apply import changed, failed, read_yaml, results, state_sls
from .test_render import CLUSTER_MASTERS, pillar

SECRET = "cluster-secret-marker-" + "4" * 20
SETTINGS = {"install_packages": False, "manage_services": True}


def cluster_pillar(**cluster):
    section = {"balancer": "127.0.0.10", "id": "c1", "secret": SECRET, **cluster}
    return pillar(mode="cluster", cluster=section, masters=CLUSTER_MASTERS, **SETTINGS)


@pytest.mark.parametrize("isolated", [True, False])
def test_cluster_options_in_a_0600_file_salt_loads(salt_env, isolated):
    env = salt_env("master2", cluster_pillar(isolated_filesystem=isolated))
    ret = state_sls(env, "multimaster.cluster")
    assert not failed(ret), ret
    assert "multimaster-cluster-config-file-managed" in changed(ret)
    assert SECRET not in repr(ret.raw)
    path = env.conf_dir / "master.d" / "multimaster-cluster.conf"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_yaml(path)["cluster_secret"] == SECRET
    # Not in the compiled states Salt caches (highstate.cache.p) nor anywhere else but the
    # pillar source.
    holders = {
        str(p.relative_to(env.base))
        for p in env.base.rglob("*")
        if p.is_file() and SECRET.encode() in p.read_bytes()
    }
    assert holders == {"conf/master.d/multimaster-cluster.conf", "pillar/multimaster.sls"}
    # Salt's own loader: the types it validates, the values the master will run with.
    opts = salt.config.master_config(str(env.conf_dir / "master"))
    assert opts["cluster_id"] == "c1"
    assert opts["cluster_peers"] == ["127.0.0.2"]
    assert opts["interface"] == "127.0.0.3"
    assert opts["cluster_isolated_filesystem"] is isolated
    assert opts["cluster_pki_dir"] == str(env.master_pki.parent / "cluster")
    assert opts["keys.cache_driver"] == "localfs_key"
    assert changed(state_sls(env, "multimaster.cluster")) == []
    clean = state_sls(env, "multimaster.master.clean")
    assert "multimaster-master-clean-cluster-config-file-absent" in changed(clean)
    assert not path.exists()


def test_a_short_secret_writes_nothing_and_is_not_shown(salt_env):
    env = salt_env("master2", cluster_pillar(secret="short-secret-marker"))
    ret = state_sls(env, "multimaster.cluster")
    assert ret.failed
    assert any("multimaster:cluster:secret: got **********" in e for e in ret.errors), ret.errors
    assert "short-secret-marker" not in repr(ret.errors)
    assert env.written() == []


def test_haproxy_config_installed_and_a_bad_one_refused(salt_env, tmp_path):
    config = tmp_path / "haproxy.cfg"
    section = {"haproxy": {"config_file": str(config)}}
    env = salt_env("lb1", cluster_pillar(**section, secret=""))
    unmanaged = {"manage_services": False}
    env_ok = env
    ret = state_sls(env_ok, "multimaster.haproxy", pillar={"multimaster": unmanaged})
    assert not failed(ret), ret
    good = config.read_text()
    assert "bind 127.0.0.10:4505" in good and "server 127.0.0.3 127.0.0.3:4506" in good
    # A balancer address that does not resolve: haproxy -c refuses, the live file stays.
    bad = {"manage_services": False, "cluster": {"balancer": "no-such-host.invalid"}}
    ret = state_sls(env_ok, "multimaster.haproxy", pillar={"multimaster": bad})
    problems = failed(ret)
    assert "haproxy -c refused" in problems["multimaster-haproxy-config-managed"]
    assert config.read_text() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["haproxy.cfg"]
    assert results(ret)["multimaster-haproxy-config-managed"]["changes"] == {}
