"""
This host's Salt daemons, as the formula's states, orchestrations and runners drive them:
restart the salt-minion or the master it controls once the current job has returned, restart a
master now, start one that does not run, stop one, sync a master's own custom modules, and tell
whether a restart is pending.

Every restart is built from the daemon's own config and its verified pidfile (or its systemd
unit), never from a command line read from ``/proc``: see ``multimaster_daemon``. The settings
(which master this minion controls) come from ``multimaster.settings``.
"""

import os

import salt.loader
from salt.exceptions import CommandExecutionError

try:
    import multimaster_daemon
    import multimaster_keystore

    HAS_UTILS = True
except ImportError:
    HAS_UTILS = False

__virtualname__ = "multimaster_daemons"


def __virtual__():
    if not HAS_UTILS:
        return (
            False,
            "multimaster_daemons: the multimaster_* utils are missing; run saltutil.sync_all",
        )
    return __virtualname__


def minion_settled():
    """
    True when no restart of this salt-minion is pending: ``restart_minion`` restarts it only
    after the job that asked has returned, and until then it still answers a ping.
    ``salt-run multimaster.wait_minions`` asks this, so that it does not report a minion that is
    about to go down.

    CLI Example:

    .. code-block:: bash

        salt '*' multimaster_daemons.minion_settled
    """
    return not multimaster_daemon.restart_pending(__opts__["pidfile"])


def restart_minion(service="salt-minion", delay=0):
    """
    Restart this salt-minion once the current job has returned: as a service where it is one,
    else as a ``salt-minion -c <its config dir> -d`` daemon built from its own config. Does
    nothing (and says so) where no salt-minion runs, e.g. ``salt-call --local`` in an image build.

    service
        The systemd unit name, used when the minion runs as that unit.

    delay
        Seconds to wait after the job has returned.

    CLI Example:

    .. code-block:: bash

        salt '*' multimaster_daemons.restart_minion
    """
    return multimaster_daemon.schedule_restart(
        __opts__["pidfile"],
        service,
        "salt-minion",
        os.path.dirname(__opts__["conf_file"]),
        wait_pid=os.getpid(),
        delay=float(delay),
    )


def _this_master():
    master = __salt__["multimaster.settings"]()["local"]["master"]
    if master is None:
        raise CommandExecutionError(
            f"multimaster:masters: no entry has minion_id {__opts__['id']!r}: this minion "
            "controls no listed master"
        )
    return master


def restart_master(service="salt-master", delay=0):
    """
    Restart this host's salt-master (the master whose control minion this is, its config dir
    and pidfile from the pillar ``multimaster:masters``) once the current job has returned and no
    other minion still runs it (at most 120 s: their returns come to this master too), the
    way it runs: a systemd unit, or ``salt-master -c <config dir> -d``. Does nothing (and says
    so) where it is not running.

    service
        The systemd unit name, used when the master runs as that unit.

    delay
        Seconds to wait after the job has returned.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster_daemons.restart_master
    """
    master = _this_master()
    # The job's other minions (the other masters of `salt 'master*' state.apply ...`) return here.
    drain = multimaster_daemon.job_to_drain(__opts__, os.getpid(), master["config_dir"])
    return multimaster_daemon.schedule_restart(
        master["pidfile"],
        service,
        "salt-master",
        master["config_dir"],
        wait_pid=os.getpid(),
        delay=float(delay),
        drain=drain,
    )


def restart_master_now(service="salt-master", timeout=90):
    """
    Restart this host's salt-master now (the way it runs) and wait until it listens on its ret
    port again. Returns how it was restarted.

    service
        The systemd unit name, used when the master runs as that unit.

    timeout
        Seconds to wait for the ret port.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster_daemons.restart_master_now
    """
    master = _this_master()
    stopped = multimaster_daemon.stop_now(
        master["pidfile"], service, "salt-master", master["config_dir"]
    )
    multimaster_daemon.start_now(stopped, "salt-master", master["config_dir"])
    _await_listening(master, timeout, "the restart")
    return stopped["service"] or "daemon"


def _await_listening(master, timeout, after):
    """
    Wait until ``master`` listens on its ret port; raise, naming ``after``, when it does not.
    """
    mopts = multimaster_keystore.master_opts(master["config_dir"])
    host = master["host"]
    if not multimaster_daemon.wait_port(host, int(mopts["ret_port"]), float(timeout)):
        raise CommandExecutionError(f"salt-master did not listen on {host} after {after}")


