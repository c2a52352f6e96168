"""
States of the ``multimaster`` formula.

``minion_restarted`` restarts salt-minion after the job that runs it has returned, so a highstate
that changes the master list still reports its result. ``master_key_files_secure`` reports master
key files whose type, mode or owner is wrong. ``haproxy_configured``/``haproxy_running`` keep the
balancer of a master cluster: a configuration HAProxy refuses never replaces the live one.
``master_config_managed``/``cluster_config_managed``/``job_cache_config_managed`` keep the 0600
``master.d`` files that may hold a secret, computed at run time (``multimaster_local``): the
execution module's returns and the rendered SLS only ever see them masked.
``job_cache_returner_installed`` puts the formula's job cache returner where the master loads
it; ``job_cache_schema_present`` prepares the shared job cache database.
"""

import difflib
import hashlib
import os
import pwd
import stat

import salt.utils.yaml
from salt.exceptions import CommandExecutionError

try:
    import multimaster_haproxy
    import multimaster_jobcache
    import multimaster_keys
    import multimaster_local
    import multimaster_safefs

    HAS_UTILS = True
except ImportError:
    HAS_UTILS = False

__virtualname__ = "multimaster"


def __virtual__():
    if not HAS_UTILS or "multimaster.restart_minion" not in __salt__:
        return (False, "multimaster: execution module not synced; run saltutil.sync_all")
    return __virtualname__


def _restarted(name, daemon, scheduled_by):
    ret = {"name": name, "result": True, "changes": {}, "comment": ""}
    if __opts__["test"]:
        ret["result"] = None
        ret["comment"] = f"{daemon} would be restarted after this job returns"
        return ret
    scheduled = scheduled_by()
    if scheduled["scheduled"]:
        ret["changes"] = {"restart": scheduled["how"]}
        ret["comment"] = f"{daemon} will restart after this job returns"
    else:
        ret["comment"] = f"{daemon} not restarted: {scheduled['reason']}"
    return ret


def minion_restarted(name, service="salt-minion", delay=0):
    """
    Restart salt-minion once the current job has returned. Use it with ``onchanges`` on the
    minion's config files. Where no salt-minion runs (``salt-call --local`` in an image build)
    it succeeds without doing anything.

    name
        Anything; shown in the state output.

    service
        The systemd unit name, used when the minion runs as that service.

    delay
        Seconds to wait after the job returned before restarting (default 0).

    CLI Example:

    .. code-block:: yaml

        multimaster-minion-service-restarted:
          multimaster.minion_restarted:
            - onchanges:
              - file: multimaster-minion-config-file-managed
    """
    return _restarted(
        name,
        "salt-minion",
        lambda: __salt__["multimaster.restart_minion"](service=service, delay=delay),
    )


def master_restarted(name, service="salt-master", delay=0):
    """
    Restart this host's salt-master (the master whose control minion runs the state; its config
    dir and pidfile come from the pillar ``multimaster:masters``) once the current job has
    returned: as a systemd unit where it is one, else ``salt-master -c <config dir> -d``. A
    master that is not running is left alone.

    name
        Anything; shown in the state output.

    service
        The systemd unit name, used when the master runs as that unit.

    delay
        Seconds to wait after the job has returned.

    CLI Example:

    .. code-block:: yaml

        multimaster-master-service-running-master-restarted:
          multimaster.master_restarted:
            - onchanges:
              - multimaster: multimaster-master-config-file-managed
    """
    return _restarted(
        name,
        "salt-master",
        lambda: __salt__["multimaster.restart_master"](service=service, delay=delay),
    )


def mod_watch(name, sfun=None, service=None, delay=0, **kwargs):
    """
    Restart on ``watch``, as ``minion_restarted``/``master_restarted`` do. Salt passes the whole
    low chunk (``__reqs__``, ``__id__`` ...) as keyword arguments: only ours are used.

    name
        Anything; shown in the state output.

    sfun
        The state function the watching state uses.

    service, delay
        As for ``minion_restarted``/``master_restarted``.

    kwargs
        The rest of the low chunk; ignored.

    CLI Example:

    .. code-block:: yaml

        multimaster-minion-service-restarted:
          multimaster.minion_restarted:
            - watch:
              - file: multimaster-minion-config-file-managed
    """
    if sfun == "master_restarted":
        return master_restarted(name, service=service or "salt-master", delay=delay)
    if sfun == "haproxy_running":
        return haproxy_running(name, kwargs.get("pidfile"), reload=True)
    return minion_restarted(name, service=service or "salt-minion", delay=delay)


