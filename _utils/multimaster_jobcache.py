"""
One job cache for every master: the formula's ``multimaster_pgjsonb`` returner as
``master_job_cache``, so every master writes job loads and returns to one PostgreSQL database
(in the tables of Salt's ``pgjsonb``) and ``salt-run jobs.lookup_jid`` on any master finds a
job another master published.

Helpers shared by the execution module, the states and the peer: the master options that
select it, the schema it writes to plus a guard against a Salt defect (created when missing,
under an advisory lock so that masters applying at once do not race) and a health check. The
connection password is read from options, handed to the driver, and never returned, logged or
put in an error.

And the formula's own jobs in whichever job cache a master keeps: a runner job's load recorded
before Salt would store it the slow way, and the transport's pull jobs forgotten once spent.
"""

import contextlib
import logging
import os
import shutil

import salt.loader
import salt.payload
import salt.utils.files
import salt.utils.jid
from salt.exceptions import SaltDeserializationError

log = logging.getLogger(__name__)

# Not Salt's pgjsonb: that one takes connection options from a minion's return (ret_kwargs,
# ret_config), so a minion could have a master log in to the minion's own server.
RETURNERS = ("multimaster_pgjsonb",)
# The master option the returner reads its connection from: libpq keywords.
OPTION = "multimaster_pgjsonb"
# libpq's sslmode values that never let the password go over a connection without TLS.
TLS_MODES = ("require", "verify-ca", "verify-full")
CHANNEL_BINDINGS = ("disable", "prefer", "require")
TABLES = ("jids", "salt_returns", "salt_events")
# Salt stores every return's load with the returner's save_load (only local_cache is spared),
# and the returner's upsert (as pgjsonb's) then replaces the publish's load (target, arguments)
# with the return's: jobs.list_jobs would show "unknown-target" and no arguments for every job.
# This trigger keeps a load that names its target from being replaced by one that does not.
GUARD = "multimaster_keep_publish_load"
# Salt's pgjsonb documented schema (the returner writes it), each statement idempotent, and
# the guard.
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS jids (jid varchar(255) NOT NULL PRIMARY KEY, load jsonb NOT NULL)",
    "CREATE INDEX IF NOT EXISTS idx_jids_jsonb ON jids USING gin (load) WITH (fastupdate=on)",
    "CREATE TABLE IF NOT EXISTS salt_returns (fun varchar(50) NOT NULL, jid varchar(255) NOT NULL,"
    " return jsonb NOT NULL, id varchar(255) NOT NULL, success varchar(10) NOT NULL,"
    " full_ret jsonb NOT NULL, alter_time TIMESTAMP WITH TIME ZONE DEFAULT NOW())",
    "CREATE INDEX IF NOT EXISTS idx_salt_returns_id ON salt_returns (id)",
    "CREATE INDEX IF NOT EXISTS idx_salt_returns_jid ON salt_returns (jid)",
    "CREATE INDEX IF NOT EXISTS idx_salt_returns_fun ON salt_returns (fun)",
    "CREATE INDEX IF NOT EXISTS idx_salt_returns_return ON salt_returns"
    " USING gin (return) WITH (fastupdate=on)",
    "CREATE INDEX IF NOT EXISTS idx_salt_returns_full_ret ON salt_returns"
    " USING gin (full_ret) WITH (fastupdate=on)",
    "CREATE SEQUENCE IF NOT EXISTS seq_salt_events_id",
    "CREATE TABLE IF NOT EXISTS salt_events (id BIGINT NOT NULL UNIQUE"
    " DEFAULT nextval('seq_salt_events_id'), tag varchar(255) NOT NULL, data jsonb NOT NULL,"
    " alter_time TIMESTAMP WITH TIME ZONE DEFAULT NOW(), master_id varchar(255) NOT NULL)",
    "CREATE INDEX IF NOT EXISTS idx_salt_events_tag ON salt_events (tag)",
    "CREATE INDEX IF NOT EXISTS idx_salt_events_data ON salt_events"
    " USING gin (data) WITH (fastupdate=on)",
    f"CREATE OR REPLACE FUNCTION {GUARD}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
    " IF OLD.load ? 'tgt' AND NOT NEW.load ? 'tgt' THEN RETURN NULL; END IF;"
    " RETURN NEW; END $$",
    f"DROP TRIGGER IF EXISTS {GUARD} ON jids",
    f"CREATE TRIGGER {GUARD} BEFORE UPDATE ON jids FOR EACH ROW EXECUTE PROCEDURE {GUARD}()",
)
# pg_advisory_xact_lock key: masters creating the schema at once take turns.
_SCHEMA_LOCK = 0x6D6D6A63
MASK = "**********"


