"""
The shared job cache applied for real on a masterless control minion, against a real PostgreSQL
server (TLS, SCRAM): the formula's returner lands in the master's ``extension_modules``, the
options in their own 0600 ``master.d`` file that Salt's own config loader reads, the schema is
created once, ``test=True`` creates nothing, a database that is down fails the schema state
with a message naming it, and the password appears in no state return and in no file but that
one (and the pillar it came from). The returner, loaded as a master loads it, stores and reads
jobs in that database, whatever a return carries.
"""

import pathlib
import stat

import multimaster_jobcache
import pytest
import salt.config
import salt.loader
import salt.utils.job

from tests.support import postgres

from .conftest import ROOT
from .test_apply import changed, failed, results, state_sls
from .test_render import pillar

DB_HOST, DB_PORT = "127.0.0.9", 30193
PASSWORD = "job-cache-password-marker-9b1e"
SETTINGS = {"install_packages": False, "manage_services": False}
SCHEMA_STATE = "multimaster-master-config-job-cache-schema-present"
FILE_STATE = "multimaster-master-config-job-cache-managed"
RETURNER_STATE = "multimaster-master-config-job-cache-returner-installed"


@pytest.fixture(scope="module")
def database():
    with postgres.database(DB_HOST, DB_PORT, "salt", "salt", PASSWORD) as server:
        yield server


@pytest.fixture(scope="module")
def job_cache(database):
    """
    The checked ``multimaster:job_cache`` section: the server's certificate verified against
    its CA and the address (and SCRAM channel binding, the default).
    """
    return {
        "returner": "multimaster_pgjsonb",
        "host": DB_HOST,
        "port": DB_PORT,
        "db": "salt",
        "user": "salt",
        "password": PASSWORD,
        "connect_timeout": 2,
        "sslmode": "verify-full",
        "channel_binding": "require",
        "sslrootcert": database.ca_file,
    }


@pytest.fixture(scope="module")
def master_opts(job_cache, tmp_path_factory):
    """
    A master's options with the job cache options and the formula's returners.
    """
    opts = salt.config.master_config("/nonexistent/master")
    opts.update(multimaster_jobcache.master_options(job_cache))
    opts["cachedir"] = str(tmp_path_factory.mktemp("master-cache"))
    opts["returner_dirs"] = [str(ROOT / "_returners")]
    return opts


@pytest.fixture(scope="module")
def returners(master_opts):
    """
    The master job cache functions, as Salt's loader loads them for a master.
    """
    return salt.loader.returners(master_opts, {})


def job_cache_pillar(database, **job_cache):
    section = {
        "enabled": True,
        "host": DB_HOST,
        "port": DB_PORT,
        "password": PASSWORD,
        "connect_timeout": 2,
        "sslmode": "verify-full",
        "sslrootcert": database.ca_file,
        **job_cache,
    }
    return pillar(job_cache=section, **SETTINGS)


def tables(database):
    listed = database.sql("SELECT tablename FROM pg_tables WHERE schemaname = 'public'", db="salt")
    return set(listed.split())


def test_test_mode_creates_no_table(salt_env, database):
    env = salt_env("master2", job_cache_pillar(database))
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
    env = salt_env("master2", job_cache_pillar(database))
    ret = state_sls(env, "multimaster.master.config")
    assert not failed(ret), ret
    assert {RETURNER_STATE, FILE_STATE, SCHEMA_STATE} <= set(changed(ret))
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
    assert opts["master_job_cache"] == "multimaster_pgjsonb"
    connect = opts["multimaster_pgjsonb"]
    assert (connect["host"], connect["port"], connect["password"]) == (DB_HOST, DB_PORT, PASSWORD)
    assert (connect["sslmode"], connect["channel_binding"]) == ("verify-full", "require")
    # The master loads it from its extension_modules: what was synced to the minion.
    returner = pathlib.Path(opts["extension_modules"]) / "returners" / "multimaster_pgjsonb.py"
    assert returner.read_bytes() == (ROOT / "_returners" / "multimaster_pgjsonb.py").read_bytes()
    assert returners_of(opts)["multimaster_pgjsonb.get_minions"]() == []
    # A second master applying it finds the schema there: nothing to do, nothing changed.
    again = state_sls(env, "multimaster.master.config")
    assert changed(again) == []
    assert "schema is present" in results(again)[SCHEMA_STATE]["comment"]
    clean = state_sls(env, "multimaster.master.clean")
    assert "multimaster-master-clean-job-cache-config-file-absent" in changed(clean)
    assert not path.exists()


