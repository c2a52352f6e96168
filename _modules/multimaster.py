"""
Multi-master helpers that run on master hosts (through their control minion) and on minions.

The SLS files of the ``multimaster`` formula call these functions so that Jinja only renders data:
``settings`` merges and validates the pillar, ``master_config``/``minion_config`` derive the
``master.d``/``minion.d`` files, ``restart_minion`` restarts the minion after the current job.
"""

import contextlib
import hashlib
import logging
import os
import socket
import sys
import time

import salt.config
import salt.payload
import salt.utils.atomicfile
import salt.utils.files
from salt.exceptions import CommandExecutionError

try:
    import multimaster_daemon
    import multimaster_handshake
    import multimaster_ids
    import multimaster_keys
    import multimaster_keystore
    import multimaster_seal
    import multimaster_settings

    HAS_UTILS = True
except ImportError:
    HAS_UTILS = False

log = logging.getLogger(__name__)

__virtualname__ = "multimaster"

_DEFAULTS_URL = "salt://multimaster/parameters/defaults.yaml"
# How many ids a return lists; counts are always complete.
SAMPLE = 50


def __virtual__():
    if not HAS_UTILS:
        return (
            False,
            "multimaster: the multimaster_* utils are missing; run saltutil.sync_all",
        )
    return __virtualname__


def _defaults(defaults):
    if defaults is not None:
        return defaults
    if "multimaster.defaults" not in __context__:
        import salt.utils.yaml

        text = __salt__["cp.get_file_str"](_DEFAULTS_URL)
        if not text:
            raise CommandExecutionError(f"multimaster: cannot read {_DEFAULTS_URL}")
        __context__["multimaster.defaults"] = salt.utils.yaml.safe_load(text)["values"]
    return __context__["multimaster.defaults"]


def _local_master(settings):
    """
    This host's master entry (the one whose control minion we are) with its paths resolved.
    """
    master = multimaster_settings.find_master(settings, __opts__["id"])
    if master is None:
        return None
    config_dir = master.get("config_dir") or os.path.dirname(__opts__["conf_file"])
    opts = salt.config.master_config(os.path.join(config_dir, "master"))
    return dict(
        master,
        config_dir=config_dir,
        pki_dir=opts["pki_dir"],
        cachedir=opts["cachedir"],
        pidfile=opts["pidfile"],
        user=opts["user"],
    )


def settings(defaults=None):
    """
    Return the validated ``multimaster`` settings: pillar merged over the formula defaults, plus
    ``local`` paths of this host (minion config and pki dirs, and the master entry this minion
    controls, if any). Raises an error naming the bad pillar key before anything changes.

    CLI Example:

    .. code-block:: bash

        salt '*' multimaster.settings
    """
    # unmask: outside a template render Salt 3008's pillar.get returns '**********' for values.
    merged = multimaster_settings.build(
        __salt__["pillar.get"]("multimaster", {}, unmask=True), _defaults(defaults)
    )
    local_master = _local_master(merged)
    merged["local"] = {
        "minion_conf_dir": os.path.dirname(__opts__["conf_file"]),
        "minion_pki_dir": __opts__["pki_dir"],
        "minion_pidfile": __opts__["pidfile"],
        "master": local_master,
    }
    merged["config"] = {
        "minion": multimaster_settings.minion_config(merged),
        "master": local_master and multimaster_settings.master_config(merged, local_master),
    }
    return merged


def validate(defaults=None):
    """
    Check the ``multimaster`` pillar; True when valid, else an error naming the key and value.

    CLI Example:

    .. code-block:: bash

        salt '*' multimaster.validate
    """
    settings(defaults)
    return True


def master_config(defaults=None):
    """
    The ``master.d`` options for the master this control minion manages.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster.master_config
    """
    config = settings(defaults)["config"]["master"]
    if config is None:
        raise CommandExecutionError(
            f"multimaster:masters: no entry has minion_id {__opts__['id']!r}; "
            "apply multimaster.master only on the control minion of a listed master"
        )
    return config