def master_key_files_secure(name, pki_dir, user):
    """
    Fail, naming each file, when master key files in ``pki_dir`` are not regular files owned by
    ``user``, or a private one gives anyone else access (0400 is what Salt and the formula
    write). Only reports: moving keys is ``sync_master_key``'s job.

    name
        Anything; shown in the state output.

    pki_dir
        The master's ``pki_dir``.

    user
        The user the master runs as (its ``user`` option), who must own the key files.

    CLI Example:

    .. code-block:: yaml

        multimaster-master-key-files-secure:
          multimaster.master_key_files_secure:
            - pki_dir: /etc/salt/pki/master
            - user: salt
    """
    problems = __salt__["multimaster.key_file_problems"](pki_dir, user)
    return {
        "name": name,
        "result": not problems,
        "changes": {},
        "comment": "; ".join(problems) or f"Master key files in {pki_dir} are secure",
    }


def master_key_served(name, fingerprint, signing=False):
    """
    Ensure the master on this host serves the key with ``fingerprint`` (ours: SHA-256 of the DER
    public key; with ``signing``, the signing pair's). Checked by a real sign-in, not a file read.
    When the stored key already has that fingerprint but the running master serves another (keys
    swapped on disk without a restart), the master is restarted and checked again. A stored key
    with another fingerprint cannot be fixed here: run ``salt-run multimaster.sync_master_key``.
    The master, its address and ports come from the pillar ``multimaster`` (this minion's entry).

    name
        Anything; shown in the state output.

    fingerprint
        The intended fingerprint (colon hex), as ``salt-run multimaster.status`` shows it.

    signing
        Check the signing pair (failover with signing) instead of the master key.

    CLI Example:

    .. code-block:: yaml

        multimaster-master-key-served:
          multimaster.master_key_served:
            - fingerprint: 'e1:b9:...:94'
    """
    ret = {"name": name, "result": False, "changes": {}, "comment": ""}
    info = __salt__["multimaster_peer.master_key_info"](signing=signing)
    stored = multimaster_keys.fingerprint(info["pub"]) if info["pub"] else None
    if stored != fingerprint:
        ret["comment"] = (
            f"{info['name']} has fingerprint {stored}, not {fingerprint}: "
            "run salt-run multimaster.sync_master_key on the primary"
        )
        return ret
    local = __salt__["multimaster.settings"]()
    host, port = local["local"]["master"]["host"], local["ports"]["ret"]
    master_pub, sign_pub = (info["own_pub"], info["pub"]) if signing else (info["pub"], None)
    verify = __salt__["multimaster_peer.verify_master_key"]
    check = verify(host, port, master_pub, sign_pub, timeout=5)
    if check["served"]:
        ret.update(result=True, comment=f"The master serves {fingerprint}")
        return ret
    if __opts__["test"]:
        ret.update(
            result=None,
            comment=f"The master does not serve {fingerprint} ({check['reason']}); "
            "it would be restarted",
        )
        return ret
    restarted = __salt__["multimaster.restart_master_now"]()
    check = verify(host, port, master_pub, sign_pub, timeout=60)
    ret["changes"] = {"restarted": restarted}
    ret["result"] = check["served"]
    ret["comment"] = (
        f"Restarted; the master now serves {fingerprint}"
        if check["served"]
        else f"Restarted, but the master still does not serve {fingerprint}: {check['reason']}"
    )
    return ret


def haproxy_configured(name):
    """
    Ensure the HAProxy configuration file ``name`` holds what the pillar ``multimaster``
    (mode cluster) describes. The new text is checked with ``haproxy -c`` before it replaces the
    live file: when HAProxy refuses it, the state fails with HAProxy's message and the running
    balancer keeps its configuration. The return carries a diff (nothing in it is secret).

    name
        The configuration file (``multimaster:cluster:haproxy:config_file``).

    CLI Example:

    .. code-block:: yaml

        multimaster-haproxy-config-managed:
          multimaster.haproxy_configured:
            - name: /etc/haproxy/haproxy.cfg
    """
    ret = {"name": name, "result": True, "changes": {}, "comment": ""}
    text = __salt__["multimaster.haproxy_config"]()
    current = multimaster_haproxy.read(name)
    if current == text:
        ret["comment"] = f"{name} is up to date"
        return ret
    diff = "".join(
        difflib.unified_diff((current or "").splitlines(True), text.splitlines(True), name, name)
    )
    if __opts__["test"]:
        ret.update(result=None, changes={"diff": diff}, comment=f"{name} would be updated")
        return ret
    try:
        multimaster_haproxy.install(name, text)
    except CommandExecutionError as exc:
        ret.update(result=False, comment=str(exc))
        return ret
    ret.update(changes={"diff": diff}, comment=f"{name} updated (haproxy -c accepted it)")
    return ret


