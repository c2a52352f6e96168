"""
A roots sync's plan and the checks of the peers' answers: what makes a peer's roots equal to the
primary's (from the manifests of ``multimaster_manifest``), whether the masters' roots pair and
overlap alike, the shape of every answer a peer sends about its roots, and what a plan does or a
root holds unlike the primary's, as a report may say it. Applying the plan on the peer is
``multimaster_roots``; the run across masters is ``multimaster_rootsync``.
"""

import itertools
import os

import multimaster_manifest
from salt.exceptions import SaltInvocationError


class RootsRefused(SaltInvocationError):
    """
    The masters' roots cannot be mirrored as they are (they do not pair, overlap unlike the
    primary's, or a peer's manifest does not match its shape): nothing was written.
    """


def plan(source, target):
    """
    What makes ``target`` equal to ``source``: ``{"add", "change", "mode", "delete"}``, sorted
    lists of relative paths (``mode``: content equal, mode differs).

    source
        The files of the primary's root.

    target
        The files of the paired root on a peer.
    """
    add = sorted(path for path in source if path not in target)
    change = sorted(
        path
        for path in source
        if path in target and source[path]["sha256"] != target[path]["sha256"]
    )
    mode = sorted(
        path
        for path in source
        if path in target
        and source[path]["sha256"] == target[path]["sha256"]
        and source[path]["mode"] != target[path]["mode"]
    )
    delete = sorted(path for path in target if path not in source)
    return {"add": add, "change": change, "mode": mode, "delete": delete}


def dir_plan(source, target):
    """
    ``[[directory, mode], ...]``, sorted: the directories of ``source`` that ``target`` lacks
    or holds with another mode, and the mode each must get.

    source
        The directory modes of the primary's root (``multimaster_manifest.manifest``'s ``dirs``).

    target
        Those of the paired root on a peer.
    """
    return [[d, mode] for d, mode in sorted(source.items()) if target.get(d) != mode]


def overlaps(layout):
    """
    ``{(slot, slot): relation}`` for every two roots of ``layout``
    (``multimaster_manifest.real_layout``) that are not apart: ``same`` directory, the first
    ``inside`` the second, or the first ``contains`` the second. A slot is ``(kind, env,
    position)``. Two masters whose roots overlap alike can be mirrored; otherwise a sync of one
    root would delete the other's files through it.

    layout
        ``{kind: {env: [path, ...]}}``.
    """
    slots = sorted(
        ((kind, env, index), os.path.normpath(path))
        for kind, envs in layout.items()
        for env, paths in envs.items()
        for index, path in enumerate(paths)
    )
    found = {}
    for (one, path), (other, there) in itertools.combinations(slots, 2):
        if path == there:
            found[(one, other)] = "same"
        elif path.startswith(there.rstrip("/") + "/"):
            found[(one, other)] = "inside"
        elif there.startswith(path.rstrip("/") + "/"):
            found[(one, other)] = "contains"
    return found


def layout(roots):
    """
    ``{kind: {env: [path, ...]}}`` of a roots report (``multimaster_manifest.manifests`` or a
    peer's summary).

    roots
        ``{kind: {env: [{"path", ...}, ...]}}``.
    """
    return {
        kind: {env: [r["path"] for r in rs] for env, rs in envs.items()}
        for kind, envs in roots.items()
    }


def check_layouts(primary, local, summary):
    """
    Raise ``RootsRefused`` unless this master is the primary (same roots and content as the
    primary reports) and every master's roots pair with the primary's by environment and
    position, and overlap as the primary's do (``check_overlaps``).

    primary
        The primary's master id.

    local
        This master's ``multimaster_manifest.manifests``.

    summary
        ``{master: answer}``: each master's answer (``manifest_answer_check``), the primary's
        among them.
    """
    if primary not in summary:
        raise RootsRefused(f"primary {primary} did not report its roots")
    theirs = summary[primary]["roots"]
    if layout(theirs) != layout(local) or (
        multimaster_manifest.digests(theirs) != multimaster_manifest.digests(local)
    ):
        raise RootsRefused(
            f"sync_roots copies the roots this master reads from its own disk: run it on the "
            f"primary {primary} (its roots differ from this master's)"
        )
    for master, answer in summary.items():
        for kind, envs in local.items():
            mine = {env: len(rs) for env, rs in envs.items()}
            peer = {env: len(rs) for env, rs in answer["roots"].get(kind, {}).items()}
            if mine != peer:
                raise RootsRefused(
                    f"{kind} of {master} do not pair with the primary's by environment and "
                    f"position: primary {layout(local)[kind]}, {master} "
                    f"{layout(answer['roots']).get(kind, {})}; nothing written"
                )
    check_overlaps(primary, summary)


