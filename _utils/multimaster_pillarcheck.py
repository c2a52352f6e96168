"""
Checks of the ``multimaster`` pillar: its shape as the operator gives it, and the merged settings
once the formula defaults are under it.

Every error names the pillar key, the offending value (masked where it may be secret) and what was
expected, and is raised as ``SettingsError`` before anything is written. ``multimaster_settings``
calls these checks and builds the configuration; the pillar's own vocabulary (modes, roots keys,
reactor switches, Python dependencies) lives here, where it is checked.
"""

import copy
import json
import os
import re

import multimaster_ids
import multimaster_jobcache
import multimaster_keys
import multimaster_saltcompat
from salt.exceptions import SaltInvocationError

MODES = ("hot", "failover", "cluster")
IPC_MODES = ("ipc", "tcp")
ROOT = "multimaster"
_CONFIG_FILE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.conf\Z")
# Pillar keys whose values may be secret: never echoed in errors, masked in returns.
_SECRET_KEY_RE = re.compile(
    r"(secret|passw|token|credential|private|(^|[.:_])pass\Z)", re.IGNORECASE
)
_SECRET_PATHS = ("master:config", "master:gitfs:remotes")
MASK = "**********"
_FINGERPRINT_RE = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){31}\Z")


# Salt's cluster secret authenticates a joining master: as long as a random key, not a password.
MIN_CLUSTER_SECRET = 32
CLUSTER_SECRET_EXPECTED = (
    f"a cluster secret of at least {MIN_CLUSTER_SECRET} characters (for example the output of "
    "'openssl rand -hex 32'), from pillar targeted at the masters only"
)
# '': localfs_key with an isolated filesystem (multimaster_settings.cluster_config), else
# Salt's default.
KEY_CACHE_DRIVERS = ("", "localfs_key", "mmap_key")
WILDCARDS = ("0.0.0.0", "::", "")
PYTHON_INSTALLS = ("auto", "pkg", "pip")
JOB_CACHE_PASSWORD_EXPECTED = (
    "the database user's password, from pillar targeted at the masters' control minions only"
)
# lookup:master:<part>_install/_pkg/_pip: how each Python dependency of the master installs.
PYTHON_DEPS = {"gitfs": "pygit2 for gitfs", "job_cache": "psycopg2 for the job cache"}
_DB_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}\Z")
_CLUSTER_ID_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")
_SHA256_HEX_RE = re.compile(r"[0-9a-fA-F]{64}\Z")
ROOTS_KEYS = ("file_roots", "pillar_roots")
# pillar multimaster:reactor switch -> (event tag, reactor SLS)
REACTORS = {
    "keys": ("salt/key", "salt://multimaster/reactor/keys.sls"),
    "first_highstate": ("salt/minion/*/start", "salt://multimaster/reactor/first_highstate.sls"),
}


class SettingsError(SaltInvocationError):
    """
    The ``multimaster`` pillar is not what the formula expects.
    """


def is_secret(key):
    """
    Whether the value at pillar ``key`` (``master:config:...``) may be secret.
    """
    under = any(key == path or key.startswith(f"{path}:") for path in _SECRET_PATHS)
    return under or bool(_SECRET_KEY_RE.search(key))


def _fail(key, value, expected):
    shown = MASK if is_secret(key) else json.dumps(value, default=str)
    name = f"{ROOT}:{key}" if key else ROOT
    raise SettingsError(f"{name}: got {shown}; expected {expected}")


def _check_mapping(data, key, where=""):
    name = f"{where}:{key}" if where else key
    if not isinstance(data.get(key), dict):
        _fail(name, data.get(key), "a mapping")


def _check_bool(data, key, where):
    if key in data and not isinstance(data[key], bool):
        _fail(f"{where}:{key}", data[key], "true or false")


def _check_int(data, key, where, minimum=0):
    value = data.get(key)
    if key in data and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
        _fail(f"{where}:{key}", value, f"an integer >= {minimum}")


def _check_port(value, key):
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        _fail(key, value, "an integer port between 1 and 65535")