def haproxy_running(name, pidfile, reload=False):
    """
    Ensure an HAProxy of configuration ``name`` runs as ``haproxy -D -p <pidfile>`` (no system
    service: labs, containers). With ``watch`` on the configuration state it reloads gracefully
    (``-sf``) when the file changed. A pidfile naming a process that is not that HAProxy is
    treated as stale: that process is never signalled.

    name
        The configuration file.

    pidfile
        Where HAProxy records its pid.

    reload
        Reload even when it runs (``watch`` passes it).

    CLI Example:

    .. code-block:: yaml

        multimaster-haproxy-running:
          multimaster.haproxy_running:
            - name: /srv/lb/haproxy.cfg
            - pidfile: /srv/lb/haproxy.pid
            - watch:
              - multimaster: multimaster-haproxy-config-managed
    """
    ret = {"name": name, "result": True, "changes": {}, "comment": ""}
    running = multimaster_haproxy.running_pids(pidfile, name)
    if running and not reload:
        ret["comment"] = f"HAProxy of {name} runs (pid {', '.join(map(str, running))})"
        return ret
    action = "reloaded" if running else "started"
    if __opts__["test"]:
        ret.update(result=None, comment=f"HAProxy of {name} would be {action}")
        return ret
    try:
        done = multimaster_haproxy.start_or_reload(name, pidfile)
    except CommandExecutionError as exc:
        ret.update(result=False, comment=str(exc))
        return ret
    ret.update(changes={"haproxy": done}, comment=f"HAProxy of {name} {done}")
    return ret


def _configs():
    """
    This host's config files with the secrets in clear (never returned, never a state argument).
    """
    return multimaster_local.settings(__salt__, __opts__, __grains__, __context__)["config"]


def _is_current(name, data, mode, owner):
    """
    ``name`` is a regular file (not a link) holding ``data``, of ``mode``, owned by ``owner``
    (a ``pwd`` entry; None: any owner).
    """
    try:
        st = os.lstat(name)
    except FileNotFoundError:
        return False
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_mode & 0o777 == mode
        and (owner is None or (st.st_uid, st.st_gid) == (owner.pw_uid, owner.pw_gid))
        and (multimaster_safefs.sha256_file(name) == hashlib.sha256(data).hexdigest())
    )


def _write_owned(name, data, mode, owner):
    """
    Write ``data`` to ``name`` with ``mode``, owned by ``owner`` (None: left to this process):
    staged beside it, fsync'd, renamed; never through a link. Raises ``OSError``.
    """
    directory, base = os.path.split(name)
    multimaster_safefs.write_file(directory, base, [data], mode)
    if owner is not None:
        os.chown(name, owner.pw_uid, owner.pw_gid, follow_symlinks=False)


def _secret_config_managed(name, part, user):
    """
    Keep ``name`` a 0600 file owned by ``user`` that holds this host's ``part`` config, computed
    here at run time: passed as a state argument, a secret in it would be returned by
    ``state.show_sls`` and stored in the minion's ``highstate.cache.p`` with the rest of the
    compiled states. The return never shows the content. Written atomically (temp file in the
    same directory, fsync, rename).
    """
    ret = {"name": name, "result": True, "changes": {}, "comment": ""}
    config = _configs().get(part)
    if not config:
        ret.update(result=False, comment=f"no {part} options in the pillar for this master")
        return ret
    data = salt.utils.yaml.safe_dump(config, default_flow_style=False).encode()
    owner = pwd.getpwnam(user) if user else None
    if _is_current(name, data, 0o600, owner):
        ret["comment"] = f"{name} is up to date"
        return ret
    if __opts__["test"]:
        ret.update(
            result=None, changes={"diff": "<secret: not shown>"}, comment=f"{name} would be updated"
        )
        return ret
    os.makedirs(os.path.dirname(name), mode=0o755, exist_ok=True)
    try:
        # The master may run as its own user: it must read its options; nobody else may.
        _write_owned(name, data, 0o600, owner)
    except OSError as exc:
        ret.update(result=False, comment=f"cannot write {name}: {exc.strerror or exc}")
        return ret
    ret.update(changes={"diff": "<secret: not shown>"}, comment=f"{name} updated")
    return ret


