"""
The shared job cache of ``multimaster:job_cache``: every master's ``master_job_cache``, in one
PostgreSQL database. It keeps jobs in the tables of Salt's ``pgjsonb`` returner and in the same
form, so ``salt-run jobs.lookup_jid`` / ``jobs.list_jobs`` on any master read them back.

Why not Salt's ``pgjsonb`` itself: it lays a return's ``ret_kwargs`` over its connection
options and reads the option profile a return's ``ret_config`` names
(``salt.returners.get_returner_options``), and every minion's return reaches the master job
cache. A minion sending ``ret_kwargs: {host: <its server>, sslmode: disable}`` had the master
log in there with the database user and password. Here the connection comes from the master's
own ``multimaster_pgjsonb`` option and nothing else: no function reads an option from a load.
And ``pgjsonb`` passes libpq no ``channel_binding``, which keeps a server that is not the
database from learning the password.

``multimaster.master`` writes the options (libpq connection keywords) to a 0600 ``master.d``
file and installs this module into the master's ``extension_modules``:

.. code-block:: yaml

    master_job_cache: multimaster_pgjsonb
    multimaster_pgjsonb:
      host: db.example.com
      port: 5432
      dbname: salt
      user: salt
      password: <password>
      connect_timeout: 5
      sslmode: require
      channel_binding: require

The module is self-contained: Salt's returner loader puts no ``utils`` directory on
``sys.path``, so the formula's utils cannot be imported here.
"""

import contextlib
import logging
import time

import salt.exceptions
import salt.utils.data
import salt.utils.jid
import salt.utils.job

try:
    import psycopg2
    import psycopg2.extras

    HAS_PG = True
except ImportError:
    HAS_PG = False

log = logging.getLogger(__name__)

__virtualname__ = "multimaster_pgjsonb"

# The master option holding the connection (libpq keywords), and the keywords passed on.
OPTION = "multimaster_pgjsonb"
KEYWORDS = (
    "host",
    "port",
    "dbname",
    "user",
    "password",
    "connect_timeout",
    "sslmode",
    "sslrootcert",
    "channel_binding",
)
MASK = "**********"
TABLES = ("jids", "salt_returns", "salt_events")


def __virtual__():
    if not HAS_PG:
        return (False, "multimaster_pgjsonb: psycopg2 is not installed in the Python of Salt")
    return __virtualname__


def _settings():
    """
    The connection keywords of the master's own options (never of a load).
    """
    settings = __opts__.get(OPTION)
    if not isinstance(settings, dict):
        return {}
    return {key: settings[key] for key in KEYWORDS if settings.get(key) not in (None, "")}


def _describe(settings):
    """
    ``user@host:port/dbname``: how errors name the database, no password.
    """
    return (
        f"{settings.get('user')}@{settings.get('host')}:{settings.get('port')}/"
        f"{settings.get('dbname')}"
    )


def _scrub(text, settings):
    password = settings.get("password")
    return text.replace(str(password), MASK) if password else text


@contextlib.contextmanager
def _cursor():
    """
    A cursor in one transaction on the job cache database: committed when the block ends,
    rolled back when it raises. Raises ``SaltMasterError`` (no password in it) when the
    database cannot be reached.
    """
    settings = _settings()
    try:
        conn = psycopg2.connect(**settings)
    except psycopg2.Error as exc:
        raise salt.exceptions.SaltMasterError(
            f"multimaster_pgjsonb: cannot connect to {_describe(settings)}: "
            + _scrub(str(exc).strip(), settings)
        ) from None
    try:
        with conn, conn.cursor() as cur:
            yield cur
    finally:
        conn.close()


def returner(ret):
    """
    Store one minion's return. Its ``ret_kwargs`` and ``ret_config`` (a minion writes them)
    choose nothing: the return is data only. A database that is down drops the return with a
    critical log line, as Salt's ``pgjsonb`` does, so a publish never waits on it.
    """
    try:
        with _cursor() as cur:
            cleaned = salt.utils.data.decode(ret)
            cur.execute(
                "INSERT INTO salt_returns (fun, jid, return, id, success, full_ret, alter_time)"
                " VALUES (%s, %s, %s, %s, %s, %s, to_timestamp(%s))",
                (
                    ret["fun"],
                    ret["jid"],
                    psycopg2.extras.Json(cleaned["return"]),
                    ret["id"],
                    ret.get("success", False),
                    psycopg2.extras.Json(cleaned),
                    time.time(),
                ),
            )
    except salt.exceptions.SaltMasterError as exc:
        log.critical(
            "multimaster_pgjsonb: PostgreSQL unavailable, dropping return for jid=%s id=%s: %s",
            ret.get("jid"),
            ret.get("id"),
            exc,
        )
    except psycopg2.Error as exc:
        log.error(
            "multimaster_pgjsonb: failed to store the return for jid=%s id=%s: %s",
            ret.get("jid"),
            ret.get("id"),
            str(exc).strip(),
        )