def _check_id(value, key):
    try:
        multimaster_ids.check_id(value, f"{ROOT}:{key}")
    except SaltInvocationError as exc:
        raise SettingsError(str(exc)) from None


def _check_roots(roots, where):
    if not isinstance(roots, dict) or not all(
        isinstance(paths, list) and all(isinstance(p, str) and os.path.isabs(p) for p in paths)
        for paths in roots.values()
    ):
        _fail(where, roots, "a mapping of environment to a list of absolute paths")


def _check_master(index, master, seen):
    where = f"masters[{index}]"
    if not isinstance(master, dict):
        _fail(where, master, "a mapping with at least 'id' and 'host'")
    _check_id(master.get("id"), f"{where}:id")
    host = master.get("host")
    if not isinstance(host, str) or not host or any(c.isspace() for c in host):
        _fail(f"{where}:host", host, "the hostname or IP address minions use")
    _check_id(master.get("minion_id", master["id"]), f"{where}:minion_id")
    for key in ("config_dir",):
        if key in master and (not isinstance(master[key], str) or not os.path.isabs(master[key])):
            _fail(f"{where}:{key}", master[key], "an absolute path")
    pinned = master.get("minion_fingerprint")
    if pinned is not None and (not isinstance(pinned, str) or not _FINGERPRINT_RE.match(pinned)):
        _fail(
            f"{where}:minion_fingerprint",
            pinned,
            "the control minion's key fingerprint as salt-run multimaster.status shows it "
            "(SHA-256, 32 lower-case hex pairs joined by ':')",
        )
    for key in ROOTS_KEYS:
        if key in master:
            _check_roots(master[key], f"{where}:{key}")
    if "interface" in master and not isinstance(master["interface"], str):
        _fail(f"{where}:interface", master["interface"], "an IP address to bind")
    for key, value in (
        ("id", master["id"]),
        ("host", host),
        ("minion_id", master.get("minion_id", master["id"])),
    ):
        if value in seen[key]:
            _fail(f"{where}:{key}", value, f"each master's {key} to be unique")
        seen[key].add(value)


def check_pillar(pillar):
    """
    Checks that need the operator's own input (before defaults hide what was given). Raises
    ``SettingsError``.
    """
    if not isinstance(pillar, dict):
        _fail("", pillar, "a mapping")
    mode = pillar.get("mode", "hot")
    if mode not in MODES:
        _fail("mode", mode, "one of " + ", ".join(MODES))
    # Signing applies where minions sign in to the masters themselves: hot and failover.
    applies = {"failover": ("failover",), "signing": ("failover", "hot")}
    for key, modes in applies.items():
        if key in pillar and mode not in modes:
            _fail(
                key,
                pillar[key],
                f"no '{key}' section with mode {mode!r} (it applies to mode "
                + " and ".join(repr(m) for m in modes)
                + ")",
            )
    share = pillar.get("max_revoke_share", 0.1)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        _fail("max_revoke_share", share, "a number > 0 and <= 1 (a share of accepted keys)")
    masters = pillar.get("masters")
    if not isinstance(masters, list) or not masters:
        _fail("masters", masters, "a non-empty list of masters, the primary first")
    seen = {"id": set(), "host": set(), "minion_id": set()}
    for index, master in enumerate(masters):
        _check_master(index, master, seen)
    _check_primary(pillar.get("primary"), [m["id"] for m in masters])
    _check_epoch(pillar.get("epoch", 1))
    _check_reserved(pillar.get("reserved", []), mode)


def signs(settings):
    """
    Whether the masters of ``settings`` (merged settings or a runner section) sign their key
    with a shared signing pair that every minion verifies (``signing:enabled``, mode hot or
    failover).
    """
    signing = settings.get("signing") or {}
    return settings["mode"] in ("hot", "failover") and bool(signing.get("enabled"))


def _check_primary(primary, ids):
    if primary is not None and primary not in ids:
        expected = f"the id of one of multimaster:masters {ids} (default: the first)"
        _fail("primary", primary, expected)


