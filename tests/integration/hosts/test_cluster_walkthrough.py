"""
docs/cluster.md's walk-through ("On real hosts: a cluster from bare machines"), run as written
on five separate hosts with Salt's default paths: three masters, the HAProxy host and a minion
that knows only the balancer. Only the bootstrap block is replaced by what it installs (HAProxy
is on the machine already). A change to the page that breaks it fails here.
"""

import json
import secrets

from tests.support import walkthrough
from toolkit import hosts as nshosts

SECTION = "On real hosts: a cluster from bare machines"
# Hosts, bridge and directories of their own: the modules after this one reuse host names.
PREFIX = "mc"
PAGE = "docs/cluster.md"
HOSTS = {
    "salt1": "10.0.3.21",
    "salt2": "10.0.3.22",
    "salt3": "10.0.3.23",
    "lb1": "10.0.3.20",
    "minion1": "10.0.3.31",
}
MASTERS = ("salt1", "salt2", "salt3")
BALANCER = "10.0.3.20"
# The master each bootstrapped minion knows, as the page's bootstrap lines give it.
MASTER_OF = {**{m: HOSTS[m] for m in MASTERS}, "lb1": HOSTS["salt1"], "minion1": BALANCER}
# What one block may take at most (the cluster forming, the minions' keys).
BLOCK_TIMEOUT = 300


def test_the_cluster_walk_through_runs_as_written(host_set):
    blocks = walkthrough.blocks(SECTION, PAGE)
    assert blocks[0].host == "every host" and "bootstrap-salt.sh" in blocks[0].script
    for host in host_set:
        nshosts.bootstrap(host, MASTER_OF[host.name], master=host.name in MASTERS)
    env = {"FORMULA_GIT": nshosts.formula_git(), "CLUSTER_SECRET": secrets.token_hex(32)}
    outputs = []
    for block in blocks[1:]:
        for name in block.hosts:
            result = host_set[name].sh(block.script, check=False, timeout=BLOCK_TIMEOUT, env=env)
            outputs.append(f"# {name}\n{result.stdout}{result.stderr}")
            assert result.returncode == 0, "\n".join(outputs)
    # What the user sees at the end: every master reaches minion1 through the balancer, and
    # the formula's check passes on each.
    for name in MASTERS:
        ping = host_set[name].sh("salt minion1 test.ping --out=json --static").stdout
        assert json.loads(ping) == {"minion1": True}, (name, ping)
        status = host_set[name].sh("salt-run multimaster.status --out=json", check=False)
        assert status.returncode == 0, (name, status.stdout, status.stderr)
        report = json.loads(status.stdout)
        assert sorted(report["cluster"]["voters"]) == sorted(HOSTS[m] for m in MASTERS)
        assert report["balancer"] == {"publish": True, "ret": True}
        assert report["backends_down"] == []
