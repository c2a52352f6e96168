"""
The master job cache the formula renders for ``multimaster:job_cache``, loaded as a master loads
it: whatever a minion's return carries, the master connects to the database of its own options
only. Salt lays a return's ``ret_kwargs`` over a returner's options and reads the profile a
return's ``ret_config`` names (``salt.returners.get_returner_options``): with Salt's ``pgjsonb``
as ``master_job_cache``, a minion sending ``ret_kwargs: {host: <its server>, sslmode:
disable}`` had the master hand its server the database user and password.
"""

import multimaster_settings
import psycopg2
import pytest
import salt.config
import salt.loader

from tests.support.loading import ROOT

PASSWORD = "pw-marker-5d20e1"
SECTION = {
    "masters": [{"id": "master1", "host": "10.0.3.61"}, {"id": "master2", "host": "10.0.3.230"}],
    "job_cache": {"enabled": True, "host": "db.example.com", "password": PASSWORD},
}
ATTACKER = {"host": "203.0.113.7", "port": 5433, "sslmode": "disable", "user": "postgres"}
JID = "20261125030303000001"


class Context:
    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FakeCursor(Context):
    def __init__(self, conn):
        self.connection = conn

    def execute(self, sql, params=None):
        self.connection.executed.append((" ".join(sql.split()), params))

    def fetchone(self):
        return None

    def fetchall(self):
        return []


class FakeConnection(Context):
    """
    What ``psycopg2.connect`` returns here: it records the statements run on it.
    """

    server_version = 170000

    def __init__(self, kwargs):
        self.kwargs = kwargs
        self.executed = []

    def cursor(self):
        return FakeCursor(self)

    def commit(self):
        pass

    def rollback(self):
        pass


@pytest.fixture
def connections(monkeypatch):
    made = []

    def connect(dsn=None, **kwargs):
        assert dsn is None, "the job cache connects with keywords, never a DSN string"
        made.append(FakeConnection(kwargs))
        return made[-1]

    monkeypatch.setattr(psycopg2, "connect", connect)
    return made


@pytest.fixture
def master(defaults, tmp_path):
    """
    A master's options with the job cache options ``multimaster.master`` renders, the formula's
    returners where ``saltutil.sync_all`` puts them, and another returner profile of the shop's
    own (``alternative.*``) that a return's ``ret_config`` could name.
    """
    settings = multimaster_settings.build(SECTION, defaults)
    opts = salt.config.master_config("/nonexistent/master")
    opts.update(multimaster_settings.job_cache_config(settings))
    opts.update(
        {
            "cachedir": str(tmp_path),
            "returner_dirs": [str(ROOT / "_returners")],
            "alternative.returner.pgjsonb.host": ATTACKER["host"],
            f"alternative.returner.{opts['master_job_cache']}.host": ATTACKER["host"],
        }
    )
    return opts


@pytest.fixture
def job_cache(master):
    """
    The ``master_job_cache`` functions, loaded by Salt's loader as the master's ``MasterMinion``
    loads them (with a ``config.option`` that reads the master's options).
    """
    functions = {"config.option": lambda key, default=None, **_: master.get(key, default)}
    returners = salt.loader.returners(master, functions)

    def call(name, *args):
        return returners[f"{master['master_job_cache']}.{name}"](*args)

    return call


def minion_return(**extra):
    return {
        "id": "web1",
        "jid": JID,
        "fun": "test.ping",
        "fun_args": [],
        "return": True,
        "retcode": 0,
        "success": True,
        **extra,
    }


@pytest.mark.parametrize(
    "forged",
    [
        {"ret_kwargs": ATTACKER},
        {"ret_config": "alternative"},
        {"ret_kwargs": ATTACKER, "ret_config": "alternative"},
    ],
    ids=["ret_kwargs", "ret_config", "both"],
)
def test_a_return_cannot_choose_the_database_the_master_connects_to(job_cache, connections, forged):
    job_cache("returner", minion_return(**forged))
    assert connections, "the return was not stored"
    for conn in connections:
        assert conn.kwargs["host"] == "db.example.com"
        assert conn.kwargs["port"] == 5432
        assert conn.kwargs["user"] == "salt"
        assert conn.kwargs.get("sslmode") != "disable"
    (stored,) = [
        params
        for conn in connections
        for sql, params in conn.executed
        if sql.startswith("INSERT INTO salt_returns")
    ]
    assert stored[1] == JID and stored[3] == "web1"
