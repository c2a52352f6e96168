"""
A throw-away PostgreSQL server on a loopback address, for the shared job cache tests: the
server binaries of Debian's ``postgresql`` package (installed by ``.ci/run``), a data directory
of its own, run as the ``postgres`` user when we are root (``initdb`` refuses root). Password
logins over TCP only (scram-sha-256), as a master would connect.
"""

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile


def server_binary(name):
    """
    The path of PostgreSQL's ``name`` (``initdb``, ``pg_ctl``, ``psql``), newest version first.
    """
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"PostgreSQL's {name} not found: apt-get install postgresql")
    return found[-1]


class PostgresServer:
    """
    ``PostgresServer(host, port)``: ``start()`` makes a cluster in a fresh directory and starts
    it on ``host:port``; ``create_database(db, user, password)`` adds a login owning a database;
    ``stop()``/``start()`` again keep the data; ``destroy()`` stops it and removes everything.
    """

    def __init__(self, host, port):
        self.host, self.port = host, port
        # Not below pytest's 0700 temp dir: the postgres user must reach its data directory.
        self.root = tempfile.mkdtemp(prefix="multimaster-pg-")
        self.data = os.path.join(self.root, "data")
        self.log = os.path.join(self.root, "server.log")
        self.as_user = os.geteuid() == 0
        if self.as_user:
            owner = pwd.getpwnam("postgres")
            os.chown(self.root, owner.pw_uid, owner.pw_gid)

    def _run(self, *argv):
        if self.as_user:
            argv = ("runuser", "-u", "postgres", "--", *argv)
        result = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=self.root)
        if result.returncode:
            raise RuntimeError(f"{argv}: {result.stdout}{result.stderr}")
        return result.stdout

    def start(self):
        if not os.path.isdir(self.data):
            self._run(
                server_binary("initdb"),
                "-D",
                self.data,
                "-U",
                "postgres",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
            )
        options = (
            f"-c listen_addresses={self.host} -p {self.port} -c unix_socket_directories={self.root}"
        )
        self._run(
            server_binary("pg_ctl"), "-D", self.data, "-l", self.log, "-o", options, "-w", "start"
        )

    def stop(self):
        self._run(server_binary("pg_ctl"), "-D", self.data, "-m", "fast", "-w", "stop")

    def sql(self, statement, db="postgres"):
        """
        Run ``statement`` as the superuser over the local socket; returns psql's unaligned output.
        """
        return self._run(
            server_binary("psql"),
            "-h",
            self.root,
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-d",
            db,
            "-v",
            "ON_ERROR_STOP=1",
            "-At",
            "-c",
            statement,
        )

    def create_database(self, db, user, password):
        self.sql(f"CREATE ROLE {user} LOGIN PASSWORD '{password}'")
        self.sql(f"CREATE DATABASE {db} OWNER {user}")

    def destroy(self):
        try:
            self.stop()
        except RuntimeError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def database(host, port, db, user, password):
    """
    A started server on ``host:port`` holding database ``db`` owned by login ``user`` with
    ``password``; stopped and removed when the block ends.
    """
    server = PostgresServer(host, port)
    try:
        server.start()
        server.create_database(db, user, password)
        yield server
    finally:
        server.destroy()
