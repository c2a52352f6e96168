"""
Every bad ``multimaster`` pillar is refused by ``multimaster_pillarcheck`` (through
``multimaster_settings.build``) with one message that names the pillar key, shows the bad value and
says what was expected (DESIGN.md §6.16).
"""

import copy
import json

import multimaster_pillarcheck
import multimaster_settings
import pytest
from salt.exceptions import SaltInvocationError

from tests.support.keyfactory import pub_pem, rsa_private

M1 = {"id": "master1", "host": "10.0.3.61"}
M2 = {"id": "master2", "host": "10.0.3.230"}
PEM = pub_pem(rsa_private(tag=30))
WEAK_PEM = pub_pem(rsa_private(bits=1024, tag=31))
# Only a header: the check must refuse private keys; no key material lives in the repository.
PRIVATE_HEADER = "-----BEGIN RSA " + "PRIVATE KEY-----"
ID_EXPECTED = "expected 1-64 bytes of letters, digits"


def pillar(**overrides):
    data = {"masters": [dict(M1), dict(M2)]}
    data.update(copy.deepcopy(overrides))
    return data


JOB_CACHE = {"enabled": True, "host": "db.example.com", "password": "pw-marker-1f2e"}

CM1 = {"id": "10.0.3.61", "host": "10.0.3.61"}
CM2 = {"id": "10.0.3.230", "host": "10.0.3.230"}


def cluster(masters=None, **cluster_section):
    """Mode cluster: master ids are their addresses, as Salt's cluster needs."""
    section = {"balancer": "lb", "id": "c1", **cluster_section}
    return pillar(mode="cluster", masters=masters or [dict(CM1), dict(CM2)], cluster=section)


def failover(**overrides):
    return pillar(mode="failover", **overrides)


def js(value):
    """
    How ``_fail`` shows a value.
    """
    return json.dumps(value)