def master_config_managed(name, user=None):
    """
    Ensure ``name`` (a ``master.d`` file, mode 0600) holds the options of the master this minion
    controls, derived from the pillar ``multimaster``: interface, ports, roots, ACLs, the
    ``multimaster`` section the runners read, gitfs remotes (their URLs may carry credentials)
    and ``master:config`` (any of it may be secret). Computed at run time, never a state
    argument; the return never shows the content.

    name, user
        As for ``cluster_config_managed``: the file, and the user the master runs as (owner).

    CLI Example:

    .. code-block:: yaml

        multimaster-master-config-file-managed:
          multimaster.master_config_managed:
            - name: /etc/salt/master.d/multimaster.conf
            - user: salt
    """
    return _secret_config_managed(name, "master", user)


def master_runners_synced(name):
    """
    Ensure the salt-master this minion controls holds the formula's runners and utils from its
    own file server in its ``extension_modules`` (``multimaster.sync_master_modules`` without a
    restart): a master's reactor keeps the runners it loaded, so a master whose reactors call
    them needs them before the restart this state's changes trigger.

    name
        A label (the master id).

    CLI Example:

    .. code-block:: yaml

        multimaster-master-config-runners-synced:
          multimaster.master_runners_synced:
            - name: master2
    """
    ret = {"name": name, "result": True, "changes": {}, "comment": ""}
    if __opts__.get("test"):
        ret.update(result=None, comment="the master's runners would be synced from its roots")
        return ret
    try:
        synced = __salt__["multimaster.sync_master_modules"](
            restart=False, forms=["runners", "utils"]
        )["synced"]
    except CommandExecutionError as exc:
        ret.update(result=False, comment=str(exc))
        return ret
    if synced:
        ret["changes"] = synced
        ret["comment"] = "runners synced into the master's extension_modules"
    else:
        ret["comment"] = "the master's runners are current"
    return ret


def cluster_config_managed(name, user=None):
    """
    Ensure ``name`` (a ``master.d`` file, mode 0600) holds this master's cluster options from the
    pillar ``multimaster`` (mode cluster), ``cluster_secret`` among them. The options are
    computed at run time, never a state argument; the return never shows the content.

    name
        The file to manage.

    user
        The user the master runs as (its ``user`` option): the file's owner. Default: leave
        the owner as the writing process makes it.

    CLI Example:

    .. code-block:: yaml

        multimaster-cluster-config-file-managed:
          multimaster.cluster_config_managed:
            - name: /etc/salt/master.d/multimaster-cluster.conf
            - user: salt
    """
    return _secret_config_managed(name, "cluster", user)


def job_cache_config_managed(name, user=None):
    """
    Ensure ``name`` (a ``master.d`` file, mode 0600) holds this master's job cache options from
    the pillar ``multimaster:job_cache``: ``master_job_cache`` and the returner's connection
    settings, the database password among them. Computed at run time, never a state argument;
    the return never shows the content.

    name
        The file to manage.

    user
        The user the master runs as (its ``user`` option): the file's owner.

    CLI Example:

    .. code-block:: yaml

        multimaster-master-config-job-cache-managed:
          multimaster.job_cache_config_managed:
            - name: /etc/salt/master.d/multimaster-job-cache.conf
            - user: salt
    """
    return _secret_config_managed(name, "job_cache", user)


