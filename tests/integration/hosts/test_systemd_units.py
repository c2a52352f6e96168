"""
The formula's restart and stop paths against real systemd units: three hosts booted with
systemd as PID 1, each over a root of its own (``toolkit/sdhosts.py``), Salt's daemons run as
``salt-master.service`` and ``salt-minion.service`` as the packages ship them. A failover pair
(as in the README) is built on them; every restart the formula makes goes through
``systemctl`` (Salt's systemd service module, the restart watcher), and each is judged by what
``systemctl`` then says: the unit active under a new main process, the minions answering.
"""

import json

import pytest

from toolkit import hosts as nshosts
from toolkit import sdhosts

HOSTS = {"master1": "10.0.9.61", "master2": "10.0.9.62", "minion1": "10.0.9.71"}
PRIMARY = "10.0.9.61"
EVERY_MINION = ["master1", "master2", "minion1"]
PILLAR = """\
multimaster:
  mode: failover
  failover: {alive_interval: 10}
  masters:
    - {id: master1, host: 10.0.9.61}
    - {id: master2, host: 10.0.9.62}
  master:
    file_roots: {base: [/srv/salt, /srv/formulas/multimaster-formula]}
    pillar_roots: {base: [/srv/pillar]}
"""
PREPARE = f"""
{nshosts.SERVE_FORMULA}cat > /srv/pillar/multimaster.sls <<'YAML'
{PILLAR}YAML
{nshosts.accept_all("master[12]|minion1", 3)}
salt '*' saltutil.sync_all && salt-run saltutil.sync_all
"""


@pytest.fixture(scope="module")
def hosts():
    """
    The module's hosts booted with systemd; on a failure the daemons' logs and units' journals
    are printed first.
    """
    hosts = sdhosts.SystemdHostSet([nshosts.Host(n, a) for n, a in HOSTS.items()])
    try:
        hosts.up()
        yield hosts
    finally:
        try:
            for host in hosts:
                if host.init_pid:
                    journal = host.sh("journalctl -b --no-pager | tail -n 40", check=False)
                    print(f"--- {host.name} journal\n{journal.stdout}")
                print(f"--- {host.name} systemd\n{host.log('systemd', tail=20)}")
                for log in ("master", "minion"):
                    print(f"--- {host.name} /var/log/salt/{log}\n{host.log(log, tail=40)}")
        finally:
            hosts.down()


def _unit(host, unit):
    """
    ``(ActiveState, MainPID)`` of ``unit`` on ``host``.
    """
    out = host.sh(f"systemctl show -p ActiveState -p MainPID {unit}").stdout
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return props["ActiveState"], int(props["MainPID"])


def _restarted(hosts, host, unit, before, timeout=120):
    """
    Wait until ``unit`` on ``host`` is active under a main process other than ``before``.
    """
    return hosts.wait(
        f"{unit} restarted on {host.name}",
        lambda: (lambda state, pid: state == "active" and pid not in (0, before))(
            *_unit(host, unit)
        ),
        timeout,
        interval=1,
    )


def _answers(host):
    return sorted(nshosts.answering(host))


def test_each_host_runs_systemd_over_a_root_of_its_own(hosts):
    for host in hosts:
        assert host.sh("systemctl is-system-running").stdout.strip() == "running"
        assert host.sh("cat /proc/1/comm").stdout.strip() == "systemd"
        # Its /tmp, /run, /var are its own; the kernel's knobs are read-only.
        mounts = host.sh("findmnt -rn -o TARGET,FSTYPE,OPTIONS").stdout.splitlines()
        kinds = {line.split()[0]: line.split()[1:] for line in mounts}
        for path in ("/", "/tmp", "/run", "/var"):
            assert kinds[path][0] == "tmpfs", kinds
        assert kinds["/etc"][0] == "overlay"
        assert kinds["/proc/sys"][1].startswith("ro,"), kinds
        # Salt sees systemd: its service module and the restart helper use systemctl.
        grains = host.sh("salt-call --local grains.get init --out=json").stdout
        assert json.loads(grains)["local"] == "systemd", grains


def test_the_units_run_the_bootstrapped_daemons(hosts):
    for host in hosts:
        nshosts.bootstrap(host, PRIMARY, master=host.name.startswith("master"))
    for name in ("master1", "master2"):
        assert _unit(hosts[name], "salt-master")[0] == "active"
    for host in hosts:
        assert _unit(host, "salt-minion")[0] == "active"
    hosts["master1"].sh(PREPARE, env={"FORMULA_GIT": nshosts.formula_git()}, timeout=600)
    hosts.wait("every minion answering", lambda: _answers(hosts["master1"]) == EVERY_MINION, 120)


def test_the_master_state_restarts_salt_master_through_its_unit(hosts):
    masters = [hosts["master1"], hosts["master2"]]
    before = {m.name: _unit(m, "salt-master")[1] for m in masters}
    hosts["master1"].sh("salt 'master*' state.apply multimaster.master", timeout=600)
    for master in masters:
        _restarted(hosts, master, "salt-master", before[master.name])
    hosts.wait("every minion answering", lambda: _answers(hosts["master1"]) == EVERY_MINION, 120)


def test_sync_master_key_restarts_the_other_master_through_its_unit(hosts):
    master2 = hosts["master2"]
    before = _unit(master2, "salt-master")[1]
    hosts["master1"].sh("salt-run multimaster.sync_master_key", timeout=600)
    _restarted(hosts, master2, "salt-master", before)
    # master.pub links to the key by an absolute path of the host: read it there.
    pki = "cat /etc/salt/pki/master/master.pub"
    assert hosts["master1"].sh(pki).stdout == master2.sh(pki).stdout
    hosts["master1"].sh(
        "salt-run multimaster.sync_roots && salt-run multimaster.sync_keys", timeout=600
    )


def test_the_minion_state_restarts_salt_minion_through_its_unit(hosts):
    before = {h.name: _unit(h, "salt-minion")[1] for h in hosts}
    primary = hosts["master1"]
    primary.sh("salt '*' state.apply multimaster.minion", timeout=600)
    primary.sh("salt-run multimaster.wait_minions", timeout=600)
    for host in hosts:
        _restarted(hosts, host, "salt-minion", before[host.name])
    hosts.wait("every minion answering", lambda: _answers(primary) == EVERY_MINION, 120)


def test_stop_master_stops_the_unit(hosts):
    primary, master2 = hosts["master1"], hosts["master2"]
    out = primary.sh("salt master2 multimaster_daemons.stop_master --out=json --static").stdout
    assert json.loads(out)["master2"]["stopped"] is True, out
    assert _unit(master2, "salt-master") == ("inactive", 0)
    # The state the package left: enabled, so a reboot would start it again.
    assert master2.sh("systemctl is-enabled salt-master").stdout.strip() == "enabled"
    master2.sh("systemctl start salt-master")
    assert _unit(master2, "salt-master")[0] == "active"
    # The orchestration's way for a master whose control minion has no other master: after
    # the job returns, from the watcher; the runner confirms it.
    out = primary.sh(
        "salt master2 multimaster_daemons.stop_master after_return=True --out=json --static"
    ).stdout
    scheduled = json.loads(out)["master2"]
    assert scheduled["scheduled"] is True and scheduled["how"] == "systemctl stop salt-master"
    primary.sh(f"salt-run multimaster.wait_master_stopped {HOSTS['master2']}", timeout=300)
    hosts.wait(
        "salt-master stopped on master2",
        lambda: _unit(master2, "salt-master") == ("inactive", 0),
        60,
        interval=1,
    )
    assert _answers(primary) == ["master1", "master2", "minion1"]
