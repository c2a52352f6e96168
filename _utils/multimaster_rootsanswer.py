"""
A peer's answer to the primary's roots round, run by its control minion
(``multimaster_peer.roots_manifest``): the summaries of its roots, and the manifests of the
directories that differ from the primary's, sealed to the master that asked. The primary's
per-directory digests come with the publish, from a delta on the base both last synced
(``multimaster_rootsbase``), or staged for the peer to pull.
"""

import json
import logging

import multimaster_daemon
import multimaster_manifest
import multimaster_rootsread
import multimaster_seal
import multimaster_transport
from salt.exceptions import CommandExecutionError

log = logging.getLogger(__name__)


def summarized_manifests(mopts, kinds):
    """
    ``(roots, files, modes, by_dir)`` of this master's ``kinds``: per kind, env and position
    the root's path, digest, file count and skipped entries (``_summary``); and the file
    manifests, directory modes and per-directory digests in the same shape.
    """
    found = multimaster_manifest.manifests(mopts, kinds)
    roots = {
        kind: {env: [_summary(kind, r) for r in rs] for env, rs in envs.items()}
        for kind, envs in found.items()
    }
    files, modes, by_dir = (
        {
            kind: {env: [r[part] for r in rs] for env, rs in envs.items()}
            for kind, envs in found.items()
        }
        for part in ("files", "dirs", "dir_digests")
    )
    return roots, files, modes, by_dir


def _summary(kind, root):
    """
    What a return may say of one root's manifest: its path, digest, file count, whether it was
    read through the roots watch's record and how many entries were skipped, with a sample of
    those (path and why) for ``file_roots`` only: the names of pillar files are for sealed
    manifests.
    """
    summary = {
        "path": root["path"],
        "digest": root["digest"],
        "count": len(root["files"]),
        "skipped_count": len(root["skipped"]),
        "watched": root.get("watched", False),
    }
    if kind != "pillar_roots":
        summary["skipped"] = dict(list(root["skipped"].items())[: multimaster_manifest.SAMPLE])
    return summary


# The most one answer carries of a peer's manifests where they are cut to directories (JSON
# bytes of their entries): sealed and base64-encoded they stay well under Salt's
# max_event_size (1 MiB), past which a Salt 3008 minion trims a return.
ANSWER_LIMIT = 384 * 1024


class AnswerBudget:
    """
    How much of the differing directories' manifests one answer may carry (``limit`` JSON
    bytes): the directories after the first that does not fit are left out, and counted in
    ``left``, for the runner's next round. The first directory of an answer always fits (a
    round always makes progress).
    """

    def __init__(self, limit=None):
        self.room = ANSWER_LIMIT if limit is None else limit
        self.taken = 0
        self.left = 0

    def take(self, where, files):
        """
        The leading directories of ``where`` (sorted) whose entries of ``files`` still fit.
        """
        # Only the directories asked for are costed: a no-op asks for none of 30,000 files.
        cost = dict.fromkeys(where, 0)
        if cost:
            for relpath, entry in files.items():
                directory = multimaster_rootsread.dir_of(relpath)
                if directory in cost:
                    cost[directory] += len(relpath) + len(json.dumps(entry)) + 8
        kept = []
        for directory in where:
            need = cost.get(directory, 0) + len(directory) + 8
            if self.left or (self.taken and need > self.room):
                self.left += 1
                continue
            self.room -= need
            self.taken += 1
            kept.append(directory)
        return kept


def narrowed(files, modes, dirs, budget=None, by_dir=None):
    """
    ``(files, modes, partial)`` in the shape of ``files``: each root's manifest and directory
    modes cut down to the directories whose digests differ from the primary's ``dirs`` (the
    directories themselves in ``partial``), as many as ``budget`` (an ``AnswerBudget``) lets
    one answer carry; or whole (``None`` in ``partial``) where ``dirs`` says nothing usable.
    ``by_dir``: this side's per-directory digests in the same shape, where they are known.
    """
    budget = budget or AnswerBudget(float("inf"))
    cut_files, cut_modes, partial = {}, {}, {}
    for kind, envs in files.items():
        for env, roots in envs.items():
            theirs = dirs.get(kind, {}).get(env) if isinstance(dirs, dict) else None
            for index, manifest in enumerate(roots):
                mine = modes[kind][env][index]
                their_digests = (
                    theirs[index] if isinstance(theirs, list) and index < len(theirs) else None
                )
                if not isinstance(their_digests, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in their_digests.items()
                ):
                    cut, where = manifest, None
                else:
                    own = by_dir[kind][env][index] if by_dir else None
                    where = budget.take(
                        multimaster_manifest.differing_dirs(manifest, their_digests, mine, own),
                        manifest,
                    )
                    cut = multimaster_manifest.within(manifest, where)
                    mine = multimaster_manifest.modes_within(mine, where)
                cut_files.setdefault(kind, {}).setdefault(env, []).append(cut)
                cut_modes.setdefault(kind, {}).setdefault(env, []).append(mine)
                partial.setdefault(kind, {}).setdefault(env, []).append(where)
    return cut_files, cut_modes, partial


