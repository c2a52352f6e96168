"""
The roots plane's runner side: read each peer's manifest, plan, deliver.

``sync_roots`` asks every master, in one round, for the manifests of its roots that differ from
this master's (sealed to this master and bound to the run), plans per peer what must move
(``multimaster_rootsplan``), then stages the content encrypted with a fresh key and sends the plan,
sealed to the peer's control minion, which pulls and applies both (``multimaster_roots``).
Every function takes a ``multimaster_control.Run``. A peer's manifest is read only when its
control minion passes the check a recipient of a private key must pass
(``multimaster_masterkey.recipient_problem``).
"""

import dataclasses
import os

import multimaster_control
import multimaster_manifest
import multimaster_masterkey
import multimaster_rootsbase
import multimaster_rootsplan
import multimaster_seal
import multimaster_transport
import salt.utils.json
from salt.exceptions import SaltInvocationError

ROOT_CHOICES = {
    "file": ("file_roots",),
    "pillar": ("pillar_roots",),
    "both": ("file_roots", "pillar_roots"),
}


# --- sync_roots ------------------------------------------------------------------------------


@dataclasses.dataclass
class _Round:
    """
    One round of manifests: this master's (``local``, their ``digests``, read with its
    ``cachedir``), the nonce the peers' manifests are bound to, and per master its answer or
    its error.
    """

    local: dict
    digests: dict
    cachedir: str
    nonce: str
    answers: dict
    errors: dict


def sync_roots(run, roots="both", test=False, timeout=300):
    """
    Make every peer's ``file_roots`` and ``pillar_roots`` equal to this master's (the primary's);
    see the runner's ``multimaster.sync_roots``.
    """
    try:
        current, found = _sync_target(run, roots)
        kinds, notes = multimaster_manifest.synced_kinds(current, ROOT_CHOICES[roots])
        if not kinds:
            return multimaster_control.finish(
                run, {"masters": {}, "comment": "; ".join(notes)}, False
            )
        round_ = _checked_layouts(
            found,
            multimaster_control.settled_round(
                run,
                found,
                lambda: _manifest_round(run, found, current, kinds, timeout),
                lambda r: (r.answers, r.errors),
            ),
        )
    except SaltInvocationError as exc:
        return multimaster_control.refused(run, exc)
    ret = {"masters": {}, "roots": round_.digests}
    if notes:
        ret["comment"] = "; ".join(notes)
    ret["masters"] = _synced_masters(run, found, round_, test, timeout)
    if not test:
        _further_rounds(run, found, current, kinds, ret["masters"], timeout)
    return multimaster_control.finish(
        run, ret, any(r.get("result") is False for r in ret["masters"].values())
    )


# The most rounds one sync_roots makes while peers answer that directories are left (each
# round carries at most multimaster_rootsanswer.ANSWER_LIMIT of manifests per peer).
MAX_ROUNDS = 50


def _further_rounds(run, found, current, kinds, results, timeout):
    """
    While a peer's answer left directories out (too many differ for one answer), another
    round for the rest, each peer's results added up in ``results``; a peer still left after
    ``MAX_ROUNDS`` fails, with the command that goes on.
    """
    rounds = 1
    while any(r.get("left") for r in results.values()) and rounds < MAX_ROUNDS:
        rounds += 1
        run.progress(f"round {rounds}: directories left on {', '.join(_with_left(results))}")
        try:
            round_ = _checked_layouts(found, _manifest_round(run, found, current, kinds, timeout))
        except SaltInvocationError as exc:
            for master in _with_left(results):
                results[master] = {**results[master], "result": False, "error": str(exc)}
            return
        for master, result in _synced_masters(run, found, round_, False, timeout).items():
            results[master] = _added(results.get(master), result)
    for master in _with_left(results):
        left = results[master]["left"]
        results[master] = {
            **results[master],
            "result": False,
            "error": f"{left} differing director{'y' if left == 1 else 'ies'} left after "
            f"{rounds} rounds: run 'salt-run multimaster.sync_roots' again",
        }


def _with_left(results):
    return sorted(m for m, r in results.items() if r.get("left"))


def _added(before, now):
    """
    One peer's result over two rounds: changes, bytes and failures added up; the later round's
    outcome (its ``left``, its error) with a failure in either round a failure.
    """
    if not before or not before.get("changes"):
        return now
    kept = ("changes", "moved_bytes", "failed", "changed")
    merged = {k: v for k, v in before.items() if k not in ("left", "changed")}
    merged.update({k: v for k, v in now.items() if k not in kept})
    if now.get("changes"):
        merged["changes"] = multimaster_rootsplan.added_reports(
            before["changes"], now["changes"], multimaster_control.SHOWN
        )
        merged["moved_bytes"] = (before.get("moved_bytes") or 0) + (now.get("moved_bytes") or 0)
        merged["failed"] = (before.get("failed") or []) + (now.get("failed") or [])
    merged["result"] = before.get("result") is not False and now.get("result") is not False
    return merged