# (pillar, the key the message must name, how the bad value is shown, what was expected)
CASES = {
    # mode
    "unknown-mode": (pillar(mode="active"), "mode", js("active"), "one of hot, failover, cluster"),
    "mode-not-a-string": (pillar(mode=["hot"]), "mode", js(["hot"]), "one of hot, failover"),
    # masters
    "masters-empty": (pillar(masters=[]), "masters", "[]", "a non-empty list of masters"),
    "masters-missing": ({"mode": "hot"}, "masters", "null", "a non-empty list of masters"),
    "masters-a-mapping": (
        pillar(masters={"id": "master1"}),
        "masters",
        js({"id": "master1"}),
        "a non-empty list",
    ),
    "master-not-a-mapping": (
        pillar(masters=["master1"]),
        "masters[0]",
        js("master1"),
        "a mapping with at least 'id' and 'host'",
    ),
    "duplicate-id": (
        pillar(masters=[M1, dict(M2, id="master1")]),
        "masters[1]:id",
        js("master1"),
        "each master's id to be unique",
    ),
    "duplicate-host": (
        pillar(masters=[M1, dict(M2, host="10.0.3.61")]),
        "masters[1]:host",
        js("10.0.3.61"),
        "each master's host to be unique",
    ),
    "duplicate-minion-id": (
        pillar(masters=[M1, dict(M2, minion_id="master1")]),
        "masters[1]:minion_id",
        js("master1"),
        "each master's minion_id to be unique",
    ),
    "duplicate-default-minion-id": (
        pillar(masters=[dict(M1, minion_id="ctl"), dict(M2, id="ctl")]),
        "masters[1]:minion_id",
        js("ctl"),
        "each master's minion_id to be unique",
    ),
    "master-without-host": (
        pillar(masters=[{"id": "master1"}]),
        "masters[0]:host",
        "null",
        "the hostname or IP address minions use",
    ),
    "master-empty-host": (
        pillar(masters=[dict(M1, host="")]),
        "masters[0]:host",
        js(""),
        "the hostname or IP address",
    ),
    "master-host-with-space": (
        pillar(masters=[dict(M1, host="10.0.3.61 10.0.3.62")]),
        "masters[0]:host",
        js("10.0.3.61 10.0.3.62"),
        "the hostname or IP address",
    ),
    "master-without-id": (
        pillar(masters=[{"host": "10.0.3.61"}]),
        "masters[0]:id",
        "None",
        ID_EXPECTED,
    ),
    "master-bad-id": (
        pillar(masters=[dict(M1, id="m*")]),
        "masters[0]:id",
        repr("m*"),
        ID_EXPECTED,
    ),
    "master-interface-not-a-string": (
        pillar(masters=[dict(M1, interface=10)]),
        "masters[0]:interface",
        "10",
        "an IP address to bind",
    ),
    "master-roots-relative-path": (
        pillar(masters=[dict(M1, pillar_roots={"base": ["srv/pillar"]})]),
        "masters[0]:pillar_roots",
        "srv/pillar",
        "a mapping of environment to a list of absolute paths",
    ),
    "relative-config-dir": (
        pillar(masters=[dict(M1, config_dir="etc/salt")]),
        "masters[0]:config_dir",
        js("etc/salt"),
        "an absolute path",
    ),
    # intervals
    "interval-not-an-integer": (
        failover(failover={"alive_interval": "30s"}),
        "failover:alive_interval",
        js("30s"),
        "an integer >= 1",
    ),
    "interval-a-float": (
        failover(failover={"failback_interval": 1.5}),
        "failover:failback_interval",
        "1.5",
        "an integer >= 0",
    ),
    "interval-negative": (
        failover(failover={"random_reauth_delay": -1}),
        "failover:random_reauth_delay",
        "-1",
        "an integer >= 0",
    ),
    "alive-interval-zero": (
        failover(failover={"alive_interval": 0}),
        "failover:alive_interval",
        "0",
        "an integer >= 1",
    ),
    "interval-a-bool": (
        failover(failover={"alive_interval": True}),
        "failover:alive_interval",
        "true",
        "an integer >= 1",
    ),
    "failback-not-a-bool": (
        failover(failover={"failback": "yes"}),
        "failover:failback",
        js("yes"),
        "true or false",
    ),
    "shuffle-an-int": (
        failover(failover={"shuffle": 1}),
        "failover:shuffle",
        "1",
        "true or false",
    ),
    "retry-dns-a-bool": (
        pillar(minion={"retry_dns": False}),
        "minion:retry_dns",
        "false",
        "an integer >= 0",
    ),
    "master-tries-below-minus-one": (
        pillar(minion={"master_tries": -2}),
        "minion:master_tries",
        "-2",
        "an integer >= -1",
    ),
    # sections that only apply to mode failover
    "failover-in-hot": (
        pillar(mode="hot", failover={"alive_interval": 10}),
        "failover",
        js({"alive_interval": 10}),
        "no 'failover' section with mode 'hot' (it applies to mode 'failover')",
    ),
    "failover-in-default-mode": (
        pillar(failover={"failback": True}),
        "failover",
        js({"failback": True}),
        "no 'failover' section with mode 'hot'",
    ),
    "failover-in-cluster": (
        pillar(
            mode="cluster",
            masters=[CM1, CM2],
            cluster={"id": "c1", "balancer": "lb"},
            failover={"shuffle": True},
        ),
        "failover",
        js({"shuffle": True}),
        "no 'failover' section with mode 'cluster'",
    ),
    "signing-in-cluster": (
        pillar(
            mode="cluster",
            masters=[CM1, CM2],
            cluster={"id": "c1", "balancer": "lb"},
            signing={"enabled": True, "public_key": PEM},
        ),
        "signing",
        js({"enabled": True, "public_key": PEM}),
        "no 'signing' section with mode 'cluster' (it applies to mode 'failover' and 'hot')",
    ),
    "signing-enabled-not-a-bool": (
        failover(signing={"enabled": "true"}),
        "signing:enabled",
        js("true"),
        "true or false",
    ),
    "signing-without-public-key": (
        failover(signing={"enabled": True}),
        "signing:public_key",
        js(""),
        "the masters' master_sign.pub: one RSA 'PUBLIC KEY' PEM",
    ),
    "signing-private-key-given": (
        failover(signing={"enabled": True, "public_key": PRIVATE_HEADER}),
        "signing:public_key",
        js(PRIVATE_HEADER),
        "one RSA 'PUBLIC KEY' PEM",
    ),
    "signing-truncated-public-key": (
        failover(
            signing={
                "enabled": True,
                "public_key": "-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----\n",
            }
        ),
        "signing:public_key",
        "MIIB",
        "unreadable public key",
    ),
    "signing-weak-public-key": (
        failover(signing={"enabled": True, "public_key": WEAK_PEM}),
        "signing:public_key",
        "BEGIN PUBLIC KEY",
        "RSA key of 1024 bits",
    ),
    "max-revoke-share-zero": (
        pillar(max_revoke_share=0),
        "max_revoke_share",
        "0",
        "a number > 0 and <= 1",
    ),
    "control-minion-fingerprint-not-a-fingerprint": (
        pillar(masters=[{"id": "m1", "host": "h1", "minion_fingerprint": "ab:cd"}]),
        "masters[0]:minion_fingerprint",
        js("ab:cd"),
        "32 lower-case hex pairs",
    ),
    # cluster
    "cluster-without-balancer": (
        pillar(mode="cluster", masters=[CM1, CM2], cluster={"id": "c1"}),
        "cluster:balancer",
        js(""),
        "the load balancer address minions use in mode 'cluster'",
    ),
    "cluster-balancer-not-a-string": (
        cluster(balancer=["lb1", "lb2"]),
        "cluster:balancer",
        js(["lb1", "lb2"]),
        "the load balancer address",
    ),
    "cluster-without-id": (
        pillar(mode="cluster", masters=[CM1, CM2], cluster={"balancer": "lb"}),
        "cluster:id",
        js(""),
        "the cluster_id",
    ),
    "cluster-id-with-a-space": (
        cluster(id="my cluster"),
        "cluster:id",
        js("my cluster"),
        "the cluster_id",
    ),
    "cluster-secret-too-short": (
        cluster(secret="hunter2"),
        "cluster:secret",
        multimaster_pillarcheck.MASK,
        "at least 32 characters",
    ),
    "cluster-secret-not-a-string": (
        cluster(secret=12345),
        "cluster:secret",
        multimaster_pillarcheck.MASK,
        "at least 32 characters",
    ),
    "cluster-master-on-a-wildcard": (
        cluster(masters=[dict(CM1, interface="0.0.0.0"), dict(CM2)]),
        "masters[0]:interface",
        js("0.0.0.0"),
        "not a wildcard",
    ),
    "cluster-master-id-is-not-its-address": (
        cluster(masters=[dict(M1), dict(M2)]),
        "masters[0]:id",
        js("master1"),
        "the master's own address '10.0.3.61' in mode 'cluster'",
    ),
    "cluster-peers-name-itself": (
        cluster(masters=[dict(CM1), dict(CM2, cluster_peers=[CM2["host"]])]),
        "masters[1]:cluster_peers",
        js([CM2["host"]]),
        "the other masters' addresses",
    ),
    "cluster-fingerprint-not-sha256": (
        cluster(masters=[dict(CM1), dict(CM2, cluster_pub_fingerprint="ab:cd")]),
        "masters[1]:cluster_pub_fingerprint",
        js("ab:cd"),
        "64 hex digits",
    ),
    "cluster-pool-port-is-ret-port": (
        cluster(pool_port=4506),
        "cluster:pool_port",
        "4506",
        "a port other than the publish and ret ports",
    ),
    "cluster-unknown-key-cache-driver": (
        pillar(cluster={"keys_cache_driver": "redis"}),
        "cluster:keys_cache_driver",
        js("redis"),
        "one of '', 'localfs_key', 'mmap_key'",
    ),
    "cluster-auto-replace-voters-not-bool": (
        pillar(cluster={"auto_replace_voters": "yes"}),
        "cluster:auto_replace_voters",
        js("yes"),
        "true or false",
    ),
    "haproxy-pidfile-relative": (
        pillar(cluster={"haproxy": {"pidfile": "run/haproxy.pid"}}),
        "cluster:haproxy:pidfile",
        js("run/haproxy.pid"),
        "an absolute path",
    ),
    # ports
    "port-zero": (
        pillar(ports={"publish": 0}),
        "ports:publish",
        "0",
        "an integer port between 1 and 65535",
    ),
    "port-too-high": (
        pillar(ports={"ret": 65536}),
        "ports:ret",
        "65536",
        "an integer port between 1 and 65535",
    ),
    "port-a-string": (
        pillar(ports={"ret": "4506"}),
        "ports:ret",
        js("4506"),
        "an integer port between 1 and 65535",
    ),
    "port-a-bool": (
        pillar(ports={"publish": True}),
        "ports:publish",
        "true",
        "an integer port",
    ),
    "ports-equal": (
        pillar(ports={"publish": 4506}),
        "ports",
        js({"publish": 4506, "ret": 4506}),
        "different publish and ret ports",
    ),
    # minion
    "bad-ipc-mode": (
        pillar(minion={"ipc_mode": "udp"}),
        "minion:ipc_mode",
        js("udp"),
        "one of ipc, tcp",
    ),
    "tcp-port-is-publish-port": (
        pillar(minion={"ipc_mode": "tcp", "tcp_pub_port": 4505}),
        "minion:tcp_pub_port",
        "4505",
        "a port not used by the masters or the other tcp port",
    ),
    "tcp-port-is-ret-port": (
        pillar(minion={"ipc_mode": "tcp", "tcp_pull_port": 4506}),
        "minion:tcp_pull_port",
        "4506",
        "a port not used by the masters",
    ),
    "tcp-ports-overlap": (
        pillar(minion={"ipc_mode": "tcp", "tcp_pub_port": 4600, "tcp_pull_port": 4600}),
        "minion:tcp_pull_port",
        "4600",
        "a port not used by the masters or the other tcp port",
    ),
    "tcp-port-out-of-range": (
        pillar(minion={"ipc_mode": "tcp", "tcp_pub_port": 70000}),
        "minion:tcp_pub_port",
        "70000",
        "an integer port between 1 and 65535",
    ),
    # master
    "relative-file-roots": (
        pillar(master={"file_roots": {"base": ["srv/salt"]}}),
        "master:file_roots",
        js({"base": ["srv/salt"]}),
        "a mapping of environment to a list of absolute paths",
    ),
    "file-roots-not-a-list": (
        pillar(master={"file_roots": {"base": "/srv/salt"}}),
        "master:file_roots",
        js({"base": "/srv/salt"}),
        "a mapping of environment to a list of absolute paths",
    ),
    "relative-pillar-roots": (
        pillar(master={"pillar_roots": {"base": ["/srv/pillar", "pillar"]}}),
        "master:pillar_roots",
        js({"base": ["/srv/pillar", "pillar"]}),
        "a list of absolute paths",
    ),
    "acl-not-a-mapping": (
        pillar(master={"acl": ["publisher_acl"]}),
        "master:acl",
        js(["publisher_acl"]),
        "a mapping of master options",
    ),
    "config-not-a-mapping": (
        pillar(master={"config": "worker_threads: 4"}),
        "master:config",
        multimaster_pillarcheck.MASK,
        "a mapping of master options",
    ),
    "roots-watch-not-a-bool": (
        pillar(master={"roots_watch": "yes"}),
        "master:roots_watch",
        js("yes"),
        "true or false",
    ),
    "gitfs-remotes-not-a-list": (
        pillar(master={"gitfs": {"remotes": "https://git.example.com/f.git"}}),
        "master:gitfs:remotes",
        multimaster_pillarcheck.MASK,
        "a list of git remote URLs",
    ),
    # types of whole sections and flags
    "pillar-not-a-mapping": (["master1"], "", js(["master1"]), "a mapping"),
    "ports-not-a-mapping": (pillar(ports=4505), "ports", "4505", "a mapping"),
    "failover-not-a-mapping": (failover(failover=30), "failover", "30", "a mapping"),
    "minion-null": (pillar(minion=None), "minion", "null", "a mapping"),
    "gitfs-not-a-mapping": (
        pillar(master={"gitfs": "pygit2"}),
        "master:gitfs",
        js("pygit2"),
        "a mapping",
    ),
    "lookup-not-a-mapping": (pillar(lookup="debian"), "lookup", js("debian"), "a mapping"),
    "lookup-master-not-a-mapping": (
        pillar(lookup={"master": "salt-master"}),
        "lookup:master",
        js("salt-master"),
        "a mapping",
    ),
    "sse-without-cluster-id": (
        pillar(sse={"enabled": True}),
        "sse:cluster_id",
        js(""),
        "the name the SSE server knows this set of masters by",
    ),
    "sse-enabled-not-a-bool": (
        pillar(sse={"enabled": "yes", "cluster_id": "prod"}),
        "sse:enabled",
        js("yes"),
        "true or false",
    ),
    "sse-in-cluster-mode": (
        pillar(
            mode="cluster",
            sse={"enabled": True, "cluster_id": "prod"},
            cluster={"balancer": "127.0.0.10", "id": "c1"},
            masters=[
                {"id": "127.0.0.2", "host": "127.0.0.2"},
                {"id": "127.0.0.3", "host": "127.0.0.3"},
            ],
        ),
        "sse:enabled",
        "true",
        "false with mode 'cluster'",
    ),
    "gitfs-install-unknown": (
        pillar(lookup={"master": {"gitfs_install": "apt"}}),
        "lookup:master:gitfs_install",
        js("apt"),
        "one of 'auto', 'pkg', 'pip'",
    ),
    "job-cache-install-unknown": (
        pillar(lookup={"master": {"job_cache_install": "yum"}}),
        "lookup:master:job_cache_install",
        js("yum"),
        "one of 'auto', 'pkg', 'pip' (how psycopg2 for the job cache installs)",
    ),
    "job-cache-enabled-not-a-bool": (
        pillar(job_cache={"enabled": "yes"}),
        "job_cache:enabled",
        js("yes"),
        "true or false",
    ),
    "job-cache-returner-unknown": (
        pillar(job_cache=dict(JOB_CACHE, returner="redis")),
        "job_cache:returner",
        js("redis"),
        "one of 'multimaster_pgjsonb'",
    ),
    "job-cache-salts-own-pgjsonb": (
        pillar(job_cache=dict(JOB_CACHE, returner="pgjsonb")),
        "job_cache:returner",
        js("pgjsonb"),
        "one of 'multimaster_pgjsonb' (the formula's returner: Salt's pgjsonb takes its "
        "connection options from a minion's return)",
    ),
    "job-cache-without-host": (
        pillar(job_cache=dict(JOB_CACHE, host="")),
        "job_cache:host",
        js(""),
        "the PostgreSQL server's hostname or IP address",
    ),
    "job-cache-port-out-of-range": (
        pillar(job_cache=dict(JOB_CACHE, port=70000)),
        "job_cache:port",
        "70000",
        "an integer port between 1 and 65535",
    ),
    "job-cache-db-injection": (
        pillar(job_cache=dict(JOB_CACHE, db="salt; DROP TABLE jids")),
        "job_cache:db",
        js("salt; DROP TABLE jids"),
        "a PostgreSQL name",
    ),
    "job-cache-password-not-a-string": (
        pillar(job_cache=dict(JOB_CACHE, password=123456789)),
        "job_cache:password",
        multimaster_pillarcheck.MASK,
        "the database user's password, from pillar targeted at the masters' control minions",
    ),
    "job-cache-timeout-zero": (
        pillar(job_cache=dict(JOB_CACHE, connect_timeout=0)),
        "job_cache:connect_timeout",
        "0",
        "an integer >= 1",
    ),
    "job-cache-sslmode-unknown": (
        pillar(job_cache=dict(JOB_CACHE, sslmode="on")),
        "job_cache:sslmode",
        js("on"),
        "one of libpq's sslmode values that require TLS: require, verify-ca, verify-full",
    ),
    "job-cache-without-tls": (
        pillar(job_cache=dict(JOB_CACHE, sslmode="prefer")),
        "job_cache:sslmode",
        js("prefer"),
        "(disable, allow and prefer may send the password without TLS)",
    ),
    "job-cache-sslmode-libpq-default": (
        pillar(job_cache=dict(JOB_CACHE, sslmode="")),
        "job_cache:sslmode",
        js(""),
        "one of libpq's sslmode values that require TLS",
    ),
    "job-cache-channel-binding-unknown": (
        pillar(job_cache=dict(JOB_CACHE, channel_binding="yes")),
        "job_cache:channel_binding",
        js("yes"),
        "one of libpq's channel_binding values: disable, prefer, require",
    ),
    "job-cache-tls-without-server-proof": (
        pillar(job_cache=dict(JOB_CACHE, sslmode="verify-ca", channel_binding="prefer")),
        "job_cache:channel_binding",
        js("prefer"),
        "'require' with sslmode 'verify-ca' (SCRAM bound to the TLS channel), or sslmode "
        "'verify-full'",
    ),
    "job-cache-sslrootcert-relative": (
        pillar(job_cache=dict(JOB_CACHE, sslmode="verify-full", sslrootcert="ca.crt")),
        "job_cache:sslrootcert",
        js("ca.crt"),
        "the absolute path of the CA certificate file on the masters",
    ),
    "config-file-with-path": (
        pillar(lookup={"config_file": "../../minion"}),
        "lookup:config_file",
        js("../../minion"),
        "a file name ending in '.conf'",
    ),
    "config-file-not-conf": (
        pillar(lookup={"config_file": "multimaster.yaml"}),
        "lookup:config_file",
        js("multimaster.yaml"),
        "a file name ending in '.conf'",
    ),
    "install-packages-not-a-bool": (
        pillar(install_packages="yes"),
        "install_packages",
        js("yes"),
        "true or false",
    ),
    "reactor-not-a-mapping": (pillar(reactor=True), "reactor", "true", "a mapping"),
    "reactor-keys-a-string": (
        pillar(reactor={"keys": "yes"}),
        "reactor:keys",
        js("yes"),
        "true or false",
    ),
    "reactor-first-highstate-window-zero": (
        pillar(reactor={"first_highstate_window": 0}),
        "reactor:first_highstate_window",
        "0",
        "an integer >= 1",
    ),
    "manage-services-an-int": (
        pillar(manage_services=0),
        "manage_services",
        "0",
        "true or false",
    ),
    "primary-not-listed": (
        pillar(primary="master9"),
        "primary",
        js("master9"),
        "the id of one of multimaster:masters",
    ),
    "epoch-zero": (pillar(epoch=0), "epoch", "0", "a whole number >= 1"),
    "epoch-a-string": (pillar(epoch="2"), "epoch", js("2"), "a whole number >= 1"),
    "epoch-a-bool": (pillar(epoch=True), "epoch", "true", "a whole number >= 1"),
    # reserved master slots
    "reserved-in-cluster": (
        dict(cluster(), reserved=["10.0.3.232"]),
        "reserved",
        js(["10.0.3.232"]),
        "no reserved slots in mode 'cluster'",
    ),
    "reserved-not-a-list": (
        pillar(reserved="10.0.3.232"),
        "reserved",
        js("10.0.3.232"),
        "a list of addresses",
    ),
    "reserved-empty-entry": (pillar(reserved=["10.0.3.232", ""]), "reserved[1]", '""', "an IP"),
    "reserved-with-space": (
        pillar(reserved=["10.0.3.232 10.0.3.233"]),
        "reserved[0]",
        js("10.0.3.232 10.0.3.233"),
        "an IP address or a name every minion resolves",
    ),
    "reserved-twice": (
        pillar(reserved=["10.0.3.232", "10.0.3.232"]),
        "reserved[1]",
        js("10.0.3.232"),
        "each reserved address once",
    ),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_pillar_names_key_value_and_expected_form(case, defaults):
    data, key, shown, expected = CASES[case]
    before = copy.deepcopy(data)
    with pytest.raises(multimaster_pillarcheck.SettingsError) as err:
        multimaster_settings.build(data, defaults)
    message = str(err.value)
    name = f"multimaster:{key}" if key else "multimaster"
    assert message.startswith(f"{name}: "), message
    assert shown in message, message
    assert "expected" in message and expected in message, message
    # Validation never touches its input.
    assert data == before


BAD_IDS = ["-rf", "m*", "a,b", ".hidden", "a\nb", "x" * 300, "../x", "a/b", "a b", "", "m?", "[ab]"]


@pytest.mark.parametrize("bad", BAD_IDS, ids=[repr(b)[:20] for b in BAD_IDS])
def test_invalid_minion_id_is_refused(bad, defaults):
    data = pillar(masters=[dict(M1, minion_id=bad), M2])
    with pytest.raises(multimaster_pillarcheck.SettingsError) as err:
        multimaster_settings.build(data, defaults)
    message = str(err.value)
    assert message.startswith("multimaster:masters[0]:minion_id: "), message
    assert repr(bad) in message
    assert ID_EXPECTED in message


@pytest.mark.parametrize("bad", ["-rf", "m*", "a,b", ".hidden", "a\nb", "x" * 65])
def test_invalid_master_id_is_refused(bad, defaults):
    data = pillar(masters=[M1, dict(M2, id=bad, minion_id="master2")])
    with pytest.raises(multimaster_pillarcheck.SettingsError) as err:
        multimaster_settings.build(data, defaults)
    assert str(err.value).startswith("multimaster:masters[1]:id: ")
    assert repr(bad) in str(err.value)


def test_settings_error_is_a_salt_invocation_error():
    # Salt reports SaltInvocationError raised in a Jinja call as a clean render failure.
    assert issubclass(multimaster_pillarcheck.SettingsError, SaltInvocationError)


def test_defaults_alone_are_refused_for_lack_of_masters(defaults):
    with pytest.raises(
        multimaster_pillarcheck.SettingsError, match=r"^multimaster:masters: got null"
    ):
        multimaster_settings.build({}, defaults)


def test_secret_values_are_never_echoed_in_errors(defaults):
    """
    master:config options and gitfs remotes may carry credentials: an error names the key and
    the expected form but masks the value.
    """
    data = pillar(master={"config": "hunter2-secret-marker"})
    with pytest.raises(multimaster_pillarcheck.SettingsError) as err:
        multimaster_settings.build(data, defaults)
    assert "multimaster:master:config" in str(err.value)
    assert "hunter2" not in str(err.value) and multimaster_pillarcheck.MASK in str(err.value)


def test_the_primary_is_the_first_master_unless_pillar_names_another(defaults):
    built = multimaster_settings.build(pillar(), defaults)
    assert (built["primary"], built["epoch"]) == (M1["id"], 1)
    assert multimaster_settings.primary(built)["id"] == M1["id"]
    built = multimaster_settings.build(pillar(primary=M2["id"], epoch=2), defaults)
    assert (built["primary"], built["epoch"]) == (M2["id"], 2)
    assert multimaster_settings.primary(built)["host"] == M2["host"]
    # The masters keep their pillar order: the minions' master lists do not change.
    assert [m["id"] for m in built["masters"]] == [M1["id"], M2["id"]]
    section = multimaster_settings.runner_section(built)
    assert (section["primary"], section["epoch"]) == (M2["id"], 2)


def test_a_section_written_before_primary_and_epoch_reads_as_the_first_generation():
    section = multimaster_pillarcheck.check_section({"masters": [M1, M2]})
    assert (section["primary"], section["epoch"]) == (M1["id"], 1)