def test_a_database_that_is_down_fails_the_schema_state_naming_it(salt_env, database):
    env = salt_env("master2", job_cache_pillar(database, port=DB_PORT + 1))
    ret = state_sls(env, "multimaster.master.config")
    problems = failed(ret)
    assert list(problems) == [SCHEMA_STATE]
    assert f"salt@{DB_HOST}:{DB_PORT + 1}/salt" in problems[SCHEMA_STATE]
    assert PASSWORD not in repr(ret.raw)


def returners_of(opts):
    return salt.loader.returners(opts, {})


def test_a_return_does_not_replace_the_published_load(database, returners):
    """
    Salt saves each return's load with the job cache's ``save_load``, which upserts it over the
    publish's load (target, arguments); the schema's trigger keeps the publish's, as
    ``jobs.list_jobs`` needs it.
    """
    jid = "20261125020202000001"
    published = {"jid": jid, "fun": "test.echo", "arg": ["hi"], "tgt": "web1", "tgt_type": "glob"}
    returners["multimaster_pgjsonb.save_load"](jid, published)
    returners["multimaster_pgjsonb.save_load"](jid, {"jid": jid, "fun": "test.echo", "id": "web1"})
    assert returners["multimaster_pgjsonb.get_load"](jid) == published
    job = returners["multimaster_pgjsonb.get_jids"]()[jid]
    assert (job["Target"], job["Arguments"]) == ("web1", ["hi"])
    # A later publish load (a re-run under the same jid) still replaces it.
    again = dict(published, arg=["again"])
    returners["multimaster_pgjsonb.save_load"](jid, again)
    assert returners["multimaster_pgjsonb.get_load"](jid) == again


def test_returns_are_stored_and_read_back_whatever_they_carry(database, returners, master_opts):
    """
    What Salt's job cache calls, on the real database: a return whose ``ret_kwargs`` and
    ``ret_config`` name another server is stored here like any other; ``jobs`` read it back.
    """
    jid = returners["multimaster_pgjsonb.prep_jid"](False, "20261125040404000001")
    assert jid == "20261125040404000001"
    load = {"jid": jid, "fun": "test.echo", "arg": ["x"], "tgt": "web*", "tgt_type": "glob"}
    returners["multimaster_pgjsonb.save_load"](jid, load)
    forged = {"ret_kwargs": {"host": "127.0.0.11", "sslmode": "disable"}, "ret_config": "alt"}
    for minion, extra in (("web1", {}), ("web2", forged)):
        ret = {"id": minion, "jid": jid, "fun": "test.echo", "return": minion, "success": True}
        returners["multimaster_pgjsonb.returner"](dict(ret, **extra))
    assert {m: r["return"] for m, r in returners["multimaster_pgjsonb.get_jid"](jid).items()} == {
        "web1": "web1",
        "web2": "web2",
    }
    assert set(returners["multimaster_pgjsonb.get_fun"]("test.echo")) == {"web1", "web2"}
    assert {"web1", "web2"} <= set(returners["multimaster_pgjsonb.get_minions"]())
    returners["multimaster_pgjsonb.event_return"]([{"tag": "test/mm", "data": {"a": 1}}])
    assert database.sql("SELECT data FROM salt_events WHERE tag = 'test/mm'", db="salt").strip()
    # Jobs older than keep_jobs_seconds go, with their returns; newer ones stay.
    database.sql(
        f"UPDATE salt_returns SET alter_time = NOW() - interval '2 days' WHERE jid = '{jid}'",
        db="salt",
    )
    assert salt.utils.job.get_keep_jobs_seconds(master_opts) == 86400
    returners["multimaster_pgjsonb.clean_old_jobs"]()
    assert returners["multimaster_pgjsonb.get_jid"](jid) == {}
    assert returners["multimaster_pgjsonb.get_load"](jid) == {}
    assert returners["multimaster_pgjsonb.get_load"]("20261125020202000001")


def test_the_transports_pull_jobs_leave_the_shared_database(database, master_opts):
    """
    The pull jobs that carried a transfer's chunks are removed from the shared job cache as the
    transfer proceeds (as from ``local_cache``); other jobs stay.
    """
    opts = master_opts
    jids = ["20261125010101000001", "20261125010101000002", "20261125010101000003"]
    for jid in jids:
        database.sql(f"INSERT INTO jids VALUES ('{jid}', '{{}}')", db="salt")
        database.sql(
            "INSERT INTO salt_returns (fun, jid, return, id, success, full_ret) VALUES"
            f" ('runner.multimaster_transfer.pull', '{jid}', '{{}}', 'm', 'true', '{{}}')",
            db="salt",
        )
    multimaster_jobcache.forget_jobs(opts, jids[:2])
    left = database.sql(
        "SELECT jid FROM jids WHERE jid LIKE '2026112501%'"
        " UNION ALL SELECT jid FROM salt_returns WHERE jid LIKE '2026112501%'",
        db="salt",
    )
    assert left.split() == [jids[2], jids[2]]