_OVERLAP = {
    None: "apart",
    "same": "one directory",
    "inside": "the first inside the second",
    "contains": "the second inside the first",
}


def check_overlaps(primary, summary):
    """
    Raise ``RootsRefused`` unless every root of a master that overlaps another there (both
    kinds, synced or not) overlaps it alike on the primary: a peer root holding another root's
    directory, where the primary's keeps them apart, would see the other's files as extra and
    delete them. Roots apart on a peer are safe whatever the primary does (nested there, the
    outer root's files are mirrored as it serves them).

    primary
        The primary's master id.

    summary
        ``{master: answer}``, each answer with ``real`` (``multimaster_manifest.real_layout``).
    """
    mine = overlaps(summary[primary]["real"])
    for master, answer in summary.items():
        theirs = overlaps(answer["real"])
        for one, other in sorted(theirs):
            if mine.get((one, other)) != theirs[(one, other)]:
                raise RootsRefused(
                    f"roots of {master} overlap unlike the primary's: {_slot(one)} "
                    f"{_where(answer['real'], one)} and {_slot(other)} "
                    f"{_where(answer['real'], other)}: {_OVERLAP[theirs.get((one, other))]} on "
                    f"{master}, {_OVERLAP[mine.get((one, other))]} on {primary}; nothing written"
                )


def _slot(slot):
    return "{} {} #{}".format(*slot)


def _where(layout_, slot):
    kind, env, index = slot
    paths = layout_.get(kind, {}).get(env, [])
    return repr(paths[index]) if index < len(paths) else "(none)"


def _mapping_of(value, what, check):
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"{what} is not a mapping")
    for item in value.values():
        check(item)


def roots_check(answer):
    """
    ``answer``, checked to hold a peer's ``roots``: ``{kind: {env: [{"path": str, "digest":
    str, ...}]}}``; raises ValueError otherwise.

    answer
        A peer's answer (``multimaster_peer.roots_manifest`` or ``master_report``).
    """

    def root_list(rs):
        if not isinstance(rs, list) or not all(
            isinstance(r, dict)
            and isinstance(r.get("path"), str)
            and isinstance(r.get("digest"), str)
            for r in rs
        ):
            raise ValueError("malformed root")

    _mapping_of(answer.get("roots"), "roots", lambda envs: _mapping_of(envs, "roots", root_list))
    return answer


def manifest_answer_check(answer):
    """
    ``roots_check``, and the real paths of every root (``{kind: {env: [str]}}``).

    answer
        A peer's ``multimaster_peer.roots_manifest`` answer.
    """

    def paths(ps):
        if not isinstance(ps, list) or not all(isinstance(p, str) for p in ps):
            raise ValueError("malformed real paths")

    _mapping_of(answer.get("real"), "real", lambda envs: _mapping_of(envs, "real", paths))
    return roots_check(answer)


def git_check(git):
    """
    Raise ValueError unless ``git`` has the shape of a peer's served commits:
    ``{role: {remote: {branch: 40-hex sha}}}`` (``multimaster_manifest.served_commits``).

    git
        What the peer sent.
    """

    def branches(refs):
        _mapping_of(refs, "git branches", lambda sha: None)
        if not all(isinstance(sha, str) and len(sha) == 40 for sha in refs.values()):
            raise ValueError("a served commit is not a sha")

    _mapping_of(git, "git", lambda remotes: _mapping_of(remotes, "git remotes", branches))