def _check_reserved(reserved, mode):
    if reserved and mode == "cluster":
        _fail(
            "reserved", reserved, "no reserved slots in mode 'cluster' (minions list the balancer)"
        )
    if not isinstance(reserved, list):
        _fail("reserved", reserved, "a list of addresses minions list before a master runs there")
    for index, host in enumerate(reserved):
        if not isinstance(host, str) or not host or any(c.isspace() for c in host):
            _fail(f"reserved[{index}]", host, "an IP address or a name every minion resolves")
        if host in reserved[:index]:
            _fail(f"reserved[{index}]", host, "each reserved address once")


def _check_epoch(epoch):
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
        _fail("epoch", epoch, "a whole number >= 1, raised by one at each promote")


def check_merged(settings):
    """
    Check ``settings``, the pillar merged over the formula defaults. Raises ``SettingsError``.
    """
    for key in (
        "ports",
        "failover",
        "signing",
        "cluster",
        "reactor",
        "sse",
        "job_cache",
        "minion",
        "master",
        "lookup",
    ):
        _check_mapping(settings, key)
    _validate_sse(settings)
    _validate_job_cache(settings)
    _check_reactor(settings["reactor"])
    _check_mapping(settings["master"], "gitfs", "master")
    _check_lookup(settings["lookup"])
    for key in ("install_packages", "manage_services"):
        if not isinstance(settings.get(key), bool):
            _fail(key, settings.get(key), "true or false")
    _check_ports(settings["ports"])
    _check_failover(settings["failover"])
    _check_signing(settings["signing"])
    _validate_cluster(settings)
    _check_minion(settings["minion"], settings["ports"])
    _check_master_options(settings["master"])


def _check_reactor(reactor):
    for key in REACTORS:
        _check_bool(reactor, key, "reactor")
    _check_int(reactor, "first_highstate_window", "reactor", minimum=1)


def _check_lookup(lookup):
    for key in ("master", "minion"):
        _check_mapping(lookup, key, "lookup")
    for part, what in PYTHON_DEPS.items():
        method = lookup["master"].get(f"{part}_install")
        if method not in PYTHON_INSTALLS:
            _fail(
                f"lookup:master:{part}_install",
                method,
                "one of " + ", ".join(map(repr, PYTHON_INSTALLS)) + f" (how {what} installs)",
            )
    config_file = lookup.get("config_file")
    if not isinstance(config_file, str) or not _CONFIG_FILE_RE.match(config_file):
        _fail(
            "lookup:config_file",
            config_file,
            "a file name ending in '.conf' (Salt only includes master.d/*.conf, minion.d/*.conf)",
        )


def _check_ports(ports):
    for key in ("publish", "ret"):
        _check_port(ports.get(key), f"ports:{key}")
    if ports["publish"] == ports["ret"]:
        _fail("ports", ports, "different publish and ret ports")


def _check_failover(failover):
    for key in ("failback_interval", "random_reauth_delay"):
        _check_int(failover, key, "failover")
    _check_int(failover, "alive_interval", "failover", minimum=1)
    for key in ("failback", "shuffle"):
        _check_bool(failover, key, "failover")


def _check_signing(signing):
    _check_bool(signing, "enabled", "signing")
    if not signing["enabled"]:
        return
    try:
        multimaster_keys.canonical(signing.get("public_key"), "signing:public_key")
    except SaltInvocationError as exc:
        _fail(
            "signing:public_key",
            signing.get("public_key"),
            "the masters' master_sign.pub: one RSA 'PUBLIC KEY' PEM of >= 2048 bits "
            f"when signing is enabled ({exc})",
        )


def _check_minion(minion, ports):
    _check_int(minion, "retry_dns", "minion")
    _check_int(minion, "master_tries", "minion", minimum=-1)
    if minion.get("ipc_mode") not in IPC_MODES:
        _fail("minion:ipc_mode", minion.get("ipc_mode"), "one of " + ", ".join(IPC_MODES))
    if minion["ipc_mode"] != "tcp":
        return
    used = {ports["publish"], ports["ret"]}
    for key in ("tcp_pub_port", "tcp_pull_port"):
        _check_port(minion.get(key), f"minion:{key}")
        if minion[key] in used:
            _fail(
                f"minion:{key}",
                minion[key],
                "a port not used by the masters or the other tcp port",
            )
        used.add(minion[key])


