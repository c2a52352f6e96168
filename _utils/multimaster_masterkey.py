"""
The master-key plane, peer side: what a master's control minion answers for the
``sync_master_key`` runner and ``status`` (the master key or signing key this master stores),
installs (a key pair sealed to it) and checks (that a master serves a key, by a real sign-in).
Plain values in, no loader dunders: the control minion's opts, this master's entry and opts.
"""

import time

import multimaster_daemon
import multimaster_handshake
import multimaster_keys
import multimaster_keystore
import multimaster_seal
import multimaster_transport
from salt.exceptions import CommandExecutionError

# The largest sealed key pair accepted.
ENVELOPE_LIMIT = 1024 * 1024


def master_key_info(minion_opts, master, mopts, signing=False):
    """
    The public master key (or signing key) ``master`` stores, its ``salt-key -F`` value and a
    fresh challenge for the runner's next envelope (``binding``).
    """
    pub = multimaster_keystore.read_master_key(mopts, signing=signing)
    return {
        "name": multimaster_keystore.master_key_files(mopts, signing)[1],
        "pub": pub,
        "own_pub": multimaster_keystore.read_master_key(mopts) if signing else pub,
        "salt_finger": pub and multimaster_keys.salt_finger(pub),
        "binding": multimaster_seal.binding(minion_opts, master),
    }


def verify_served(minion_opts, host, port, pub, sign_pub=None, timeout=60):
    """
    ``(served, reason)``: does the master at ``host:port`` serve ``pub`` (signed with
    ``sign_pub``'s pair)? Retried each second until it does or ``timeout`` has passed.
    """
    deadline = time.monotonic() + timeout
    while True:
        ok, reason = multimaster_handshake.serves(minion_opts, host, port, pub, sign_pub, timeout=5)
        if ok or time.monotonic() > deadline:
            return ok, reason
        time.sleep(1)


def served_args(mopts, pub, signing):
    """
    ``(pub, sign_pub)`` a sign-in must prove: the master's own key, and in signing mode the
    signing pair too.
    """
    if signing:
        return multimaster_keystore.read_master_key(mopts), pub
    return pub, None


def opened_pair(minion_opts, envelope, master, signing):
    """
    Open the envelope (signed by the trusted master, bound to this master and a challenge of
    ours) and check the pair it carries. Returns ``(pem, pub, fp)``.
    """
    purpose = "master_sign" if signing else "master_key"
    body, bound = multimaster_seal.unsealed_for(minion_opts, master, envelope, purpose)
    pub = multimaster_keys.canonical(body.get("pub"), "sealed public key")
    fp = multimaster_keys.fingerprint(pub)
    if bound.get("fp") != fp:
        raise CommandExecutionError(f"sealed key {fp} is not the bound fingerprint {bound['fp']}")
    if multimaster_keys.private_key_fingerprint(body["pem"]) != fp:
        raise CommandExecutionError("sealed key pair: the private key does not match the public")
    return body.pop("pem"), pub, fp


def service(section):
    """
    The service name of the salt-master (``lookup:master:service``).
    """
    return section.get("lookup", {}).get("master", {}).get("service", "salt-master")


def install_master_key(minion_opts, master, section, transfer, pull, signing=False, timeout=90):
    """
    What ``multimaster_peer.install_master_key`` answers: the sealed pair pulled with ``pull``
    stored while the master is stopped (unless it already serves it), the master started
    again and checked by a sign-in.
    """
    mopts = multimaster_keystore.master_opts(master["config_dir"])
    host, port = master["host"], int(section["ports"]["ret"])
    envelope = multimaster_transport.pulled_json(transfer, ENVELOPE_LIMIT, "master key", pull)
    pem, pub, fp = opened_pair(minion_opts, envelope, master, signing)
    result = {"fp": fp, "changed": False, "restarted": None}
    current = multimaster_keystore.read_master_key(mopts, signing=signing)
    if current and multimaster_keys.fingerprint(current) == fp:
        served = served_args(mopts, pub, signing)
        ok, reason = verify_served(minion_opts, host, port, *served, timeout=10)
        if ok:
            return dict(result, served=True, reason=reason)
    # Swap only while the master is stopped: a running master keeps its private key in memory.
    stopped = multimaster_daemon.stop_now(
        mopts["pidfile"], service(section), "salt-master", master["config_dir"]
    )
    try:
        multimaster_keystore.install_master_key(mopts, pem, pub, signing=signing)
    finally:
        del pem
        multimaster_daemon.start_now(stopped, "salt-master", master["config_dir"])
    result.update(changed=True, restarted=stopped["service"] or "daemon")
    if not multimaster_daemon.wait_port(host, port, timeout):
        return dict(result, served=False, reason=f"master did not listen on {host}:{port}")
    served = served_args(mopts, pub, signing)
    ok, reason = verify_served(minion_opts, host, port, *served, timeout=timeout)
    return dict(result, served=ok, reason=reason)