class JobCacheError(Exception):
    """
    The job cache database cannot be reached or prepared; the message holds no password.
    """


def master_options(job_cache):
    """
    The master options that make ``job_cache`` (the pillar's ``multimaster:job_cache``, checked)
    the master job cache: ``master_job_cache`` and the returner's connection (libpq keywords),
    the password among them (they go to a 0600 ``master.d`` file of their own).
    """
    connect = {
        "host": job_cache["host"],
        "port": job_cache["port"],
        "dbname": job_cache["db"],
        "user": job_cache["user"],
        "password": job_cache["password"],
        "connect_timeout": job_cache["connect_timeout"],
        "sslmode": job_cache["sslmode"],
        "channel_binding": job_cache["channel_binding"],
    }
    if job_cache["sslrootcert"]:
        connect["sslrootcert"] = job_cache["sslrootcert"]
    return {"master_job_cache": job_cache["returner"], OPTION: connect}


def connection(opts):
    """
    The connection ``opts`` (a master's options) give the job cache (libpq keywords and the
    ``returner``), or None when its ``master_job_cache`` is not one this module knows (Salt's
    ``local_cache``, say).
    """
    returner = opts.get("master_job_cache")
    if returner not in RETURNERS:
        return None
    settings = opts.get(OPTION)
    if not isinstance(settings, dict):
        settings = {}
    conn = {key: value for key, value in settings.items() if value not in (None, "")}
    conn["returner"] = returner
    return conn


def describe(conn):
    """
    ``user@host:port/dbname`` of ``conn`` (from ``connection``): what reports show, no password.
    """
    return f"{conn.get('user')}@{conn.get('host')}:{conn.get('port')}/{conn.get('dbname')}"


def _scrub(text, conn):
    password = conn.get("password")
    return text.replace(str(password), MASK) if password else text


@contextlib.contextmanager
def _cursor(conn):
    try:
        import psycopg2  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise JobCacheError(
            "psycopg2 is not installed in the Python that runs Salt "
            "(multimaster.master installs it with the job cache on)"
        ) from None
    try:
        db = psycopg2.connect(**{key: value for key, value in conn.items() if key != "returner"})
    except psycopg2.Error as exc:
        raise JobCacheError(f"{describe(conn)}: {_scrub(str(exc).strip(), conn)}") from None
    try:
        with db, db.cursor() as cur:
            yield cur
    except psycopg2.Error as exc:
        raise JobCacheError(f"{describe(conn)}: {_scrub(str(exc).strip(), conn)}") from None
    finally:
        db.close()


def _missing(cur):
    cur.execute("SELECT " + ", ".join(["to_regclass(%s)"] * len(TABLES)), TABLES)
    found = cur.fetchone()
    missing = [table for table, oid in zip(TABLES, found, strict=True) if oid is None]
    cur.execute("SELECT count(*) FROM pg_trigger WHERE tgname = %s", (GUARD,))
    if not cur.fetchone()[0]:
        missing.append(f"trigger {GUARD}")
    return missing


def missing_schema(conn):
    """
    What of the schema (the returner's tables, the guard trigger) the database of ``conn``
    lacks. Raises ``JobCacheError``.
    """
    with _cursor(conn) as cur:
        return _missing(cur)


def ensure_schema(conn):
    """
    Create what of the schema the database of ``conn`` lacks, in one transaction under an
    advisory lock; returns what it created. Raises ``JobCacheError``.
    """
    with _cursor(conn) as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        missing = _missing(cur)
        if missing:
            for statement in SCHEMA:
                cur.execute(statement)
        return missing


def forget_shared_jobs(conn, jids):
    """
    Delete the jobs ``jids`` (loads and returns) from the database of ``conn``: what the
    transport's pull jobs carried is plumbing, not history. Raises ``JobCacheError``.
    """
    with _cursor(conn) as cur:
        cur.execute("DELETE FROM salt_returns WHERE jid = ANY(%s)", (list(jids),))
        cur.execute("DELETE FROM jids WHERE jid = ANY(%s)", (list(jids),))


