"""
The rotation plane: a new master key on every master of a set that signs, no minion restarted.

A minion with ``verify_master_pubkey_sign`` takes a *changed* master key when the master's
signature over it verifies with the ``master_sign.pub`` it trusts (Salt's
``verify_signing_master``). So a set whose masters share a signing pair can change every
master key: the primary makes a fresh pair for each master (mode failover) or one pair for all
(mode hot), seals it to that master's control minion (the master-key plane's envelope), and
each master is stopped for the swap and started again once, the primary last, from this
runner's own process. Every master's new key is then proven by a real, signature-verifying
sign-in from another master's control minion, which was never restarted.

A hot minion keeps one cached master key for all its masters, and Salt checks a sign-in's
token against the key cached when the answer comes, not when the token was encrypted: while
its sign-ins run side by side (its connection and its job processes, after a master restarts),
the first one that meets the new key changes the cache and the others fail. So in mode hot
every minion takes the new key ahead (``take_master_key``, checked against the signing key it
trusts) before any master serves it: every later sign-in encrypts its token to the new key.

The peer side is ``minions_verifying``: which minions reached by a master verify signed keys.
The runner side refuses before any change when a minion would be cut off (it does not verify,
or it answers no master) and keeps one record per rotation (``generation``: only public
fingerprints) in the primary's ``pki_dir``, so that a re-run resumes or is a no-op.
"""

import base64
import json
import os

import multimaster_control
import multimaster_daemon
import multimaster_keys
import multimaster_keystore
import multimaster_keysync
import multimaster_masterkey
import multimaster_masterkeyfiles
import multimaster_pillarcheck
import multimaster_returns
import multimaster_seal
import multimaster_settle
import salt.client
import salt.key
import salt.utils.atomicfile
import salt.utils.files
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from salt.exceptions import CommandExecutionError, SaltInvocationError

RECORD = "multimaster_rotation.json"
# Where a minion caches its master's public key (one file for all its masters).
MINION_MASTER_PUB = "minion_master.pub"
PREPARE = (
    "apply multimaster.minion to them with multimaster:signing:enabled in pillar (docs/rotation.md)"
)
PREPARE_ONE = PREPARE.replace(" to them ", " to it ")

# --- peer side (run by a control minion) ---------------------------------------------------


def minions_verifying(config_dir, timeout=5):
    """
    ``{minion id: verifies}`` for the minions that answer the master of ``config_dir``:
    whether each takes only a master key signed by the pair it trusts
    (``verify_master_pubkey_sign``). What a minion says of itself is only its own risk: one
    that says yes and does not verify cuts itself off.
    """
    with salt.client.get_local_client(os.path.join(config_dir, "master")) as client:
        returns = multimaster_returns.cmd(
            client,
            "*",
            "config.get",
            int(timeout),
            arg=["verify_master_pubkey_sign"],
            full_return=True,
        )
    # Salt lists a targeted minion that did not return as False, or as a "no_return" entry.
    return {
        minion: ret["ret"] is True
        for minion, ret in (returns or {}).items()
        if isinstance(ret, dict) and "ret" in ret and ret.get("out") != "no_return"
    }


def check_verifying(answer):
    """
    ``answer`` of ``minions_verifying`` as the runner uses it: ``{"minions": {id: bool}}``.
    """
    minions = answer["minions"]
    if not isinstance(minions, dict) or not all(
        isinstance(k, str) and isinstance(v, bool) for k, v in minions.items()
    ):
        raise ValueError("minions is not a map of minion ids to true/false")
    return answer


# --- minion side (every minion of a hot set) --------------------------------------------------


def _signed_bytes(pub):
    # The text the primary signs and a minion checks: the key without surrounding whitespace.
    return pub.strip().encode()


def sign_key(signing_pem, pub):
    """
    The signing pair's signature over ``pub`` (base64), as ``take_master_key`` checks it.
    """
    key = serialization.load_pem_private_key(signing_pem.encode(), None)
    signature = key.sign(_signed_bytes(pub), padding.PKCS1v15(), hashes.SHA256())
    return base64.b64encode(signature).decode()


