"""
The ``multimaster`` pillar: merge with the formula defaults and derive the master and minion
configuration it implies.

Pure logic shared by the execution module (which the SLS files call), the runner (which reads the
same section from the master's own options) and the state module. The pillar is checked by
``multimaster_pillarcheck`` (``build`` runs it before merging and after), so every error names the
pillar key, the offending value and what was expected, and is raised before anything is written.
"""

import copy
import os
import re
import socket

import multimaster_jobcache
import multimaster_pillarcheck
import multimaster_saltcompat
import multimaster_transport
import salt.utils.dictupdate
from salt.exceptions import CommandExecutionError, SaltInvocationError

_URL_USERINFO_RE = re.compile(r"(?<=://)[^/@\s]+@")
# Master options the formula renders only when pillar sets them (no default: a master.d key
# replaces the master's own).
OWN_MASTER_KEYS = ("interface", *multimaster_pillarcheck.ROOTS_KEYS, "fileserver_backend")
# Mode cluster with an isolated filesystem: hand a master's new cluster AES key to its peers.
CLUSTER_AES_REACTOR = ("rotate_cluster_aes_key", "salt://multimaster/reactor/cluster_aes.sls")


def build(pillar, defaults):
    """
    Merge ``pillar`` (the ``multimaster`` pillar section) over ``defaults`` and validate.

    Returns the merged settings; masters get ``minion_id`` filled in. Raises ``SettingsError``.
    """
    multimaster_pillarcheck.check_pillar(pillar)
    settings = salt.utils.dictupdate.update(
        copy.deepcopy(defaults), copy.deepcopy(pillar), recursive_update=True
    )
    multimaster_pillarcheck.check_merged(settings)
    for master in settings["masters"]:
        master.setdefault("minion_id", master["id"])
    settings["primary"] = settings.get("primary") or settings["masters"][0]["id"]
    return settings


def redacted_settings(settings):
    """
    ``settings`` (from ``build``, with ``config``) with what may be secret masked, for returns.
    """
    out = redacted(settings)
    derived = (out.get("config") or {}).get("master")
    if derived:
        # master:config options are copied flat into the derived master.d options.
        for key in settings["master"]["config"]:
            if key in derived:
                derived[key] = multimaster_pillarcheck.MASK
    return out


def redacted(data, path=""):
    """
    A copy of ``data`` with what may be secret masked: every value under ``master:config``,
    keys named like secrets, and credentials in URLs.

    path
        Where ``data`` sits in the pillar (``master:config`` ...), to tell secret keys.
    """
    if isinstance(data, dict):
        return {
            key: (
                multimaster_pillarcheck.MASK
                if multimaster_pillarcheck.is_secret(f"{path}{key}")
                and not isinstance(value, (dict, list))
                else redacted(value, f"{path}{key}:")
            )
            for key, value in data.items()
        }
    if isinstance(data, list):
        return [redacted(item, path) for item in data]
    if isinstance(data, str):
        return _URL_USERINFO_RE.sub(multimaster_pillarcheck.MASK + "@", data)
    return data


def primary(settings):
    """
    The primary's entry (``primary``, by default the first master): the source of truth for
    key acceptance, roots and the master key.

    settings
        The merged ``multimaster`` settings (``build``) or a checked section.
    """
    return next(m for m in settings["masters"] if m["id"] == settings["primary"])


def find_master(settings, minion_id):
    """
    The master entry whose control minion is ``minion_id``, or None.

    settings
        The merged ``multimaster`` settings.
    """
    for master in settings["masters"]:
        if master["minion_id"] == minion_id:
            return master
    return None


def local_master(section, minion_id, default_config_dir):
    """
    The master entry whose control minion is ``minion_id``, its ``config_dir`` resolved (the
    minion's own config dir when the entry names none) and the set's ``epoch`` added, or None.
    Paths a peer acts on come from here, never from a caller's arguments.

    section
        The ``multimaster`` section (checked).

    default_config_dir
        The config dir used where an entry names none (a path).
    """
    master = find_master(section, minion_id)
    if master is None:
        return None
    # The set's epoch rides with the entry: an order must be bound to it at least.
    config_dir = master.get("config_dir") or default_config_dir
    return dict(master, config_dir=config_dir, epoch=section.get("epoch", 1))


