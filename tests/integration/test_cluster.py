"""
Salt's native master cluster behind a real HAProxy, set up by the formula on real daemons: three
masters on 127.0.0.2-4 (isolated filesystem) whose cluster options ``multimaster.cluster``
rendered (``salt-call --local`` on each master's control minion, as on a bare master host), an
HAProxy on 127.0.0.5 that ``multimaster.haproxy`` configured and started, and minions that know
only the balancer.
"""

import contextlib
import pathlib
import time

import multimaster_keystore
import pytest

from . import harness
from .harness import START_TIMEOUT, Ports, devkit, kill_daemons_of

pytestmark = pytest.mark.integration

PREFIX = "cl"
PORTS = Ports(publish=30180, ret=30181)
POOL_PORT = 30182
HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
BALANCER = "127.0.0.5"
MINIONS = (f"{PREFIX}-minion1", f"{PREFIX}-minion2")
# Planted in pillar as the cluster secret: it must end up in the 0600 master.d files only.
SECRET = "cluster-secret-marker-" + "9f3c" * 8
CLUSTER_ID = "cl-test"
FORM_TIMEOUT = 120


def control_minion_id(index):
    return f"{PREFIX}-cm{index + 1}"


def local_cli(factory):
    return factory.salt_call_cli(timeout=180)


def apply_local(factory, sls):
    """``salt-call --local state.apply sls`` with the formula synced first, as on a bare host."""
    cli = local_cli(factory)
    synced = cli.run("--local", "saltutil.sync_all")
    assert synced.returncode == 0, synced
    ret = cli.run("--local", "state.apply", sls)
    return harness.assert_states_ok(ret)


def members(master):
    ret = master.salt_run_cli(timeout=60).run("cluster.members")
    return ret.data if ret.returncode == 0 and isinstance(ret.data, dict) else {}


def cluster_formed(masters, cluster_pki_dirs):
    """Every master sees three voters and a leader, and every peer holds the same AES key."""
    views = [members(m) for m in masters]
    if not all(v.get("voter_count") == len(masters) and v.get("leader_id") for v in views):
        return False
    aes = {
        (pathlib.Path(d) / ".aes").read_bytes() if (pathlib.Path(d) / ".aes").exists() else None
        for d in cluster_pki_dirs
    }
    return len(aes) == 1 and None not in aes


@pytest.fixture(scope="module")
def cluster_set(salt_factories, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"{PREFIX}-set")
    pillar_dir = root / "pillar"
    formula = harness.copy_formula(tmp_path_factory.mktemp(f"{PREFIX}-formula"))
    lb_dir = root / "lb"
    masters = [
        # Salt's cluster names a peer by its id and dials it by the same string.
        salt_factories.salt_master_daemon(
            host,
            overrides=harness.master_overrides(host, PORTS, pillar_dir, serve_repo=False),
            on_auth_event_callback=lambda *_: None,
        )
        for i, host in enumerate(HOSTS)
    ]
    entries = [
        devkit.master_entry(m.id, HOSTS[i], m.config_dir, minion_id=control_minion_id(i))
        for i, m in enumerate(masters)
    ]
    section = devkit.multimaster_section(
        entries,
        PORTS,
        mode="cluster",
        install_packages=False,
        manage_services=True,
        master={
            "file_roots": {"base": [str(formula)]},
            "pillar_roots": {"base": [str(pillar_dir)]},
            "config": {"file_ignore_regex": harness.FILE_IGNORE_REGEX},
        },
        cluster={
            "balancer": BALANCER,
            "id": CLUSTER_ID,
            "pool_port": POOL_PORT,
            "isolated_filesystem": True,
            "haproxy": {
                "config_file": str(lb_dir / "haproxy.cfg"),
                "pidfile": str(lb_dir / "haproxy.pid"),
                "check_interval": 1,
            },
        },
    )
    # The secret is targeted at the control minions of the masters only.
    devkit.write_config(
        pillar_dir / "top.sls",
        {"base": {"*": ["multimaster"], f"{PREFIX}-cm*": ["cluster_secret"]}},
    )
    devkit.write_config(pillar_dir / "multimaster.sls", {"multimaster": section})
    devkit.write_config(
        pillar_dir / "cluster_secret.sls", {"multimaster": {"cluster": {"secret": SECRET}}}
    )
    local = {
        "file_client": "local",
        "file_roots": {"base": [str(formula)]},
        "pillar_roots": {"base": [str(pillar_dir)]},
    }
    with contextlib.ExitStack() as stack:
        started = time.monotonic()
        for index, master in enumerate(masters):
            cm = master.salt_minion_daemon(control_minion_id(index), overrides=local)
            apply_local(cm, "multimaster.cluster")
        lb = masters[0].salt_minion_daemon(f"{PREFIX}-lb", overrides=local)
        apply_local(lb, "multimaster.haproxy")
        stack.callback(
            devkit.stop_pids,
            [harness.read_pid(lb_dir / "haproxy.pid")]
            if harness.read_pid(lb_dir / "haproxy.pid")
            else [],
        )
        applied = time.monotonic() - started
        for factory in masters:
            stack.callback(kill_daemons_of, factory.config_dir)
            stack.callback(factory.terminate)
        for factory in masters:
            factory.start(start_timeout=START_TIMEOUT)
        mopts = [multimaster_keystore.master_opts(m.config_dir) for m in masters]
        pki_dirs = [o["cluster_pki_dir"] for o in mopts]
        harness.wait_for(
            lambda: cluster_formed(masters, pki_dirs), FORM_TIMEOUT, 2, "the cluster to form"
        )
        formed = time.monotonic() - started - applied
        minions = []
        for minion_id in MINIONS:
            factory = masters[0].salt_minion_daemon(
                minion_id, overrides=harness.minion_overrides(BALANCER, PORTS)
            )
            key = devkit.new_rsa_key()
            pki = pathlib.Path(factory.config["pki_dir"])
            pki.mkdir(parents=True, exist_ok=True)
            (pki / "minion.pem").write_text(devkit.private_pem(key))
            (pki / "minion.pem").chmod(0o400)
            (pki / "minion.pub").write_text(devkit.public_pem(key))
            # Key consistency is the tool's job in a cluster: accepted on every peer.
            for opts in mopts:
                multimaster_keystore.write(opts, [(minion_id, "accepted", devkit.public_pem(key))])
            stack.callback(kill_daemons_of, factory.config_dir)
            stack.callback(factory.terminate)
            factory.start(start_timeout=START_TIMEOUT)
            minions.append(factory)
        print(f"\ncluster: formula applied in {applied:.1f} s, formed in {formed:.1f} s")
        yield {
            "masters": masters,
            "minions": minions,
            "mopts": mopts,
            "root": root,
            "lb_dir": lb_dir,
        }


def answers(master, timeout=10):
    """The minions that answer ``test.ping`` published by ``master``."""
    try:
        ret = master.salt_cli(timeout=timeout + 30).run(
            f"--timeout={timeout}", "test.ping", minion_tgt=f"{PREFIX}-minion*"
        )
    except harness.FactoryTimeout:
        return []
    return sorted(k for k, v in (ret.data or {}).items() if v is True)


def test_jobs_from_each_master_reach_every_minion(cluster_set):
    for master in cluster_set["masters"]:
        harness.wait_for(
            lambda m=master: answers(m) == sorted(MINIONS),
            180,
            2,
            f"every minion to answer {master.id}",
        )