def minion_config(defaults=None):
    """
    The ``minion.d`` options (master list, master_type, failover settings) for this minion.

    CLI Example:

    .. code-block:: bash

        salt '*' multimaster.minion_config
    """
    return settings(defaults)["config"]["minion"]


def key_file_problems(pki_dir, user):
    """
    List what is wrong with the master key files in ``pki_dir``: private keys must be regular
    files, mode 0400, owned by ``user``; symlinks (Salt's ``master.pem`` compatibility links)
    are followed to their target. Returns an empty list when all is well or no key exists yet.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster.key_file_problems /etc/salt/pki/master salt
    """
    import pwd

    problems = []
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        return [f"user {user!r} does not exist"]
    try:
        names = sorted(os.listdir(pki_dir))
    except FileNotFoundError:
        return []
    seen = set()
    for name in names:
        if not name.endswith((".pem", ".pub")):
            continue
        path = os.path.join(pki_dir, name)
        real = os.path.realpath(path)
        # master.pem/.pub are links to <id>.pem/.pub in 3008: check each file once.
        if real in seen:
            continue
        seen.add(real)
        if not os.path.isfile(real):
            problems.append(f"{path}: not a regular file")
            continue
        stat = os.stat(real)
        mode = stat.st_mode & 0o777
        private = name.endswith(".pem")
        if private and mode != 0o400:
            problems.append(f"{real}: mode {mode:04o}; expected 0400")
        if not private and mode & 0o022:
            problems.append(f"{real}: mode {mode:04o}; expected not group/world-writable")
        if stat.st_uid != uid:
            problems.append(f"{real}: owner uid {stat.st_uid}; expected {user} ({uid})")
    return problems


def restart_minion(service="salt-minion", delay=0):
    """
    Restart this salt-minion once the current job has returned: as a service where it is one,
    else by re-running its own command line as a daemon. Does nothing (and says so) where no
    salt-minion runs, e.g. ``salt-call --local`` in an image build.

    CLI Example:

    .. code-block:: bash

        salt '*' multimaster.restart_minion
    """
    return multimaster_daemon.schedule_restart(
        __opts__["pidfile"], service, wait_pid=os.getpid(), delay=float(delay)
    )


def restart_master(pidfile, service="salt-master", delay=0):
    """
    Restart the salt-master recorded in ``pidfile`` once the current job has returned, the way
    it runs (service or ``-d`` daemon). Does nothing (and says so) where it is not running.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster.restart_master /var/run/salt-master.pid
    """
    return multimaster_daemon.schedule_restart(
        pidfile, service, wait_pid=os.getpid(), delay=float(delay)
    )


def active_master():
    """
    The master this minion is connected to right now (on a multi-master minion
    ``__opts__["master"]`` names only the current one; ``master_list`` names all).

    CLI Example:

    .. code-block:: bash

        salt-call multimaster.active_master
    """
    return {
        "master": __opts__.get("master"),
        "master_list": __opts__.get("master_list", __opts__.get("master")),
        "master_type": __opts__.get("master_type"),
    }


def check_masters(timeout=2, defaults=None):
    """
    Can this minion reach each master's publish and ret ports? One entry per master id.

    CLI Example:

    .. code-block:: bash

        salt '*' multimaster.check_masters timeout=1
    """
    merged = settings(defaults)
    report = {}
    for master in merged["masters"]:
        entry = {"host": master["host"]}
        for name, port in merged["ports"].items():
            try:
                with socket.create_connection((master["host"], port), timeout=float(timeout)):
                    entry[name] = True
            except OSError:
                entry[name] = False
        report[master["id"]] = entry
    return report


# --- key plane: the master-host side of the runner's work -------------------------------------


def _master_opts(config_dir):
    """
    Options of the master this control minion manages. ``config_dir`` may be a path, or a mapping
    ``{control minion id: path}`` so one publish can address every master.
    """
    if isinstance(config_dir, dict):
        config_dir = config_dir.get(__opts__["id"])
    if not config_dir:
        local = settings()["local"]["master"]
        config_dir = local["config_dir"] if local else os.path.dirname(__opts__["conf_file"])
    return config_dir, multimaster_keystore.master_opts(config_dir)


