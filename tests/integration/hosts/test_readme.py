"""
The README's real-host walk-through ("On real hosts: a failover pair from bare machines"), run
as written on four separate hosts with Salt's default paths; only the bootstrap block is
replaced by what it installs. A change to the README that breaks it fails here.
"""

from tests.support import hostwatch, walkthrough
from toolkit import hosts as nshosts

SECTION = "On real hosts: a failover pair from bare machines"
HOSTS = {
    "master1": "10.0.3.61",
    "master2": "10.0.3.230",
    "minion1": "10.0.3.71",
    "minion2": "10.0.3.72",
}
PRIMARY = "10.0.3.61"
# What one block may take at most (the failover wait is the longest: 4 x alive_interval).
BLOCK_TIMEOUT = 600


def test_the_failover_pair_walk_through_runs_as_written(host_set):
    blocks = walkthrough.blocks(SECTION)
    assert blocks[0].host == "every host" and "bootstrap-salt.sh" in blocks[0].script
    for host in host_set:
        nshosts.bootstrap(host, PRIMARY, master=host.name.startswith("master"))
    env = {"FORMULA_GIT": nshosts.formula_git()}
    outputs = []
    for block in blocks[1:]:
        result = host_set[block.host].sh(block.script, check=False, timeout=BLOCK_TIMEOUT, env=env)
        outputs.append(f"# {block.host}\n{result.stdout}{result.stderr}")
        assert result.returncode == 0, "\n".join(outputs)
        if "salt-run multimaster.status" in block.script:
            assert_roots_read_through_the_watch(host_set)
    # The last block waited until both minions answered master2 with master1 down.
    final = host_set["master2"].sh("salt 'minion*' test.ping --out=json --static").stdout
    assert '"minion1": true' in final and '"minion2": true' in final, final


def why_not_watched(master):
    """What a failure shows of a master's roots watch: its config, engine and record."""
    return master.sh(
        "grep -rn -A2 engines /etc/salt/master.d/ || true; "
        "ls /var/cache/salt/master/extmods/engines /var/cache/salt/master/multimaster "
        "/var/cache/salt/master/multimaster/roots-watch 2>&1 || true; "
        "cat /var/cache/salt/master/multimaster/roots-watch/engine.pid 2>&1 || true; "
        "ps -eo pid,args | grep -i [s]alt-master || true; "
        "grep -i engine /var/log/salt/master || true",
        check=False,
    ).stdout


def assert_roots_read_through_the_watch(host_set):
    """
    Both masters run the roots watch engine ``multimaster.master`` configured. master2 got the
    formula (its engine among it) only with the walk-through's ``sync_roots``: its next
    ``multimaster.master`` syncs the engine and restarts it once (docs/roots.md). Then
    master2's roots are read through its record, and a file written on master1 since reaches
    master2.
    """
    master1, master2 = host_set["master1"], host_set["master2"]
    master1.sh(
        "salt master2 state.apply multimaster.master && salt-run multimaster.wait_masters",
        timeout=600,
    )
    master1.sh("echo 'watched: true' > /srv/salt/watched.sls")
    returncode, report = hostwatch.run_json(master1, "salt-run multimaster.sync_roots", 300)
    assert returncode == 0, report
    if report["masters"]["master2"]["watched"] is not True:
        print(f"master2's roots watch:\n{why_not_watched(master2)}")
    assert report["masters"]["master2"]["watched"] is True, report
    assert master2.sh("cat /srv/salt/watched.sls").stdout == "watched: true\n"
