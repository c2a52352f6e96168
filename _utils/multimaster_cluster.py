"""
The cluster plane (mode cluster), its plain-value part: the planning and the checks of both
ends of the wire contract of the runners ``share_peer_keys`` and ``share_cluster_aes`` (the
request each sends, what the control minion's ``multimaster_peer`` does with it, the check of
its answer), the cluster's AES key file, Salt's readiness sentinels and the no-op Raft entry
(``cluster_ready``), and the cluster part of ``status``. Plain values in, no loader dunders:
the runner and control-minion sides that put them to work are ``multimaster_clustersync``.

The cluster's shared AES key (``cluster_pki_dir/.aes``) on masters with an isolated filesystem:
Salt 3008.3 encrypts every publish of a master cluster with this key and hands it to a minion
when it signs in; a joining master receives it from its peer once. But a master also makes a
new one by itself (a ``salt-key -d``/``-r`` there, or ``publish_session`` seconds after the
last), and tells its peers only to re-read their own file: its ``rotate_cluster_aes_key`` event
carries no key. With no shared filesystem the peers keep the old key, and a minion that signed
in to one master cannot read what another publishes ("Payload decryption failed").

The formula hands the newest key to every peer. Newest is the key with the latest stamp (the
file's mtime, kept when it is copied), ties broken by digest: masters that rotate at the same
time all end with the same key, whatever order the copies arrive in.
"""

import base64
import binascii
import hashlib
import logging
import os
import tempfile

import multimaster_daemon
import multimaster_keys
import multimaster_pillarcheck
import multimaster_safefs
import multimaster_seal
import salt.utils.event
import salt.utils.files
import salt.utils.user
from salt.exceptions import CommandExecutionError, SaltInvocationError

log = logging.getLogger(__name__)

AES_FILE = ".aes"
# What Salt's Crypticle.generate_key_string(192) writes: 24 key bytes and a 32-byte HMAC key.
AES_KEY_BYTES = 56
# Salt's EventMonitor re-reads the key file for this tag when a peer (``__peer_id``) sent it.
RELOAD_TAG = "rotate_cluster_aes_key"


def aes_path(mopts):
    """
    Where the master of ``mopts`` keeps the cluster's AES key.

    mopts
        The master's opts (its ``cluster_pki_dir``).
    """
    return os.path.join(mopts["cluster_pki_dir"], AES_FILE)


def _digest(key):
    return hashlib.sha256(key.encode()).hexdigest()


def read_aes(mopts):
    """
    ``(key, held)`` of the master of ``mopts``: the key text and ``{"stamp", "digest"}``; both
    None when it has no key yet (its salt-master never started as a cluster master). The key
    never leaves the caller: only ``held`` is reported.
    """
    path = aes_path(mopts)
    try:
        with salt.utils.files.fopen(path, "r") as handle:
            key = handle.read().strip()
            stamp = os.fstat(handle.fileno()).st_mtime
    except FileNotFoundError:
        return None, None
    return key, {"stamp": stamp, "digest": _digest(key)}


def held_aes(mopts):
    """
    ``{"stamp", "digest"}`` of the key the master of ``mopts`` holds (None: no key yet). Public:
    a SHA-256 digest of a random key says nothing of it.
    """
    return read_aes(mopts)[1]


CLUSTER_KEY = "cluster.pem"
CLUSTER_PUB = "cluster.pub"


def held_cluster_key(mopts):
    """
    ``{"fingerprint", "pair"}`` of the cluster key pair the master of ``mopts`` holds in its
    ``cluster_pki_dir``: the fingerprint of ``cluster.pub`` (None: no such file, or not a
    public key) and whether ``cluster.pem`` is its private half. Public: the private key is
    read here and never leaves. A joiner's own pair can survive its join (a process starting
    while the join reply rewrites the files makes a new one), and its minions then meet another
    master key than the cluster's.
    """
    directory = mopts["cluster_pki_dir"]
    try:
        with salt.utils.files.fopen(os.path.join(directory, CLUSTER_PUB), "r") as handle:
            public = multimaster_keys.fingerprint(handle.read())
        with salt.utils.files.fopen(os.path.join(directory, CLUSTER_KEY), "r") as handle:
            private = multimaster_keys.private_key_fingerprint(handle.read())
    except (OSError, ValueError, TypeError):
        return {"fingerprint": None, "pair": False}
    return {"fingerprint": public, "pair": public is not None and public == private}


