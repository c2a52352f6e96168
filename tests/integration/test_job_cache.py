"""
One job cache for all masters (``multimaster:job_cache``): ``multimaster.master`` makes the
formula's ``multimaster_pgjsonb`` returner every master's ``master_job_cache`` on a real
PostgreSQL server (TLS, SCRAM with channel binding: the pillar's defaults), so a job published
on master1 is found by ``salt-run jobs.lookup_jid`` on master2. A minion's return cannot send a
master to another server. With the database stopped, publishing still works, the master logs
the failure and ``multimaster.status`` reports it. The database password is only in the
masters' 0600 files.
"""

import contextlib
import json
import pathlib
import secrets
import socket
import stat
import subprocess
import sys
import threading

import pytest
import salt.utils.jid

from tests.support import postgres

from .harness import (
    MASTER_HOSTS,
    REPO_ROOT,
    START_TIMEOUT,
    Ports,
    changed_states,
    formula_master_options,
    master_entry,
    multimaster_pillar,
    port_offset,
    served_formula,
    wait_for,
    wait_for_ping,
)

pytestmark = pytest.mark.integration

PREFIX = "jc"
PORTS = Ports(publish=30190, ret=30191)
DB_HOST, DB_PORT = "127.0.0.9", 30192 + port_offset()
# Where a minion's forged return asks the master to connect: a listener that records who comes.
DECOY_HOST, DECOY_PORT = "127.0.0.11", 30194 + port_offset()
PASSWORD = f"jc-password-{secrets.token_hex(8)}"
MINION = "jc-minion"
CONFIG_FILE = "multimaster-job-cache.conf"
RETURNER = "multimaster_pgjsonb.py"


@pytest.fixture(scope="module")
def database():
    with postgres.database(DB_HOST, DB_PORT, "salt", "salt", PASSWORD) as server:
        yield server


@pytest.fixture(scope="module")
def job_cache_pillar(master1, master2_factory, ports, pillar_tree, database):
    return multimaster_pillar(
        [master_entry(master1, MASTER_HOSTS[0]), master_entry(master2_factory, MASTER_HOSTS[1])],
        ports,
        manage_services=False,
        master=formula_master_options(served_formula(), pillar_tree.root),
        job_cache={
            "enabled": True,
            "host": DB_HOST,
            "port": DB_PORT,
            "password": PASSWORD,
            "connect_timeout": 2,
        },
    )


@pytest.fixture(scope="module")
def control_minions(master1, master2_factory, start_minion, pillar_tree, job_cache_pillar):
    """
    Both masters' control minions, connected to master1, their keys on master2 too.
    """
    ids = [master1.id, master2_factory.id]
    for minion_id in ids:
        pillar_tree.set(minion_id, job_cache_pillar)
        start_minion(master1, minion_id, share_with=[master2_factory])
    ret = master1.salt_cli(timeout=180).run("-L", "saltutil.sync_all", minion_tgt=",".join(ids))
    assert ret.returncode == 0, ret
    return ids


@pytest.fixture(scope="module")
def applied(master1, control_minions):
    """
    ``multimaster.master`` on both control minions (the job cache file, psycopg2 already in this
    venv, the schema), then master1 restarted on it, as ``manage_services`` would, and the
    formula's runners synced to it.
    """
    ret = master1.salt_cli(timeout=180).run(
        "-L", "state.apply", "multimaster.master", minion_tgt=",".join(control_minions)
    )
    assert ret.returncode == 0, ret
    for minion_id in control_minions:
        failed = [sid for sid, st in ret.data[minion_id].items() if st["result"] is not True]
        assert not failed, ret
    master1.terminate()
    master1.start(start_timeout=START_TIMEOUT)
    # The runners (multimaster.status) on master1, as a user syncs them.
    synced = master1.salt_run_cli(timeout=120).run("saltutil.sync_all")
    assert synced.returncode == 0, synced
    for minion_id in control_minions:
        wait_for_ping(master1.salt_cli(), minion_id, timeout=90)
    return ret


@pytest.fixture(scope="module")
def master2(daemons, master2_factory, applied):
    daemons.start(master2_factory, timeout=START_TIMEOUT)
    return master2_factory