def start_master(service="salt-master", timeout=90):
    """
    Start this host's salt-master (the master whose control minion this is) unless it runs, and
    wait until it listens on its ret port: what ``multimaster.orch.add_master`` runs on a new
    master once the set's key, its config, roots and runners are in place, so that it first
    listens serving the set's key. As its systemd unit where the host knows one, else
    ``salt-master -c <config dir> -d``.

    service
        The systemd unit name.

    timeout
        Seconds to wait for the ret port.

    CLI Example:

    .. code-block:: bash

        salt master3 multimaster_daemons.start_master
    """
    master = _this_master()
    how = multimaster_daemon.start_if_stopped(
        master["pidfile"], service, "salt-master", master["config_dir"]
    )
    _await_listening(master, timeout, "its start")
    return {"started": how is not None, "how": how}


def sync_master_modules(restart=True, service="salt-master", forms=None):
    """
    ``salt-run saltutil.sync_all`` for this host's salt-master (the master whose control minion
    this is): the custom runners, utils ... of its own file_roots into its extension_modules.
    When that changed anything and the master runs, it is restarted once this job has returned:
    Salt's reactor keeps the runners it loaded at start, so a master whose reactors call the
    formula's runners needs them before it starts. What ``multimaster.orch.add_master`` runs on
    a new master once ``sync_roots`` has filled its roots.

    restart
        False: sync only.

    service
        The systemd unit name, used when the master runs as that unit.

    forms
        Only these module kinds (e.g. ``[runners, utils]``); default all of them.

    CLI Example:

    .. code-block:: bash

        salt master3 multimaster_daemons.sync_master_modules
        salt master3 multimaster_daemons.sync_master_modules restart=False forms='[runners, utils]'
    """
    master = _this_master()
    mopts = multimaster_keystore.master_opts(master["config_dir"])
    # The runner functions themselves, not runner jobs: no job dirs or job cache of that master
    # are involved (one that never started has none; its job cache may be what is being set up).
    runner = salt.loader.runner(mopts, utils=salt.loader.utils(mopts))
    if forms is None:
        synced = runner["saltutil.sync_all"]()
    else:
        synced = {form: runner[f"saltutil.sync_{form}"]() for form in forms}
    if not isinstance(synced, dict):
        raise CommandExecutionError(f"saltutil.sync_all on {master['id']} failed: {synced}")
    changed = {form: names for form, names in synced.items() if names}
    ret = {"synced": changed}
    if changed and restart:
        ret["restart"] = restart_master(service)
    return ret


def stop_master(config_dir=None, service="salt-master", timeout=60, after_return=False):
    """
    Stop the salt-master of ``config_dir`` on this host (a system service where it is one, else
    the verified pid of its pidfile) and wait until it is gone; what ``multimaster.orch.
    remove_master`` runs with ``multimaster_stop: true`` on a master that has left
    ``multimaster:masters``. Nothing runs from a command line read from ``/proc``; a pidfile
    naming another process is refused.

    config_dir
        The master's config dir; default: this minion's own (``/etc/salt`` on a package install).

    service
        The systemd unit name, used when the master runs as that unit.

    timeout
        Seconds to wait for it to exit.

    after_return
        Stop it only once this job has returned, from a detached watcher, and return at once:
        for a minion whose only master is this one (a cluster master's control minion), which
        could not return after it stopped. ``multimaster.wait_master_stopped`` confirms it.

    CLI Example:

    .. code-block:: bash

        salt master3 multimaster_daemons.stop_master
    """
    config_dir = config_dir or os.path.dirname(__opts__["conf_file"])
    mopts = multimaster_keystore.master_opts(config_dir)
    if after_return:
        scheduled = multimaster_daemon.schedule_restart(
            mopts["pidfile"], service, "salt-master", config_dir, wait_pid=os.getpid(), stop=True
        )
        return dict(scheduled, config_dir=config_dir)
    stopped = multimaster_daemon.stop_now(
        mopts["pidfile"], service, "salt-master", config_dir, timeout=float(timeout)
    )
    return {"stopped": stopped["was_running"], "pid": stopped["pid"], "config_dir": config_dir}