def _sync_target(run, roots):
    """
    ``(opts, section)``: this master's config on disk and its section. Refuses an unknown
    ``roots`` and a cluster.
    """
    if roots not in ROOT_CHOICES:
        raise multimaster_control.Refused(f"roots={roots!r}: expected one of file, pillar, both")
    current = multimaster_control.on_disk(run)
    found = multimaster_control.acting(run, multimaster_control.section(run, current), "sync_roots")
    return current, found


def _manifest_round(run, found, current, kinds, timeout):
    """
    This master's manifests of ``kinds`` and every master's answer. One round: each master
    compares its digests with this master's and returns its manifests, sealed, only where they
    differ (pillar ones always: see ``multimaster_rootsplan.published``).
    """
    opts = {key: current.get(key) for key in multimaster_manifest.MANIFEST_OPTS}
    local = multimaster_manifest.manifests(opts, kinds)
    digests = multimaster_manifest.digests(local)
    nonce = os.urandom(32).hex()
    answers, errors = multimaster_control.call(
        run,
        found,
        multimaster_control.ids(found),
        "roots_manifest",
        {
            "kinds": kinds,
            "full": True,
            "nonce": nonce,
            "unless": multimaster_rootsplan.published(digests),
            "dirs": _published_dir_digests(run, found, local, opts["cachedir"]),
        },
        timeout,
        multimaster_rootsplan.manifest_answer_check,
    )
    return _Round(local, digests, opts["cachedir"], nonce, answers, errors)


def _checked_layouts(found, round_):
    """
    ``round_``, once its answers show this master is the primary and every master's roots
    pair with it (``multimaster_rootsplan.check_layouts``).
    """
    multimaster_rootsplan.check_layouts(
        multimaster_control.ids(found)[0], round_.local, round_.answers
    )
    return round_


def _published_dir_digests(run, found, local, cachedir):
    """
    This master's per-directory digests for the manifest publish: as they are when they fit in
    ``multimaster_manifest.DIR_DIGESTS_LIMIT``, else ``{"staged": {master: descriptor}}``,
    staged for each peer's control minion to pull (the publish carries only the descriptors),
    with the ``delta`` since the last sync (``multimaster_rootsbase``) that spares a peer
    still at that sync's state the pull.
    """
    dirs = multimaster_rootsplan.published_dir_digests(local)
    if len(salt.utils.json.dumps(dirs)) <= multimaster_manifest.DIR_DIGESTS_LIMIT:
        return dirs
    peers = multimaster_control.ids(found)[1:]
    staged = {m: multimaster_control.staged(run, found, m, dirs) for m in peers}
    return {"staged": staged, "delta": multimaster_rootsbase.deltas(cachedir, local)}


def _synced_masters(run, found, round_, test, timeout):
    """
    Per master: its error, ``changed: False`` where its roots already match, else the result of
    syncing it (in the configured order). Unless ``test``, this round's roots become the next
    sync's base (``multimaster_rootsbase``) where a peer now holds them.
    """
    out = {master: {"result": False, "error": error} for master, error in round_.errors.items()}
    for master in [m for m in multimaster_control.ids(found)[1:] if m in round_.answers]:
        if multimaster_manifest.digests(round_.answers[master]["roots"]) == round_.digests:
            out[master] = {"result": True, "changed": False}
        else:
            out[master] = _sync_one_root_set(run, found, master, round_, test, timeout)
        out[master]["watched"] = _watched(round_.answers[master]["roots"])
    if not test and any(r.get("result") is True and not r.get("left") for r in out.values()):
        multimaster_rootsbase.save(round_.cachedir, round_.local)
    return out


def _watched(roots):
    """
    Whether a master read every one of its roots through the roots watch's record
    (``docs/roots.md``): False names a master that stats every file at each sync.
    """
    found = [
        r.get("watched") is True for envs in roots.values() for rs in envs.values() for r in rs
    ]
    return bool(found) and all(found)