def _trusted_signing_key(minion_opts):
    name = f"{minion_opts.get('master_sign_key_name') or 'master_sign'}.pub"
    try:
        with salt.utils.files.fopen(os.path.join(minion_opts["pki_dir"], name), "r") as handle:
            return serialization.load_pem_public_key(handle.read().encode())
    except (FileNotFoundError, ValueError):
        raise CommandExecutionError(
            f"no readable {name} in {minion_opts['pki_dir']}: this minion trusts no signing "
            f"key; {PREPARE_ONE}"
        ) from None


def _check_signed(minion_opts, pub, signature):
    try:
        raw = base64.b64decode(str(signature), validate=True)
        _trusted_signing_key(minion_opts).verify(
            raw, _signed_bytes(pub), padding.PKCS1v15(), hashes.SHA256()
        )
    except (InvalidSignature, ValueError):
        raise CommandExecutionError(
            "the key is not signed by the signing pair this minion trusts: nothing changed"
        ) from None


def take_master_key(minion_opts, pub, signature):
    """
    What ``multimaster.take_master_key`` answers: ``pub`` stored as this minion's cached master
    key when ``signature`` verifies with the signing key it trusts; ``{"fingerprint",
    "changed"}``. Refused, changing nothing, on a minion that does not verify signed keys, or
    that checks every publish with its cached key (``sign_pub_messages``: the masters not yet
    rotated would be refused).
    """
    if not minion_opts.get("verify_master_pubkey_sign"):
        raise CommandExecutionError(
            "this minion does not verify signed master keys (verify_master_pubkey_sign); "
            + PREPARE_ONE
        )
    if minion_opts.get("sign_pub_messages"):
        raise CommandExecutionError(
            "this minion checks every publish with its cached master key (sign_pub_messages): "
            "it takes the new key at its next sign-in instead"
        )
    try:
        pub = multimaster_keys.canonical(pub, "pub")
    except multimaster_keys.InvalidKeyError as exc:
        raise CommandExecutionError(str(exc)) from None
    _check_signed(minion_opts, pub, signature)
    path = os.path.join(minion_opts["pki_dir"], MINION_MASTER_PUB)
    fp = multimaster_keys.fingerprint(pub)
    try:
        with salt.utils.files.fopen(path, "r") as handle:
            if multimaster_keys.fingerprint(handle.read()) == fp:
                return {"fingerprint": fp, "changed": False}
    except FileNotFoundError:
        pass
    # atomic_open keeps the mode of the file it replaces: a sign-in never reads half a key.
    with salt.utils.atomicfile.atomic_open(path, "w") as handle:
        handle.write(pub)
    return {"fingerprint": fp, "changed": True}


# --- runner side -----------------------------------------------------------------------------


def signs(section):
    """
    Whether the masters of ``section`` share a signing pair that minions verify.
    """
    return multimaster_pillarcheck.signs(section)


def unrotatable(section):
    """
    Why the masters of ``section`` cannot rotate their keys with no minion outage, or None.
    """
    if not signs(section):
        return (
            "the masters do not share a signing pair, so every minion would refuse a new "
            "master key: set multimaster:signing in pillar and run salt-run "
            "multimaster.enable_signing (docs/rotation.md)"
        )
    return None