def key_inventory(config_dir=None, buckets=None, ids=None, with_pubs=False):
    """
    This master's minion-key inventory. Without ``buckets``/``ids``: only digests (the total and
    one per bucket), the count and whether an interrupted run needs repair — a few KB whatever
    the number of keys. With ``buckets`` or ``ids``: the entries ``{id: [state, fp, ...]}`` in
    them and, with ``with_pubs``, their public keys.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster.key_inventory /etc/salt
        salt master2 multimaster.key_inventory /etc/salt ids='[minion1]' with_pubs=True
    """
    _, mopts = _master_opts(config_dir)
    alive = _master_alive(mopts)
    wanted = None
    if ids is not None:
        wanted = set(ids)
    elif buckets is not None:
        chosen = {int(b) for b in buckets}
        wanted = lambda minion_id: multimaster_keys.bucket_of(minion_id) in chosen  # noqa: E731
    full_scan = wanted is None
    with _fingerprint_cache(mopts, full_scan) as fp_cache:
        entries, pubs = multimaster_keystore.inventory(
            mopts, with_pubs=with_pubs, ids=wanted, fp_cache=fp_cache
        )
    if full_scan:
        total, per_bucket = multimaster_keys.digests(entries)
        return {
            "alive": alive,
            "digest": total,
            "buckets": per_bucket,
            "count": len(entries),
            "repair": multimaster_keystore.repair_needed(mopts),
        }
    return {"alive": alive, "entries": entries, "pubs": pubs}


@contextlib.contextmanager
def _fingerprint_cache(mopts, full_scan):
    """
    Fingerprints of this master's key files from the last full scan, kept in this minion's
    cachedir (public data only): a re-run reads only the files that changed.
    """
    name = hashlib.sha256(mopts["pki_dir"].encode()).hexdigest()[:16]
    path = os.path.join(__opts__["cachedir"], "multimaster", f"fingerprints-{name}.p")
    try:
        with salt.utils.files.fopen(path, "rb") as handle:
            known = salt.payload.load(handle)
    except (OSError, ValueError, TypeError):
        known = {}
    cache = multimaster_keystore.FingerprintCache(known if isinstance(known, dict) else {})
    yield cache
    if full_scan and cache.changed:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with salt.utils.atomicfile.atomic_open(path, "wb") as handle:
            salt.payload.dump(cache.seen, handle)


def _master_alive(mopts):
    """
    Is this host's salt-master running and listening on its ret port?
    """
    if multimaster_daemon.read_pid(mopts["pidfile"]) is None:
        return False
    host = mopts["interface"]
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return multimaster_daemon.wait_port(host, mopts["ret_port"], timeout=2)


# What each planned action leaves in the key store (None: no key at all).
_TARGET_STATE = {
    "accept": "accepted",
    "pend": "pending",
    "reject": "rejected",
    "deny": "denied",
    "delete": None,
}


def _checked_pem(action):
    pem = multimaster_keys.canonical(action.get("pub"), f"key of {action['id']!r}")
    if multimaster_keys.fingerprint(pem) != action.get("fp"):
        raise multimaster_keys.InvalidKeyError(
            f"key of {action['id']!r}: fingerprint {multimaster_keys.fingerprint(pem)} "
            f"does not match the planned {action.get('fp')}"
        )
    return pem