def control_master(pillar, minion_opts):
    """
    ``(master entry, section)`` of the master whose control minion has ``minion_opts``: its
    ``config_dir`` resolved (``local_master``) and the checked ``multimaster`` section. Raises
    ``CommandExecutionError`` naming the minion when the pillar is invalid or names no such
    master.

    pillar
        The minion's ``multimaster`` pillar section.

    minion_opts
        The control minion's opts (its ``id`` and ``conf_file``).
    """
    try:
        section = multimaster_pillarcheck.check_section(pillar)
    except SaltInvocationError as exc:
        raise CommandExecutionError(f"{minion_opts['id']}: {exc}") from None
    master = local_master(section, minion_opts["id"], os.path.dirname(minion_opts["conf_file"]))
    if master is None:
        raise CommandExecutionError(
            f"{minion_opts['id']} is not the control minion of any master in the pillar "
            "multimaster:masters (target that pillar at the masters' control minions)"
        )
    return master, section


def runner_section(settings):
    """
    What the masters keep under ``multimaster:`` in their own config for the runners to read.

    settings
        The merged ``multimaster`` settings.
    """
    keys = ["mode", "ports", "masters", "primary", "epoch", "manage_services", "max_revoke_share"]
    if settings["mode"] == "failover":
        keys += ["failover", "signing"]
    elif multimaster_pillarcheck.signs(settings):
        keys += ["signing"]
    section = {key: copy.deepcopy(settings[key]) for key in keys}
    if settings["mode"] == "cluster":
        # The secret stays in its own 0600 file: the runners never need it.
        section["cluster"] = {
            key: copy.deepcopy(value)
            for key, value in settings["cluster"].items()
            if key != "secret"
        }
    return section


def pull_acl(settings):
    """
    The ``peer_run`` entry that lets the control minions (and only them) call the one runner
    function that serves staged transfers.

    settings
        The merged, validated ``multimaster`` pillar.
    """
    ids = "|".join(re.escape(m.get("minion_id") or m["id"]) for m in settings["masters"])
    return {f"^({ids})$": [f"^{re.escape(multimaster_transport.PULL)}$"]}


def fileserver_backends(backends, gitfs=False):
    """
    A master's ``fileserver_backend``: ``backends`` in order, ``gitfs`` when gitfs has
    remotes, and last ``multimaster``, the backend that serves ``sync_roots`` its transfers
    (it finds nothing but those). No name twice.

    backends
        Pillar ``multimaster:master:fileserver_backend``, else the master's own value.

    gitfs
        Whether ``master:gitfs:remotes`` are set.
    """
    out = []
    for name in [*backends, *(["gitfs"] if gitfs else []), multimaster_transport.BACKEND]:
        if name not in out:
            out.append(name)
    return out


def python_install(settings, part, salt_install):
    """
    How ``multimaster.master`` installs the Python dependency ``part`` (a key of
    ``multimaster_pillarcheck.PYTHON_DEPS``): ``pkg`` (``lookup:master:<part>_pkg``) or ``pip``
    (``lookup:master:<part>_pip`` with Salt's own pip). ``auto`` picks ``pkg`` only for a
    distro-packaged Salt on the system Python: onedir Salt never sees the system's packages.

    salt_install
        ``multimaster_saltcompat.salt_install()`` of this host.
    """
    method = settings["lookup"]["master"][f"{part}_install"]
    if method == "auto":
        return "pkg" if salt_install == "package" else "pip"
    return method


def python_deps(settings, salt_install):
    """
    The Python packages this pillar needs on a master, each as ``{"part", "method", "name"}``:
    pygit2 when gitfs has remotes, psycopg2 when the job cache is on. Raises ``SettingsError``
    when a distro package is wanted and this os_family names none.

    salt_install
        ``multimaster_saltcompat.salt_install()`` of this host.
    """
    wanted = {
        "gitfs": bool(settings["master"]["gitfs"]["remotes"]),
        "job_cache": settings["job_cache"]["enabled"],
    }
    deps = []
    for part in multimaster_pillarcheck.PYTHON_DEPS:
        if wanted[part]:
            method = python_install(settings, part, salt_install)
            name = settings["lookup"]["master"][f"{part}_{method}"]
            multimaster_pillarcheck.check_package_name(part, method, name)
            deps.append({"part": part.replace("_", "-"), "method": method, "name": name})
    return deps


