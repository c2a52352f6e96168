"""
Mode cluster: the cluster options each master gets (``cluster_config``), the secret's care, and the
HAProxy configuration (checked by the real ``haproxy -c``), installed only when HAProxy accepts it;
a stale or foreign pidfile never gets a process signalled.
"""

import os
import subprocess
import sys
import time

import multimaster_cluster as mc
import multimaster_haproxy as mh
import multimaster_keys
import multimaster_pillarcheck
import multimaster_settings as ms
import pytest
import salt.config
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from salt.exceptions import CommandExecutionError

SECRET = "cluster-secret-marker-" + "7" * 20
HOSTS = ["10.0.3.61", "10.0.3.62", "10.0.3.63"]


def cluster(defaults, **extra):
    masters = [{"id": host, "host": host} for host in HOSTS]
    section = {"id": "salt-cluster", "balancer": "10.0.3.10", "secret": SECRET}
    section.update(extra.pop("cluster", {}))
    return ms.build({"mode": "cluster", "masters": masters, "cluster": section, **extra}, defaults)


def test_each_master_peers_with_the_others_on_its_own_address(defaults):
    settings = cluster(defaults)
    config = ms.cluster_config(settings, settings["masters"][1], "/etc/salt/pki/master")
    assert config == {
        "cluster_id": "salt-cluster",
        "cluster_peers": [HOSTS[0], HOSTS[2]],
        "cluster_pki_dir": "/etc/salt/pki/cluster",
        "cluster_pool_port": 4520,
        "cluster_isolated_filesystem": True,
        "publish_session": 86400,
        # A removed master leaves the Raft vote only this way (docs/cluster.md).
        "cluster_auto_replace_voters": True,
        "cluster_secret": SECRET,
        # Not mmap_key as Salt recommends: 3008.3's join needs pki_dir/master.pub as a file.
        "keys.cache_driver": "localfs_key",
    }
    master = ms.master_config(settings, settings["masters"][1])
    assert master["interface"] == HOSTS[1]
    # Salt's id would be the hostname: the peers would not find this master's entry.
    assert master["id"] == HOSTS[1]
    assert "cluster_secret" not in master
    assert "secret" not in ms.set_config(settings)["multimaster"]["cluster"]


def test_auto_replace_voters_false_is_rendered_false(defaults):
    settings = cluster(defaults, cluster={"auto_replace_voters": False})
    config = ms.cluster_config(settings, settings["masters"][0], "/etc/salt/pki/master")
    assert config["cluster_auto_replace_voters"] is False


def test_shared_filesystem_keeps_salts_key_driver_and_a_joiner_pins_the_cluster_key(defaults):
    pinned = "AB" * 32
    settings = cluster(defaults, cluster={"isolated_filesystem": False, "pki_dir": "/gluster/pki"})
    settings["masters"][2].update(cluster_peers=[HOSTS[0]], cluster_pub_fingerprint=pinned)
    config = ms.cluster_config(settings, settings["masters"][2], "/etc/salt/pki/master")
    assert config["cluster_peers"] == [HOSTS[0]]
    assert config["cluster_pki_dir"] == "/gluster/pki"
    assert config["cluster_pub_fingerprint"] == pinned.lower()
    assert "keys.cache_driver" not in config


@pytest.mark.parametrize("secret", ["", "short"])
def test_a_master_without_a_proper_secret_is_refused(defaults, secret):
    settings = cluster(defaults)
    settings["cluster"]["secret"] = secret
    with pytest.raises(multimaster_pillarcheck.SettingsError) as err:
        ms.cluster_config(settings, settings["masters"][0], "/etc/salt/pki/master")
    assert str(err.value).startswith("multimaster:cluster:secret: got **********")
    assert "at least 32 characters" in str(err.value)


def test_minions_build_without_the_secret(defaults):
    # The secret is targeted at the masters only: every other minion's pillar lacks it.
    settings = cluster(defaults, cluster={"secret": ""})
    assert ms.minion_config(settings)["master"] == ["10.0.3.10"]


