"""
Multi-master helpers that users and the formula's SLS files call, on masters' control minions
and on every minion.

The SLS files call these functions so that Jinja only renders data: ``settings`` merges and
validates the pillar, ``master_config``/``minion_config`` derive the ``master.d``/``minion.d``
files. Restarting, stopping and syncing this host's own Salt daemons lives in
``multimaster_daemons``; what only the ``multimaster`` runners drive on a master host lives in
``multimaster_peer``.

Every function here can be published and its return lands in the job cache: none returns a
secret. The files that hold secrets are written by the formula's states, which compute them at
run time (``multimaster_local``).
"""

import logging
import os
import socket
import time

import salt.utils.files
from salt.exceptions import CommandExecutionError

try:
    import multimaster_cluster
    import multimaster_clustersync
    import multimaster_daemon
    import multimaster_haproxy
    import multimaster_ids
    import multimaster_local
    import multimaster_pillarcheck
    import multimaster_rotation
    import multimaster_safefs
    import multimaster_saltcompat
    import multimaster_settings

    HAS_UTILS = True
except ImportError:
    HAS_UTILS = False

log = logging.getLogger(__name__)

__virtualname__ = "multimaster"


def __virtual__():
    if not HAS_UTILS:
        return (
            False,
            "multimaster: the multimaster_* utils are missing; run saltutil.sync_all",
        )
    return __virtualname__


def settings(defaults=None, redact=True):
    """
    Return the validated ``multimaster`` settings: pillar merged over the formula defaults, plus
    ``local`` paths of this host (minion config and pki dirs, and the master entry this minion
    controls, if any) and the ``config`` files derived from them. What may be secret is masked
    (``master:config`` values, credentials in gitfs remote URLs, any ``*secret*``/``*password*``/
    ``*token*`` key): the return lands in the master's job cache. Raises an error naming the bad
    pillar key before anything changes.

    defaults
        The formula defaults (``parameters/defaults.yaml`` ``values``); read from the file
        server when not given.

    redact
        Only ``True``: the secrets never leave this host through a return. The formula's
        states write them to their files at run time.

    CLI Example:

    .. code-block:: bash

        salt '*' multimaster.settings
    """
    if redact is not True:
        raise CommandExecutionError(
            f"redact={redact!r} is not accepted: multimaster.settings always masks secrets (its "
            "return lands in the job cache); leave redact out. The formula's states write the "
            "secrets to their master.d files at run time"
        )
    merged = multimaster_local.settings(__salt__, __opts__, __grains__, __context__, defaults)
    return multimaster_settings.redacted_settings(merged)


def haproxy_config(defaults=None):
    """
    The ``haproxy.cfg`` text ``multimaster.haproxy`` installs for the cluster in pillar (mode
    cluster): frontends on the balancer address, every master a health-checked backend server.

    defaults
        As for ``settings``.

    CLI Example:

    .. code-block:: bash

        salt balancer1 multimaster.haproxy_config
    """
    merged = settings(defaults)
    if merged["mode"] != "cluster":
        raise CommandExecutionError(
            f"multimaster:mode is {merged['mode']!r}; the balancer is only for mode 'cluster'"
        )
    return multimaster_haproxy.config_text(merged)


def validate(defaults=None):
    """
    Check the ``multimaster`` pillar; True when valid, else an error naming the key and value.

    defaults
        As for ``settings``.

    CLI Example:

    .. code-block:: bash

        salt '*' multimaster.validate
    """
    settings(defaults)
    return True


def master_config(defaults=None):
    """
    The ``master.d`` options for the master this control minion manages, with what may be secret
    masked (the return lands in the job cache; the state writes the real values).

    defaults
        As for ``settings``.

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

    defaults
        As for ``settings``.

    CLI Example:

    .. code-block:: bash

        salt '*' multimaster.minion_config
    """
    return settings(defaults)["config"]["minion"]