def checked_generation(value):
    """
    ``value`` as a rotation's generation (an integer from 1), else ``Refused`` naming it.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        value = repr(value)
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise multimaster_control.Refused(
            f"generation: got {value}; expected the number of this rotation (1 for the first, "
            "one more for each later one)"
        )
    return number


def record_path(opts):
    return os.path.join(opts["pki_dir"], RECORD)


def read_record(opts):
    """
    The last rotation's record ``{"generation", "masters": {id: fingerprint}, "done"}``, or
    None before the first.
    """
    try:
        with salt.utils.files.fopen(record_path(opts), "r") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None


def write_record(opts, record):
    """
    Store ``record`` (public fingerprints only) beside the master's keys, 0600.
    """
    with salt.utils.atomicfile.atomic_open(record_path(opts), "w") as handle:
        json.dump(record, handle, sort_keys=True)
    # atomic_open gives the file the mode of the one it replaces (or the umask's).
    os.chmod(record_path(opts), 0o600)


def generation_record(opts, generation):
    """
    The record this run continues: the stored one when it is of ``generation``, a new one when
    ``generation`` is the next; ``Refused`` for an older or skipped generation.
    """
    record = read_record(opts)
    last = record["generation"] if record else 0
    if record and generation == last:
        return record
    if record and not record.get("done"):
        raise multimaster_control.Refused(
            f"generation {last} did not finish: run rotate_master_key generation={last} again first"
        )
    if generation != last + 1:
        raise multimaster_control.Refused(
            f"generation: got {generation}; the last rotation was generation {last}, so "
            f"the next is {last + 1}"
        )
    return {"generation": generation, "masters": {}, "done": False}


def new_pair(keysize):
    """
    ``(private PEM, public PEM)`` of a fresh RSA pair as Salt writes a master's: PKCS#1
    private, SubjectPublicKeyInfo public.
    """
    key = rsa.generate_private_key(public_exponent=65537, key_size=max(int(keysize), 2048))
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ).decode()
    pub = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return pem, pub


def unready_minions(run, answers, skip_unanswered):
    """
    Why the minions would be cut off by a new key, or None: one that does not verify signed
    keys, or (unless ``skip_unanswered``) an accepted one that answered no master.
    """
    said = {}
    for answer in answers.values():
        for minion, verifies in answer["minions"].items():
            said[minion] = said.get(minion, True) and verifies
    plain = sorted(m for m, verifies in said.items() if not verifies)
    if plain:
        return (
            f"minions {multimaster_keys.shown(plain)} do not verify a signed master key "
            f"(verify_master_pubkey_sign): a new key would cut them off; {PREPARE}"
        )
    accepted = salt.key.get_key(run.opts).list_status("acc").get("minions", [])
    silent = sorted(set(accepted) - set(said))
    if silent and not skip_unanswered:
        return (
            f"minions {multimaster_keys.shown(silent)} answered no master: one that is down, "
            "start and run again (or pass skip_unanswered=True if it verifies signed keys); "
            "one that does not verify signed keys cannot sign in to a master that signs: " + PREPARE
        )
    return None


def check_minions(run, section, skip_unanswered, timeout):
    """
    Ask every master which of its minions verify signed keys; ``Refused`` when a master does
    not answer or a minion would be cut off.
    """
    order = multimaster_control.ids(section)
    answers, errors = multimaster_control.call(
        run, section, order, "minions_verifying", {}, timeout, check=check_verifying
    )
    if errors:
        raise multimaster_control.Refused(
            "every master must answer before its key changes: "
            + "; ".join(f"{m}: {e}" for m, e in sorted(errors.items()))
        )
    problem = unready_minions(run, answers, skip_unanswered)
    if problem:
        raise multimaster_control.Refused(problem)


def planned(section, plan, record):
    """
    The masters whose stored key is not yet the one this generation gave them, in the order
    they rotate: the peers, then the primary (its restart ends this runner's publishes). In
    mode hot, every master when one is.
    """
    order = multimaster_control.ids(section)
    stale = []
    for master in order[1:] + order[:1]:
        own = plan["info"][master].get("own_pub") or ""
        if multimaster_keys.fingerprint(own) != record["masters"].get(master):
            stale.append(master)
    if stale and not multimaster_masterkey.uses_signing(section):
        # Mode hot shares one key: a run that stopped half-way gives every master a new one.
        return order[1:] + order[:1]
    return stale


def deliver_to_peer(run, section, master, plan, held, pair, timeout, signer):
    """
    Seal ``pair`` to the control minion of peer ``master``, signed with ``signer`` (the master
    key that control minion caches), which stops its master, stores the pair, starts it again
    and proves it by a sign-in. Returns the master's report.
    """
    entry = multimaster_control.by_id(section)[master]
    problem = multimaster_masterkey.recipient_problem(run, entry, held)
    if problem:
        return {"result": False, "error": f"refused: {problem}"}
    pem, pub = pair
    fp = multimaster_keys.fingerprint(pub)
    envelope = multimaster_seal.seal(
        {"pem": pem, "pub": pub},
        "master_key",
        entry["minion_id"],
        multimaster_control.primary_key_entry(run, entry["minion_id"])[1],
        signer,
        multimaster_control.bound(
            multimaster_control.binding(plan["info"][master], master, section), fp=fp
        ),
    )
    transfer = multimaster_control.staged(run, section, master, envelope)
    done, error = multimaster_control.call_one(
        run, section, master, "install_master_key", {"transfer": transfer}, timeout
    )
    if error is not None:
        return {"result": False, "error": error}
    return {"result": bool(done.get("served")), "restarted": done.get("restarted")}


def restart_here(run, section, timeout, while_stopped=None):
    """
    Restart this master (the primary) the way it ran, calling ``while_stopped(mopts)`` while
    it is stopped, and wait for its port. This runner's own process does it: the restart would
    lose the return of a control minion's job.
    """
    config_dir = os.path.dirname(run.opts["conf_file"])
    mopts = multimaster_keystore.master_opts(config_dir)
    entry = multimaster_control.by_id(section)[multimaster_control.ids(section)[0]]
    try:
        stopped = multimaster_daemon.stop_now(
            mopts["pidfile"], multimaster_masterkey.service(section), "salt-master", config_dir
        )
        try:
            if while_stopped is not None:
                while_stopped(mopts)
        finally:
            multimaster_daemon.start_now(stopped, "salt-master", config_dir)
    except CommandExecutionError as exc:
        return {"result": False, "error": str(exc)}
    port = int(section["ports"]["ret"])
    if not multimaster_daemon.wait_port(entry["host"], port, timeout):
        return {"result": False, "error": f"this master did not listen on port {port}"}
    return {"result": True, "restarted": stopped["service"] or "daemon"}


def install_here(run, section, pair, timeout):
    """
    Install ``pair`` on this master (the primary) while it is stopped (``restart_here``).
    """
    return restart_here(
        run,
        section,
        timeout,
        lambda mopts: multimaster_masterkeyfiles.install_master_key(mopts, *pair),
    )


def take_ahead(run, pub, timeout):
    """
    Mode hot: every minion that answers this master caches ``pub`` before any master serves
    it, checking the primary's signature; returns the ids that took it. One that did not takes
    it at its next sign-in, as Salt does, where a sign-in running beside it can fail once.
    """
    signing = multimaster_keystore.master_opts(os.path.dirname(run.opts["conf_file"]))
    signing_pem = multimaster_masterkeyfiles.read_master_key(signing, signing=True, private=True)
    kwarg = {"pub": pub, "signature": sign_key(signing_pem, pub)}
    del signing_pem
    with salt.client.get_local_client(run.opts["conf_file"]) as client:
        returns = multimaster_returns.cmd(
            client, "*", "multimaster.take_master_key", int(timeout), kwarg=kwarg, full_return=True
        )
    fp = multimaster_keys.fingerprint(pub)
    return {
        minion
        for minion, ret in (returns or {}).items()
        if isinstance(ret, dict)
        and isinstance(ret.get("ret"), dict)
        and ret["ret"].get("fingerprint") == fp
    }


def shared_pair(run, section, record, stale, timeout):
    """
    Mode hot: ``(pair, taken)``, one fresh pair for every master of ``stale``, recorded, and
    the minions that took it ahead (``take_ahead``). Mode failover: ``(None, set())``.
    """
    if multimaster_masterkey.uses_signing(section):
        return None, set()
    pair = new_pair(run.opts.get("keysize", 2048))
    for master in stale:
        record["masters"][master] = multimaster_keys.fingerprint(pair[1])
    write_record(run.opts, record)
    run.progress("every minion: taking the new master key ahead")
    return pair, take_ahead(run, pair[1], min(int(timeout), 60))


def ahead_report(run, taken):
    """
    ``{"taken": count, "not_taken": [accepted ids]}`` of the minions that took the key ahead.
    """
    accepted = salt.key.get_key(run.opts).list_status("acc").get("minions", [])
    return {"taken": len(taken), "not_taken": sorted(set(accepted) - set(taken))}


def rotate(run, section, plan, record, stale, timeout, shared=None, taken=()):
    """
    A fresh pair for each master of ``stale`` (``shared``, the one pair of a hot set, for
    every one), its fingerprint recorded before it is sent; returns ``{master: report}``.
    A control minion in ``taken`` caches the new key already, so its envelope is signed with
    it: the key it checks envelopes with is the one it caches.
    """
    primary = multimaster_control.ids(section)[0]
    control = [m["minion_id"] for m in section["masters"]]
    held = multimaster_keysync.inventories(run, section, 60, ids=control)["inventories"]
    reports = {}
    for master in stale:
        pair = shared or new_pair(run.opts.get("keysize", 2048))
        record["masters"][master] = multimaster_keys.fingerprint(pair[1])
        write_record(run.opts, record)
        run.progress(f"{master}: installing a new master key, restarting, verifying")
        if master == primary:
            reports[master] = install_here(run, section, pair, timeout)
        else:
            ahead = multimaster_control.by_id(section)[master]["minion_id"] in taken
            signer = pair[0] if ahead else multimaster_control.signer_key(run)
            reports[master] = deliver_to_peer(
                run, section, master, plan, held, pair, timeout, signer
            )
        del pair
        if reports[master]["result"] is False:
            break
    return reports


def verified(run, section, record, plan, timeout):
    """
    Every master proves by a signature-verifying sign-in, from the next master's control
    minion, that it serves the key of this generation; ``{master: report}``.
    """
    info, _ = multimaster_control.call(
        run, section, multimaster_control.ids(section), "master_key_info", {}, 60
    )
    ret = {"masters": {}}
    for master in multimaster_control.ids(section):
        own = (info.get(master) or {}).get("pub") or ""
        if multimaster_keys.fingerprint(own) != record["masters"].get(master):
            ret["masters"][master] = {"result": False, "error": "stores another key than planned"}
        plan["info"].setdefault(master, {})["own_pub"] = own
    multimaster_masterkey.verify_all(run, section, ret, plan, True, timeout)
    return ret["masters"]


def prepared(run, generation, skip_unanswered):
    """
    ``(section, plan, record, stale)`` of a rotation that may go ahead; ``Refused`` otherwise.
    """
    section = multimaster_control.acting(run, multimaster_control.section(run), "rotate_master_key")
    problem = unrotatable(section)
    if problem:
        raise multimaster_control.Refused(problem)
    record = generation_record(run.opts, checked_generation(generation))
    multimaster_control.await_restarts(run, section)
    plan, errors = multimaster_masterkey.key_plan(run, section, True, 60)
    problems = [f"{m}: {e}" for m, e in sorted(errors.items())]
    problems += [f"{m} holds another signing pair: run sync_master_key" for m in plan["stale"]]
    if problems:
        raise multimaster_control.Refused(
            "every master must answer and hold the primary's signing pair: " + "; ".join(problems)
        )
    stale = planned(section, plan, record)
    if stale:
        check_minions(run, section, skip_unanswered, 60)
    return section, plan, record, stale


def merged(ret, checked):
    """
    Put each master's sign-in report of ``checked`` into ``ret["masters"]``.
    """
    for master, report in checked.items():
        entry = ret["masters"].setdefault(master, {"result": True})
        # The rotation's own error says more than the check after it: keep it.
        entry.update({k: v for k, v in report.items() if k not in ("result", *entry)})
        if report.get("result") is False:
            entry["result"] = False


def rotate_master_key(run, generation=None, test=False, skip_unanswered=False, timeout=180):
    """
    The ``rotate_master_key`` runner: refuse what would cut a minion off, then (unless ``test``)
    give every master whose key is not yet of ``generation`` a new one, and prove them all.
    """
    try:
        section, plan, record, stale = prepared(run, generation, skip_unanswered)
    except SaltInvocationError as exc:
        return multimaster_control.refused(run, exc)
    ret = {"generation": record["generation"], "rotated": stale, "masters": {}}
    if test:
        ret["comment"] = f"would give {', '.join(stale)} a new key" if stale else "nothing to do"
        return multimaster_control.finish(run, ret, False)
    if stale:
        shared, taken = shared_pair(run, section, record, stale, timeout)
        if shared:
            ret["ahead"] = ahead_report(run, taken)
        ret["masters"] = rotate(run, section, plan, record, stale, timeout, shared, taken)
        del shared
    if stale and stale[-1] in ret["masters"]:
        ret["settled"] = multimaster_settle.wait_masters(run, timeout=timeout)
    merged(ret, verified(run, section, record, plan, timeout))
    failed = any(r.get("result") is False for r in ret["masters"].values())
    failed = failed or bool(ret.get("settled", {}).get("retcode"))
    if failed:
        ret["comment"] = f"rotation incomplete: run it again with generation={ret['generation']}"
    else:
        if not record.get("done"):
            write_record(run.opts, dict(record, done=True))
        ret["comment"] = "every master serves its new key"
        if not stale:
            ret["comment"] = f"generation {ret['generation']} is in place: nothing changed"
    return multimaster_control.finish(run, ret, failed)