def test_a_control_minion_talks_to_its_own_master_not_the_balancer(defaults):
    settings = cluster(defaults)
    assert ms.minion_config(settings, settings["masters"][2])["master"] == [HOSTS[2]]


def test_an_isolated_cluster_reacts_to_a_new_cluster_aes_key_and_a_shared_one_does_not(defaults):
    aes = {"rotate_cluster_aes_key": ["salt://multimaster/reactor/cluster_aes.sls"]}
    isolated = cluster(defaults)
    assert aes in ms.master_config(isolated, isolated["masters"][0])["reactor"]
    shared = cluster(defaults, cluster={"isolated_filesystem": False, "pki_dir": "/gluster/pki"})
    assert "reactor" not in ms.master_config(shared, shared["masters"][0])
    hot = ms.build({"mode": "hot", "masters": [{"id": "m1", "host": "m1"}]}, defaults)
    assert ms.reactor_config(hot) == []


def test_the_secret_is_masked_in_returns(defaults):
    settings = cluster(defaults)
    settings["config"] = {"cluster": ms.cluster_config(settings, settings["masters"][0], "/p/m")}
    shown = repr(ms.redacted_settings(settings))
    assert SECRET not in shown


def test_haproxy_config_has_every_master_and_haproxy_accepts_it(defaults, tmp_path):
    settings = cluster(defaults)
    text = mh.config_text(settings)
    for port in (4505, 4506):
        assert f"bind 10.0.3.10:{port}" in text
        for host in HOSTS:
            assert f"server {host} {host}:{port} check inter 2s" in text
    # Publish connections live as long as the masters' publish_session.
    assert "timeout client 86400s" in text and "timeout server 86400s" in text
    assert SECRET not in text
    path = tmp_path / "haproxy.cfg"
    path.write_text(text)
    valid, output = mh.check(str(path))
    assert valid, output


def backend(text, name):
    """The lines of HAProxy backend ``name`` in ``text``."""
    block = text.split(f"\nbackend {name}\n", 1)[1].split("\n\n", 1)[0]
    return [line.strip() for line in block.splitlines()]


@pytest.mark.parametrize(
    "isolated, req_balance",
    [(True, ["balance source", "hash-type consistent"]), (False, ["balance roundrobin"])],
)
def test_requests_of_one_minion_stay_on_one_master_when_sessions_are_not_shared(
    defaults, tmp_path, isolated, req_balance
):
    # Isolated filesystems: a minion's session key is only on the master it signed in to, so
    # every request connection of that minion must reach the same master.
    text = mh.config_text(cluster(defaults, cluster={"isolated_filesystem": isolated}))
    assert backend(text, "salt-master-req")[: len(req_balance)] == req_balance
    assert backend(text, "salt-master-pub")[0] == "balance roundrobin"
    # A reload cuts the old process's connections: no minion keeps the old hashing.
    assert f"    hard-stop-after {mh.HARD_STOP_AFTER}s\n" in text
    path = tmp_path / "haproxy.cfg"
    path.write_text(text)
    valid, output = mh.check(str(path))
    assert valid, output


def test_a_config_haproxy_refuses_never_replaces_the_live_one(defaults, tmp_path):
    path = tmp_path / "haproxy.cfg"
    good = mh.config_text(cluster(defaults))
    assert mh.install(str(path), good) is True
    assert mh.install(str(path), good) is False
    # A pillar naming a balancer address that does not resolve: haproxy -c says so.
    bad = mh.config_text(cluster(defaults, cluster={"balancer": "no-such-host.invalid"}))
    with pytest.raises(CommandExecutionError, match="haproxy -c refused") as err:
        mh.install(str(path), bad)
    assert "no-such-host.invalid" in str(err.value)
    assert path.read_text() == good
    assert sorted(os.listdir(tmp_path)) == ["haproxy.cfg"]


