"""
A hot set grows and shrinks on separate hosts with Salt's default paths. Its masters' reactor
config came with the image (in ``master.d`` before the formula's runners were ever synced to
them): once the set is built with the formula, ``salt-key -a`` on master2 reaches master1, and a
reaction that could not run said so in the master's log at error level. A new minion of the
set gets exactly one first highstate from the two masters' reactions. Then the "Adding a master"
walk-through of docs/adding-masters.md runs as written: master3 joins and leaves, into and out
of the slot the set's pillar reserves for it: no minion the formula configured and no master
the set ran restarts, the minions pinged from the primary through the join miss no ping, and
none of them ever meets a master key of master3's own (it first starts with the set's key).
"""

import json
import os
import threading

import psutil

from tests.support import walkthrough
from tests.support.hostwatch import Pinger, minion_pid
from toolkit import hosts as nshosts

HOSTS = {
    "master1": "10.0.3.61",
    "master2": "10.0.3.230",
    "minion1": "10.0.3.71",
    "minion3": "10.0.3.73",
    "master3": "10.0.3.232",
}
PRIMARY = "10.0.3.61"
PAGE = "docs/adding-masters.md"
IMAGE_REACTOR = """\
reactor:
  - salt/key: [salt://multimaster/reactor/keys.sls]
"""
PILLAR = """\
multimaster:
  mode: hot
  reactor: {keys: true, first_highstate: true}
  reserved: [10.0.3.232]
  masters:
    - {id: master1, host: 10.0.3.61}
    - {id: master2, host: 10.0.3.230}
  master:
    file_roots: {base: [/srv/salt, /srv/formulas/multimaster-formula]}
    pillar_roots: {base: [/srv/pillar]}
"""


def _first_highstate_returned(master):
    """
    Whether ``master``'s job cache holds minion3's return of the first-highstate job.
    """
    jobs = master.sh(
        "salt-run jobs.list_jobs search_function=state.sls search_target=minion3 --out=json",
        check=False,
    ).stdout
    for jid in json.loads(jobs or "{}"):
        ret = master.sh(f"salt-run jobs.lookup_jid {jid} --out=json", check=False).stdout
        if '"minion3"' in ret:
            return True
    return False


def _reactor_error(master):
    """
    Whether ``master``'s log says at error level that the key reactor cannot run.
    """
    lines = master.log("master", tail=2000).splitlines()
    return any("[ERROR" in line and "the key reactor cannot run" in line for line in lines)


def _minion_pids(host_set, names):
    """
    Each host's salt-minion PID, from Salt's default pidfile (None while a restart has none).
    """
    return {name: minion_pid(host_set[name]) for name in names}


def _master_pids(host_set, names):
    """
    Each host's salt-master PID, from Salt's default pidfile.
    """
    return {name: host_set[name].path("/run/salt-master.pid").read_text().strip() for name in names}


PINGED = ("minion1", "minion3")
MASTER_PUB = "/etc/salt/pki/master/master.pub"


def _master_pub(host):
    """
    The public master key in ``host``'s key store (Salt 3008 makes ``master.pub`` a link to
    ``<id>.pub``, an absolute path inside the host).
    """
    path = host.path(MASTER_PUB)
    if path.is_symlink():
        target = os.readlink(path)
        path = host.path(target) if os.path.isabs(target) else path.parent / target
    return path.read_text()


def _served_keys(master3, stop, seen):
    """
    Every public master key master3's key store holds while a salt-master runs there (its
    default pidfile names a live process), read every 0.2 s until ``stop`` is set: what a
    minion signing in to it would have been shown.
    """
    pidfile = master3.path("/run/salt-master.pid")
    while not stop.wait(0.2):
        try:
            running = psutil.pid_exists(int(pidfile.read_text().strip()))
            key = _master_pub(master3)
        except (OSError, ValueError):
            continue
        if running:
            seen.add(key)


def _answer_master3(host_set, minions):
    return set(minions) <= nshosts.answering(host_set["master3"], minions)


def _accepted(host, minion):
    return minion in host.sh("salt-key -l acc").stdout.split()


PREPARE = f"""
{nshosts.SERVE_FORMULA}# The site's highstate: minion3 counts its runs.
printf "base:\\n  minion3: [counted]\\n" > /srv/salt/top.sls
printf "/srv/highstates:\\n  file.append:\\n    - text: highstate\\n" > /srv/salt/counted.sls
cat > /srv/pillar/multimaster.sls <<'YAML'
{PILLAR}YAML
{nshosts.accept_all("master[12]|minion1", 3)}"""
BUILD = """
salt '*' saltutil.sync_all && salt-run saltutil.sync_all
salt 'master*' state.apply multimaster.master
salt-run multimaster.sync_master_key
salt-run multimaster.sync_roots
salt-run multimaster.sync_keys
# each master's runners now come from its own roots, before the restart that loads them
salt 'master*' state.apply multimaster.master
salt-run multimaster.wait_masters     # a salt command meets a restarting master; a runner waits
salt-run multimaster.wait_minions     # the minions of a restarted master sign in again
salt '*' state.apply multimaster.minion queue=True   # after a reaction's job, if one runs
salt-run multimaster.wait_masters
salt-run multimaster.wait_minions
"""