def key_file_problems(pki_dir, user):
    """
    List what is wrong with the master key files in ``pki_dir``: private keys must be regular
    files owned by ``user`` that no one else can read or write and no one can execute (0400;
    0200, where Salt leaves a key it stopped using, reveals nothing either); public keys must
    not be group/world-writable; symlinks (Salt's ``master.pem`` compatibility links) are
    followed to their target. Returns an empty list when all is well or no key exists yet.

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
        try:
            stat = os.stat(real)
        except FileNotFoundError:
            stat = None
            if not os.path.islink(path):
                continue  # removed since the listing (Salt rewrites a key by remove, write)
        except OSError:  # a link loop, a directory it may not search
            stat = None
        if stat is None or not os.path.isfile(real):
            problems.append(f"{path}: not a regular file")
            continue
        mode = stat.st_mode & 0o777
        private = name.endswith(".pem")
        # What leaks is access by anyone else. Salt's flush of the master.pem link chmods its
        # target 0200 before removing the link, and may leave it so: no one can read that.
        if private and mode & 0o177:
            problems.append(f"{real}: mode {mode:04o}; expected 0400")
        if not private and mode & 0o022:
            problems.append(f"{real}: mode {mode:04o}; expected not group/world-writable")
        if stat.st_uid != uid:
            problems.append(f"{real}: owner uid {stat.st_uid}; expected {user} ({uid})")
    return problems


# How long after its salt-minion started a minion claims its first highstate (default of
# pillar multimaster:reactor:first_highstate_window, as in the formula's defaults.yaml): long
# enough for a new minion whose key is accepted within minutes, short enough that a start event
# forged for a minion that has run for a while highstates nothing.
FIRST_HIGHSTATE_WINDOW = 600
_WINDOW_KEY = "multimaster:reactor:first_highstate_window"


def claim_first_highstate(**kwargs):
    """
    Run ``state.highstate`` on this minion if nothing has claimed its first highstate yet and
    its salt-minion started moments ago: what every master's first-highstate reactor publishes
    when the minion starts. The mark (``<pki_dir>/multimaster_first_highstate``) is created
    atomically, so when every master's reactor calls this at once, on a restart or after a
    failover, exactly one call runs the highstate. ``multimaster.minion`` sets the mark on
    minions it configures, so switching the reactor on does not highstate a fleet that is
    already set up. Delete the mark to have the next start run a highstate again.

    Any minion can fire a start event with another minion's id in it: the claim is made only
    while this salt-minion process (the one its pidfile names, verified) started at most
    ``multimaster:reactor:first_highstate_window`` seconds ago (pillar or minion config,
    default 600). Past that nothing is claimed and the mark stays unset: restart the minion to
    have its first highstate.

    CLI Example:

    .. code-block:: bash

        salt web1 multimaster.claim_first_highstate
    """
    path = multimaster_local.first_highstate_mark(__opts__)
    if not os.path.lexists(path):
        late = _not_just_started()
        if late:
            return {"highstate": False, "comment": late}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        with salt.utils.files.fopen(path) as fh:
            return {"highstate": False, "comment": f"already claimed: {fh.read(500).strip()}"}
    with os.fdopen(fd, "w") as fh:
        fh.write(f"jid {kwargs.get('__pub_jid')} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
    return {"highstate": True, "ret": __salt__["state.highstate"](queue=True)}


def _first_highstate_window():
    value = __salt__["config.get"](_WINDOW_KEY, FIRST_HIGHSTATE_WINDOW)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CommandExecutionError(
            f"{_WINDOW_KEY}: got {value!r}; expected an integer number of seconds >= 1"
        )
    return value


def _not_just_started():
    """
    Why this minion must not claim its first highstate now (its salt-minion did not start
    within the window, or cannot be told to have), or None.
    """
    window = _first_highstate_window()
    pidfile = __opts__["pidfile"]
    since = multimaster_daemon.running_since(
        pidfile, "salt-minion", os.path.dirname(__opts__["conf_file"])
    )
    if since is None:
        return (
            f"no running salt-minion of this config is recorded in {pidfile}: this minion cannot "
            "tell that it just started; not claimed"
        )
    age = time.time() - since
    if age > window:
        return (
            f"this salt-minion started {age:.0f} s ago, longer than {_WINDOW_KEY} ({window} s): "
            "a start event for a minion that did not just start is a replay or forged; not "
            "claimed (restart the minion to have its first highstate)"
        )
    return None


def forget_cluster_peer(peer, rotate_secret=False, test=False):
    """
    Delete the cluster peer key ``cluster_pki_dir/peers/<peer>.pub`` of this host's cluster
    master: what ``multimaster.orch.remove_master`` runs on every remaining master once the
    removed one is stopped, before they restart without it. Only a master no longer listed in
    ``multimaster:masters`` can be forgotten; the path comes from this master's own config.

    peer
        The removed master's cluster address (its Raft node id, as in ``cluster_peers``).

    rotate_secret
        Refuse, changing nothing, while this master still holds the peer's key and runs with
        the ``multimaster:cluster:secret`` that pillar holds now: the removed master knows that
        secret. Put a new one in pillar first; the restart that follows writes it.

    test
        Check only: say what would be deleted, delete nothing.

    CLI Example:

    .. code-block:: bash

        salt master1 multimaster.forget_cluster_peer 127.0.0.4 rotate_secret=True
    """
    multimaster_ids.check_id(peer, "peer")
    # The pillar alone (no formula defaults from the file server): a cluster names its mode.
    section = multimaster_pillarcheck.check_section(
        multimaster_saltcompat.pillar_section(__salt__, "multimaster")
    )
    peers_dir, held = multimaster_clustersync.peer_to_forget(__opts__, section, peer, rotate_secret)
    if held and not test:
        multimaster_safefs.delete_file(peers_dir, f"{peer}.pub")
        log.info("multimaster: cluster peer key of %s deleted from %s", peer, peers_dir)
    return {"peer": peer, "deleted": held and not test, "held": held, "peers_dir": peers_dir}


def take_master_key(pub, signature):
    """
    Cache ``pub`` as this minion's master key (``minion_master.pub``) when ``signature``
    verifies with the ``master_sign.pub`` this minion trusts. ``rotate_master_key`` calls it on
    every minion of a hot set before any master serves the new key, so that no sign-in meets a
    key it did not encrypt its token to. Refused, changing nothing, where the minion does not
    verify signed master keys or checks every publish with its cached key
    (``sign_pub_messages``). Returns the key's fingerprint and whether the cache changed.

    pub
        The new master public key (PEM).

    signature
        The primary's signing pair's signature over it (base64).

    CLI Example:

    .. code-block:: bash

        salt '*' multimaster.take_master_key pub="$(cat master.pub)" signature=...
    """
    return multimaster_rotation.take_master_key(__opts__, pub, signature)


def id_problems(ids):
    """
    What is wrong with each id in ``ids``: one message per value that is not a strict minion or
    master id (no leading '.' or '-', no glob characters, commas, whitespace, control characters
    or path separators, at most 64 bytes), naming what it is, the value and the expected form;
    an empty list when all are ids. The orchestrations check the ids their pillar names with it,
    before any of them reaches a state.

    ids
        A mapping of what each value is (a pillar key, for the message) to the value; values
        that are None (an optional setting left out) are not checked.

    CLI Example:

    .. code-block:: bash

        salt-call multimaster.id_problems '{"pillar multimaster_new": "web*"}'
    """
    if not isinstance(ids, dict):
        raise CommandExecutionError(
            f"ids: got {ids!r}; expected a mapping of what each value is to the value"
        )
    return multimaster_ids.problems(ids)


def cluster_restart_order(leave_out=None):
    """
    Mode cluster: the order the orchestrations restart the masters in, ``[[step, [minion
    id]]]``: one master per step, the master this runs on (its ``interface``) last. Run where
    an orchestration renders, on a master.

    leave_out
        Ids of masters not to restart (the one being added or removed).

    CLI Example:

    .. code-block:: bash

        salt-run salt.cmd multimaster.cluster_restart_order
    """
    masters = settings()["masters"]
    order = multimaster_cluster.restart_order(masters, __opts__.get("interface"), leave_out or [])
    return [[step, targets] for step, targets in order]


def cluster_join_plan(new_id):
    """
    Mode cluster: how the listed master ``new_id`` joins, as ``multimaster.orch.add_master``
    renders it on a master: ``{"joined", "leader", "masters", "problem"}`` from this master's
    ``cluster.members``; ``masters`` is pillar's list with the new entry's ``cluster_peers`` set
    to the leader, for the join job alone.

    new_id
        The joining master's id (its address).

    CLI Example:

    .. code-block:: bash

        salt-run salt.cmd multimaster.cluster_join_plan 10.0.3.24
    """
    found = [m for m in settings()["masters"] if m["id"] == new_id]
    if not found:
        raise CommandExecutionError(
            f"new_id: got {new_id!r}; expected the id of a master in multimaster:masters"
        )
    return multimaster_cluster.join_plan(
        __pillar__.get("multimaster", {}).get("masters", []),
        new_id,
        multimaster_pillarcheck.cluster_address(found[0]),
        multimaster_clustersync.members(__opts__),
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


def check_resolves(hosts):
    """
    Check that this minion resolves every master address in ``hosts``; raises an error naming
    those it cannot. ``multimaster.minion`` runs it before it writes the master list: a hot
    minion that lists a name it cannot resolve answers none of its masters until the name
    resolves (measured in ``bench/README.md``).

    hosts
        The addresses of the minion's ``master`` list (IP addresses or DNS names).

    CLI Example:

    .. code-block:: bash

        salt '*' multimaster.check_resolves '[10.0.3.61, master2.example.com]'
    """
    if isinstance(hosts, str):
        hosts = [hosts]
    missing = multimaster_settings.unresolvable(hosts, __opts__.get("ipv6"))
    if missing:
        raise CommandExecutionError(
            f"multimaster: {', '.join(repr(h) for h in missing)} "
            f"{'does' if len(missing) == 1 else 'do'} not resolve on "
            f"{__opts__['id']}: Salt's minion retries a master name it cannot resolve (retry_dns) "
            "before it goes on, and a hot minion answers none of its masters meanwhile. Give the "
            "name an address (DNS or /etc/hosts) or put the master's IP address in pillar "
            "multimaster:masters, then apply again"
        )
    return True


def check_masters(timeout=2, defaults=None):
    """
    Can this minion reach each master's publish and ret ports? One entry per master id.

    timeout
        Seconds per connection attempt.

    defaults
        As for ``settings``.

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