def job_cache_config(settings):
    """
    The ``master.d`` options of the shared job cache (None when it is off), its password among
    them: written to a 0600 file of their own, like the cluster secret. Raises ``SettingsError``
    when the pillar this master's control minion sees holds no password.

    settings
        The merged ``multimaster`` settings.
    """
    job_cache = settings["job_cache"]
    if not job_cache["enabled"]:
        return None
    multimaster_pillarcheck.check_job_cache_password(job_cache)
    return multimaster_jobcache.master_options(job_cache)


def shares_cluster_aes(settings):
    """
    Does the set need the cluster AES key reactor (mode cluster, isolated filesystem)? No shared
    ``cluster_pki_dir`` carries a master's new key to its peers there.
    """
    return settings["mode"] == "cluster" and bool(settings["cluster"]["isolated_filesystem"])


def watches_roots(settings):
    """
    Does each master run the roots watch engine? Modes hot and failover, unless pillar turns
    it off: a cluster's masters take no ``sync_roots``.
    """
    return bool(settings["master"]["roots_watch"]) and settings["mode"] != "cluster"


ROOTS_WATCH_ENGINE = "multimaster_rootswatch"


def _engine_name(engine):
    return next(iter(engine), None) if isinstance(engine, dict) else engine


def engines_with_roots_watch(own):
    """
    The master's ``engines`` with the roots watch added: Salt takes a ``master.d`` list over
    the ``master`` file's whole, so the master's own engines (``own``, a list or Salt's mapping
    form) are rendered beside it.
    """
    if isinstance(own, dict):
        own = [{name: opts} for name, opts in own.items()]
    kept = [e for e in own or [] if _engine_name(e) != ROOTS_WATCH_ENGINE]
    return [*kept, {ROOTS_WATCH_ENGINE: {}}]


def syncs_master_modules(settings):
    """
    Does ``multimaster.master`` sync the formula's runners, utils and engines into the
    master's ``extension_modules`` before the restart that loads them (reactors calling the
    runners, the roots watch engine)?
    """
    reactor = settings["reactor"]
    return bool(
        reactor["keys"]
        or reactor["first_highstate"]
        or shares_cluster_aes(settings)
        or watches_roots(settings)
    )


def reactor_config(settings):
    """
    The master's ``reactor`` list: the switches of ``multimaster:reactor`` that are on, and the
    cluster AES key reactor where ``shares_cluster_aes`` (empty when none is).

    settings
        The merged ``multimaster`` settings.
    """
    reactor = settings["reactor"]
    reactors = [
        {tag: [sls]}
        for key, (tag, sls) in multimaster_pillarcheck.REACTORS.items()
        if reactor.get(key)
    ]
    if shares_cluster_aes(settings):
        tag, sls = CLUSTER_AES_REACTOR
        reactors.append({tag: [sls]})
    return reactors


def reactors_with_own(own, ours):
    """
    The master's ``reactor`` list with the formula's entries ``ours`` added: as with
    ``engines``, a ``master.d`` list replaces the ``master`` file's whole, so the master's own
    entries (``own``) are rendered first (an entry Salt finds twice across ``master.d`` files
    runs once: it drops equal list items when it merges them).
    """
    kept = [entry for entry in own if isinstance(entry, dict)] if isinstance(own, list) else []
    return [*kept, *(entry for entry in ours if entry not in kept)]


def set_config(settings):
    """
    The ``master.d`` options that change when the set of masters does, kept in a file of their
    own that ``multimaster.master`` writes without restarting the master: the ``multimaster``
    section (the runners, reactions included, read it from the config on disk) and the
    ``peer_run`` entry of the transfer pull (Salt merges it with the master's other
    ``peer_run`` entries). A running master keeps the pull entry it started with; a control
    minion added since pulls through the file server, which needs none (``ContentPull``).

    settings
        The merged, validated ``multimaster`` settings.
    """
    return {
        multimaster_pillarcheck.ROOT: runner_section(settings),
        "peer_run": pull_acl(settings),
    }


