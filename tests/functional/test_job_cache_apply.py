"""
The shared job cache applied for real on a masterless control minion, against a real PostgreSQL
server: the options land in their own 0600 ``master.d`` file that Salt's own config loader
reads, the schema ``pgjsonb`` needs is created once, ``test=True`` creates nothing, a database
that is down fails the schema state with a message naming it, and the password appears in no
state return and in no file but that one (and the pillar it came from).
"""

import stat

import pytest
import salt.config
import salt.loader

from tests.support import postgres
from tests.unit import helpers  # noqa: F401  (puts _utils on sys.path)

from .test_apply import changed, failed, results, state_sls
from .test_render import pillar

import multimaster_jobcache  # noqa: E402  isort: skip
import multimaster_transport  # noqa: E402  isort: skip

DB_HOST, DB_PORT = "127.0.0.9", 30193
PASSWORD = "job-cache-password-marker-9b1e"
SETTINGS = {"install_packages": False, "manage_services": False}
JOB_CACHE = {
    "returner": "pgjsonb",
    "host": DB_HOST,
    "port": DB_PORT,
    "db": "salt",
    "user": "salt",
    "password": PASSWORD,
    "connect_timeout": 2,
    "sslmode": "",
}
SCHEMA_STATE = "multimaster-master-config-job-cache-schema-present"
FILE_STATE = "multimaster-master-config-job-cache-managed"


@pytest.fixture(scope="module")
def database():
    with postgres.database(DB_HOST, DB_PORT, "salt", "salt", PASSWORD) as server:
        yield server


def job_cache_pillar(**job_cache):
    section = {
        "enabled": True,
        "host": DB_HOST,
        "port": DB_PORT,
        "password": PASSWORD,
        "connect_timeout": 2,
        **job_cache,
    }
    return pillar(job_cache=section, **SETTINGS)


def tables(database):
    listed = database.sql("SELECT tablename FROM pg_tables WHERE schemaname = 'public'", db="salt")
    return set(listed.split())


def test_test_mode_creates_no_table(salt_env, database):
    env = salt_env("master2", job_cache_pillar())
    ret = state_sls(env, "multimaster.master.config", test=True)
    schema = results(ret)[SCHEMA_STATE]
    assert schema["result"] is None
    assert schema["changes"]["schema"]["new"] == [
        "jids",
        "salt_returns",
        "salt_events",
        "trigger multimaster_keep_publish_load",
    ]
    assert tables(database) == set()
    assert env.written() == []


def test_options_in_a_0600_file_salt_loads_and_the_schema_created(salt_env, database):
    env = salt_env("master2", job_cache_pillar())
    ret = state_sls(env, "multimaster.master.config")
    assert not failed(ret), ret
    assert {FILE_STATE, SCHEMA_STATE} <= set(changed(ret))
    assert tables(database) == {"jids", "salt_returns", "salt_events"}
    assert PASSWORD not in repr(ret.raw)
    path = env.conf_dir / "master.d" / "multimaster-job-cache.conf"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    holders = {
        str(p.relative_to(env.base))
        for p in env.base.rglob("*")
        if p.is_file() and PASSWORD.encode() in p.read_bytes()
    }
    assert holders == {"conf/master.d/multimaster-job-cache.conf", "pillar/multimaster.sls"}
    opts = salt.config.master_config(str(env.conf_dir / "master"))
    assert opts["master_job_cache"] == "pgjsonb"
    assert (opts["returner.pgjsonb.host"], opts["returner.pgjsonb.port"]) == (DB_HOST, DB_PORT)
    assert opts["returner.pgjsonb.pass"] == PASSWORD
    # A second master applying it finds the schema there: nothing to do, nothing changed.
    again = state_sls(env, "multimaster.master.config")
    assert changed(again) == []
    assert "schema is present" in results(again)[SCHEMA_STATE]["comment"]
    clean = state_sls(env, "multimaster.master.clean")
    assert "multimaster-master-clean-job-cache-config-file-absent" in changed(clean)
    assert not path.exists()


def test_a_database_that_is_down_fails_the_schema_state_naming_it(salt_env, database):
    env = salt_env("master2", job_cache_pillar(port=DB_PORT + 1))
    ret = state_sls(env, "multimaster.master.config")
    problems = failed(ret)
    assert list(problems) == [SCHEMA_STATE]
    assert f"salt@{DB_HOST}:{DB_PORT + 1}/salt" in problems[SCHEMA_STATE]
    assert PASSWORD not in repr(ret.raw)


def test_a_return_does_not_replace_the_published_load(database):
    """
    Salt saves each return's load with the job cache's ``save_load`` and ``pgjsonb`` upserts it
    over the publish's load (target, arguments); the schema's trigger keeps the publish's, as
    ``jobs.list_jobs`` needs it. Through Salt's own returner, loaded as a master loads it.
    """
    opts = salt.config.master_config("/nonexistent/master")
    opts.update(multimaster_jobcache.master_options(JOB_CACHE))
    returners = salt.loader.returners(opts, {})
    jid = "20261125020202000001"
    published = {"jid": jid, "fun": "test.echo", "arg": ["hi"], "tgt": "web1", "tgt_type": "glob"}
    returners["pgjsonb.save_load"](jid, published)
    returners["pgjsonb.save_load"](jid, {"jid": jid, "fun": "test.echo", "id": "web1"})
    assert returners["pgjsonb.get_load"](jid) == published
    job = returners["pgjsonb.get_jids"]()[jid]
    assert (job["Target"], job["Arguments"]) == ("web1", ["hi"])
    # A later publish load (a re-run under the same jid) still replaces it.
    again = dict(published, arg=["again"])
    returners["pgjsonb.save_load"](jid, again)
    assert returners["pgjsonb.get_load"](jid) == again


def test_the_transports_pull_jobs_leave_the_shared_database(database):
    """
    The pull jobs that carried a transfer's chunks are removed from the shared job cache as the
    transfer proceeds (as from ``local_cache``); other jobs stay.
    """
    opts = {"cachedir": "/nonexistent", **multimaster_jobcache.master_options(JOB_CACHE)}
    jids = ["20261125010101000001", "20261125010101000002", "20261125010101000003"]
    for jid in jids:
        database.sql(f"INSERT INTO jids VALUES ('{jid}', '{{}}')", db="salt")
        database.sql(
            "INSERT INTO salt_returns (fun, jid, return, id, success, full_ret) VALUES"
            f" ('runner.multimaster_transfer.pull', '{jid}', '{{}}', 'm', 'true', '{{}}')",
            db="salt",
        )
    multimaster_transport.forget_jobs(opts, jids[:2])
    left = database.sql(
        "SELECT jid FROM jids WHERE jid LIKE '2026112501%' UNION ALL SELECT jid FROM salt_returns",
        db="salt",
    )
    assert left.split() == [jids[2], jids[2]]