def test_key_reactor_from_the_image_propagates_once_the_set_is_built(host_set):
    for host in host_set:
        if host.name.startswith("master"):
            reactor = host.path("/etc/salt/master.d/reactor.conf")
            reactor.parent.mkdir(parents=True, exist_ok=True)
            reactor.write_text(IMAGE_REACTOR)
    for name in ("master1", "master2", "minion1"):
        nshosts.bootstrap(host_set[name], PRIMARY, master=name.startswith("master"))
    primary = host_set["master1"]
    env = {"FORMULA_GIT": nshosts.formula_git()}
    primary.sh(PREPARE, env=env, timeout=600)
    # The formula is served, its runners not synced yet: the key events of the accepts above
    # cannot be acted on, and the master's log says so at error level (the reactor may still
    # be rendering when the last minion answers).
    host_set.wait("the key reactor's error in master1's log", lambda: _reactor_error(primary), 60)
    primary.sh(BUILD, timeout=900)
    # A new minion of the set: its key pends on both masters; accepted on master2 only.
    minion3 = host_set["minion3"]
    nshosts.bootstrap(minion3, PRIMARY)
    minion3.path("/etc/salt/minion.d/99-master-address.conf").write_text(
        "master: [10.0.3.61, 10.0.3.230]\n"
    )
    minion3.sh("systemctl restart salt-minion")
    for name in ("master1", "master2"):
        host_set.wait(
            f"minion3 pending on {name}",
            lambda name=name: "minion3" in host_set[name].sh("salt-key -l un").stdout.split(),
            60,
        )
    host_set["master2"].sh("salt-key -a minion3 -y")
    host_set.wait("minion3 accepted on master1", lambda: _accepted(primary, "minion3"), 30)
    # Both masters react to minion3's start; the minion runs the one highstate they ask for.
    highstates = minion3.path("/srv/highstates")
    host_set.wait("minion3's first highstate", highstates.exists, 180)
    for name in ("master1", "master2"):
        host_set.wait(
            f"{name}'s first-highstate job to return",
            lambda name=name: _first_highstate_returned(host_set[name]),
            120,
        )
    assert highstates.read_text().split() == ["highstate"]


def test_the_add_and_remove_master_walk_through_runs_as_written(host_set):
    """
    Runs after the set above is built: master3 joins with the blocks of docs/adding-masters.md,
    every minion then answers master3, and it leaves again, its salt-master stopped. Its address
    is the set's reserved slot: the minions the formula configured listed it from the start,
    and neither the join nor the leave restarts one of them.
    """
    blocks = walkthrough.blocks("Adding a master", PAGE)
    assert blocks[0].host == "master3" and "bootstrap-salt.sh" in blocks[0].script
    primary = host_set["master1"]
    # minion3 came after the build: the formula configures it now, its one restart.
    started = _minion_pids(host_set, ["minion3"])
    primary.sh("salt minion3 state.apply multimaster.minion")
    host_set.wait(
        "minion3 to restart with the formula's config and answer",
        lambda: (
            _minion_pids(host_set, ["minion3"]) != started
            and "minion3" in nshosts.answering(primary, ["minion3"])
        ),
        90,
    )
    configured = ("master1", "master2", "minion1", "minion3")
    conf = "/etc/salt/minion.d/multimaster.conf"
    listed = host_set["minion1"].path(conf).read_text()
    assert "10.0.3.232" in listed, listed
    pids = _minion_pids(host_set, configured)
    masters = _master_pids(host_set, ("master1", "master2"))
    # The walk-through installs Salt without salt-master and add_master installs it; these
    # hosts run Salt from pip, which carries salt-master already: installed, never started.
    nshosts.bootstrap(host_set["master3"], PRIMARY, master=True, master_started=False)
    joined, left = blocks[1], blocks[2]
    # Pinged from the primary once a second through the whole join: no master the set ran
    # and no minion restarts, and no ping goes unanswered.
    stop, seen = threading.Event(), set()
    watcher = threading.Thread(target=_served_keys, args=(host_set["master3"], stop, seen))
    watcher.start()
    try:
        with Pinger([primary], ",".join(PINGED), timeout=5) as pinger:
            primary.sh(joined.script, timeout=1200)
    finally:
        stop.set()
        watcher.join()
    print(
        f"\nadd_master into a reserved slot: {len(pinger.ticks)} pings, {len(pinger.missed)} missed"
    )
    assert pinger.ticks and not pinger.missed, pinger.missed
    assert _minion_pids(host_set, configured) == pids
    assert _master_pids(host_set, ("master1", "master2")) == masters
    # master3 ran only ever with the set's key: no minion could meet a key of its own there.
    assert seen == {_master_pub(primary)}, seen
    # Not restarted, a minion signs in to master3 when Salt's reconnect comes round to it.
    everyone = ("master1", "master2", "master3", "minion1", "minion3")
    host_set.wait("every minion to answer master3", lambda: _answer_master3(host_set, everyone), 90)
    host_set["master1"].sh(left.script, timeout=900)
    assert (
        not host_set["master3"].sh("systemctl is-active salt-master", check=False).returncode == 0
    )
    assert _minion_pids(host_set, configured) == pids
    # The slot stays reserved: the minions' list did not change.
    assert host_set["minion1"].path(conf).read_text() == listed
