"""
The shared job cache: the master options it renders, the connection read back from a master's
options, and a health check that never shows the password.
"""

import json
import os
import socket

import multimaster_jobcache as jobcache
import multimaster_pillarcheck
import multimaster_settings
import pytest

from tests.support.jobs import running

PASSWORD = "pw-marker-7c41d9"
SECTION = {
    "masters": [{"id": "master1", "host": "10.0.3.61"}, {"id": "master2", "host": "10.0.3.230"}],
    "job_cache": {"enabled": True, "host": "db.example.com", "password": PASSWORD},
}


@pytest.fixture
def settings(defaults):
    return multimaster_settings.build(SECTION, defaults)


def test_master_options_select_the_formulas_returner_with_the_pillar_connection(settings):
    """
    The formula's returner, not Salt's pgjsonb; by default TLS with SCRAM channel binding.
    """
    assert multimaster_settings.job_cache_config(settings) == {
        "master_job_cache": "multimaster_pgjsonb",
        "multimaster_pgjsonb": {
            "host": "db.example.com",
            "port": 5432,
            "dbname": "salt",
            "user": "salt",
            "password": PASSWORD,
            "connect_timeout": 5,
            "sslmode": "require",
            "channel_binding": "require",
        },
    }
    settings["job_cache"].update(sslmode="verify-full", sslrootcert="/etc/salt/pki/db-ca.crt")
    connect = multimaster_settings.job_cache_config(settings)["multimaster_pgjsonb"]
    assert (connect["sslmode"], connect["sslrootcert"]) == (
        "verify-full",
        "/etc/salt/pki/db-ca.crt",
    )


@pytest.mark.parametrize(
    "tls",
    [
        {"sslmode": "require", "channel_binding": "require"},
        {"sslmode": "verify-ca", "channel_binding": "require", "sslrootcert": "/etc/ssl/db.crt"},
        {"sslmode": "verify-full", "channel_binding": "disable", "sslrootcert": "system"},
        {"sslmode": "verify-full", "channel_binding": "prefer", "sslrootcert": ""},
    ],
)
def test_tls_that_proves_the_server_is_accepted(defaults, tls):
    """
    TLS always; and SCRAM channel binding or a verified certificate and host name.
    """
    section = dict(SECTION, job_cache=dict(SECTION["job_cache"], **tls))
    settings = multimaster_settings.build(section, defaults)
    connect = multimaster_settings.job_cache_config(settings)["multimaster_pgjsonb"]
    assert {key: connect.get(key, "") for key in tls} == tls


def test_nothing_is_rendered_while_the_job_cache_is_off(defaults):
    settings = multimaster_settings.build({"masters": SECTION["masters"]}, defaults)
    assert multimaster_settings.job_cache_config(settings) is None
    assert "master_job_cache" not in multimaster_settings.master_config(
        settings, settings["masters"][0]
    )


def test_only_a_master_needs_the_password(defaults):
    """
    The password is targeted at the masters' control minions: the other minions see the section
    without it and build their settings; a master without it is refused, naming the key.
    """
    section = dict(SECTION, job_cache=dict(SECTION["job_cache"], password=""))
    settings = multimaster_settings.build(section, defaults)
    assert multimaster_settings.minion_config(settings)["master"] == ["10.0.3.61", "10.0.3.230"]
    with pytest.raises(
        multimaster_pillarcheck.SettingsError, match="multimaster:job_cache:password"
    ):
        multimaster_settings.job_cache_config(settings)


def test_the_connection_is_read_back_from_the_master_options(settings):
    options = multimaster_settings.job_cache_config(settings)
    conn = jobcache.connection(options)
    assert conn == dict(options["multimaster_pgjsonb"], returner="multimaster_pgjsonb")
    assert jobcache.describe(conn) == "salt@db.example.com:5432/salt"


def test_a_master_on_salts_local_cache_shares_nothing():
    assert jobcache.connection({"master_job_cache": "local_cache"}) is None
    assert jobcache.check({"master_job_cache": "local_cache"}) == {
        "returner": "local_cache",
        "shared": False,
    }


def test_the_password_is_masked_in_settings_returns(settings):
    settings["config"] = {"job_cache": multimaster_settings.job_cache_config(settings)}
    shown = multimaster_settings.redacted_settings(settings)
    assert PASSWORD not in json.dumps(shown)
    assert shown["job_cache"]["password"] == multimaster_pillarcheck.MASK
    assert shown["config"]["job_cache"]["multimaster_pgjsonb"]["password"] == (
        multimaster_pillarcheck.MASK
    )
    assert shown["config"]["job_cache"]["multimaster_pgjsonb"]["host"] == "db.example.com"


def closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_database_that_is_down_is_reported_without_the_password():
    options = {
        "master_job_cache": "multimaster_pgjsonb",
        "multimaster_pgjsonb": {
            "host": "127.0.0.1",
            "port": closed_port(),
            "dbname": "salt",
            "user": "salt",
            "password": PASSWORD,
            "connect_timeout": 2,
        },
    }
    report = jobcache.check(options)
    assert report["shared"] is True and report["reachable"] is False
    assert report["database"].startswith("salt@127.0.0.1:")
    assert "Connection refused" in report["error"] or "connect" in report["error"]
    assert PASSWORD not in json.dumps(report)


def test_an_error_that_quotes_the_password_is_scrubbed():
    conn = {"user": "salt", "host": "h", "port": 5432, "dbname": "salt", "password": PASSWORD}
    assert jobcache._scrub(f"bad dsn password={PASSWORD}", conn) == (
        f"bad dsn password={jobcache.MASK}"
    )


@pytest.mark.parametrize(
    ("install", "methods"),
    [("onedir", ("pip", "pip")), ("pip", ("pip", "pip")), ("package", ("pkg", "pkg"))],
)
def test_python_deps_follow_how_salt_is_installed(defaults, install, methods):
    section = dict(SECTION, master={"gitfs": {"remotes": ["https://git.example.com/f.git"]}})
    settings = multimaster_settings.build(section, defaults)
    deps = multimaster_settings.python_deps(settings, install)
    names = {"pip": ("pygit2", "psycopg2-binary"), "pkg": ("python3-pygit2", "python3-psycopg2")}
    assert deps == [
        {"part": "gitfs", "method": methods[0], "name": names[methods[0]][0]},
        {"part": "job-cache", "method": methods[1], "name": names[methods[1]][1]},
    ]


def test_no_python_deps_without_gitfs_or_job_cache(defaults):
    settings = multimaster_settings.build({"masters": SECTION["masters"]}, defaults)
    assert multimaster_settings.python_deps(settings, "onedir") == []


def test_a_recorded_runner_job_is_stored_without_listing_every_key(tmp_path, monkeypatch):
    # Every runner job of the formula (sync_keys ...) records its load as it starts: Salt then
    # stores the job's return without globbing the master's id over the accepted keys (28 s
    # per job at 100,000 keys), and jobs.list_jobs still names the function and the user.
    import salt.config
    import salt.loader
    import salt.utils.job
    import salt.utils.minions

    opts = salt.config.master_config(os.devnull)
    opts.update(id="m1_master", cachedir=str(tmp_path / "cache"), pki_dir=str(tmp_path / "pki"))
    listed = []
    monkeypatch.setattr(
        salt.utils.minions.CkMinions, "check_minions", lambda self, *a, **k: listed.append(a)
    )
    jid, fun = "20261127000000000001", "runner.multimaster.sync_keys"
    running(opts, jid, fun)
    jobcache.record_runner_load(opts, jid, fun, opts["id"], user="root")
    ret = {"jid": jid, "fun": fun, "return": {"comment": "All masters already hold the same keys"}}
    salt.utils.job.store_job(
        opts, {"id": "m1_master", "tgt": "m1_master", "jid": jid, "return": ret}
    )
    loader = salt.loader.returners(opts, {})
    load = loader["local_cache.get_load"](jid)
    assert listed == []
    assert (load["fun"], load["user"], load["Minions"]) == (fun, "root", ["m1_master"])
    assert "already hold" in repr(loader["local_cache.get_jid"](jid)["m1_master"])


def test_no_runner_job_is_recorded_where_salt_would_store_none(tmp_path):
    import salt.config
    import salt.loader

    opts = salt.config.master_config(os.devnull)
    opts.update(cachedir=str(tmp_path / "cache"), pki_dir=str(tmp_path / "pki"))
    jid = "20261127000000000002"
    running(opts, jid, "runner.x.y")
    jobcache.record_runner_load(dict(opts, runner_returns=False), jid, "runner.x.y", "m1")
    jobcache.record_runner_load(opts, None, "runner.x.y", "m1")
    jobcache.record_runner_load(
        dict(opts, master_job_cache="multimaster_pgjsonb"), jid, "runner.x.y", "m1"
    )
    # Salt runs another function under this jid: the reactor's threads share a module's
    # globals, so __jid__ may be another job's by the time the function reads it.
    jobcache.record_runner_load(opts, jid, "runner.x.z", "m1")
    assert salt.loader.returners(opts, {})["local_cache.get_load"](jid) == {}