def _makedirs_owned(directory, owner):
    """
    Create ``directory`` and its missing parents (0755), each owned by ``owner`` (None: left to
    this process).
    """
    missing = []
    while not os.path.isdir(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    for path in reversed(missing):
        os.mkdir(path, 0o755)
        if owner is not None:
            os.chown(path, owner.pw_uid, owner.pw_gid, follow_symlinks=False)


def _synced_returner(base):
    """
    The content of the returner ``base`` (a file name) as ``saltutil.sync_all`` synced it to
    this minion. Raises ``CommandExecutionError`` naming what to run.
    """
    path = os.path.join(__opts__["extension_modules"], "returners", base)
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise CommandExecutionError(
            f"the formula's returner is not synced to this minion ({path}: "
            f"{exc.strerror or exc}); run saltutil.sync_all on it, then apply again"
        ) from None


def job_cache_returner_installed(name, user=None):
    """
    Ensure ``name`` (``<the master's extension_modules>/returners/multimaster_pgjsonb.py``) is
    the formula's job cache returner as synced to this minion, mode 0644, owned by ``user``:
    the master loads its ``master_job_cache`` from there when it starts. Installed here rather
    than by the master's own ``saltutil.sync_all`` because a master that joins the set has no
    formula in its roots yet, and a master whose ``master_job_cache`` names a returner it lacks
    publishes nothing. Directories it creates are owned by ``user`` too, so that the master's
    own ``saltutil.sync_all`` can still write there.

    name
        The file to install: ``<returner>.py`` in a ``returners`` directory, the returner one
        of the formula's (``multimaster_pgjsonb``).

    user
        The user the master runs as (its ``user`` option): the owner.

    CLI Example:

    .. code-block:: yaml

        multimaster-master-config-job-cache-returner-installed:
          multimaster.job_cache_returner_installed:
            - name: /var/cache/salt/master/extmods/returners/multimaster_pgjsonb.py
            - user: salt
    """
    ret = {"name": name, "result": True, "changes": {}, "comment": ""}
    base = os.path.basename(name)
    if base not in [f"{returner}.py" for returner in multimaster_jobcache.RETURNERS]:
        expected = ", ".join(f"{returner}.py" for returner in multimaster_jobcache.RETURNERS)
        ret.update(result=False, comment=f"{name}: expected a file named {expected}")
        return ret
    try:
        data = _synced_returner(base)
    except CommandExecutionError as exc:
        ret.update(result=False, comment=str(exc))
        return ret
    owner = pwd.getpwnam(user) if user else None
    if _is_current(name, data, 0o644, owner):
        ret["comment"] = f"{name} is up to date"
        return ret
    action = "updated" if os.path.lexists(name) else "installed"
    if __opts__["test"]:
        ret.update(result=None, changes={"returner": action}, comment=f"{name} would be {action}")
        return ret
    try:
        _makedirs_owned(os.path.dirname(name), owner)
        _write_owned(name, data, 0o644, owner)
    except OSError as exc:
        ret.update(result=False, comment=f"cannot write {name}: {exc.strerror or exc}")
        return ret
    ret.update(changes={"returner": action}, comment=f"{name} {action}")
    return ret


def job_cache_schema_present(name):
    """
    Ensure the job cache database holds the tables the ``multimaster_pgjsonb`` returner writes to
    (those of Salt's ``pgjsonb``) and the trigger that keeps a job's published load (target,
    arguments) from being replaced by a return's, creating what is missing (idempotent; masters
    applying at once take turns on a database lock). The connection comes from the pillar
    ``multimaster:job_cache`` at run time; the return names the database as
    ``user@host:port/dbname``, never the password.

    name
        A label for the state (the database is the pillar's).

    CLI Example:

    .. code-block:: yaml

        multimaster-master-config-job-cache-schema:
          multimaster.job_cache_schema_present:
            - name: job cache schema
    """
    ret = {"name": name, "result": True, "changes": {}, "comment": ""}
    options = _configs().get("job_cache")
    if not options:
        ret.update(result=False, comment="the job cache is not enabled in the pillar")
        return ret
    conn = multimaster_jobcache.connection(options)
    where = multimaster_jobcache.describe(conn)
    try:
        missing = multimaster_jobcache.missing_schema(conn)
        if missing and __opts__["test"]:
            ret.update(
                result=None,
                changes={"schema": {"old": [], "new": missing}},
                comment=f"{where}: would create {', '.join(missing)}",
            )
            return ret
        if missing:
            missing = multimaster_jobcache.ensure_schema(conn)
    except multimaster_jobcache.JobCacheError as exc:
        ret.update(result=False, comment=str(exc))
        return ret
    if missing:
        ret.update(
            changes={"schema": {"old": [], "new": missing}},
            comment=f"{where}: created {', '.join(missing)}",
        )
    else:
        ret["comment"] = f"{where}: the job cache schema is present"
    return ret