def master_config(settings, master, own=None):
    """
    The ``master.d`` options for ``master`` (an entry of ``settings["masters"]``) that take a
    restart to apply; ``set_config`` has the others. Salt reads ``master.d`` after the
    master's own ``master`` file and a key set here replaces the one there, so only what
    pillar sets is rendered; where the set needs a value of its own (file server backends,
    ``peer_run``) it extends the master's own.

    own
        The master's own options, as its config without the formula's files sets them
        (``fileserver_backend``, ``peer_run``, ``engines``, ``reactor``); Salt's defaults
        where absent.
    """
    own = own or {}
    section = settings["master"]
    config = {
        "publish_port": settings["ports"]["publish"],
        "ret_port": settings["ports"]["ret"],
    }
    interface = _interface(settings, master)
    if interface:
        config["interface"] = interface
    if settings["mode"] == "cluster":
        # Salt's cluster looks a master up among its peers by its id (less ``_master``), which
        # defaults to the hostname: unset, the peers never find their entry and never form.
        config["id"] = interface
    # A master's own roots (masters sharing a host need different paths) win.
    for key in multimaster_pillarcheck.ROOTS_KEYS:
        if key in master or key in section:
            config[key] = master.get(key, section.get(key))
    # Identical on every master: masters with different ACLs each hold independent control.
    config.update(section["acl"])
    peer_run = {**(own.get("peer_run") or {}), **(section["acl"].get("peer_run") or {})}
    if peer_run:
        config["peer_run"] = peer_run
    if multimaster_pillarcheck.signs(settings):
        config["master_sign_pubkey"] = True
    if settings["sse"]["enabled"]:
        config["sseapi_cluster_id"] = settings["sse"]["cluster_id"]
        config["sseapi_failover_master"] = settings["mode"] == "failover"
    reactors = reactor_config(settings)
    if reactors:
        config["reactor"] = reactors_with_own(own.get("reactor"), reactors)
    gitfs = section["gitfs"]
    config["fileserver_backend"] = fileserver_backends(
        section.get("fileserver_backend") or own.get("fileserver_backend") or ["roots"],
        bool(gitfs["remotes"]),
    )
    if gitfs["remotes"]:
        config["gitfs_provider"] = gitfs["provider"]
        config["gitfs_remotes"] = gitfs["remotes"]
    if watches_roots(settings):
        config["engines"] = engines_with_roots_watch(own.get("engines"))
    config.update(section["config"])
    return config


def _interface(settings, master):
    """
    The address ``master`` binds where the set decides it (cluster mode: the address its
    peers dial) or pillar names one; None leaves the master's own setting alone.
    """
    if settings["mode"] == "cluster":
        return multimaster_pillarcheck.cluster_address(master)
    return master.get("interface") or settings["master"].get("interface")


def minion_config(settings, local_master=None):
    """
    The ``minion.d`` options that make a minion hot, failover or cluster-balanced.

    settings
        The merged ``multimaster`` settings.

    local_master
        The master entry this minion controls, if any. In mode cluster a control minion talks
        to its own master, not the balancer: the runners address a master through its control
        minion, and its master alone holds its session key. In mode failover a control minion
        always fails back to the primary: the runners reach it only there, and a Salt 3008
        failover minion leaves a master the moment its connection drops (any restart).
    """
    mode = settings["mode"]
    minion = settings["minion"]
    if mode == "cluster" and local_master:
        hosts = [multimaster_pillarcheck.cluster_address(local_master)]
    elif mode == "cluster":
        hosts = [settings["cluster"]["balancer"]]
    else:
        hosts = minion_master_list(settings["masters"], settings["reserved"])
    config = {
        "master": hosts,
        "master_port": settings["ports"]["ret"],
        "publish_port": settings["ports"]["publish"],
        "master_type": "failover" if mode == "failover" else "str",
        "retry_dns": minion["retry_dns"],
        "master_tries": minion["master_tries"],
    }
    if mode == "failover":
        failover = settings["failover"]
        config.update(
            {
                "master_alive_interval": failover["alive_interval"],
                "master_failback": failover["failback"] or local_master is not None,
                "master_failback_interval": failover["failback_interval"],
                "random_master": failover["shuffle"],
                "random_reauth_delay": failover["random_reauth_delay"],
            }
        )
    if multimaster_pillarcheck.signs(settings):
        config["verify_master_pubkey_sign"] = True
    if minion["ipc_mode"] == "tcp":
        # Salt 3008 runs one minion event bus for all master connections: one port pair.
        config.update(
            {
                "ipc_mode": "tcp",
                "tcp_pub_port": minion["tcp_pub_port"],
                "tcp_pull_port": minion["tcp_pull_port"],
            }
        )
    return config