@pytest.fixture(scope="module")
def minion(master1, master2, start_minion):
    """
    A minion of master1 only: master2 can know its jobs only from the shared database.
    """
    factory = start_minion(master1, MINION, share_with=[master2])
    wait_for_ping(master1.salt_cli(), MINION, timeout=60)
    return factory


def test_every_master_gets_a_0600_job_cache_file_and_the_schema(
    applied, master1, master2_factory, database
):
    for master in (master1, master2_factory):
        path = pathlib.Path(master.config_dir) / "master.d" / CONFIG_FILE
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert "master_job_cache: multimaster_pgjsonb" in path.read_text()
        returner = pathlib.Path(master.config["extension_modules"], "returners", RETURNER)
        assert returner.read_bytes() == (REPO_ROOT / "_returners" / RETURNER).read_bytes()
    tables = database.sql("SELECT tablename FROM pg_tables WHERE schemaname = 'public'", db="salt")
    assert set(tables.split()) == {"jids", "salt_returns", "salt_events"}
    assert PASSWORD not in applied.stdout + applied.stderr


def test_a_job_published_on_master1_is_looked_up_on_master2(master1, master2, minion):
    token = f"echo-{secrets.token_hex(4)}"
    ret = master1.salt_cli(timeout=60).run("test.echo", token, minion_tgt=MINION)
    assert ret.returncode == 0 and ret.data == token, ret
    # master2 never saw this job: it lists it and its return from the shared database.
    run = master2.salt_run_cli(timeout=60)
    jobs = run.run("jobs.list_jobs", "search_function=test.echo")
    assert jobs.returncode == 0, jobs
    matching = [jid for jid, job in jobs.data.items() if job["Arguments"] == [token]]
    assert len(matching) == 1, jobs.data
    (jid,) = matching
    looked_up = run.run("jobs.lookup_jid", jid)
    assert looked_up.returncode == 0 and looked_up.data == {MINION: token}, looked_up


def test_a_second_apply_changes_nothing_and_leaves_no_password_in_the_job_cache(
    master1, master2, minion, control_minions, database
):
    """
    The state returns now land in the shared database: neither they nor any other row holds the
    password.
    """
    ret = master1.salt_cli(timeout=180).run(
        "-L", "state.apply", "multimaster.master", minion_tgt=",".join(control_minions)
    )
    assert ret.returncode == 0, ret
    for minion_id in control_minions:
        assert changed_states(ret.data[minion_id]) == {}

    def stored():
        query = "SELECT count(*) FROM salt_returns WHERE fun = 'state.apply'"
        return int(database.sql(query, db="salt").strip())

    # Salt fires a return's event before its job cache stores it: the CLI can be done first.
    wait_for(lambda: stored() >= len(control_minions), timeout=30, what="both returns stored")
    assert stored() == len(control_minions)
    leaked = database.sql(
        f"SELECT (SELECT count(*) FROM jids WHERE load::text LIKE '%{PASSWORD}%')"
        f" + (SELECT count(*) FROM salt_returns WHERE full_ret::text LIKE '%{PASSWORD}%')",
        db="salt",
    )
    assert int(leaked.strip()) == 0


# Sends one request, as the minion of the config file in argv[1], on its request channel to its
# master: what a minion whose host is compromised can send with the minion's own key.
FORGE = """
import json, sys
import salt.channel.client, salt.config, salt.minion
opts = salt.config.minion_config(sys.argv[1])
opts.update(salt.minion.resolve_dns(opts))
with salt.channel.client.ReqChannel.factory(opts, crypt="aes") as channel:
    print(json.dumps(channel.send(json.loads(sys.argv[2]), timeout=30)))
"""