def test_a_stale_or_foreign_pidfile_names_no_haproxy(tmp_path):
    config = tmp_path / "haproxy.cfg"
    config.write_text("")
    pidfile = tmp_path / "haproxy.pid"
    # A live process that is not HAProxy (this test), and one that does not exist.
    pidfile.write_text(f"{os.getpid()}\n999999999\n")
    assert mh.running_pids(str(pidfile), str(config)) == []
    # A process named haproxy-ish but started after the pidfile was written (a reused pid).
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.1)
        pidfile.write_text(f"{sleeper.pid}\n")
        assert mh.running_pids(str(pidfile), str(config)) == []
    finally:
        sleeper.kill()
        sleeper.wait()


def test_stop_with_a_foreign_pidfile_signals_nothing(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pidfile = tmp_path / "haproxy.pid"
        pidfile.write_text(f"{sleeper.pid}\n")
        assert mh.stop(str(tmp_path / "haproxy.cfg"), str(pidfile)) is False
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_stop_of_a_haproxy_the_kernel_is_reaping_reports_it_stopped(monkeypatch):
    """
    psutil 7.2's wait fails with ENOENT or EINVAL from pidfd_open on a process being reaped:
    stop reports the haproxy stopped, with no exception text.
    """
    signalled = []

    class Exiting:
        def __init__(self, pid):
            self.pid = pid

        def terminate(self):
            signalled.append(self.pid)

    def failing_wait(procs, timeout):
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(mh, "running_pids", lambda pidfile, config: [4242])
    monkeypatch.setattr(mh.psutil, "Process", Exiting)
    monkeypatch.setattr(mh.psutil, "wait_procs", failing_wait)
    assert mh.stop("/etc/haproxy/haproxy.cfg", "/run/haproxy.pid") is True
    assert signalled == [4242]


def test_haproxy_starts_and_reloads_gracefully_from_its_pidfile(defaults, tmp_path):
    settings = cluster(
        defaults,
        cluster={"balancer": "127.0.0.9"},
        ports={"publish": 31505, "ret": 31506},
    )
    config, pidfile = tmp_path / "haproxy.cfg", tmp_path / "haproxy.pid"
    mh.install(str(config), mh.config_text(settings))
    try:
        assert mh.start_or_reload(str(config), str(pidfile)) == "started"
        first = mh.running_pids(str(pidfile), str(config))
        assert first
        assert mh.start_or_reload(str(config), str(pidfile)) == "reloaded"
        second = mh.running_pids(str(pidfile), str(config))
        assert second and not set(first) & set(second)
    finally:
        mh.stop(str(config), str(pidfile))
    assert mh.running_pids(str(pidfile), str(config)) == []


def test_cluster_options_keep_their_types_through_salts_master_config(defaults):
    settings = cluster(defaults)
    config = ms.cluster_config(settings, settings["masters"][0], "/etc/salt/pki/master")
    # As the master reads the file: YAML, then Salt's own option handling and type checks.
    opts = salt.config.apply_master_config(overrides=yaml.safe_load(yaml.safe_dump(config)))
    for key, value in config.items():
        assert opts[key] == value, key
    assert opts["cluster_peers"] == HOSTS[1:]


def test_status_fails_on_a_missing_member_a_closed_port_or_no_leader(monkeypatch):
    section = {
        "mode": "cluster",
        "ports": {"publish": 4505, "ret": 4506},
        "masters": [{"id": host, "host": host} for host in HOSTS],
        "cluster": {"balancer": "10.0.3.10"},
    }
    closed = {(HOSTS[2], 4506)}
    monkeypatch.setattr(mc.multimaster_daemon, "port_open", lambda a, p: (a, p) not in closed)
    members = {"voters": HOSTS[:2] + ["10.0.3.99"], "learners": [], "leader_id": HOSTS[0]}
    ret, failed = mc.status_report(section, members)
    assert failed and ret["cluster"]["missing"] == [HOSTS[2]]
    assert ret["cluster"]["not_configured"] == ["10.0.3.99"]
    assert ret["backends_down"] == [HOSTS[2]] and all(ret["balancer"].values())
    closed.clear()
    members["voters"] = HOSTS
    assert mc.status_report(section, members)[1] is False
    assert mc.status_report(section, dict(members, leader_id=None))[1] is True
    ret, failed = mc.status_report(section, "no such runner")
    assert failed and ret["cluster"]["error"] == "cluster.members returned 'no such runner'"


def test_aes_agreement_fails_on_another_key_no_key_or_a_master_not_asked():
    one, other = {"stamp": 5.0, "digest": "a" * 64}, {"stamp": 6.0, "digest": "b" * 64}
    report, failed = mc.aes_agreement(dict.fromkeys(HOSTS, one), {})
    assert not failed and report["alike"] is True
    # A digest prefix only: enough to compare by eye, nothing of the key.
    assert report["masters"][HOSTS[0]] == {"stamp": 5.0, "digest": "a" * 12}
    report, failed = mc.aes_agreement({HOSTS[0]: one, HOSTS[1]: other, HOSTS[2]: one}, {})
    assert failed and report["masters"][HOSTS[1]]["digest"] == "b" * 12
    report, failed = mc.aes_agreement({HOSTS[0]: one, HOSTS[1]: None}, {})
    assert failed and report["masters"][HOSTS[1]] == {"error": "no key yet"}
    why = "control minion salt3 did not answer"
    report, failed = mc.aes_agreement({HOSTS[0]: one, HOSTS[1]: one}, {HOSTS[2]: why})
    assert failed and report["masters"][HOSTS[2]] == {"error": why}


def write_pair(directory, private, public=None):
    """
    ``cluster.pem`` holding ``private`` and ``cluster.pub`` holding ``public`` (default: its
    own public half) in ``directory``, as Salt writes them.
    """
    public = public or private
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cluster.pem").write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    (directory / "cluster.pub").write_bytes(
        public.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def test_held_cluster_key_gives_the_pub_fingerprint_and_whether_the_pem_is_its_half(tmp_path):
    one, other = (rsa.generate_private_key(public_exponent=65537, key_size=2048) for _ in "12")
    write_pair(tmp_path / "a", one)
    held = mc.held_cluster_key({"cluster_pki_dir": str(tmp_path / "a")})
    pub = (tmp_path / "a" / "cluster.pub").read_text()
    assert held == {"fingerprint": multimaster_keys.fingerprint(pub), "pair": True}
    # A pem and a pub of two pairs (the join race can interleave the two writes).
    write_pair(tmp_path / "b", one, public=other)
    assert mc.held_cluster_key({"cluster_pki_dir": str(tmp_path / "b")})["pair"] is False
    missing = mc.held_cluster_key({"cluster_pki_dir": str(tmp_path / "none")})
    assert missing == {"fingerprint": None, "pair": False}
    (tmp_path / "a" / "cluster.pem").write_text("not a key")
    assert mc.held_cluster_key({"cluster_pki_dir": str(tmp_path / "a")})["pair"] is False


def test_cluster_key_agreement_names_the_master_holding_another_pair_and_the_repair():
    one = {"fingerprint": "aa:" * 31 + "aa", "pair": True}
    other = {"fingerprint": "bb:" * 31 + "bb", "pair": True}
    report, failed = mc.cluster_key_agreement(dict.fromkeys(HOSTS, one), {})
    assert not failed and report["alike"] is True and "comment" not in report
    assert report["masters"][HOSTS[2]] == {"fingerprint": one["fingerprint"], "alike": True}
    # The lone joiner is the one off, whichever master runs status.
    report, failed = mc.cluster_key_agreement({HOSTS[0]: other, HOSTS[1]: one, HOSTS[2]: one}, {})
    assert failed and report["masters"][HOSTS[0]]["alike"] is False
    assert report["comment"].startswith(f"{HOSTS[0]}: stop each master named")
    assert "cluster.pem and cluster.pub" in report["comment"]
    report, failed = mc.cluster_key_agreement(
        {HOSTS[0]: one, HOSTS[1]: dict(one, pair=False), HOSTS[2]: None}, {}
    )
    assert failed and report["comment"].startswith(f"{HOSTS[1]}, {HOSTS[2]}: ")
    assert "not the private half" in report["masters"][HOSTS[1]]["error"]
    assert "saltutil.sync_all" in report["masters"][HOSTS[2]]["error"]
    why = "control minion salt3 did not answer"
    report, failed = mc.cluster_key_agreement({HOSTS[0]: one, HOSTS[1]: one}, {HOSTS[2]: why})
    assert failed and report["masters"][HOSTS[2]] == {"error": why}


def test_an_aes_info_answer_with_a_malformed_cluster_key_is_refused():
    held = {"stamp": 5.0, "digest": "a" * 64}
    assert mc.aes_info_check({"held": held})["held"] == held
    good = {"fingerprint": "aa:bb", "pair": True}
    assert mc.aes_info_check({"held": held, "cluster_key": good})["cluster_key"] == good
    for bad in ("aa:bb", {"fingerprint": 7, "pair": True}, {"fingerprint": "aa", "pair": "yes"}):
        with pytest.raises(ValueError, match="cluster_key"):
            mc.aes_info_check({"held": held, "cluster_key": bad})


CLUSTER_SET = [
    {"id": "10.0.3.21", "host": "10.0.3.21", "minion_id": "salt1"},
    {"id": "10.0.3.22", "host": "10.0.3.22", "minion_id": "salt2"},
    {"id": "10.0.3.23", "host": "10.0.3.23", "interface": "10.0.3.23", "minion_id": "salt3"},
    {"id": "10.0.3.24", "host": "10.0.3.24", "minion_id": "salt4"},
]


def test_restart_order_is_one_master_a_step_this_one_last_and_leaves_out_the_new_one():
    order = mc.restart_order(CLUSTER_SET, "10.0.3.22", ["10.0.3.24"])
    assert order == [("peer-1", ["salt1"]), ("peer-2", ["salt3"]), ("here", ["salt2"])]
    # Run on a host that is no listed master: every master a peer step, no "here".
    assert [s for s, _ in mc.restart_order(CLUSTER_SET, "10.9.9.9")] == [
        "peer-1",
        "peer-2",
        "peer-3",
        "peer-4",
    ]


def test_join_plan_lists_the_leader_as_the_new_masters_one_peer_for_the_join_only():
    members = {"voters": ["10.0.3.21", "10.0.3.22"], "leader_id": "10.0.3.22"}
    plan = mc.join_plan(CLUSTER_SET, "10.0.3.24", "10.0.3.24", members)
    assert plan["joined"] is False and plan["leader"] == "10.0.3.22" and plan["problem"] is None
    assert plan["masters"][3] == {**CLUSTER_SET[3], "cluster_peers": ["10.0.3.22"]}
    assert plan["masters"][:3] == CLUSTER_SET[:3] and "cluster_peers" not in CLUSTER_SET[3]


def test_join_plan_of_a_member_has_nothing_to_join():
    members = {"voters": ["10.0.3.21"], "learners": ["10.0.3.24"]}
    plan = mc.join_plan(CLUSTER_SET, "10.0.3.24", "10.0.3.24", members)
    assert plan["joined"] is True and plan["problem"] is None


@pytest.mark.parametrize(
    "members, says",
    [
        ({"voters": ["10.0.3.21"]}, "names no Raft leader (voters: ['10.0.3.21'])"),
        ({"error": "cluster.members failed on this master (its log has why)"}, "failed"),
    ],
)
def test_join_plan_without_a_leader_names_the_problem(members, says):
    plan = mc.join_plan(CLUSTER_SET, "10.0.3.24", "10.0.3.24", members)
    assert plan["joined"] is False and says in plan["problem"], plan
