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
PREPARE = f"""
{nshosts.SERVE_FORMULA}cat > /srv/pillar/multimaster.sls <<'YAML'
$PILLAR
YAML
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


def pillar(host_set, mode):
    """The set's pillar: master1 and master2 in ``mode``, no signing yet."""
    section = {
        "mode": mode,
        "masters": [{"id": m, "host": host_set[m].address} for m in ("master1", "master2")],
        "master": {
            "file_roots": {"base": ["/srv/salt", "/srv/formulas/multimaster-formula"]},
            "pillar_roots": {"base": ["/srv/pillar"]},
        },
    }
    return {"multimaster": section}


def _signing_pub(master):
    return read(master, f"{MASTER_PKI}/master_sign.pub")


def _signs(master):
    text = master.path("/etc/salt/master.d/multimaster.conf").read_text()
    return yaml.safe_load(text).get("master_sign_pubkey") is True


def built(host_set, mode):
    """
    The set built plain in ``mode`` as the README builds it, then the operator's signing pair
    on the primary and its public key in pillar. Returns the master key master2 serves.
    """
    master1, master2 = host_set["master1"], host_set["master2"]
    for host in host_set:
        nshosts.bootstrap(host, master1.address, master=host.name.startswith("master"))
    section = pillar(host_set, mode)
    prepare = PREPARE.replace("$PILLAR", yaml.safe_dump(section).strip())
    master1.sh(prepare, env={"FORMULA_GIT": nshosts.formula_git()}, timeout=600)
    master1.sh(BUILD, timeout=1200)
    master1.sh(f"salt-key --gen-keys=master_sign --gen-keys-dir={MASTER_PKI}")
    section["multimaster"]["signing"] = {"enabled": True, "public_key": _signing_pub(master1)}
    master1.path("/srv/pillar/multimaster.sls").write_text(yaml.safe_dump(section))
    return read(master2, f"{MASTER_PKI}/master.pub")


def turned_on(host_set, answering):
    """
    ``salt-run multimaster.enable_signing`` after its ``test=True``, minion1 pinged once a
    second from each master until it answers the masters named in ``answering`` again; each
    daemon restarted once, both masters sign, minion1 verifies. Returns ``(seconds, pinger)``.
    """
    master1, master2, minion1 = (host_set[n] for n in ("master1", "master2", "minion1"))
    code, data = run_json(master1, "salt-run multimaster.enable_signing test=True")
    assert code == 0 and data["masters"] == ["master1", "master2"], data
    assert not _signs(master1) and not _signs(master2)

    started = time.monotonic()
    with PidWatch(host_set) as pids, Pinger((master1, master2), "minion1") as pinger:
        code, data = run_json(master1, "salt-run multimaster.enable_signing", timeout=900)
        enabled = time.monotonic()
        host_set.wait(
            f"minion1 to answer {', '.join(answering)}",
            lambda: all(pinger.answered_since(enabled, m) for m in answering),
            90,
            1,
        )
    took = time.monotonic() - started
    assert code == 0, data
    assert data["proof"]["retcode"] == 0, data
    assert pids.restarts() == {"master1": 1, "master2": 1, "minion1": 1}, pids.seen
    assert _signs(master1) and _signs(master2)
    assert _signing_pub(master2) == _signing_pub(master1)
    conf = yaml.safe_load(minion1.path("/etc/salt/minion.d/multimaster.conf").read_text())
    assert conf["verify_master_pubkey_sign"] is True, conf
    assert read(minion1, "/etc/salt/pki/minion/master_sign.pub") == _signing_pub(master1)
    assert pinger.longest_outage() <= NO_MASTER_BOUND
    return took, pinger


def again_restarts_nothing(host_set):
    """``enable_signing`` run again: nothing to do, no daemon restarted."""
    with PidWatch(host_set) as pids:
        code, data = run_json(host_set["master1"], "salt-run multimaster.enable_signing")
    assert code == 0, data
    assert data["primary"]["restarted"] is None and data["minions"]["failed"] == {}, data
    assert data["peers"]["master2"]["restarted"] is None, data
    assert pids.restarts() == {"master1": 0, "master2": 0, "minion1": 0}, pids.seen


def figures(mode, took, pinger):
    return (
        f"\nsigning turned on in a {mode} set of 2: {took:.0f}s; minion1 restarted once; "
        f"longest time with no answer from any master {pinger.longest_outage():.1f}s; from "
        f"master1 {pinger.longest_outage('master1'):.1f}s, from master2 "
        f"{pinger.longest_outage('master2'):.1f}s"
    )


def test_signing_is_turned_on_in_a_running_hot_set(host_set):
    master_key = built(host_set, "hot")
    took, pinger = turned_on(host_set, ("master1", "master2"))
    # The master key the set shares is unchanged.
    assert read(host_set["master2"], f"{MASTER_PKI}/master.pub") == master_key
    print(figures("hot", took, pinger))
    again_restarts_nothing(host_set)


def rotated(host_set):
    """
    ``rotate_master_key generation=1`` on master1, which succeeds; returns master1's key before
    it and ``{master: key}`` after it.
    """
    master1, master2 = host_set["master1"], host_set["master2"]
    before = read(master1, f"{MASTER_PKI}/master.pub")
    code, data = run_json(master1, "salt-run multimaster.rotate_master_key generation=1")
    assert code == 0, data
    return before, {m.name: read(m, f"{MASTER_PKI}/master.pub") for m in (master1, master2)}


def test_the_prepared_set_rotates_its_key(host_set):
    master1, master2 = host_set["master1"], host_set["master2"]
    before, after = rotated(host_set)
    assert after["master1"] != before and after["master2"] == after["master1"]
    assert answers(master1, "minion1") and answers(master2, "minion1")