def minion_master_list(masters, reserved):
    """
    The ``master`` list of a hot or failover minion: the masters' hosts in pillar order, then
    the ``reserved`` slots. A master whose host is reserved keeps its slot's place, so a
    master added into a slot leaves every minion's list as it was.
    """
    listed = [master["host"] for master in masters if master["host"] not in reserved]
    return listed + list(reserved)


def unresolvable(hosts, ipv6=None, getaddrinfo=socket.getaddrinfo):
    """
    The entries of ``hosts`` (a minion's ``master`` list) this host cannot resolve, in order.
    A minion resolves each master it lists before it connects (Salt's ``resolve_dns``), and
    a hot minion waits there (``retry_dns``, every 30 s) before it serves any other master.
    An IP address resolves by itself. Resolution only: Salt's ``dns_check`` also tries to
    connect, which an address where no master runs yet (a reserved slot) would fail.

    ipv6
        The minion's ``ipv6`` option: ``False`` resolves IPv4 addresses only, as Salt does.
    """
    family = socket.AF_INET if ipv6 is False else socket.AF_UNSPEC
    missing = []
    for host in hosts:
        try:
            getaddrinfo(host, None, family, socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            missing.append(host)
    return missing


def cluster_config(settings, master, pki_dir):
    """
    The cluster options of ``master`` (an entry of ``settings["masters"]``), ``cluster_secret``
    among them: written to a 0600 ``master.d`` file of their own. Raises ``SettingsError`` when
    the pillar this host sees holds no secret.

    pki_dir
        That master's ``pki_dir``; ``cluster_pki_dir`` defaults to ``cluster`` beside it.
    """
    cluster = settings["cluster"]
    multimaster_pillarcheck.check_cluster_host(cluster)
    address = multimaster_pillarcheck.cluster_address(master)
    peers = master.get("cluster_peers") or [
        multimaster_pillarcheck.cluster_address(other)
        for other in settings["masters"]
        if other is not master
    ]
    multimaster_pillarcheck.check_cluster_peers_found(settings["masters"], peers)
    config = {
        "cluster_id": cluster["id"],
        "cluster_peers": [peer for peer in peers if peer != address],
        "cluster_pki_dir": master.get("cluster_pki_dir")
        or cluster["pki_dir"]
        or os.path.join(os.path.dirname(os.path.normpath(pki_dir)), "cluster"),
        "cluster_pool_port": cluster["pool_port"],
        "cluster_isolated_filesystem": cluster["isolated_filesystem"],
        # The balancer's publish timeouts are the same value (haproxy_config).
        "publish_session": cluster["publish_session"],
        "cluster_secret": cluster["secret"],
    }
    # Salt recommends mmap_key with an isolated filesystem, but 3008.3's cluster join reads
    # pki_dir/master.pub as a file, which mmap_key never writes: a joining master crashes on
    # start. So '' pins localfs_key there (Salt's docs say isolated masters default to mmap_key).
    driver = cluster["keys_cache_driver"] or (
        "localfs_key" if cluster["isolated_filesystem"] else ""
    )
    if driver and multimaster_saltcompat.has_key_cache():
        config[multimaster_saltcompat.KEY_CACHE_OPTION] = driver
    if multimaster_saltcompat.can_replace_voters():
        # Salt 3008.3 has no command that takes a member out of the Raft vote: a removed master
        # would count in every majority after it. Off, the leader demotes none that is silent.
        config["cluster_auto_replace_voters"] = cluster["auto_replace_voters"]
    if master.get("cluster_pub_fingerprint"):
        config["cluster_pub_fingerprint"] = master["cluster_pub_fingerprint"].lower()
    return config