def event_return(events):
    """
    Store events (with ``event_return: multimaster_pgjsonb``), each with this master's id.
    """
    try:
        with _cursor() as cur:
            for event in events:
                cur.execute(
                    "INSERT INTO salt_events (tag, data, master_id, alter_time)"
                    " VALUES (%s, %s, %s, to_timestamp(%s))",
                    (
                        event.get("tag", ""),
                        psycopg2.extras.Json(event.get("data", "")),
                        __opts__["id"],
                        time.time(),
                    ),
                )
    except (salt.exceptions.SaltMasterError, psycopg2.Error) as exc:
        log.critical("multimaster_pgjsonb: dropping %d event(s): %s", len(events), exc)


def save_load(jid, load, minions=None):  # pylint: disable=unused-argument
    """
    Save the load of job ``jid``, replacing one stored before (the schema's trigger keeps a
    publish's load from being replaced by a return's). Raises when the database cannot be
    reached: Salt logs it with the job.
    """
    with _cursor() as cur:
        cur.execute(
            "INSERT INTO jids (jid, load) VALUES (%(jid)s, %(load)s)"
            " ON CONFLICT (jid) DO UPDATE SET load = %(load)s",
            {"jid": jid, "load": psycopg2.extras.Json(salt.utils.data.decode(load))},
        )


def save_minions(jid, minions, syndic_id=None):  # pylint: disable=unused-argument
    """
    Nothing to do: the returns name the minions (as in Salt's ``pgjsonb``).
    """


def prep_jid(nocache=False, passed_jid=None):  # pylint: disable=unused-argument
    """
    The job id: ``passed_jid``, or a new one.
    """
    return passed_jid if passed_jid is not None else salt.utils.jid.gen_jid(__opts__)


def get_load(jid):
    """
    The load saved for job ``jid`` ({} when there is none).
    """
    with _cursor() as cur:
        cur.execute("SELECT load FROM jids WHERE jid = %s", (jid,))
        row = cur.fetchone()
    return row[0] if row else {}


def get_jid(jid):
    """
    ``{minion id: full return}`` of job ``jid``.
    """
    with _cursor() as cur:
        cur.execute("SELECT id, full_ret FROM salt_returns WHERE jid = %s", (jid,))
        return dict(cur.fetchall())


def get_fun(fun):
    """
    ``{minion id: full return}`` of the latest return of ``fun`` of each minion.
    """
    with _cursor() as cur:
        cur.execute(
            "SELECT DISTINCT ON (id) id, full_ret FROM salt_returns WHERE fun = %s"
            " ORDER BY id, alter_time DESC",
            (fun,),
        )
        return dict(cur.fetchall())


def get_jids():
    """
    Every job: ``{jid: the job's description}`` (``salt.utils.jid.format_jid_instance``).
    """
    with _cursor() as cur:
        cur.execute("SELECT jid, load FROM jids")
        rows = cur.fetchall()
    return {jid: salt.utils.jid.format_jid_instance(jid, load) for jid, load in rows}


def get_minions():
    """
    The ids of the minions that have returned.
    """
    with _cursor() as cur:
        cur.execute("SELECT DISTINCT id FROM salt_returns")
        return [row[0] for row in cur.fetchall()]


def _expire(cur, seconds, archive):
    """
    Remove (``archive``: move to ``<table>_archive`` first) what is older than ``seconds``: a
    job's load once all its returns are.
    """
    cur.execute("SELECT NOW() - make_interval(secs => %s)", (seconds,))
    (stamp,) = cur.fetchone()
    old_job = (
        "EXISTS (SELECT 1 FROM salt_returns r WHERE r.jid = j.jid) AND NOT EXISTS"
        " (SELECT 1 FROM salt_returns r WHERE r.jid = j.jid AND r.alter_time >= %(stamp)s)"
    )
    selections = {
        "jids": f"FROM jids j WHERE {old_job}",
        "salt_returns": "FROM salt_returns WHERE alter_time < %(stamp)s",
        "salt_events": "FROM salt_events WHERE alter_time < %(stamp)s",
    }
    for table in TABLES:
        if archive:
            cur.execute(f"CREATE TABLE IF NOT EXISTS {table}_archive (LIKE {table})")
            cur.execute(
                f"INSERT INTO {table}_archive SELECT * {selections[table]}", {"stamp": stamp}
            )
        cur.execute(f"DELETE {selections[table]}", {"stamp": stamp})


def clean_old_jobs():
    """
    Called by the master's maintenance loop: with ``keep_jobs_seconds`` > 0, remove the jobs
    and events older than that (``archive_jobs: true``: move them to ``*_archive`` tables).
    """
    seconds = int(salt.utils.job.get_keep_jobs_seconds(__opts__))
    if seconds <= 0:
        return
    try:
        with _cursor() as cur:
            _expire(cur, seconds, bool(__opts__.get("archive_jobs", False)))
    except (salt.exceptions.SaltMasterError, psycopg2.Error) as exc:
        log.error("multimaster_pgjsonb: could not remove old jobs: %s", exc)