def _check_master_options(master):
    _check_bool(master, "roots_watch", "master")
    for key in ROOTS_KEYS:
        if key in master:
            _check_roots(master[key], f"master:{key}")
    if "interface" in master and not isinstance(master["interface"], str):
        _fail("master:interface", master["interface"], "an IP address to bind")
    for key in ("acl", "config"):
        if not isinstance(master.get(key), dict):
            _fail(f"master:{key}", master.get(key), "a mapping of master options")
    remotes = master["gitfs"].get("remotes")
    if not isinstance(remotes, list):
        _fail("master:gitfs:remotes", remotes, "a list of git remote URLs")
    backends = master.get("fileserver_backend")
    if "fileserver_backend" in master and not (
        isinstance(backends, list)
        and backends
        and all(isinstance(name, str) and name.strip() for name in backends)
    ):
        _fail(
            "master:fileserver_backend",
            backends,
            "a non-empty list of file server backend names, e.g. [roots] or [roots, gitfs]",
        )


def _validate_sse(settings):
    sse = settings["sse"]
    _check_bool(sse, "enabled", "sse")
    if not sse["enabled"]:
        return
    if settings["mode"] == "cluster":
        _fail(
            "sse:enabled",
            True,
            "false with mode 'cluster' (the SSE options are for hot and failover sets)",
        )
    cluster_id = sse.get("cluster_id")
    if not isinstance(cluster_id, str) or not _CLUSTER_ID_RE.match(cluster_id):
        _fail(
            "sse:cluster_id",
            cluster_id,
            "the name the SSE server knows this set of masters by (letters, digits, '_', '.', "
            "'-'; at most 64)",
        )


def _validate_job_cache(settings):
    job_cache = settings["job_cache"]
    _check_bool(job_cache, "enabled", "job_cache")
    if not job_cache["enabled"]:
        return
    if job_cache.get("returner") not in multimaster_jobcache.RETURNERS:
        _fail(
            "job_cache:returner",
            job_cache.get("returner"),
            "one of "
            + ", ".join(map(repr, multimaster_jobcache.RETURNERS))
            + " (the formula's returner: Salt's pgjsonb takes its connection options from a"
            " minion's return)",
        )
    host = job_cache.get("host")
    if not isinstance(host, str) or not host or any(c.isspace() for c in host):
        _fail("job_cache:host", host, "the PostgreSQL server's hostname or IP address")
    _check_port(job_cache.get("port"), "job_cache:port")
    for key in ("db", "user"):
        if not isinstance(job_cache.get(key), str) or not _DB_NAME_RE.match(job_cache[key]):
            _fail(
                f"job_cache:{key}",
                job_cache.get(key),
                "a PostgreSQL name (letters, digits, _; at most 63)",
            )
    # Empty is allowed here: only the masters' control minions see it (check_job_cache_password).
    if not isinstance(job_cache.get("password"), str):
        _fail("job_cache:password", job_cache.get("password"), JOB_CACHE_PASSWORD_EXPECTED)
    _check_int(job_cache, "connect_timeout", "job_cache", minimum=1)
    _validate_job_cache_tls(job_cache)
    _check_bool(job_cache, "create_schema", "job_cache")


