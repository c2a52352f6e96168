"""
The status plane: what each master reports and what differs.

The peer side is what a master's control minion answers for ``multimaster.status``
(``master_report``) and ``multimaster.wait_masters`` (``settled``), and the minions that answer
its master: plain values in, no loader dunders. The runner's side reads every master's report in
one round trip and compares them (master key, minion-key sets, roots and served commits, job
cache, which minions answer); in mode cluster it reports Salt's Raft membership and the ports up
instead. Read-only everywhere.
"""

import os

import multimaster_cluster
import multimaster_clustersync
import multimaster_control
import multimaster_daemon
import multimaster_jobcache
import multimaster_keys
import multimaster_keystore
import multimaster_keysync
import multimaster_keywrite
import multimaster_manifest
import multimaster_masterkey
import multimaster_masterkeyfiles
import multimaster_returns
import multimaster_rootsanswer
import multimaster_rootsplan
import multimaster_rootsync
import multimaster_seal
import salt.utils.json
from salt.exceptions import SaltInvocationError

# --- peer side (run by a control minion) ---------------------------------------------------


def settled(master, mopts, minion_pidfile):
    """
    ``{"up", "restart_pending", "settled"}`` of the salt-master of ``master``: up, and no
    restart of it or of this control minion (``minion_pidfile``) pending?
    """
    up = bool(multimaster_daemon.master_alive(master, mopts))
    pending = multimaster_daemon.host_restart_pending(mopts, minion_pidfile)
    return {"up": up, "restart_pending": pending, "settled": up and not pending}


def store_problems(mopts, signing):
    """
    The problems of the key store and the master key pair (and signing pair, with ``signing``).
    """
    problems = multimaster_keystore.store_problems(mopts)
    problems += multimaster_masterkeyfiles.master_key_pair_problems(mopts)
    if signing:
        problems += multimaster_masterkeyfiles.master_key_pair_problems(mopts, signing=True)
    return problems


def ping_minions(config_dir, timeout=5):
    """
    The minions that answer ``test.ping`` published by the master of ``config_dir`` within
    ``timeout`` seconds (a minion not connected costs a short find_job round, not the master's
    ``gather_job_timeout``).
    """
    import salt.client

    with salt.client.get_local_client(os.path.join(config_dir, "master")) as client:
        returns = multimaster_returns.cmd(client, "*", "test.ping", int(timeout))
    return sorted(minion for minion, ret in returns.items() if ret is True)


def master_report(minion_opts, master, mopts, signing=False, ping_timeout=5):
    """
    What ``multimaster_peer.master_report`` answers for ``master`` (its opts ``mopts``).
    """
    report = {
        "keys": multimaster_keywrite.peer_inventory(minion_opts, master, mopts),
        "master_key": multimaster_masterkey.master_key_info(minion_opts, master, mopts, signing),
        "store_problems": store_problems(mopts, signing),
        "answering": [],
    }
    for part in ("keys", "master_key"):
        report[part].pop("binding")
    kinds = multimaster_manifest.synced_kinds(mopts)[0]
    report["roots"] = multimaster_rootsanswer.summarized_manifests(mopts, kinds)[0]
    report["git"] = multimaster_manifest.served_commits(mopts)
    report["job_cache"] = multimaster_jobcache.check(mopts)
    report["alive"] = report["keys"]["alive"]
    if report["alive"]:
        report["answering"] = ping_minions(master["config_dir"], timeout=ping_timeout)
    return report


# --- runner side -----------------------------------------------------------------------------


def status(run, masters=None, timeout=30, ping_timeout=5, test=False):
    """
    ``salt-run multimaster.status``: the report of a hot or failover set, or of a cluster.
    Read-only: ``test`` changes nothing either.
    """
    try:
        section = multimaster_control.configured(run, masters, "status")
    except SaltInvocationError as exc:
        return multimaster_control.refused(run, exc)
    if section["mode"] == "cluster":
        return cluster_status(run, section, timeout)
    return _set_status(run, section, timeout, ping_timeout)


def cluster_status(run, section, timeout):
    """
    Mode cluster: Salt's Raft membership as this master sees it (``cluster.members``), the
    ports up (``multimaster_cluster.status_report``), and one cluster AES key and one cluster
    key pair on every master (``multimaster_clustersync.key_agreement``, ``timeout`` for the
    control minions).
    """
    members = multimaster_clustersync.members(run.opts)
    report, failed = multimaster_cluster.status_report(section, members)
    aes, aes_differ, pair, pair_differs = multimaster_clustersync.key_agreement(
        run, section, timeout
    )
    report["cluster_aes"], report["cluster_key"] = aes, pair
    return multimaster_control.finish(run, report, failed or aes_differ or pair_differs)