def _sync_one_root_set(run, found, master, round_, test, timeout):
    """
    Plan ``master``'s roots from its manifest in ``round_`` and, unless ``test``, deliver and
    apply the plan.
    """
    answer, local = round_.answers[master], round_.local
    try:
        files, modes, partial, left = opened_manifest(run, found, master, answer, round_.nonce)
        pairs, members = multimaster_rootsplan.sync_plan(local, files, modes, partial)
    except (SaltInvocationError, multimaster_seal.SealError) as exc:
        return {"result": False, "error": f"manifest of {master}: {exc}"}
    except (KeyError, IndexError, TypeError):
        return {"result": False, "error": malformed_manifest(master)}
    report = multimaster_rootsplan.plan_report(pairs, local, multimaster_control.SHOWN)
    more = {"left": left} if left else {}
    if test:
        return {"result": None, "planned": report, **more}
    run.progress(f"{master}: {report['counts']} ({report['bytes']} bytes)")
    plan = _deliver_roots(run, found, master, pairs, members, answer.get("binding"))
    return {**_applied(run, found, master, plan, report, timeout), **more}


def _applied(run, found, master, plan, report, timeout):
    """
    ``master``'s result of applying the staged ``plan`` (whose changes ``report`` lists).
    """
    applied, error = multimaster_control.call_one(
        run, found, master, "apply_roots", {"plan": plan}, timeout
    )
    if error is not None:
        return {"result": False, "error": error, "planned": report}
    failed = applied.get("failed") or []
    run.progress(f"{master}: {applied.get('bytes')} bytes moved, {len(failed)} failed")
    return {
        "result": not failed,
        "changes": report,
        "moved_bytes": applied.get("bytes"),
        "via": applied.get("via"),
        "failed": failed,
    }


# --- a peer's manifest -----------------------------------------------------------------------


class _Nonce:
    """
    The one nonce of this run that a sealed manifest must be bound to (used once per master).
    """

    def __init__(self, value):
        self.value = value

    def consume(self, challenge):
        if challenge != self.value:
            raise multimaster_seal.SealError("manifest is not bound to this run")
        self.value = None


def opened_manifest(run, found, master, answer, nonce):
    """
    ``(files, modes, partial, left)``: the peer's file manifests and directory modes, unsealed
    with this master's key and checked to be signed by the peer's control minion (its key
    accepted here) and bound to this run; per root the directories a manifest covers (``None``:
    the whole root); and how many differing directories the answer left for another round.
    """
    entry = multimaster_control.by_id(found)[master]
    problem = multimaster_masterkey.recipient_problem(run, entry, {})
    if problem:
        raise multimaster_control.Refused(problem)
    body, _ = multimaster_seal.unseal(
        answer.get("sealed"),
        "roots_manifest",
        master,
        multimaster_control.signer_key(run),
        multimaster_control.primary_key_entry(run, entry["minion_id"])[1],
        _expected_binding(master, entry),
        _Nonce(nonce),
    )
    files = body["files"]
    return (
        files,
        multimaster_rootsplan.modes_check(body.get("dir_modes"), files),
        multimaster_rootsplan.partial_check(body.get("dirs"), files),
        multimaster_rootsplan.left_check(body.get("left", 0)),
    )


def malformed_manifest(master):
    return (
        f"manifest of {master}: its answer lacks fields this runner needs; run "
        f"'salt-run saltutil.sync_all' and 'salt <its control minion> saltutil.sync_all' so "
        "both ends run the same formula version"
    )


def _expected_binding(master, entry):
    """
    What a peer's answer must be bound to: the master, and its ``config_dir`` where pillar
    names one (else the peer binds the config dir it resolved itself, which only it knows).
    """
    expect = {"target": master}
    if entry.get("config_dir"):
        expect["config_dir"] = entry["config_dir"]
    return expect


# --- delivery --------------------------------------------------------------------------------


def _deliver_roots(run, found, master, pairs, members, binding):
    """
    Stage the content (encrypted with a fresh key) and the plan (sealed to the peer's control
    minion, carrying that key and the content's descriptor: its ticket, which this master's
    file server serves, reaches no one else), then return the plan's descriptor for the peer
    to pull and apply both.
    """
    entry = multimaster_control.by_id(found)[master]
    key = os.urandom(32)
    content = multimaster_transport.stage_files(
        run.opts, entry["minion_id"], members, key, fileserver=True
    )
    plan = multimaster_seal.seal(
        {
            "key": key.hex(),
            "content": content,
            "pairs": [{k: v for k, v in p.items() if k != "added"} for p in pairs],
        },
        "roots",
        entry["minion_id"],
        multimaster_control.primary_key_entry(run, entry["minion_id"])[1],
        multimaster_control.signer_key(run),
        multimaster_control.bound(multimaster_control.binding({"binding": binding}, master, found)),
    )
    # Sealed to the peer: its file server may hand it over, to that minion only.
    return multimaster_control.staged(run, found, master, plan)
