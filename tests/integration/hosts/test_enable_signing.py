"""
Signing turned on in a running hot set on separate hosts (Salt's default paths): the set is
built plain, as the README builds it; the operator makes a signing pair on the primary, puts
its public key in pillar and runs ``salt-run multimaster.enable_signing``. Every master then
signs with that pair, every minion verifies it and restarted once, minion1 was without a
master only for a bounded time, and the prepared set rotates its key (``rotate_master_key``).
"""

import time

import yaml

from tests.support.hostwatch import PidWatch, Pinger, answers, read, run_json
from toolkit import hosts as nshosts

HOSTS = {"master1": "10.0.3.61", "master2": "10.0.3.230", "minion1": "10.0.3.71"}
PRIMARY = "10.0.3.61"
PILLAR = """\
multimaster:
  mode: hot
  masters:
    - {id: master1, host: 10.0.3.61}
    - {id: master2, host: 10.0.3.230}
  master:
    file_roots: {base: [/srv/salt, /srv/formulas/multimaster-formula]}
    pillar_roots: {base: [/srv/pillar]}
"""
PREPARE = f"""
{nshosts.SERVE_FORMULA}cat > /srv/pillar/multimaster.sls <<'YAML'
{PILLAR}YAML
{nshosts.accept_all("master[12]|minion1", 3)}"""
BUILD = """
salt '*' saltutil.sync_all && salt-run saltutil.sync_all
salt 'master*' state.apply multimaster.master
salt-run multimaster.wait_masters
salt-run multimaster.sync_master_key
salt-run multimaster.sync_keys
salt-run multimaster.wait_masters
salt-run multimaster.wait_minions
salt '*' state.apply multimaster.minion
salt-run multimaster.wait_minions
"""
MASTER_PKI = "/etc/salt/pki/master"
# The longest time minion1 may go without an answer from any master while signing is turned
# on: from its own restart (verifying, refused by every master) until the primary signs and
# minion1 retries it (acceptance_wait_time, 10 s), plus the ping's CLI start, with room for
# this 2-core machine's load. Measured: docs/rotation.md.
NO_MASTER_BOUND = 60


def _signing_pub(master):
    return read(master, f"{MASTER_PKI}/master_sign.pub")


def _signs(master):
    text = master.path("/etc/salt/master.d/multimaster.conf").read_text()
    return yaml.safe_load(text).get("master_sign_pubkey") is True


def test_signing_is_turned_on_in_a_running_hot_set(host_set):
    for name in HOSTS:
        nshosts.bootstrap(host_set[name], PRIMARY, master=name.startswith("master"))
    master1, master2, minion1 = (host_set[n] for n in HOSTS)
    master1.sh(PREPARE, env={"FORMULA_GIT": nshosts.formula_git()}, timeout=600)
    master1.sh(BUILD, timeout=1200)
    master_key = read(master2, f"{MASTER_PKI}/master.pub")
    # The operator: a signing pair on the primary, its public key in pillar.
    master1.sh(f"salt-key --gen-keys=master_sign --gen-keys-dir={MASTER_PKI}")
    pillar = yaml.safe_load(PILLAR)
    pillar["multimaster"]["signing"] = {"enabled": True, "public_key": _signing_pub(master1)}
    master1.path("/srv/pillar/multimaster.sls").write_text(yaml.safe_dump(pillar))

    code, data = run_json(master1, "salt-run multimaster.enable_signing test=True")
    assert code == 0 and data["masters"] == ["master1", "master2"], data
    assert not _signs(master1) and not _signs(master2)

    started = time.monotonic()
    with PidWatch(host_set) as pids, Pinger((master1, master2), "minion1") as pinger:
        code, data = run_json(master1, "salt-run multimaster.enable_signing", timeout=900)
        host_set.wait(
            "minion1 to answer both masters",
            lambda: all(t and t[-1] > time.monotonic() - 3 for t in pinger.answered_by.values()),
            90,
            1,
        )
    took = time.monotonic() - started
    assert code == 0, data
    assert data["proof"]["retcode"] == 0, data
    assert pids.restarts() == {"master1": 1, "master2": 1, "minion1": 1}, pids.seen
    assert _signs(master1) and _signs(master2)
    # The primary's signing pair on master2; the master key the set shares is unchanged.
    assert _signing_pub(master2) == _signing_pub(master1)
    assert read(master2, f"{MASTER_PKI}/master.pub") == master_key
    conf = yaml.safe_load(minion1.path("/etc/salt/minion.d/multimaster.conf").read_text())
    assert conf["verify_master_pubkey_sign"] is True, conf
    assert read(minion1, "/etc/salt/pki/minion/master_sign.pub") == _signing_pub(master1)
    gap = pinger.longest_outage()
    print(
        f"\nsigning turned on in a hot set of 2: {took:.0f}s; minion1 restarted once; longest "
        f"time with no answer from any master {gap:.1f}s; from master1 "
        f"{pinger.longest_outage('master1'):.1f}s, from master2 "
        f"{pinger.longest_outage('master2'):.1f}s"
    )
    assert gap <= NO_MASTER_BOUND

    # Again: nothing to do, nothing restarted.
    with PidWatch(host_set) as pids:
        code, data = run_json(master1, "salt-run multimaster.enable_signing", timeout=900)
    assert code == 0, data
    assert data["primary"]["restarted"] is None and data["minions"]["failed"] == {}, data
    assert data["peers"]["master2"]["restarted"] is None, data
    assert pids.restarts() == {"master1": 0, "master2": 0, "minion1": 0}, pids.seen


def test_the_prepared_set_rotates_its_key(host_set):
    master1, master2 = host_set["master1"], host_set["master2"]
    before = read(master1, f"{MASTER_PKI}/master.pub")
    code, data = run_json(master1, "salt-run multimaster.rotate_master_key generation=1")
    assert code == 0, data
    after = read(master1, f"{MASTER_PKI}/master.pub")
    assert after != before and read(master2, f"{MASTER_PKI}/master.pub") == after
    assert answers(master1, "minion1") and answers(master2, "minion1")