def _set_status(run, section, timeout, ping_timeout):
    """
    The report of a hot or failover set, finished: ``retcode`` 1 when a master does not answer
    or anything that must be equal differs.
    """
    signing = multimaster_masterkey.uses_signing(section)
    reports, errors = _master_reports(run, section, signing, timeout, ping_timeout)
    reachable = [m for m in multimaster_control.ids(section) if m in reports]
    complete = len(reachable) == len(multimaster_control.ids(section))
    ret = {"masters": _masters_part(section, reports, errors, signing)}
    key_ok = _master_key_part(ret, section, reports, reachable, signing, complete)
    ret["keys_equal"] = _agreement(
        len({reports[m]["keys"]["digest"] for m in reachable}) <= 1, complete
    )
    if ret["keys_equal"] is False:
        ret["keys_differ"] = _keys_differ(run, section, timeout)
    ret["minions"] = _answering_matrix(section, reports)
    roots, roots_equal = _roots_status(run, section, reports, timeout) if reachable else ({}, True)
    ret.update(roots)
    job_cache, job_cache_ok = _job_cache_status(reports, reachable)
    ret.update(job_cache)
    failed = bool(errors) or ret["keys_equal"] is False or not key_ok or not roots_equal
    return multimaster_control.finish(run, ret, failed or not job_cache_ok)


def _master_reports(run, section, signing, timeout, ping_timeout):
    """
    ``(reports, errors)`` per master: one round trip, in which each control minion reports
    digests, its master's key and who answers.
    """
    return multimaster_control.call(
        run,
        section,
        multimaster_control.ids(section),
        "master_report",
        {"signing": signing, "ping_timeout": ping_timeout},
        timeout + ping_timeout,
        _report_check,
    )


def _report_check(answer):
    answer["keys"] = multimaster_keys.check_inventory_return(answer["keys"], "digests")
    pub = answer["master_key"].get("pub")
    answer["master_key"]["fp"] = multimaster_keys.fingerprint(pub) if pub else None
    if not isinstance(answer.get("answering"), list):
        raise ValueError("answering is not a list")
    multimaster_rootsplan.git_check(answer.get("git"))
    return multimaster_rootsplan.roots_check(answer)


def _masters_part(section, reports, errors, signing):
    """
    Per master in order: unreachable and why, or its key fingerprint, key count and digest
    and the problems of its key store.
    """
    part = {}
    for master in multimaster_control.ids(section):
        if master in errors:
            part[master] = {"reachable": False, "error": errors[master]}
            continue
        report = reports[master]
        part[master] = {
            "reachable": True,
            "signing_key" if signing else "master_key": report["master_key"]["fp"],
            "salt_finger": report["master_key"].get("salt_finger"),
            "keys": report["keys"]["count"],
            "keys_digest": report["keys"]["digest"][:16],
        }
        if report.get("store_problems"):
            part[master]["store_problems"] = report["store_problems"][: multimaster_control.SHOWN]
    return part


def _agreement(alike, complete):
    """
    Whether every master holds the same: ``False`` when the masters that answered differ
    (``alike`` false); ``True`` when they are alike and every master answered (``complete``);
    ``None`` when they are alike but a master did not answer: not known, never a ``True`` made
    of the masters that happened to answer.
    """
    if not alike:
        return False
    return True if complete else None


def _master_key_part(ret, section, reports, reachable, signing, complete):
    """
    Add to ``ret`` whether the masters store the same key (and, signing, whether it is the
    configured public key), as ``_agreement`` says it; return whether all is well.
    """
    fps = {reports[m]["master_key"]["fp"] for m in reachable}
    # Signing mode: each master keeps its own key; what must be shared is the signing pair.
    same = _agreement(len(fps) <= 1, complete)
    ret["same_signing_key" if signing else "same_master_key"] = same
    if not signing:
        return same is True
    configured = multimaster_keys.fingerprint(section["signing"].get("public_key", ""))
    matches = _agreement(fps <= {configured}, complete)
    ret["signing_public_key_matches"] = matches
    return same is True and matches is True


def _keys_differ(run, section, timeout):
    """
    The minion ids (at most ``SHOWN``) whose key entry differs between masters, with each
    master's state of it.
    """
    inventories = multimaster_keysync.inventories(run, section, timeout)["inventories"]
    differing = {}
    ids = set().union(*(inv.keys() for inv in inventories.values()))
    for minion_id in ids:
        seen = {m: inventories[m].get(minion_id) for m in inventories}
        if len({tuple(e) if e else None for e in seen.values()}) > 1:
            differing[minion_id] = {m: (e.state if e else None) for m, e in seen.items()}
    return dict(sorted(differing.items())[: multimaster_control.SHOWN])


def _answering_matrix(section, reports):
    """
    ``{minion_id: {master: answers}}``: which masters each minion answers, by minion id.
    """
    order = multimaster_control.ids(section)
    matrix = {}
    for master in order:
        for minion_id in reports.get(master, {}).get("answering", []):
            matrix.setdefault(minion_id, {m: False for m in order})[master] = True
    return dict(sorted(matrix.items()))


def _root_digests(report):
    """
    ``{(kind, env, position): (path, digest)}`` of one master's report.
    """
    return {
        (kind, env, index): (root["path"], root["digest"])
        for kind, envs in report["roots"].items()
        for env, rs in envs.items()
        for index, root in enumerate(rs)
    }