def staged_dir_digests(dirs, master_id, pull):
    """
    The primary's per-directory digests as ``roots_manifest`` got them in ``dirs``: as they
    are, or, for ``{"staged": {master id: transfer descriptor}}``, those staged for
    ``master_id``, pulled with ``pull``. None when none were staged for it or the pull fails
    (the peer then seals its whole manifest, as without digests).

    dirs
        The ``dirs`` argument of ``roots_manifest``.

    master_id
        The id of the master this control minion serves.

    pull
        ``pull(ticket, offset)`` (``multimaster_transport.ContentPull`` in a job).
    """
    staged = dirs.get("staged") if isinstance(dirs, dict) else None
    if not isinstance(staged, dict):
        return dirs
    descriptor = staged.get(master_id)
    if descriptor is None:
        return None
    try:
        return multimaster_transport.pulled_json(
            descriptor, multimaster_manifest.DIR_DIGESTS_PULL_LIMIT, "directory digests", pull
        )
    except CommandExecutionError as exc:
        log.warning("multimaster: the primary's directory digests could not be pulled: %s", exc)
        return None


def digests_from_deltas(dirs, mine, theirs, by_dir):
    """
    The primary's per-directory digests of the roots of ``by_dir``, with no pull: a root whose
    digest is the primary's is equal to it, and one at the base of its ``delta`` (beside the
    staged digests in ``dirs``: ``multimaster_rootsbase``) differs from it in the delta's
    directories only. None when a root is neither: the peer pulls the full digests.

    dirs
        The ``dirs`` argument of ``roots_manifest``.

    mine
        This master's root digests (``digests``).

    theirs
        The primary's (``roots_manifest``'s ``unless``).

    by_dir
        ``{kind: {env: [dir_digests, ...]}}`` of this master's published roots that differ.
    """
    deltas = dirs.get("delta") if isinstance(dirs, dict) else None
    if not isinstance(deltas, dict):
        return None
    out = {}
    for kind, envs in by_dir.items():
        for env, roots in envs.items():
            for index, own in enumerate(roots):
                digest = mine[kind][env][index]
                if digest == _nth(theirs, kind, env, index):
                    known = own
                else:
                    known = _delta_applied(_nth(deltas, kind, env, index), digest, own)
                if known is None:
                    return None
                out.setdefault(kind, {}).setdefault(env, []).append(known)
    return out


def _nth(tree, kind, env, index):
    """``tree[kind][env][index]`` of a publish's argument; None where it has no such entry."""
    envs = tree.get(kind) if isinstance(tree, dict) else None
    roots = envs.get(env) if isinstance(envs, dict) else None
    return roots[index] if isinstance(roots, list) and index < len(roots) else None


def _delta_applied(delta, digest, own):
    """
    The primary's per-directory digests of a root from its ``delta``, where this master's root
    (``digest``, per-directory ``own``) is at the delta's base; else None.
    """
    if not isinstance(delta, dict) or delta.get("base") != digest:
        return None
    changed = delta.get("dirs")
    if not isinstance(changed, dict) or not all(
        isinstance(v, str) or v is None for v in changed.values()
    ):
        return None
    return {d: v for d, v in {**own, **changed}.items() if v is not None}


def peer_manifest(
    minion_opts, master, mopts, kinds, full=False, nonce=None, unless=None, dirs=None, pull=None
):
    """
    What ``multimaster_peer.roots_manifest`` answers for ``master`` (its opts ``mopts``): the
    summaries and real paths of its roots, a fresh challenge and, with ``full``, the manifests
    of the kinds that differ from ``unless``, cut to ``dirs`` and sealed to the master that
    asked, bound to its ``nonce``. ``pull``: the job's ``multimaster_transport.puller``, where
    ``dirs`` were staged (``staged_dir_digests``) and their ``delta`` does not give them
    (``digests_from_deltas``). ``restart_pending`` answers what
    ``master_settled`` would, so that a sync needs no settle round of its own
    (``multimaster_control.settled_round``).
    """
    roots, files, modes, by_dir = summarized_manifests(
        mopts, [kind for kind in kinds if kind in multimaster_manifest.ROOT_KINDS]
    )
    ret = {
        "roots": roots,
        "real": multimaster_manifest.real_layout(mopts),
        "binding": multimaster_seal.binding(minion_opts, master),
        "restart_pending": multimaster_daemon.host_restart_pending(mopts, minion_opts["pidfile"]),
    }
    mine, theirs = multimaster_manifest.digests(roots), unless if isinstance(unless, dict) else {}
    differing = {kind: envs for kind, envs in files.items() if mine[kind] != theirs.get(kind)}
    if full and differing:
        published = {kind: by_dir[kind] for kind in differing if kind != "pillar_roots"}
        known = digests_from_deltas(dirs, mine, theirs, published)
        if known is None:
            # Through the primary's file server, as the content comes (peer_run where it can't).
            with multimaster_transport.ContentPull(minion_opts, pull) as fetch:
                known = staged_dir_digests(dirs, master["id"], fetch)
        dirs = known
        budget = AnswerBudget()
        files, modes, partial = narrowed(differing, modes, dirs, budget, by_dir)
        ret["sealed"] = multimaster_seal.seal(
            {"files": files, "dir_modes": modes, "dirs": partial, "left": budget.left},
            "roots_manifest",
            master["id"],
            multimaster_seal.own_file(minion_opts, "minion_master.pub"),
            multimaster_seal.own_file(minion_opts, "minion.pem"),
            multimaster_seal.bind(nonce, master["id"], master["config_dir"]),
        )
    return ret