def published(roots):
    """
    The kinds of ``roots`` that a publish may carry: every minion sees a publish, and names and
    digests of pillar files are not for it (a digest of a small pillar file confirms a guessed
    secret). The peers send those manifests whole.

    roots
        ``{kind: ...}`` (digests or manifests).
    """
    return {kind: envs for kind, envs in roots.items() if kind != "pillar_roots"}


def published_dir_digests(local):
    """
    ``{kind: {env: [{dir: digest}, ...]}}`` of this master's published roots (``published``),
    for the peers to return only the directories that differ.

    local
        This master's ``multimaster_manifest.manifests``.
    """
    return {
        kind: {env: [r["dir_digests"] for r in rs] for env, rs in envs.items()}
        for kind, envs in published(local).items()
    }


def _per_root(value, files, what, valid):
    """
    ``value`` (``{kind: {env: [item, ...]}}`` from a peer's sealed manifest), checked to have
    the shape of ``files`` and each item to pass ``valid``; ``RootsRefused`` names ``what``.
    """
    for kind, envs in files.items():
        for env, roots in envs.items():
            given = value.get(kind, {}).get(env) if isinstance(value, dict) else None
            if not isinstance(given, list) or len(given) != len(roots):
                raise RootsRefused(f"the {what} of {kind} {env} do not match the manifests")
            if not all(valid(item) for item in given):
                raise RootsRefused(f"malformed {what} in {kind} {env}")
    return value


def partial_check(partial, files):
    """
    The peer's ``dirs`` (which directories each manifest covers; ``None``: all), checked to
    have the shape of ``files``; ``RootsRefused`` otherwise.

    partial
        ``{kind: {env: [[directory, ...] or None, ...]}}`` or None, from the sealed manifest.

    files
        The peer's file manifests, ``{kind: {env: [files, ...]}}``.
    """
    if partial is None:
        return None
    return _per_root(
        partial,
        files,
        "directory lists",
        lambda where: (
            where is None or (isinstance(where, list) and all(isinstance(d, str) for d in where))
        ),
    )


def left_check(left):
    """
    How many differing directories a peer's answer left for another round: a count, else
    ``RootsRefused``.
    """
    if isinstance(left, bool) or not isinstance(left, int) or not 0 <= left <= 10**7:
        raise RootsRefused(f"left: got {str(left)[:40]!r}; expected a count of directories")
    return left


def added_reports(first, second, shown):
    """
    Two ``plan_report`` results as one: counts and bytes added, at most ``shown`` paths of each
    list.
    """
    report = {key: sorted(first[key] + second[key])[:shown] for key in (*_LISTED,)}
    report["skipped"] = {**first["skipped"], **second["skipped"]}
    counts = {key: first["counts"][key] + second["counts"][key] for key in first["counts"]}
    return {"counts": counts, "bytes": first["bytes"] + second["bytes"], **report}


def modes_check(modes, files):
    """
    The peer's directory modes, checked to have the shape of ``files`` and to hold permission
    bits; ``RootsRefused`` otherwise.

    modes
        ``{kind: {env: [{directory: mode}, ...]}}`` from the sealed manifest.

    files
        The peer's file manifests, ``{kind: {env: [files, ...]}}``.
    """
    return _per_root(
        modes,
        files,
        "directory modes",
        lambda root: (
            isinstance(root, dict)
            and all(
                isinstance(d, str) and type(m) is int and 0 <= m <= 0o777 for d, m in root.items()
            )
        ),
    )


