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
it; ``job_cache_schema_present`` prepares the shared job cache database. What a state does beyond
one execution-module call (writing files, their owners) is in ``multimaster_states``.
"""

from salt.exceptions import CommandExecutionError

try:
    import multimaster_haproxy
    import multimaster_states

    HAS_UTILS = True
except ImportError:
    HAS_UTILS = False

__virtualname__ = "multimaster"


def __virtual__():
    if not HAS_UTILS or "multimaster_daemons.restart_minion" not in __salt__:
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
        lambda: __salt__["multimaster_daemons.restart_minion"](service=service, delay=delay),
    )


def master_restarted(name, service="salt-master", delay=0):
    """
    Restart this host's salt-master (the master whose control minion runs the state; its config
    dir and pidfile come from the pillar ``multimaster:masters``) once the current job has
    returned and no other minion still runs it (at most 120 s): as a systemd unit where it is
    one, else ``salt-master -c <config dir> -d``. A master that is not running is left alone.

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
        lambda: __salt__["multimaster_daemons.restart_master"](service=service, delay=delay),
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
    return multimaster_states.master_key_served_ret(
        name, fingerprint, signing, __salt__, __opts__["test"]
    )


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
    text = __salt__["multimaster.haproxy_config"]()
    return multimaster_states.haproxy_config_ret(name, text, __opts__["test"])


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
    return multimaster_states.host_configs(__salt__, __opts__, __grains__, __context__)


def _secret_config_managed(name, part, user):
    """
    ``name`` kept a 0600 file owned by ``user`` holding this host's ``part`` config, computed
    here at run time (``multimaster_states.secret_config_ret``).
    """
    config = _configs().get(part)
    return multimaster_states.secret_config_ret(name, config, part, user, __opts__["test"])


def master_set_config_managed(name, user=None):
    """
    Ensure ``name`` (a ``master.d`` file, mode 0600) holds what changes when the set of masters
    does: the ``multimaster`` section the runners read from the config on disk, and the
    ``peer_run`` entry of the transfer pull. No restart watches it: a master added to the set
    or an epoch raised by a promotion reaches the runners (and the reactions' runner calls)
    at their next run, and the running masters keep serving.

    name, user
        As for ``master_config_managed``: the file, and the user the master runs as (owner).

    CLI Example:

    .. code-block:: yaml

        multimaster-master-config-set-managed:
          multimaster.master_set_config_managed:
            - name: /etc/salt/master.d/multimaster-set.conf
            - user: salt
    """
    return _secret_config_managed(name, "set", user)


def master_config_managed(name, user=None):
    """
    Ensure ``name`` (a ``master.d`` file, mode 0600) holds the options of the master this minion
    controls, derived from the pillar ``multimaster``: interface, ports, roots, ACLs, gitfs
    remotes (their URLs may carry credentials) and ``master:config`` (any of it may be
    secret): what takes a master restart to apply (``master_set_config_managed`` has the
    rest). Computed at run time, never a state argument; the return never shows the content.

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
    Ensure the salt-master this minion controls holds the formula's runners, utils and engines
    from its own file server in its ``extension_modules``
    (``multimaster_daemons.sync_master_modules`` without a restart): a master's reactor keeps
    the runners it loaded and its engines the modules they started with, so a master whose
    reactors call the runners, or that runs the roots watch engine, needs them before the
    restart this state's changes trigger.

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
        synced = __salt__["multimaster_daemons.sync_master_modules"](
            restart=False, forms=["runners", "utils", "engines"]
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
    return multimaster_states.job_cache_returner_ret(name, user, __opts__)


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
    options = _configs().get("job_cache")
    return multimaster_states.job_cache_schema_ret(name, options, __opts__["test"])
