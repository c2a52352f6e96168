"""
States of the ``multimaster`` formula.

``minion_restarted`` restarts salt-minion after the job that runs it has returned, so a highstate
that changes the master list still reports its result. ``master_key_files_secure`` reports master
key files whose type, mode or owner is wrong.
"""

__virtualname__ = "multimaster"


def __virtual__():
    if "multimaster.restart_minion" not in __salt__:
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


def master_restarted(name, pidfile, service="salt-master", delay=0):
    """
    Restart the salt-master recorded in ``pidfile`` once the current job has returned, as a
    service where it is one, else as a ``-d`` daemon with its own command line. A master that is
    not running is left alone.

    CLI Example:

    .. code-block:: yaml

        multimaster-master-service-running-master-restarted:
          multimaster.master_restarted:
            - pidfile: /var/run/salt-master.pid
            - onchanges:
              - file: multimaster-master-config-file-managed
    """
    return _restarted(
        name,
        "salt-master",
        lambda: __salt__["multimaster.restart_master"](pidfile, service=service, delay=delay),
    )


def mod_watch(name, sfun=None, **kwargs):
    """
    Restart on ``watch``, as ``minion_restarted``/``master_restarted`` do.
    """
    if sfun == "master_restarted":
        return master_restarted(name, **kwargs)
    return minion_restarted(name, **kwargs)


def master_key_files_secure(name, pki_dir, user):
    """
    Fail, naming each file, when master key files in ``pki_dir`` are not regular files with mode
    0400 (private) owned by ``user``. Only reports: moving keys is ``sync_master_key``'s job.

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


def master_key_served(name, fingerprint, host, port=4506, config_dir=None, signing=False):
    """
    Ensure the master on this host serves the key with ``fingerprint`` (ours: SHA-256 of the DER
    public key; with ``signing``, the signing pair's). Checked by a real sign-in, not a file read.
    When the stored key already has that fingerprint but the running master serves another (keys
    swapped on disk without a restart), the master is restarted and checked again. A stored key
    with another fingerprint cannot be fixed here: run ``salt-run multimaster.sync_master_key``.

    name
        Anything; shown in the state output.

    CLI Example:

    .. code-block:: yaml

        multimaster-master-key-served:
          multimaster.master_key_served:
            - fingerprint: 'e1:b9:...:94'
            - host: 10.0.3.230
    """
    ret = {"name": name, "result": False, "changes": {}, "comment": ""}
    info = __salt__["multimaster.master_key_info"](config_dir=config_dir, signing=signing)
    if info["fp"] != fingerprint:
        ret["comment"] = (
            f"{info['name']} has fingerprint {info['fp']}, not {fingerprint}: "
            "run salt-run multimaster.sync_master_key on the primary"
        )
        return ret
    master_pub = info["pub"]
    sign_pub = None
    if signing:
        master_pub = __salt__["multimaster.master_key_info"](config_dir=config_dir)["pub"]
        sign_pub = info["pub"]
    check = __salt__["multimaster.verify_master_key"](host, port, master_pub, sign_pub, timeout=5)
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
    restarted = __salt__["multimaster.restart_master_now"](host, port, config_dir=config_dir)
    check = __salt__["multimaster.verify_master_key"](host, port, master_pub, sign_pub, timeout=60)
    ret["changes"] = {"restarted": restarted}
    ret["result"] = check["served"]
    ret["comment"] = (
        f"Restarted; the master now serves {fingerprint}"
        if check["served"]
        else f"Restarted, but the master still does not serve {fingerprint}: {check['reason']}"
    )
    return ret
