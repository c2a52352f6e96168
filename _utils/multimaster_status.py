"""
The status plane, peer side: what a master's control minion answers for ``multimaster.status``
(``master_report``) and ``multimaster.wait_masters`` (``settled``), and the minions that answer
its master. Plain values in, no loader dunders: the control minion's opts, this master's entry
and opts.
"""

import os

import multimaster_daemon
import multimaster_jobcache
import multimaster_keystore
import multimaster_masterkey
import multimaster_roots


def settled(master, mopts, minion_pidfile):
    """
    ``{"up", "restart_pending", "settled"}`` of the salt-master of ``master``: up, and no
    restart of it or of this control minion (``minion_pidfile``) pending?
    """
    up = bool(multimaster_daemon.master_alive(master, mopts))
    # This control minion's own restart (multimaster.minion) counts too: until it has happened
    # the runners would lose it mid-call.
    pending = any(
        multimaster_daemon.restart_pending(pidfile)
        for pidfile in (mopts["pidfile"], minion_pidfile)
    )
    return {"up": up, "restart_pending": pending, "settled": up and not pending}


def store_problems(mopts, signing):
    """
    The problems of the key store and the master key pair (and signing pair, with ``signing``).
    """
    problems = multimaster_keystore.store_problems(mopts)
    problems += multimaster_keystore.master_key_pair_problems(mopts)
    if signing:
        problems += multimaster_keystore.master_key_pair_problems(mopts, signing=True)
    return problems


def ping_minions(config_dir, timeout=5):
    """
    The minions that answer ``test.ping`` published by the master of ``config_dir``.
    """
    import salt.client

    with salt.client.get_local_client(os.path.join(config_dir, "master")) as client:
        returns = client.cmd("*", "test.ping", timeout=int(timeout))
    return sorted(minion for minion, ret in returns.items() if ret is True)


def master_report(minion_opts, master, mopts, signing=False, ping_timeout=5):
    """
    What ``multimaster_peer.master_report`` answers for ``master`` (its opts ``mopts``).
    """
    report = {
        "keys": multimaster_keystore.peer_inventory(minion_opts, master, mopts),
        "master_key": multimaster_masterkey.master_key_info(minion_opts, master, mopts, signing),
        "store_problems": store_problems(mopts, signing),
        "answering": [],
    }
    for part in ("keys", "master_key"):
        report[part].pop("binding")
    kinds = multimaster_roots.synced_kinds(mopts)[0]
    report["roots"] = multimaster_roots.summarized_manifests(mopts, kinds)[0]
    report["git"] = multimaster_roots.served_commits(mopts)
    report["job_cache"] = multimaster_jobcache.check(mopts)
    report["alive"] = report["keys"]["alive"]
    if report["alive"]:
        report["answering"] = ping_minions(master["config_dir"], timeout=ping_timeout)
    return report