def check(opts):
    """
    The job cache of the master with options ``opts``: which returner, and for a shared database
    whether it answers and holds the schema (``missing`` lists what it lacks). Never raises;
    holds no password.
    """
    conn = connection(opts)
    if conn is None:
        return {"returner": opts.get("master_job_cache") or "local_cache", "shared": False}
    report = {"returner": conn["returner"], "shared": True, "database": describe(conn)}
    try:
        missing = missing_schema(conn)
    except JobCacheError as exc:
        return dict(report, reachable=False, error=str(exc))
    report["reachable"] = True
    if missing:
        report["missing"] = missing
    return report


def forget_jobs(opts, jids):
    """
    Remove the given runner jobs from the master's job cache, its own ``local_cache`` or the
    database all masters share (``multimaster:job_cache``): the pull jobs that carried chunks
    are transport, not history. Another job cache keeps them until ``keep_jobs``.

    opts
        The sending master's opts.

    jids
        The job ids of earlier pulls of one transfer.
    """
    jids = [jid for jid in jids if salt.utils.jid.is_jid(str(jid))]
    if not jids or not opts.get("job_cache", True):
        return
    shared = connection(opts)
    if shared is not None:
        try:
            forget_shared_jobs(shared, jids)
        except JobCacheError as exc:
            # The chunks are ciphertext: left in the database, they go with keep_jobs.
            log.warning("multimaster: pull jobs stay in the job cache: %s", exc)
        return
    if opts.get("master_job_cache", "local_cache") != "local_cache":
        return
    jobs = os.path.join(opts["cachedir"], "jobs")
    for jid in jids:
        shutil.rmtree(
            salt.utils.jid.jid_dir(jid, jobs, opts.get("hash_type", "sha256")),
            ignore_errors=True,
        )


def record_runner_load(opts, jid, fun, minion, user=None):
    """
    Store the load of runner job ``jid`` in the master's ``local_cache`` before the job returns,
    naming its one minion. Salt stores a runner job's load when it ends, only when none is
    stored yet, and then computes its minions by globbing ``minion`` over every accepted key:
    O(keys) for every runner job, about 0.9 s at 10,000 keys and 28 s at 100,000 (Salt 3008's
    ``localfs_key`` checks each key's path).

    opts
        The master's opts.

    jid
        The runner job's id (``__jid__``); nothing is stored without one.

    fun
        What the job runs, as Salt names it (``runner.multimaster.sync_keys``).

    minion
        The id the job targets: the runner's own (``opts["id"]``), or a pull's requester.

    user
        Who runs it (``__user__``).
    """
    if not (jid and salt.utils.jid.is_jid(str(jid)) and opts.get("job_cache", True)):
        return
    if not (minion and opts.get("runner_returns", True)):
        return
    if opts.get("ext_job_cache") or opts.get("master_job_cache", "local_cache") != "local_cache":
        return
    if _running_function(opts, jid) != fun:
        # Salt sets a runner's __jid__ in the module's globals, which the reactor's threads
        # share: a jid another job set meanwhile is left alone (Salt stores ours, slowly).
        return
    load = {"jid": jid, "id": minion, "tgt": minion, "tgt_type": "glob", "fun": fun}
    load["user"] = user or "UNKNOWN"
    try:
        returners = salt.loader.returners(opts, {})
        # The jid file first: Salt's clean_old_jobs scrubs a job directory without one as
        # corrupt, even while its job runs, and the job's answer is then lost.
        returners["local_cache.prep_jid"](passed_jid=jid)
        returners["local_cache.save_load"](jid, load, minions=[minion])
    except Exception as exc:  # pylint: disable=broad-except
        # Only a shortcut: without it Salt stores the load itself, the slow way.
        log.debug("multimaster: could not record runner job %s: %s", jid, exc)


def _running_function(opts, jid):
    """
    What runner job ``jid`` runs, from the job tracker file Salt writes before it calls the
    function (``<cachedir>/proc/<jid>``); None when there is none.
    """
    try:
        with salt.utils.files.fopen(os.path.join(opts["cachedir"], "proc", str(jid)), "rb") as fp_:
            return salt.payload.load(fp_).get("fun")
    except (OSError, ValueError, AttributeError, SaltDeserializationError):
        return None