def _validate_job_cache_tls(job_cache):
    """
    The masters hand the database the password: only over TLS, and only to a server that proves
    it is the database (its certificate, ``verify-full``) or that knows the password itself
    (SCRAM with ``channel_binding: require``, which also refuses a cleartext password request).
    """
    sslmode = job_cache.get("sslmode")
    if sslmode not in multimaster_jobcache.TLS_MODES:
        _fail(
            "job_cache:sslmode",
            sslmode,
            "one of libpq's sslmode values that require TLS: "
            + ", ".join(multimaster_jobcache.TLS_MODES)
            + " (disable, allow and prefer may send the password without TLS)",
        )
    binding = job_cache.get("channel_binding")
    if binding not in multimaster_jobcache.CHANNEL_BINDINGS:
        _fail(
            "job_cache:channel_binding",
            binding,
            "one of libpq's channel_binding values: "
            + ", ".join(multimaster_jobcache.CHANNEL_BINDINGS),
        )
    if binding != "require" and sslmode != "verify-full":
        _fail(
            "job_cache:channel_binding",
            binding,
            f"'require' with sslmode {sslmode!r} (SCRAM bound to the TLS channel), or sslmode "
            "'verify-full' (the server's certificate checked against sslrootcert and the host "
            "name): otherwise whatever answers at the host can ask the masters for the password",
        )
    rootcert = job_cache.get("sslrootcert")
    if not isinstance(rootcert, str) or not (rootcert in ("", "system") or os.path.isabs(rootcert)):
        _fail(
            "job_cache:sslrootcert",
            rootcert,
            "'' (libpq's default, ~/.postgresql/root.crt of the masters' user), 'system' (the "
            "system's CA store, libpq 16 or newer) or the absolute path of the CA certificate "
            "file on the masters",
        )


def _validate_cluster(settings):
    cluster = settings["cluster"]
    _check_mapping(cluster, "haproxy", "cluster")
    _check_mapping(settings["lookup"], "haproxy", "lookup")
    _check_port(cluster.get("pool_port"), "cluster:pool_port")
    _check_bool(cluster, "isolated_filesystem", "cluster")
    _check_bool(cluster, "auto_replace_voters", "cluster")
    _check_int(cluster, "publish_session", "cluster", minimum=1)
    driver = cluster.get("keys_cache_driver")
    if driver not in KEY_CACHE_DRIVERS:
        _fail(
            "cluster:keys_cache_driver", driver, "one of " + ", ".join(map(repr, KEY_CACHE_DRIVERS))
        )
    secret = cluster.get("secret")
    if not isinstance(secret, str) or (secret and len(secret) < MIN_CLUSTER_SECRET):
        _fail("cluster:secret", secret, CLUSTER_SECRET_EXPECTED)
    _check_haproxy(cluster["haproxy"])
    if settings["mode"] != "cluster":
        return
    _check_cluster_mode(cluster, settings["ports"])
    for index, master in enumerate(settings["masters"]):
        _check_cluster_master(f"masters[{index}]", master)


def _check_haproxy(haproxy):
    for key in ("check_interval", "connect_timeout", "maxconn"):
        _check_int(haproxy, key, "cluster:haproxy", minimum=1)
    if not isinstance(haproxy.get("config_file"), str) or not os.path.isabs(haproxy["config_file"]):
        _fail("cluster:haproxy:config_file", haproxy.get("config_file"), "an absolute path")
    pidfile = haproxy.get("pidfile")
    if not isinstance(pidfile, str) or (pidfile and not os.path.isabs(pidfile)):
        _fail(
            "cluster:haproxy:pidfile",
            pidfile,
            "'' (HAProxy runs as the system service) or an absolute path",
        )


def _check_cluster_mode(cluster, ports):
    balancer = cluster.get("balancer")
    if not isinstance(balancer, str) or not balancer or any(c.isspace() for c in balancer):
        _fail(
            "cluster:balancer",
            balancer,
            "the load balancer address minions use in mode 'cluster' (HAProxy binds it)",
        )
    if not isinstance(cluster.get("id"), str) or not _CLUSTER_ID_RE.match(cluster["id"]):
        _fail("cluster:id", cluster.get("id"), "the cluster_id: letters, digits, '_', '.', '-'")
    if cluster.get("pki_dir") and not os.path.isabs(cluster["pki_dir"]):
        _fail("cluster:pki_dir", cluster["pki_dir"], "'' or an absolute path")
    if cluster["pool_port"] in (ports["publish"], ports["ret"]):
        _fail(
            "cluster:pool_port", cluster["pool_port"], "a port other than the publish and ret ports"
        )


