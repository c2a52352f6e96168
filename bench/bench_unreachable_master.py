"""
What a master the minion lists but that does not run costs the minion: the ground a reserved
master slot (an address minions list before a master runs there) stands on.

One master (master1) and one minion (minion1) on separate namespace hosts with Salt's default
paths. For each case the minion starts with master1 plus the slot in its ``master`` list and
master1 pings it until it answers (at most 60 s). Then an idle window of ``--seconds``: the
minion's CPU seconds (every process of its host) and the lines its log gained (at Salt's
default level, warning), of them errors; then a window as long in which master1 pings it once a
second: the pings missed. Each case's last minion log is kept in ``bench/run/unreachable/``.
``--fill`` instead: a master coming up at an address the running minion lists (see
``slot_filled``). Run as root (it makes network namespaces):

    .venv/bin/python bench/bench_unreachable_master.py --seconds 30 --turns 3
    .venv/bin/python bench/bench_unreachable_master.py --fill --turns 2
"""

import argparse
import os
import shutil
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The dev toolkit (toolkit/) shared with the lab and the tests.
sys.path.insert(0, ROOT)

from toolkit import hosts as nshosts  # noqa: E402

MASTER = "10.0.3.61"
# A host that is up on the bridge with no salt-master: its port refuses at once.
IDLE_HOST = "10.0.3.62"
# An address on the bridge with no host at all: nothing answers ARP, a connect times out.
NO_HOST = "10.0.3.63"
HOSTS = {"master1": MASTER, "minion1": "10.0.3.71", "idle": IDLE_HOST}
CASES = {
    "hot, master1 alone": ("str", [MASTER]),
    "hot, + an address with no host": ("str", [MASTER, NO_HOST]),
    "hot, + a host with no master": ("str", [MASTER, IDLE_HOST]),
    "hot, + a name that does not resolve": ("str", [MASTER, "reserved.invalid"]),
    "failover, master1 alone": ("failover", [MASTER]),
    "failover, + an address with no host": ("failover", [MASTER, NO_HOST]),
}
FIRST_ANSWER_LIMIT = 60
MINION_LOG = "/var/log/salt/minion"
# Each case's minion log of its last turn, to read what the errors were.
RUN_DIR = os.path.join(ROOT, "bench", "run", "unreachable")


def minion_config(master_type, masters):
    # retry_dns 0 for failover, as Salt's failover docs advise: it acts only on a name that
    # does not resolve, and the failover cases list addresses.
    text = f"master: [{', '.join(masters)}]\n"
    if master_type == "failover":
        text += "master_type: failover\nmaster_alive_interval: 10\nretry_dns: 0\n"
    return text


def cpu_seconds(pids):
    """
    User plus system CPU seconds of ``pids`` (those still running), from /proc.
    """
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    return total / ticks


def answered(master):
    proc = master.sh("salt minion1 test.ping -t 3 --out=txt", check=False, timeout=60)
    return "minion1: True" in proc.stdout


def log_lines(minion):
    path = minion.path(MINION_LOG)
    if not path.is_file():
        return []
    return path.read_text(errors="replace").splitlines()


def one_turn_start(host_set, master_type, masters):
    """
    minion1 started afresh with ``masters``; the seconds until master1 gets its answer (None:
    not within ``FIRST_ANSWER_LIMIT``).
    """
    master, minion = host_set["master1"], host_set["minion1"]
    minion.kill_all()
    minion.path("/etc/salt/minion.d").mkdir(parents=True, exist_ok=True)
    minion.path("/etc/salt/minion_id").write_text("minion1")
    minion.path("/etc/salt/minion.d/99-master-address.conf").write_text(
        minion_config(master_type, masters)
    )
    minion.path(MINION_LOG).unlink(missing_ok=True)
    start = time.monotonic()
    minion.sh(minion.start_command("salt-minion"))
    while time.monotonic() - start < FIRST_ANSWER_LIMIT:
        if answered(master):
            return time.monotonic() - start
        time.sleep(1)
    return None


def slug(case):
    return "".join(c if c.isalnum() else "-" for c in case).strip("-")


def one_turn(host_set, case, seconds):
    master_type, masters = CASES[case]
    master, minion = host_set["master1"], host_set["minion1"]
    first = one_turn_start(host_set, master_type, masters)
    # The idle window: what the minion spends and logs on its own (no job runs).
    lines_before = len(log_lines(minion))
    cpu_before = cpu_seconds(minion.pids())
    time.sleep(seconds)
    cpu = cpu_seconds(minion.pids()) - cpu_before
    new = log_lines(minion)[lines_before:]
    errors = sum("[ERROR" in line for line in new)
    # The ping window: master1 pings once a second (a ping that waits counts once).
    pings, missed, end = 0, 0, time.monotonic() + seconds
    while time.monotonic() < end:
        tick = time.monotonic()
        pings += 1
        missed += not answered(master)
        time.sleep(max(0.0, 1 - (time.monotonic() - tick)))
    running = bool(minion.pids())
    minion.kill_all()
    kept = os.path.join(RUN_DIR, f"{slug(case)}.log")
    with open(kept, "w", encoding="utf-8") as handle:
        handle.write("\n".join(log_lines(minion)) + "\n")
    return {
        "first": first,
        "missed": missed,
        "pings": pings,
        "running": running,
        "cpu": cpu,
        "log": len(new),
        "errors": errors,
    }


