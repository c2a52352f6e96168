"""
The base of a roots sync: per published root of the primary, the per-directory digests it
had at the end of its last ``sync_roots`` (what every peer that sync left equal now holds).
The next sync publishes, beside its full per-directory digests (staged, hundreds of KB for a
large tree), the directories that changed since: the ``delta``. A peer whose root still has
the base's digest holds exactly the base's directories, so the primary's digests are its own
with the delta applied: it pulls nothing. A peer at another state pulls the full digests, as
before; so a base that no peer holds costs time, never correctness.

Only published roots (``multimaster_rootsplan.published``: no ``pillar_roots``) have a base:
every minion sees a publish.
"""

import hashlib
import json
import os

import multimaster_manifest
import multimaster_rootsread

# The most directories a delta names (changed, added or removed): beyond it the peers pull the
# full digests.
MOST_DELTA_DIRS = 256


def _path(cachedir):
    return os.path.join(cachedir, "multimaster", "roots-base.json")


def _slot(kind, env, index, path):
    return hashlib.sha256(json.dumps([kind, env, index, path]).encode()).hexdigest()


def _load(cachedir):
    try:
        with open(_path(cachedir), encoding="utf-8") as handle:
            base = json.load(handle)
    except (OSError, ValueError):
        return {}
    return base if isinstance(base, dict) else {}


def _published_roots(local):
    for kind, envs in local.items():
        if kind == "pillar_roots":
            continue
        for env, roots in envs.items():
            for index, root in enumerate(roots):
                yield kind, env, index, root


def deltas(cachedir, local):
    """
    ``{kind: {env: [delta or None, ...]}}`` of this master's published roots ``local``
    (``multimaster_manifest.manifests``) against the base kept in ``cachedir``: a delta is
    ``{"base": digest, "dirs": {directory: digest, or None where it is gone}}``; None where
    there is no base or more than ``MOST_DELTA_DIRS`` directories changed.

    cachedir
        This master's cachedir.

    local
        This master's manifests.
    """
    base = _load(cachedir)
    out = {}
    for kind, env, index, root in _published_roots(local):
        kept = base.get(_slot(kind, env, index, root["path"]))
        out.setdefault(kind, {}).setdefault(env, []).append(_delta(kept, root["dir_digests"]))
    return out


def _delta(kept, now):
    """The delta from the kept base ``kept`` to the per-directory digests ``now``."""
    if not isinstance(kept, dict) or not isinstance(kept.get("by_dir"), dict):
        return None
    then = kept["by_dir"]
    changed = {d: now.get(d) for d in set(then) | set(now) if then.get(d) != now.get(d)}
    if len(changed) > MOST_DELTA_DIRS:
        return None
    return {"base": multimaster_manifest.root_digest(then), "dirs": changed}


def save(cachedir, local):
    """
    Keep this master's published roots ``local`` as the base of the next sync (nothing to
    write when it is the base already).

    cachedir
        This master's cachedir.

    local
        The manifests the sync's last round planned from.
    """
    base = {
        _slot(kind, env, index, root["path"]): {"by_dir": root["dir_digests"]}
        for kind, env, index, root in _published_roots(local)
    }
    if base != _load(cachedir):
        multimaster_rootsread.save_json(_path(cachedir), base)