def send_as(minion, load):
    """
    Send ``load`` to the master of ``minion`` (a factory) over that minion's request channel.
    """
    proc = subprocess.run(
        [sys.executable, "-c", FORGE, minion.config_file, json.dumps(load)],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@contextlib.contextmanager
def decoy_server(host, port):
    """
    A TCP listener on ``host:port`` for the block: the list it yields gets the address of
    every client that connects (each connection is closed at once).
    """
    seen = []
    stop = threading.Event()
    with socket.create_server((host, port)) as server:
        server.settimeout(0.2)

        def serve():
            while not stop.is_set():
                try:
                    conn, peer = server.accept()
                except TimeoutError:
                    continue
                seen.append(peer)
                conn.close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            yield seen
        finally:
            stop.set()
            thread.join()


def test_a_minions_return_cannot_send_the_master_to_another_database(master1, minion, database):
    """
    A minion's return carrying ``ret_kwargs`` that name another server (and no TLS) does not
    make the master connect there with the database login: the return lands in the real
    database, and nothing reaches the decoy.
    """
    jid = salt.utils.jid.gen_jid({})
    token = f"forged-{secrets.token_hex(4)}"
    forged = {
        "cmd": "_return",
        "id": MINION,
        "jid": jid,
        "fun": "test.echo",
        "fun_args": [token],
        "return": token,
        "retcode": 0,
        "success": True,
        "ret_kwargs": {
            "host": DECOY_HOST,
            "port": DECOY_PORT,
            "sslmode": "disable",
            "connect_timeout": 2,
        },
        "ret_config": "decoy",
    }

    def stored():
        query = f"SELECT count(*) FROM salt_returns WHERE jid = '{jid}' AND id = '{MINION}'"
        return int(database.sql(query, db="salt").strip())

    with decoy_server(DECOY_HOST, DECOY_PORT) as connections:
        send_as(minion, forged)
        wait_for(
            lambda: stored() or connections, timeout=30, what="the forged return stored or sent"
        )
    assert connections == [], f"master1 connected to {DECOY_HOST}:{DECOY_PORT}"
    assert stored() == 1


def status(master):
    ret = master.salt_run_cli(timeout=180).run("multimaster.status")
    report = ret.data
    assert isinstance(report, dict), ret
    return ret, report


def test_status_shows_every_master_on_the_shared_database(master1, master2, minion):
    _, report = status(master1)
    assert report["job_cache_ok"] is True, report
    for master in (master1.id, master2.id):
        cache = report["job_cache"][master]
        assert cache["reachable"] is True and cache["returner"] == "multimaster_pgjsonb"
        assert cache["database"] == f"salt@{DB_HOST}:{DB_PORT}/salt"


def test_with_the_database_down_publishing_works_and_the_failure_is_reported(
    master1, master2, minion, database
):
    log = pathlib.Path(master1.config["log_file"])
    before = log.stat().st_size
    database.stop()
    try:
        ret = master1.salt_cli(timeout=60).run("test.ping", minion_tgt=MINION)
        assert ret.returncode == 0 and ret.data is True, ret

        def reported():
            with log.open("rb") as handle:
                handle.seek(before)
                written = handle.read().decode(errors="replace")
            return (
                "CRITICAL" in written and "multimaster_pgjsonb: PostgreSQL unavailable" in written
            )

        wait_for(reported, timeout=30, what="the failure in master1's log")
        ret, report = status(master1)
        assert ret.returncode != 0
        assert report["job_cache_ok"] is False
        for master in (master1.id, master2.id):
            cache = report["job_cache"][master]
            assert cache["reachable"] is False and DB_HOST in cache["error"], cache
    finally:
        database.start()
    _, report = status(master1)
    assert report["job_cache_ok"] is True, report


def test_the_password_is_only_in_the_masters_0600_files(
    salt_factories, master1, master2, minion, control_minions
):
    """
    Logs at debug, job caches, proc, minion caches: the password is nowhere but in the job
    cache files, and in master1's minion data cache of the two control minions' pillar (Salt
    keeps compiled pillar there; docs/job-cache.md says to target the password at them only).
    """
    allowed = {pathlib.Path(m.config_dir) / "master.d" / CONFIG_FILE for m in (master1, master2)}
    found = [
        path
        for path in pathlib.Path(salt_factories.root_dir).rglob("*")
        if path.is_file() and not path.is_symlink() and PASSWORD.encode() in path.read_bytes()
    ]
    pillar_cache = [p for p in found if p not in allowed and "pillar" in p.parts]
    leaks = [str(p) for p in found if p not in allowed and p not in pillar_cache]
    assert not leaks, json.dumps(leaks)
    assert allowed <= set(found)
    assert {p.stem for p in pillar_cache} <= set(control_minions), pillar_cache