def _check_cluster_master(where, master):
    address = cluster_address(master)
    if address in WILDCARDS:
        _fail(
            f"{where}:interface",
            address,
            "the master's own address in mode 'cluster' (its Raft node id and the address "
            "its peers dial): not a wildcard",
        )
    if master["id"] != address:
        _fail(
            f"{where}:id",
            master["id"],
            f"the master's own address {address!r} in mode 'cluster': Salt names a cluster "
            "peer by its id and dials it by the same string, so id, interface and the "
            "peers' cluster_peers must agree",
        )
    _check_cluster_peers(where, master.get("cluster_peers"), address)
    pinned = master.get("cluster_pub_fingerprint")
    if pinned is not None and (not isinstance(pinned, str) or not _SHA256_HEX_RE.match(pinned)):
        _fail(
            f"{where}:cluster_pub_fingerprint",
            pinned,
            "the SHA-256 hex digest (64 hex digits) of the cluster's cluster.pub PEM",
        )
    if master.get("cluster_pki_dir") is not None and not (
        isinstance(master["cluster_pki_dir"], str) and os.path.isabs(master["cluster_pki_dir"])
    ):
        _fail(f"{where}:cluster_pki_dir", master["cluster_pki_dir"], "an absolute path")


def _check_cluster_peers(where, peers, address):
    if peers is not None and (
        not isinstance(peers, list)
        or not peers
        or not all(isinstance(p, str) and p and p != address for p in peers)
    ):
        _fail(
            f"{where}:cluster_peers",
            peers,
            "a non-empty list of the other masters' addresses (a joining master may name one)",
        )


def check_section(section):
    """
    Validate the ``multimaster`` section a runner reads from the master's config (or kwargs);
    returns it with ``minion_id`` filled in. Raises ``SettingsError``.
    """
    check_pillar(section)
    section = copy.deepcopy(section)
    for master in section["masters"]:
        master.setdefault("minion_id", master["id"])
    section.setdefault("ports", {"publish": 4505, "ret": 4506})
    # Written before primary and epoch existed: the first master, the first generation.
    section["primary"] = section.get("primary") or section["masters"][0]["id"]
    section.setdefault("epoch", 1)
    return section


def cluster_address(master):
    """
    The address a cluster master binds and its peers dial: its ``interface``, else its ``host``.
    Salt's Raft uses it as the master's node id, which is why the checks hold ``id`` to it.

    master
        An entry of ``settings["masters"]``.
    """
    return master.get("interface") or master["host"]


def check_package_name(part, method, name):
    """
    Refuse an empty package ``name`` for the Python dependency ``part`` installed by ``method``
    (``pkg`` or ``pip``).
    """
    if not isinstance(name, str) or not name:
        _fail(
            f"lookup:master:{part}_{method}",
            name,
            f"the name of the package of {PYTHON_DEPS[part]} (this os_family has none "
            "in parameters/os_family/: set it in pillar)",
        )


def check_job_cache_password(job_cache):
    """
    Refuse an empty job cache password: the pillar this master's control minion sees must hold it.
    """
    if not job_cache["password"]:
        _fail("job_cache:password", job_cache["password"], JOB_CACHE_PASSWORD_EXPECTED)


def check_cluster_host(cluster):
    """
    Refuse to render ``cluster`` options where this master's Salt has no native cluster, or where
    the pillar this host sees holds no cluster secret.
    """
    if not multimaster_saltcompat.can_cluster():
        _fail(
            "mode",
            "cluster",
            f"'hot' or 'failover': Salt {multimaster_saltcompat.salt_version()} on this master "
            "has no native master cluster (Salt 3007 or newer)",
        )
    secret = cluster["secret"]
    if not isinstance(secret, str) or len(secret) < MIN_CLUSTER_SECRET:
        _fail("cluster:secret", secret, CLUSTER_SECRET_EXPECTED)


def check_cluster_peers_found(masters, peers):
    """
    Refuse a cluster master with no ``peers`` to join (``masters``: the set's entries).
    """
    if not peers:
        _fail("masters", [m["id"] for m in masters], "at least two masters in a cluster")