def apply_key_actions(actions, config_dir=None):
    """
    Apply planned key actions to this master's key store: each ``{"id", "op"
    (accept|pend|reject|deny|delete), "fp", "pub", "expect"}``. Every id and key is checked before
    anything is written (a bad one refuses the whole batch); an action whose id changed since it
    was planned (``expect``) is skipped. Repairs what an interrupted run left, and rotates the AES
    key when an accepted key was removed.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster.apply_key_actions '[{"id": "m1", "op": "delete", "fp": null}]'
    """
    _, mopts = _master_opts(config_dir)
    checked = []
    for action in actions:
        multimaster_ids.check_id(action.get("id"), "minion id")
        if action.get("op") not in _TARGET_STATE:
            raise CommandExecutionError(f"unknown key action {action.get('op')!r}")
        pem = None if action["op"] == "delete" else _checked_pem(action)
        checked.append((action, pem))
    repaired = multimaster_keystore.repair(mopts)
    current, _ = multimaster_keystore.inventory(mopts, ids={a["id"] for a in actions})
    changes, done, skipped, rotate = [], [], [], False
    for action, pem in checked:
        minion_id, op = action["id"], action["op"]
        held = current.get(minion_id)
        if held != action.get("expect"):
            skipped.append({"id": minion_id, "op": op, "reason": f"changed since planned: {held}"})
            continue
        changes.append((minion_id, _TARGET_STATE[op], pem))
        rotate = rotate or (op in ("reject", "delete") and bool(held) and held[0] == "accepted")
        done.append({"id": minion_id, "op": op})
    start = time.monotonic()
    multimaster_keystore.write(mopts, changes)
    log.info("multimaster: wrote %d key change(s) in %.2fs", len(changes), time.monotonic() - start)
    if rotate:
        multimaster_keystore.rotate_aes(mopts)
    counts = {}
    for item in done:
        counts[item["op"]] = counts.get(item["op"], 0) + 1
    # Counts and a sample: a 10,000-key return would cost more on the wire than the work itself.
    return {
        "changes": counts,
        "ids": sorted(item["id"] for item in done)[:SAMPLE],
        "skipped": skipped[:SAMPLE],
        "skipped_count": len(skipped),
        "repaired": repaired[:SAMPLE],
        "rotated": rotate,
    }


def master_key_info(config_dir=None, signing=False):
    """
    Fingerprints of the master key pair this master stores (or its signing pair): ours (SHA-256
    of the DER public key) and Salt's ``salt-key -F`` value. Public data only.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster.master_key_info /etc/salt
    """
    _, mopts = _master_opts(config_dir)
    pub = multimaster_keystore.read_master_key(mopts, signing=signing)
    return {
        "name": multimaster_keystore.master_key_files(mopts, signing)[1],
        "fp": pub and multimaster_keys.fingerprint(pub),
        "salt_finger": pub and multimaster_keys.salt_finger(pub),
        "pub": pub,
    }


def _own_private_key():
    with salt.utils.files.fopen(os.path.join(__opts__["pki_dir"], "minion.pem")) as fh_:
        return fh_.read()


def _signer_pub():
    # The master that sent the envelope is one this minion already trusts: its cached key.
    with salt.utils.files.fopen(os.path.join(__opts__["pki_dir"], "minion_master.pub")) as fh_:
        return fh_.read()