def _roots_status(run, section, reports, timeout):
    """
    ``(part, equal)``: each root's digest per master (the roots a master serves from disk,
    paired by kind, environment and position) and, where they differ, which paths differ from
    the first reachable master in order (the primary when it answers); the commits every master
    serves per git remote.
    """
    reachable = [m for m in multimaster_control.ids(section) if m in reports]
    complete = len(reachable) == len(multimaster_control.ids(section))
    part, differing = _roots_part(reports, reachable, complete)
    if differing:
        part["roots_differ"] = _roots_paths_differ(run, section, reachable, differing, timeout)
    git, git_equal = _git_part(reports, reachable, complete)
    part.update(git)
    return part, not differing and git_equal is not False


def _roots_part(reports, reachable, complete):
    """
    ``(part, differing)``: each root's digest and path per master, whether all are equal, and
    the roots (``(kind, env, position)``) whose digests differ.
    """
    digests = {m: _root_digests(reports[m]) for m in reachable}
    slots = sorted(set().union(*(d.keys() for d in digests.values())), key=str)
    part = {"roots": {}}
    differing = []
    for slot in slots:
        seen = {m: digests[m].get(slot) for m in reachable}
        kind, env, index = slot
        part["roots"].setdefault(kind, {}).setdefault(env, {})[index] = {
            m: (f"{v[1][:16]} {v[0]}" if v else None) for m, v in seen.items()
        }
        if len({v[1] if v else None for v in seen.values()}) > 1:
            differing.append(slot)
    part["roots_equal"] = _agreement(not differing, complete)
    return part, differing


def _git_part(reports, reachable, complete):
    """
    ``(part, equal)``: per git remote, "same commits" or each master's commit per branch, and
    whether all serve the same; an empty part when no master serves a git remote.
    """
    served = {m: reports[m]["git"] for m in reachable}
    remotes = {(role, url) for git in served.values() for role, rs in git.items() for url in rs}
    if not remotes:
        return {}, True
    part = {"git": {}}
    equal = True
    for role, url in sorted(remotes):
        commits = {m: served[m].get(role, {}).get(url) for m in reachable}
        same = len({salt.utils.json.dumps(c, sort_keys=True) for c in commits.values()}) == 1
        equal = equal and same
        part["git"][f"{role} {url}"] = (
            "same commits"
            if same
            else {
                m: ({b: sha[:12] for b, sha in c.items()} if c else None)
                for m, c in commits.items()
            }
        )
    part["git_equal"] = _agreement(equal, complete)
    return part, part["git_equal"]


def _roots_paths_differ(run, section, reachable, slots, timeout):
    """
    Per differing root, per master: the paths missing, changed, re-moded or extra and the
    directories of another mode (how many of each for ``pillar_roots``) compared with the first
    reachable master (manifests sealed to this master, as ``sync_roots`` reads them).
    """
    opened, errors = _opened_manifests(run, section, reachable, slots, timeout)
    reference = reachable[0]
    out = {}
    for kind, env, index in slots:
        name = f"{kind} {env} {index}"
        out[name] = {}
        for master in reachable[1:]:
            if master in errors or reference in errors:
                out[name][master] = errors.get(master) or errors[reference]
                continue
            try:
                source = [part[kind][env][index] for part in opened[reference]]
                target = [part[kind][env][index] for part in opened[master]]
            except (KeyError, IndexError):
                out[name][master] = f"{master} has no such root"
                continue
            out[name][master] = multimaster_rootsplan.differences(
                *source, *target, shown=multimaster_control.SHOWN, named=kind != "pillar_roots"
            )
    return out


def _opened_manifests(run, section, reachable, slots, timeout):
    """
    ``(opened, errors)``: each reachable master's whole manifests of the kinds in ``slots``
    (files and directory modes), opened; or why not.
    """
    nonce = os.urandom(32).hex()
    kinds = sorted({kind for kind, _, _ in slots})
    answers, errors = multimaster_control.call(
        run,
        section,
        reachable,
        "roots_manifest",
        {"kinds": kinds, "full": True, "nonce": nonce},
        timeout,
        multimaster_rootsplan.roots_check,
    )
    opened = {}
    for master, answer in answers.items():
        try:
            # No directory digests were sent: whole manifests.
            opened[master] = multimaster_rootsync.opened_manifest(
                run, section, master, answer, nonce
            )[:2]
        except (SaltInvocationError, multimaster_seal.SealError) as exc:
            errors[master] = f"manifest of {master}: {exc}"
        except (KeyError, IndexError, TypeError):
            errors[master] = multimaster_rootsync.malformed_manifest(master)
    return opened, errors


def _job_cache_status(reports, reachable):
    """
    Each master's job cache as its control minion found it (returner, database, answering,
    what of the schema is missing), and whether all is well: either no master uses a shared
    database, or every master uses the same one and it answers with its whole schema.
    """
    caches = {m: reports[m]["job_cache"] for m in reachable if "job_cache" in reports[m]}
    if not any(cache["shared"] for cache in caches.values()):
        return {}, True
    ok = len({cache.get("database") for cache in caches.values()}) == 1 and all(
        cache.get("reachable") and not cache.get("missing") for cache in caches.values()
    )
    return {"job_cache": caches, "job_cache_ok": ok}, ok
