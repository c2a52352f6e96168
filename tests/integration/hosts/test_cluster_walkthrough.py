"""
docs/cluster.md's walk-throughs ("On real hosts: a cluster from bare machines", then "On real
hosts: adding a fourth master"), run as written on separate hosts with Salt's default paths:
three masters, the HAProxy host and a minion that knows only the balancer, then a fourth master
added with ``multimaster.orch.add_master``. Only the bootstrap blocks are replaced by what they
install (HAProxy is on the machine already). A change to the page that breaks it fails here.
"""

import json
import secrets
import time

from tests.support import walkthrough
from toolkit import hosts as nshosts

SECTION = "On real hosts: a cluster from bare machines"
ADD_SECTION = "On real hosts: adding a fourth master"
# Hosts, bridge and directories of their own: the modules after this one reuse host names.
PREFIX = "mc"
PAGE = "docs/cluster.md"
HOSTS = {
    "salt1": "10.0.3.21",
    "salt2": "10.0.3.22",
    "salt3": "10.0.3.23",
    "lb1": "10.0.3.20",
    "minion1": "10.0.3.31",
    "salt4": "10.0.3.24",
}
MASTERS = ("salt1", "salt2", "salt3")
ADD_AGAIN = (
    "salt-run state.orch multimaster.orch.add_master "
    """pillar='{"multimaster_new": "10.0.3.24", "multimaster_balancer_minion": "lb1"}'"""
)
# The master the added master's minion knows until the orchestration moves it to its own.
ADDED, ADDED_MINION_OF = "salt4", HOSTS["salt1"]
BALANCER = "10.0.3.20"
# The master each bootstrapped minion knows, as the page's bootstrap lines give it.
MASTER_OF = {**{m: HOSTS[m] for m in MASTERS}, "lb1": HOSTS["salt1"], "minion1": BALANCER}
# How long every minion may take to answer a master's job after the walk-through.
EVERY_MINION_TIMEOUT = 90
# What one block may take at most. The longest is add_master's orchestration, which restarts
# every master in turn: 79 s on an idle machine, past 290 s once in a CI run (it hit 300 s).
BLOCK_TIMEOUT = 600


def test_the_cluster_walk_through_runs_as_written(host_set):
    blocks = walkthrough.blocks(SECTION, PAGE)
    assert blocks[0].host == "every host" and "bootstrap-salt.sh" in blocks[0].script
    for name, master_address in MASTER_OF.items():
        nshosts.bootstrap(host_set[name], master_address, master=name in MASTERS)
    run_blocks(host_set, blocks[1:])
    # What the user sees at the end: every master reaches minion1 through the balancer, and
    # the formula's check passes on each.
    for name in MASTERS:
        assert_serves_the_cluster(host_set[name], MASTERS)


def test_a_fourth_master_is_added_with_one_orchestration(host_set):
    """
    After the walk-through above: salt4 bootstrapped as a minion of salt1, listed in pillar,
    its key accepted, then ``multimaster.orch.add_master`` on salt1 alone makes it a voter that
    publishes to minion1 through the balancer, behind HAProxy with the others.
    """
    blocks = walkthrough.blocks(ADD_SECTION, PAGE)
    assert blocks[0].host == ADDED and "bootstrap-salt.sh" in blocks[0].script
    nshosts.bootstrap(host_set[ADDED], ADDED_MINION_OF, master=True)
    started = time.monotonic()
    run_blocks(host_set, blocks[1:])
    took = time.monotonic() - started
    print(f"\nsalt4 added (pillar, key, orchestration, checks) in {took:.0f} s")
    # Safe to re-run: salt4 is a member, so the join is skipped, and every step converges.
    rerun = host_set["salt1"].sh(ADD_AGAIN, check=False, timeout=BLOCK_TIMEOUT)
    assert rerun.returncode == 0, (rerun.stdout, rerun.stderr)
    assert "new-master-joins" not in rerun.stdout, rerun.stdout
    print_orchestration_time("salt1 (re-run)", rerun.stdout)
    masters = (*MASTERS, ADDED)
    for name in masters:
        assert_serves_the_cluster(host_set[name], masters)
    # Its control minion moved to its own master, and HAProxy sends to it.
    minion_conf = host_set[ADDED].sh("salt-call --local config.get master --out=json").stdout
    assert json.loads(minion_conf)["local"] in (HOSTS[ADDED], [HOSTS[ADDED]])
    assert f"{HOSTS[ADDED]}:" in host_set["lb1"].path("/etc/haproxy/haproxy.cfg").read_text()


def run_blocks(host_set, blocks):
    """Each block on each of its hosts in turn, as the page prints it; stops at a failure."""
    env = {"FORMULA_GIT": nshosts.formula_git(), "CLUSTER_SECRET": secrets.token_hex(32)}
    for block in blocks:
        for name in block.hosts:
            result = host_set[name].sh(block.script, check=False, timeout=BLOCK_TIMEOUT, env=env)
            assert result.returncode == 0, block_failure(host_set, block, name, result)
            if "state.orch" in block.script:
                print_orchestration_time(name, result.stdout)


def block_failure(host_set, block, name, result, lines=60):
    """
    A failed block's message: the block and host first, then the end of its output, then
    minion1's log (a CI log shows a long message's start and end, not its middle).
    """
    output = f"{result.stdout}{result.stderr}".splitlines()[-lines:]
    return "\n".join(
        [
            f"the block {block.script.splitlines()[0]!r} failed on {name} "
            f"(exit {result.returncode}); the end of its output:",
            *output,
            minion_log_tail(host_set),
        ]
    )


def assert_serves_the_cluster(host, masters):
    """
    A job from ``host``'s master reaches every minion (minion1 behind the balancer, lb1, the
    control minions of ``masters``), and ``multimaster.status`` there passes with ``masters``
    the voters and the balancer and every backend up.
    """
    minions = sorted({*masters, "lb1", "minion1"})
    started, ping = time.monotonic(), None
    while time.monotonic() - started < EVERY_MINION_TIMEOUT:
        ping = host.sh("salt '*' test.ping --out=json --static", check=False).stdout
        if json.loads(ping or "{}") == dict.fromkeys(minions, True):
            break
        time.sleep(2)
    keys = host.sh("salt-key -L --out=json", check=False).stdout
    assert json.loads(ping or "{}") == dict.fromkeys(minions, True), (host.name, ping, keys)
    print(f"{host.name}: every minion answered after {time.monotonic() - started:.0f} s")
    status = host.sh("salt-run multimaster.status --out=json", check=False)
    assert status.returncode == 0, (host.name, status.stdout, status.stderr)
    report = json.loads(status.stdout)
    assert sorted(report["cluster"]["voters"]) == sorted(HOSTS[m] for m in masters)
    assert report["balancer"] == {"publish": True, "ret": True}
    assert report["backends_down"] == []


def print_orchestration_time(name, stdout):
    """The run time an orchestration's output ends with (its last ``Total run time``)."""
    times = [line.strip() for line in stdout.splitlines() if "Total run time:" in line]
    print(f"{name}: orchestration {times[-1] if times else '(no run time printed)'}")


def minion_log_tail(host_set, lines=40):
    """The end of minion1's log (it knows only the balancer), for a failure's message."""
    log = host_set["minion1"].path("/var/log/salt/minion")
    text = log.read_text(errors="replace") if log.exists() else "(no log)"
    return "# minion1's log\n" + "\n".join(text.splitlines()[-lines:])