def _verify_served(host, port, pub, sign_pub=None, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        ok, reason = multimaster_handshake.serves(__opts__, host, port, pub, sign_pub, timeout=5)
        if ok or time.monotonic() > deadline:
            return ok, reason
        time.sleep(1)


def _default_master_cmdline(config_dir):
    # A master that was not running is started as a daemon from this Salt install.
    return [os.path.join(os.path.dirname(sys.executable), "salt-master"), "-c", config_dir, "-d"]


def _served_args(mopts, pub, signing):
    # What a sign-in must prove: the master's own key, and in signing mode the signing pair too.
    if signing:
        return multimaster_keystore.read_master_key(mopts), pub
    return pub, None


def install_master_key(envelope, host, port, config_dir=None, signing=False, timeout=90):
    """
    Install the master key pair (or signing pair) sealed to this control minion by the
    ``sync_master_key`` runner: open and verify the envelope, stop this host's master, store the
    pair through the key cache, start the master the way it ran, wait until it answers, and
    verify by a real sign-in that it serves the new key. Never returns or logs the key.

    CLI Example:

    .. code-block:: bash

        salt-run multimaster.sync_master_key   # the runner calls this; not meant for the CLI
    """
    config_dir, mopts = _master_opts(config_dir)
    purpose = "master_sign" if signing else "master_key"
    body = multimaster_seal.unseal(
        envelope, purpose, __opts__["id"], _own_private_key(), _signer_pub()
    )
    pub = multimaster_keys.canonical(body["pub"], "sealed public key")
    fp = multimaster_keys.fingerprint(pub)
    if multimaster_keys.private_key_fingerprint(body["pem"]) != fp:
        raise CommandExecutionError("sealed key pair: the private key does not match the public")
    result = {"fp": fp, "changed": False, "restarted": None}
    current = multimaster_keystore.read_master_key(mopts, signing=signing)
    if current and multimaster_keys.fingerprint(current) == fp:
        ok, reason = _verify_served(host, port, *_served_args(mopts, pub, signing), timeout=10)
        if ok:
            return dict(result, served=True, reason=reason)
    # Swap only while the master is stopped: a running master keeps its private key in memory.
    stopped = multimaster_daemon.stop_now(mopts["pidfile"], "salt-master")
    multimaster_keystore.install_master_key(mopts, body.pop("pem"), pub, signing=signing)
    multimaster_daemon.start_now(stopped, _default_master_cmdline(config_dir))
    result.update(changed=True, restarted=stopped["service"] or "daemon")
    if not multimaster_daemon.wait_port(host, port, timeout):
        return dict(result, served=False, reason=f"master did not listen on {host}:{port}")
    ok, reason = _verify_served(host, port, *_served_args(mopts, pub, signing), timeout=timeout)
    return dict(result, served=ok, reason=reason)


def restart_master_now(host, port, config_dir=None, timeout=90):
    """
    Restart this host's master now (the way it runs) and wait until it listens again.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster.restart_master_now 127.0.0.3 4506
    """
    config_dir, mopts = _master_opts(config_dir)
    stopped = multimaster_daemon.stop_now(mopts["pidfile"], "salt-master")
    multimaster_daemon.start_now(stopped, _default_master_cmdline(config_dir))
    if not multimaster_daemon.wait_port(host, int(port), timeout):
        raise CommandExecutionError(f"salt-master did not listen on {host}:{port} after restart")
    return stopped["service"] or "daemon"


def verify_master_key(host, port, pub, sign_pub=None, timeout=30):
    """
    Does the master at ``host:port`` serve ``pub`` (and sign it with ``sign_pub``'s pair)?
    Checked by a real sign-in with this minion's own key, which must be accepted there.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster.verify_master_key 127.0.0.3 4506 "$(cat master.pub)"
    """
    ok, reason = _verify_served(host, int(port), pub, sign_pub, timeout=float(timeout))
    return {"served": ok, "reason": reason, "fp": multimaster_keys.fingerprint(pub)}


def master_report(config_dir=None, signing=False, ping_timeout=5):
    """
    What ``salt-run multimaster.status`` needs from this host in one call: the key inventory
    digests, the master key (or signing key) fingerprints, and the minions that answer
    ``test.ping`` from this master.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster.master_report /etc/salt
    """
    report = {
        "keys": key_inventory(config_dir),
        "master_key": master_key_info(config_dir, signing=signing),
        "answering": [],
    }
    report["master_key"].pop("pub")
    # A stopped master is reported as such (the runner treats alive False as unreachable).
    report["alive"] = report["keys"]["alive"]
    if report["alive"]:
        report["answering"] = ping_minions(config_dir, timeout=ping_timeout)
    return report


def ping_minions(config_dir=None, timeout=5):
    """
    The minions that answer ``test.ping`` published by this host's master.

    CLI Example:

    .. code-block:: bash

        salt master2 multimaster.ping_minions /etc/salt
    """
    import salt.client

    config_dir, _ = _master_opts(config_dir)
    with salt.client.get_local_client(os.path.join(config_dir, "master")) as client:
        returns = client.cmd("*", "test.ping", timeout=int(timeout))
    return sorted(minion for minion, ret in returns.items() if ret is True)