def pki(host, *parts):
    return host.path(os.path.join("/etc/salt/pki/master", *parts))


def emptied(host, inside):
    """
    Remove what is in ``inside`` on ``host`` (the directory itself is the host's mount).
    """
    path = host.path(inside)
    for child in path.iterdir():
        if child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()


def minion_pid(minion):
    path = minion.path("/run/salt-minion.pid")
    return path.read_text().strip() if path.is_file() else None


def slot_filled(host_set, foreign_first):
    """
    A master comes up in the slot the running minion already lists (``IDLE_HOST``) with
    master1's key and the minion's key accepted: seconds until it gets the minion's answer,
    and whether the minion restarted. ``foreign_first``: the slot's master first runs once
    with a key of its own for 20 s (a host bootstrapped with ``-M`` starts one).
    """
    master, minion, idle = host_set["master1"], host_set["minion1"], host_set["idle"]
    idle.kill_all()
    emptied(idle, "/etc/salt")
    emptied(idle, "/var/cache/salt")
    one_turn_start(host_set, "str", [MASTER, IDLE_HOST])
    pid = minion_pid(minion)
    foreign = None
    if foreign_first:
        idle.path("/etc/salt/master.d").mkdir(parents=True, exist_ok=True)
        idle.path("/etc/salt/master.d/auto.conf").write_text("auto_accept: True\n")
        idle.sh(idle.start_command("salt-master"))
        time.sleep(20)
        foreign = {"slot": answered(idle), "master1": answered(master)}
        idle.kill_all()
        emptied(idle, "/etc/salt")
    pki(idle, "minions").mkdir(parents=True, exist_ok=True)
    # Salt 3008 keeps a master's pair as <its id>.pem/.pub (the host name here).
    for source, target in (
        ("master1.pem", "idle.pem"),
        ("master1.pub", "idle.pub"),
        ("minions/minion1", "minions/minion1"),
    ):
        shutil.copy2(pki(master, source), pki(idle, target))
    start = time.monotonic()
    idle.sh(idle.start_command("salt-master"))
    seconds = None
    while time.monotonic() - start < FIRST_ANSWER_LIMIT:
        if answered(idle):
            seconds = time.monotonic() - start
            break
        time.sleep(1)
    result = {
        "seconds": seconds,
        "restarted": minion_pid(minion) != pid,
        "master1": answered(master),
        "foreign": foreign,
    }
    minion.kill_all()
    idle.kill_all()
    return result


def shown(value, digits=1):
    return "never" if value is None else f"{value:.{digits}f}"


def print_fills(host_set, turns):
    for foreign_first in (False, True):
        name = "after a master with its own key" if foreign_first else "first master there"
        for _ in range(turns):
            got = slot_filled(host_set, foreign_first)
            foreign = got["foreign"]
            print(
                f"slot filled, {name}: the slot's master answered after "
                f"{shown(got['seconds'])} s; minion restarted: {got['restarted']}; master1 "
                f"answered after: {got['master1']}"
                + (
                    f"; while the foreign key ran: slot answered {foreign['slot']}, master1 "
                    f"answered {foreign['master1']}"
                    if foreign
                    else ""
                ),
                flush=True,
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=60, help="the ping window of a turn")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--case", action="append", choices=list(CASES), help="only these")
    parser.add_argument(
        "--fill", action="store_true", help="instead: a master coming up in a listed slot"
    )
    args = parser.parse_args()
    with nshosts.HostSet([nshosts.Host(n, a) for n, a in HOSTS.items()], prefix="mmub") as hs:
        hs["master1"].path("/etc/salt/master.d").mkdir(parents=True, exist_ok=True)
        hs["master1"].path("/etc/salt/master.d/auto.conf").write_text("auto_accept: True\n")
        hs["master1"].sh(hs["master1"].start_command("salt-master"))
        os.makedirs(RUN_DIR, exist_ok=True)
        if args.fill:
            print_fills(hs, args.turns)
            return
        for case in args.case or CASES:
            turns = [one_turn(hs, case, args.seconds) for _ in range(args.turns)]
            for turn in turns:
                print(
                    f"{case}: first answer {shown(turn['first'])} s; {args.seconds} s idle: CPU "
                    f"{turn['cpu']:.2f} s, log +{turn['log']} lines ({turn['errors']} errors); "
                    f"missed {turn['missed']} of {turn['pings']} pings"
                    f"{'' if turn['running'] else '; the minion had exited'}",
                    flush=True,
                )
            cpu = statistics.median(t["cpu"] for t in turns)
            missed = statistics.median(t["missed"] for t in turns)
            errors = statistics.median(t["errors"] for t in turns)
            print(
                f"== {case}: medians: CPU {cpu:.2f} s, {errors} errors logged, {missed} missed",
                flush=True,
            )


if __name__ == "__main__":
    main()