def newer(offered, held):
    """
    Does the key described by ``offered`` (``{"stamp", "digest"}``) replace the one described by
    ``held`` (None: no key)? The later stamp wins, the greater digest on a tie.
    """
    if held is None:
        return True
    return (offered["stamp"], offered["digest"]) > (held["stamp"], held["digest"])


def check_key(key):
    """
    ``key`` as Salt's cluster writes it (base64 of 56 bytes), or ``CommandExecutionError`` that
    does not quote it.
    """
    try:
        valid = isinstance(key, str) and len(base64.b64decode(key, validate=True)) == AES_KEY_BYTES
    except (binascii.Error, ValueError):
        valid = False
    if not valid:
        raise CommandExecutionError(
            f"cluster AES key: not a key as Salt writes it (base64 of {AES_KEY_BYTES} bytes)"
        )
    return key


def install_aes(mopts, key, stamp):
    """
    Make ``key`` the cluster's AES key of the master of ``mopts`` if it is newer than the one
    held (``newer``): written beside the live file (0600, the master's user), its mtime set to
    ``stamp``, renamed over it. Returns True when it was installed. The running master picks it
    up on ``reload`` only.
    """
    offered = {"stamp": stamp, "digest": _digest(check_key(key))}
    if not newer(offered, held_aes(mopts)):
        return False
    path = aes_path(mopts)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".aes-")
    try:
        with os.fdopen(fd, "w") as handle:
            os.fchmod(fd, 0o600)
            user = mopts.get("user")
            if user:
                os.fchown(fd, salt.utils.user.get_uid(user), -1)
            handle.write(key)
            handle.flush()
            os.fsync(fd)
        os.utime(tmp, (stamp, stamp))
        os.rename(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    return True


def reload(mopts, sender):
    """
    Make the running salt-master of ``mopts`` re-read its key file: the event Salt's own
    ``EventMonitor`` handles when a peer rotated (``__peer_id``: ``sender``, the master that
    handed the key on). True once the master's bus took it.
    """
    try:
        with salt.utils.event.get_master_event(mopts, mopts["sock_dir"], listen=False) as bus:
            return bool(bus.fire_event({"__peer_id": sender}, RELOAD_TAG))
    except Exception as exc:  # pylint: disable=broad-except
        log.warning("multimaster: the master did not take %s: %s", RELOAD_TAG, exc)
        return False


class ClusterRefused(SaltInvocationError):
    """
    Not a matter of this set (it is not a cluster) or a master id it does not list: nothing
    was changed.
    """


# Purposes of the signed documents each end checks (both ends are here).
PEER_KEYS_ORDER = "cluster_peer_keys"
AES_ENVELOPE = "cluster_aes"
PEERS_DIR = "peers"


# --- the set ---------------------------------------------------------------------------------


def check_mode(section, why):
    """
    Raise ``ClusterRefused`` (``mode is '<mode>': <why>``) unless ``section``'s mode is cluster.

    section
        The checked ``multimaster`` section.

    why
        What is a cluster matter, for the message.
    """
    if section["mode"] != "cluster":
        raise ClusterRefused(f"mode is {section['mode']!r}: {why}")


def targets(section, named):
    """
    The master ids ``named`` (empty: every master of ``section``); ``ClusterRefused`` names
    those ``section`` does not list.

    section
        The checked ``multimaster`` section.

    named
        A list of master ids.
    """
    ids = [m["id"] for m in section["masters"]]
    chosen = named or ids
    unknown = sorted(set(chosen) - set(ids))
    if unknown:
        raise ClusterRefused(f"masters={unknown}: not in multimaster:masters {ids}")
    return chosen


# --- peer keys: the runner's end -------------------------------------------------------------


def own_peer_keys(section, cluster_pki_dir):
    """
    ``({address: PEM}, [addresses missing here])`` of the configured masters' keys in
    ``cluster_pki_dir/peers/``; an invalid one counts as missing.

    section
        The checked ``multimaster`` section.

    cluster_pki_dir
        This master's ``cluster_pki_dir``.
    """
    held = multimaster_keys.peer_keys(os.path.join(cluster_pki_dir, PEERS_DIR))
    addresses = [multimaster_pillarcheck.cluster_address(m) for m in section["masters"]]
    return (
        {a: held[a] for a in addresses if held.get(a)},
        [a for a in addresses if not held.get(a)],
    )


def peer_keys_check(answer):
    """
    ``answer`` (``multimaster_peer.cluster_peer_keys``), checked to hold a mapping ``held``;
    ValueError otherwise.

    answer
        The peer's answer.
    """
    if not isinstance(answer["held"], dict):
        raise ValueError("held is not a mapping")
    return answer


def peer_keys_plan(address, held, keys):
    """
    ``(missing, report)``: the keys of ``keys`` a master lacks (``{address: PEM}``, never its
    own) and ``{"missing": [...], "conflicts": [...]}``, a conflict being a peer it holds
    another key for (never replaced).

    address
        The master's cluster address.

    held
        ``{address: fingerprint}`` it holds (``peer_keys_check``).

    keys
        ``{address: PEM}`` this master holds (``own_peer_keys``).
    """
    conflicts = sorted(
        peer
        for peer, fp in held.items()
        if peer in keys and fp != multimaster_keys.fingerprint(keys[peer])
    )
    missing = {peer: pem for peer, pem in keys.items() if peer != address and peer not in held}
    return missing, {"missing": sorted(missing), "conflicts": conflicts}


def peer_keys_order(missing, minion_id, signer, bound):
    """
    The order that lets the control minion ``minion_id`` add ``missing`` (``check_peer_keys``
    checks it there); ValueError when it cannot be signed.

    missing
        ``{address: PEM}`` (``peer_keys_plan``).

    minion_id
        The recipient control minion.

    signer
        The private key (PEM) the control minions trust: the cluster's.

    bound
        The binding to the recipient's challenge (``multimaster_seal.bind``).
    """
    return multimaster_seal.order({"keys": missing}, PEER_KEYS_ORDER, minion_id, signer, bound)


def peer_keys_result(report, done):
    """
    ``report`` (``peer_keys_plan``) with what the master did (``install_peer_keys``): the keys
    written, the conflicts either end found, and ``result`` (no conflict).

    report
        The plan's report.

    done
        The peer's answer.
    """
    conflicts = sorted(set(report["conflicts"]) | set(done.get("conflicts") or {}))
    return dict(report, result=not conflicts, written=done.get("written", []), conflicts=conflicts)


# --- peer keys: the peer's end ---------------------------------------------------------------


def member_peers_dir(master, section, mopts):
    """
    The ``peers`` directory of the cluster master ``master``; ``CommandExecutionError`` unless
    the set is a cluster and that master's config joins it.

    master
        This host's entry of ``section["masters"]``.

    section
        The checked ``multimaster`` section.

    mopts
        That master's opts.
    """
    if section["mode"] != "cluster" or not mopts.get("cluster_id"):
        raise CommandExecutionError(
            f"{master['id']}: not a cluster master (mode {section['mode']!r}, cluster_id "
            f"{mopts.get('cluster_id')!r} in {master['config_dir']}/master)"
        )
    return os.path.join(mopts["cluster_pki_dir"], PEERS_DIR)


def held_peer_keys(peers_dir):
    """
    ``{peer id: fingerprint}`` of the keys in ``peers_dir`` (None: invalid).

    peers_dir
        A cluster's ``cluster_pki_dir/peers``.
    """
    return {
        peer: pem and multimaster_keys.fingerprint(pem)
        for peer, pem in multimaster_keys.peer_keys(peers_dir).items()
    }


def check_peer_keys(keys, order, minion_id, master_pub, expect, challenges):
    """
    Raise unless ``order`` is the runner's signature over ``keys`` (``peer_keys_order``) for
    this control minion, bound to a challenge it issued (consumed).

    keys
        ``{address: PEM}`` as published.

    order
        The signed order.

    minion_id
        This control minion's id.

    master_pub
        The public key (PEM) it trusts as its master's: the cluster's.

    expect
        The binding fields that must match (this master's id and config dir).

    challenges
        This minion's ``multimaster_seal.ChallengeStore``.
    """
    if not isinstance(keys, dict):
        raise CommandExecutionError(f"keys: got {type(keys).__name__}; expected {{address: PEM}}")
    multimaster_seal.check_order(
        order, {"keys": keys}, PEER_KEYS_ORDER, minion_id, master_pub, expect, challenges
    )


def install_peer_keys(peers_dir, keys, master, section):
    """
    Add the keys of ``keys`` that ``peers_dir`` lacks; ``{"written", "unchanged",
    "conflicts"}``. Only the other masters of ``section``, only a strict RSA public key, every
    key checked before any is written; a key that differs from one held is never replaced (a
    conflict: a forged key would let its holder read the peers' AES keys).

    peers_dir
        The master's ``member_peers_dir``.

    keys
        ``{address: PEM}`` (checked by ``check_peer_keys``).

    master
        This host's entry of ``section["masters"]``.

    section
        The checked ``multimaster`` section.
    """
    own = multimaster_pillarcheck.cluster_address(master)
    peers = {multimaster_pillarcheck.cluster_address(m) for m in section["masters"]} - {own}
    checked = {}
    for peer, pem in sorted(keys.items()):
        if peer not in peers:
            raise CommandExecutionError(
                f"peer key for {peer!r}: not another master of multimaster:masters "
                f"(expected one of {sorted(peers)})"
            )
        checked[peer] = multimaster_keys.canonical(pem, f"peer key of {peer!r}")
    held = held_peer_keys(peers_dir)
    ret = {"written": [], "unchanged": [], "conflicts": {}}
    for peer, pem in checked.items():
        fp = multimaster_keys.fingerprint(pem)
        if peer in held:
            if held[peer] == fp:
                ret["unchanged"].append(peer)
            else:
                ret["conflicts"][peer] = {"held": held[peer], "offered": fp}
            continue
        multimaster_safefs.write_file(peers_dir, f"{peer}.pub", [pem.encode()], 0o644)
        ret["written"].append(peer)
    if ret["written"]:
        log.info("multimaster: cluster peer keys added: %s", ", ".join(ret["written"]))
    return ret


# --- the AES key: the runner's end -----------------------------------------------------------


def own_aes(mopts):
    """
    ``(key, held)`` of the master of ``mopts`` (``read_aes``); ``ClusterRefused`` when it has
    no key yet.

    mopts
        The master's opts.
    """
    key, held = read_aes(mopts)
    if key is None:
        raise ClusterRefused(
            f"no cluster AES key at {aes_path(mopts)}: this salt-master has not started as a "
            "cluster master yet"
        )
    return key, held


def aes_info_check(answer):
    """
    ``answer`` (``multimaster_peer.cluster_aes_info``), checked to hold ``held``: None or a
    numeric ``stamp`` and a ``digest``; ValueError otherwise.

    answer
        The peer's answer.
    """
    held = answer["held"]
    if held is not None and not (
        isinstance(held.get("stamp"), (int, float)) and isinstance(held.get("digest"), str)
    ):
        raise ValueError("held is not a stamp and a digest")
    pair = answer.get("cluster_key")
    if pair is not None and not (
        isinstance(pair, dict)
        and (pair.get("fingerprint") is None or isinstance(pair["fingerprint"], str))
        and isinstance(pair.get("pair"), bool)
    ):
        raise ValueError("cluster_key is not a fingerprint and a pair flag")
    return answer


def aes_plan(held, own, test):
    """
    The report for a master holding ``held`` when this master's key (``own``) is not sent to
    it (it holds that key or a newer one, or ``test``); None when it is.

    held
        What the master holds (``aes_info_check``).

    own
        What this master holds (``own_aes``).

    test
        Only report.
    """
    if held and held["digest"] == own["digest"]:
        return {"result": True, "current": True}
    if held and newer(held, own):
        # That master rotated later: its own reaction hands its key on.
        return {"result": True, "current": False, "newer_there": True}
    if test:
        return {"result": True, "current": False, "would_install": True}
    return None


def aes_envelope(key, own, minion_id, control_pub, signer, bound):
    """
    ``key`` sealed to the control minion ``minion_id`` (``open_aes_envelope`` opens it there);
    ValueError when it cannot be sealed.

    key
        This master's key (``own_aes``).

    own
        Its stamp and digest.

    minion_id
        The recipient control minion.

    control_pub
        Its public key (PEM) as accepted on this master.

    signer
        The private key (PEM) the control minions trust: the cluster's.

    bound
        The binding to the recipient's challenge, with ``sender`` (this master's id).
    """
    body = {"key": key, "stamp": own["stamp"]}
    return multimaster_seal.seal(body, AES_ENVELOPE, minion_id, control_pub, signer, bound)


def aes_result(done):
    """
    The report of a master's ``install_shared_aes`` answer ``done``: failed when it installed
    the key and its salt-master did not take the reload.

    done
        The peer's answer.
    """
    return {
        "result": bool(not done.get("installed") or done.get("reloaded")),
        "current": False,
        "installed": bool(done.get("installed")),
        "reloaded": bool(done.get("reloaded")),
    }


# --- the AES key: the peer's end -------------------------------------------------------------


def open_aes_envelope(envelope, minion_id, minion_key, master_pub, expect, challenges):
    """
    ``(key, stamp, sender)`` of an ``aes_envelope`` sealed to this control minion, signed with
    the key it trusts and bound to a challenge it issued (consumed); raises otherwise. The key
    is not checked here (``install_aes`` does).

    envelope
        The sealed key.

    minion_id
        This control minion's id.

    minion_key
        Its private key (PEM).

    master_pub
        The public key (PEM) it trusts as its master's: the cluster's.

    expect
        The binding fields that must match (this master's id and config dir).

    challenges
        This minion's ``multimaster_seal.ChallengeStore``.
    """
    body, bound = multimaster_seal.unseal(
        envelope, AES_ENVELOPE, minion_id, minion_key, master_pub, expect, challenges
    )
    stamp = body.get("stamp")
    if isinstance(stamp, bool) or not isinstance(stamp, (int, float)):
        raise CommandExecutionError(f"sealed cluster AES key: stamp {stamp!r} is not a time")
    return body.pop("key", None), stamp, bound.get("sender")


def install_shared_aes(mopts, key, stamp, sender):
    """
    ``install_aes``, and when the key was installed, ``reload``; ``{"installed",
    "reloaded"}``.

    mopts
        The master's opts.

    key
        The key (``open_aes_envelope``).

    stamp
        Its stamp.

    sender
        The master that handed it on (None: unnamed).
    """
    installed = install_aes(mopts, key, stamp)
    ret = {"installed": installed, "reloaded": False}
    if installed:
        log.info("multimaster: cluster AES key from %s installed", sender)
        ret["reloaded"] = reload(mopts, sender or "multimaster")
    return ret


# --- readiness -------------------------------------------------------------------------------

# Salt 3008.3's Raft leader appends nothing when elected and commits only entries of its own
# term, so after a restart that ends in an election (every master restarted, or a restarted
# master winning) the CONFIG entries naming the voters are never applied again: the restarted
# masters never mark themselves ready (``<cachedir>/health/ready``) and defer minion and CLI
# requests. ``cluster.route_clear`` proposes a ROUTE entry, sending this name's writes to every
# master (what an unrouted name gets anyway); Salt carries it to whichever master leads, and
# once it commits the older entries apply with it. Each proposal is one small entry in every
# master's Raft log, and the masters that do not lead log an error for it: proposed only while
# a master is not ready or not settled.
NUDGE_ROUTE = "multimaster"
NUDGE_TAG = "cluster/runner/route_clear"


def nudge_event():
    """
    ``(data, tag)`` of the event that proposes the no-op Raft entry when fired on a master's
    bus (Salt's ``cluster.route_clear data_type=multimaster``).
    """
    return {"data_type": NUDGE_ROUTE}, NUDGE_TAG


def started(pidfile, config_dir, cachedir):
    """
    When a master's running salt-master started (epoch seconds) if it has written Salt's
    ``startup`` sentinel since, else None. Salt clears ``<cachedir>/health`` only when a master
    starts: a sentinel older than the process is a previous run's.

    pidfile
        The master's ``pidfile``.

    config_dir
        Its config directory.

    cachedir
        Its ``cachedir``.
    """
    since = multimaster_daemon.running_since(pidfile, "salt-master", config_dir)
    return since if since is not None and _sentinel(cachedir, "startup", since) else None


def ready(cachedir, since):
    """
    Has the master whose salt-master started at ``since`` (``started``) written Salt's
    readiness sentinel ``<cachedir>/health/ready`` since: its Raft applied the entry naming it
    a voter?

    cachedir
        Its ``cachedir``.

    since
        When it started.
    """
    return _sentinel(cachedir, "ready", since)


def _sentinel(cachedir, name, since):
    try:
        return os.path.getmtime(os.path.join(cachedir, "health", name)) >= since
    except OSError:
        return False


# --- status ----------------------------------------------------------------------------------


def status_report(section, members):
    """
    ``(report, failed)``: Salt's Raft membership (``members``), every configured master a
    member (members the section no longer lists are named, not a failure), a leader elected,
    and the balancer's frontends and each master's publish/return ports (what HAProxy's
    health checks probe) accepting connections.

    section
        The checked ``multimaster`` section, mode cluster.

    members
        What ``cluster.members`` returned on this master (a mapping with ``error`` when it
        failed).
    """
    ports = section["ports"]
    expected = [multimaster_pillarcheck.cluster_address(m) for m in section["masters"]]
    if not isinstance(members, dict):
        members = {"error": f"cluster.members returned {members!r}"}
    known = set(members.get("voters", [])) | set(members.get("learners", []))
    ret = {
        "cluster": {
            "voters": members.get("voters", []),
            "learners": members.get("learners", []),
            "leader": members.get("leader_id"),
            "missing": [address for address in expected if address not in known],
            # Salt 3008.3 keeps a removed master in its Raft (a learner once demoted).
            "not_configured": sorted(known - set(expected)),
        },
        "backends": {address: _ports_open(address, ports) for address in expected},
    }
    if members.get("error"):
        ret["cluster"]["error"] = members["error"]
    balancer = (section.get("cluster") or {}).get("balancer")
    if balancer:
        ret["balancer"] = _ports_open(balancer, ports)
    down = [a for a, up in ret["backends"].items() if not all(up.values())]
    ret["backends_down"] = down
    failed = bool(ret["cluster"]["missing"] or down or not ret["cluster"]["leader"])
    failed = failed or "error" in ret["cluster"] or not all(ret.get("balancer", {}).values())
    return ret, failed


def aes_agreement(held, errors):
    """
    ``(report, failed)``: whether every master holds one cluster AES key. A master holding
    another key cannot read what the others publish to its minions, nor they what it does.

    held
        ``{master id: {"stamp", "digest"} or None}`` (``held_aes``; None: no key yet).

    errors
        ``{master id: why}`` for masters whose key could not be asked.
    """
    masters = {
        m: {"stamp": h["stamp"], "digest": h["digest"][:12]} if h else {"error": "no key yet"}
        for m, h in held.items()
    }
    masters.update({m: {"error": why} for m, why in errors.items()})
    digests = {h["digest"] if h else None for h in held.values()}
    alike = not errors and len(digests) == 1 and None not in digests
    return {"alike": alike, "masters": dict(sorted(masters.items()))}, not alike


CLUSTER_KEY_REPAIR = (
    "stop each master named, copy cluster.pem and cluster.pub from a master holding the "
    "cluster's key into its cluster_pki_dir (mode 0400) and start it (docs/cluster.md)"
)


def cluster_key_agreement(held, errors):
    """
    ``(report, failed)``: whether every master holds one cluster key pair. A master holding
    another pair hands its minions another master key than the cluster's: they refuse the
    cluster's publishes, or the others' minions refuse its own.

    held
        ``{master id: {"fingerprint", "pair"} or None}`` (``held_cluster_key``; None: its
        control minion did not report it), the master running status first.

    errors
        ``{master id: why}`` for masters whose pair could not be asked.
    """
    counts = {}
    for pair in held.values():
        if pair and pair["fingerprint"] and pair["pair"]:
            counts[pair["fingerprint"]] = counts.get(pair["fingerprint"], 0) + 1
    # The fingerprint most masters hold is the cluster's (a lone joiner made the other one);
    # on a tie, the one met first: ``key_agreement`` puts the master running status first.
    common = max(counts, key=counts.get) if counts else None
    masters = {m: {"error": why} for m, why in errors.items()}
    for master, pair in held.items():
        masters[master] = _cluster_key_entry(pair, common)
    off = sorted(m for m, entry in masters.items() if "error" in entry or not entry["alike"])
    report = {"alike": not off, "masters": dict(sorted(masters.items()))}
    if off:
        report["comment"] = f"{', '.join(off)}: {CLUSTER_KEY_REPAIR}"
    return report, bool(off)


def _cluster_key_entry(pair, common):
    if pair is None:
        return {
            "error": "its control minion does not report its cluster key pair: "
            "sync the formula's modules to it (saltutil.sync_all)"
        }
    if pair["fingerprint"] is None:
        return {"error": "no cluster.pub (or not a public key) in its cluster_pki_dir"}
    entry = {"fingerprint": pair["fingerprint"], "alike": pair["fingerprint"] == common}
    if not pair["pair"]:
        entry.update(alike=False, error="its cluster.pem is not the private half of cluster.pub")
    return entry


def _ports_open(address, ports):
    return {name: multimaster_daemon.port_open(address, ports[name]) for name in ("publish", "ret")}


def restart_order(masters, here, leave_out=()):
    """
    ``[(step, [minion id])]``: the masters of ``masters`` but ``leave_out`` (ids), restarted
    one at a time (masters of a cluster that start together race their joins: one kept an AES
    key of its own), each a step ``peer-<n>`` of its own, and last, as step ``here``, the one
    whose address is ``here``: the master running the orchestration never restarts while it
    waits for a return.
    """
    kept = [m for m in masters if m["id"] not in leave_out]
    own = [m["minion_id"] for m in kept if multimaster_pillarcheck.cluster_address(m) == here]
    others = [m for m in kept if multimaster_pillarcheck.cluster_address(m) != here]
    steps = [(f"peer-{index}", [m["minion_id"]]) for index, m in enumerate(others, 1)]
    return steps + ([("here", own)] if own else [])


def join_plan(masters, new_id, address, members):
    """
    How the master ``new_id`` (at ``address``) joins: ``{"joined", "leader", "masters",
    "problem"}``. ``masters`` is pillar's ``multimaster:masters``, returned with the new entry's
    ``cluster_peers`` set to the Raft leader for the join job alone (Salt 3008.3: a joiner talks
    only to the peers it lists, and one of them must be the leader); ``problem`` says why it
    cannot join when it is no member and ``members`` (``cluster.members`` here, or
    ``{"error": ...}``) names no leader.
    """
    joined = address in set(members.get("voters", [])) | set(members.get("learners", []))
    leader = members.get("leader_id")
    problem = None
    if not joined and not leader:
        problem = members.get("error") or (
            f"cluster.members on this master names no Raft leader (voters: "
            f"{members.get('voters', [])})"
        )
    return {
        "joined": joined,
        "leader": leader,
        "masters": [
            dict(m, cluster_peers=[leader]) if m.get("id") == new_id and leader else m
            for m in masters
        ],
        "problem": problem,
    }
