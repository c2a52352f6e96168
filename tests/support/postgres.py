"""
A throw-away PostgreSQL server on a loopback address, for the shared job cache tests: the
server binaries of Debian's ``postgresql`` package (installed by ``.ci/run``), a data directory
of its own, run as the ``postgres`` user when we are root (``initdb`` refuses root). Password
logins over TCP with TLS only (``hostssl ... scram-sha-256``), as docs/job-cache.md has a database
server take the masters' logins: the server's certificate is signed by a CA of its own
(``ca_file``), for the address it listens on.
"""

import contextlib
import datetime
import glob
import ipaddress
import os
import pwd
import shutil
import subprocess
import tempfile

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

# Only the superuser on the local socket logs in without TLS (the tests' own psql).
HBA = """\
local all postgres trust
hostssl all all 127.0.0.0/8 scram-sha-256
"""
CA_NAME = "multimaster test CA"


def server_binary(name):
    """
    The path of PostgreSQL's ``name`` (``initdb``, ``pg_ctl``, ``psql``), newest version first.
    """
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"PostgreSQL's {name} not found: apt-get install postgresql")
    return found[-1]


def _certificate(subject, issuer, public_key, signing_key, ca, host=None):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if host:
        san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))])
        builder = builder.add_extension(san, critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def write_tls_files(directory, host):
    """
    ``ca.crt``, and ``server.crt``/``server.key`` for the IP address ``host`` signed by that CA,
    in ``directory``; returns their paths (CA, certificate, key).
    """
    ca_key = ec.generate_private_key(ec.SECP256R1())
    server_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate(CA_NAME, CA_NAME, ca_key.public_key(), ca_key, True)
    server = _certificate(host, CA_NAME, server_key.public_key(), ca_key, False, host)
    paths = [os.path.join(directory, name) for name in ("ca.crt", "server.crt", "server.key")]
    for path, cert in zip(paths[:2], (ca, server), strict=True):
        with open(path, "wb") as handle:
            handle.write(cert.public_bytes(serialization.Encoding.PEM))
    key = server_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    descriptor = os.open(paths[2], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(key)
    return paths


class PostgresServer:
    """
    ``PostgresServer(host, port)``: ``start()`` makes a cluster in a fresh directory and starts
    it on ``host:port``; ``create_database(db, user, password)`` adds a login owning a database;
    ``stop()``/``start()`` again keep the data; ``destroy()`` stops it and removes everything.
    ``ca_file``: the CA certificate that signed the server's.
    """

    def __init__(self, host, port):
        self.host, self.port = host, port
        # Not below pytest's 0700 temp dir: the postgres user must reach its data directory.
        self.root = tempfile.mkdtemp(prefix="multimaster-pg-")
        self.data = os.path.join(self.root, "data")
        self.log = os.path.join(self.root, "server.log")
        self.as_user = os.geteuid() == 0
        self.ca_file, self.cert_file, self.key_file = write_tls_files(self.root, host)
        if self.as_user:
            owner = pwd.getpwnam("postgres")
            for path in (self.root, self.cert_file, self.key_file):
                os.chown(path, owner.pw_uid, owner.pw_gid)

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
            # initdb's file, rewritten in place: it keeps the owner initdb gave it.
            with open(os.path.join(self.data, "pg_hba.conf"), "w", encoding="utf-8") as handle:
                handle.write(HBA)
        options = (
            f"-c listen_addresses={self.host} -p {self.port} -c unix_socket_directories={self.root}"
            f" -c ssl=on -c ssl_cert_file={self.cert_file} -c ssl_key_file={self.key_file}"
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