def sync_plan(local, files, modes, partial=None):
    """
    ``(pairs, members)``: per paired root what to write, re-mode and delete, and the modes of
    its directories; the source files of the content stream in order (``(root, relpath,
    size)``). A kind the peer left out of its manifests has the primary's digests there: equal.

    local
        This master's ``multimaster_manifest.manifests``.

    files
        The peer's file manifests, ``{kind: {env: [files, ...]}}``.

    modes
        The peer's directory modes (``modes_check``).

    partial
        Which directories each of the peer's manifests covers (``partial_check``): only
        those are compared, the others are equal. ``None``: every manifest is whole.
    """
    pairs, members = [], []
    for kind, envs in ((k, e) for k, e in local.items() if k in files):
        for env, rs in envs.items():
            for index, source in enumerate(rs):
                target = files.get(kind, {}).get(env, [])[index]
                where = (partial or {}).get(kind, {}).get(env, [None] * len(rs))[index]
                mine, dirs = (
                    (source["files"], source["dirs"])
                    if where is None
                    else (
                        multimaster_manifest.within(source["files"], where),
                        multimaster_manifest.modes_within(source["dirs"], where),
                    )
                )
                diff = plan(mine, target)
                write = [
                    {"path": path, **source["files"][path]} for path in diff["add"] + diff["change"]
                ]
                members += [(source["path"], w["path"], w["size"]) for w in write]
                pairs.append(
                    {
                        "kind": kind,
                        "env": env,
                        "index": index,
                        "write": write,
                        "added": diff["add"],
                        "mode": [[path, source["files"][path]["mode"]] for path in diff["mode"]],
                        "delete": diff["delete"],
                        "dirs": dir_plan(dirs, modes[kind][env][index]),
                    }
                )
    return pairs, members


# What a plan's report lists per change (the paths, or how many of them for pillar_roots).
_LISTED = ("added", "changed", "modes", "dir_modes", "deleted")


def plan_report(pairs, local, shown):
    """
    What ``pairs`` (``sync_plan``) do: per change how many paths and, for ``file_roots``,
    which (the names of pillar files never leave the sealed manifests and plan: a runner's
    return lands in the job cache); the bytes to move.

    pairs
        The pairs of ``sync_plan``.

    local
        This master's ``multimaster_manifest.manifests``.

    shown
        How many paths each list holds at most (counts are always complete).
    """
    counts = dict.fromkeys((*_LISTED, "skipped"), 0)
    listed = {key: [] for key in counts}
    for pair in pairs:
        changes = _pair_changes(pair, local[pair["kind"]][pair["env"]][pair["index"]])
        for key, paths in changes.items():
            counts[key] += len(paths)
            if pair["kind"] != "pillar_roots":
                listed[key] += paths
    report = {key: sorted(paths)[:shown] for key, paths in listed.items()}
    report["skipped"] = dict(report["skipped"])
    size = sum(w["size"] for pair in pairs for w in pair["write"])
    return {"counts": counts, "bytes": size, **report}


def _pair_changes(pair, root):
    """
    ``{change: [path, ...]}`` of one paired root's plan (``skipped``: ``[(path, why), ...]`` of
    what the primary's root holds that is never copied), each path under the primary's root.
    """

    def under(relpath):
        return os.path.normpath(f"{root['path']}/{relpath}")

    added = set(pair["added"])
    return {
        "added": [under(w["path"]) for w in pair["write"] if w["path"] in added],
        "changed": [under(w["path"]) for w in pair["write"] if w["path"] not in added],
        "modes": [under(path) for path, _ in pair["mode"]],
        "dir_modes": [under(directory) for directory, _ in pair["dirs"]],
        "deleted": [under(path) for path in pair["delete"]],
        "skipped": [(under(path), why) for path, why in root["skipped"].items()],
    }


def differences(files, modes, their_files, their_modes, shown, named=True):
    """
    What a root holds unlike the reference's ``files`` and directory ``modes``: the paths
    ``missing``, ``changed``, re-moded (``mode``) or ``extra``, the directories of another mode
    (``dir_mode``); each only when any.

    files
        The reference root's files (a manifest's ``files``).

    modes
        The reference root's directory modes.

    their_files
        The compared root's files.

    their_modes
        The compared root's directory modes.

    shown
        How many paths each list holds at most.

    named
        False for ``pillar_roots`` (their names are for sealed manifests only): how many of
        each instead of the paths.
    """
    diff = plan(files, their_files)
    diff["dir_mode"] = [
        directory for directory, _ in dir_plan(modes, their_modes) if directory in their_modes
    ]
    keys = {"missing": "add", "changed": "change", "mode": "mode", "extra": "delete"}
    keys["dir_mode"] = "dir_mode"
    return {k: diff[v][:shown] if named else len(diff[v]) for k, v in keys.items() if diff[v]}
