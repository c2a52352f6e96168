"""
The daemon toolkit shared by the demo lab (``lab/``), the benchmark (``bench/``) and the
tests: wait for and stop daemons, make RSA keys, write daemon configs and pillar, run the Salt CLIs
with JSON output.

Import it after putting the repository root on ``sys.path``::

    sys.path.insert(0, str(REPO_ROOT))
    from toolkit import devkit

It is outside every ``_<type>/`` dir, so ``saltutil.sync_all`` never ships it, and the SPM build
excludes ``toolkit/`` like ``lab/``, ``bench/`` and ``tests/`` (see
``tests/functional/test_spm_build.py``). The pid and wait helpers are those the formula's own
restarts use (``_utils/multimaster_daemon.py``), re-exported here so that no caller keeps a copy
of its own.
"""

import contextlib
import dataclasses
import functools
import json
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import threading

import psutil
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
# The Salt CLIs of the virtualenv running us: the lab, the bench and the tests drive the Salt
# they were installed with, never one found on PATH.
BIN = pathlib.Path(sys.executable).parent

# The formula's daemon helpers are imported the way Salt imports _utils for loaded modules.
if str(REPO_ROOT / "_utils") not in sys.path:
    sys.path.insert(0, str(REPO_ROOT / "_utils"))

from multimaster_daemon import port_open, read_pid, wait_for, wait_port  # noqa: E402
from multimaster_settings import fileserver_backends, pull_acl, reactor_config  # noqa: E402

__all__ = [
    "BIN",
    "REPO_ROOT",
    "CliResult",
    "Ports",
    "ec_public_pem",
    "json_docs",
    "loopback_master",
    "loopback_minion",
    "master_entry",
    "multimaster_master_options",
    "multimaster_section",
    "new_public_pem",
    "new_rsa_key",
    "pkcs1_public_pem",
    "port_open",
    "private_pem",
    "public_pem",
    "public_pem_pool",
    "read_pid",
    "salt_cli",
    "salt_command",
    "stop_pids",
    "wait_for",
    "wait_port",
    "wait_until",
    "write_config",
    "write_multimaster_pillar",
]


# --- daemons ---------------------------------------------------------------------------------


class Poller:
    """
    While active (a context manager), calls ``poll()`` every ``interval`` seconds in a thread,
    and once more on exit: for what must be watched while something else runs.
    """

    def __init__(self, interval):
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def poll(self):
        raise NotImplementedError

    def _run(self):
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *_):
        self._stop.set()
        self._thread.join()
        self.poll()


def wait_until(what, check, timeout, interval=1.0, error=AssertionError):
    """
    Call ``check`` until it returns something truthy and return that; once ``timeout`` seconds
    have passed raise ``error(message)``, the message naming ``what``.

    ``error`` is the caller's failure: AssertionError in tests, SystemExit in the bench, the
    lab's own error carrying the logs to show.
    """
    result = wait_for(check, timeout, interval)
    if not result:
        raise error(f"timed out after {timeout}s waiting for {what}")
    return result


def stop_pids(pids, timeout=30):
    """
    SIGTERM the processes ``pids`` at once, wait for them and their children to exit, SIGKILL
    whatever is left after ``timeout`` seconds. Pids that are already gone are skipped.
    """
    procs = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            # Children too: a Salt daemon's workers must be gone before its ports are free.
            procs += [proc, *proc.children(recursive=True)]
            # Only the parent is signalled: it stops its workers itself, as on a real host.
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for leftover in alive:
        with contextlib.suppress(psutil.Error):
            leftover.kill()
    psutil.wait_procs(alive, timeout=5)


# --- keys ------------------------------------------------------------------------------------


# What a user puts on file_roots: the formula, not the whole checkout.
FORMULA_PARTS = (
    "multimaster",
    "_engines",
    "_fileserver",
    "_modules",
    "_returners",
    "_runners",
    "_states",
    "_utils",
)


def copy_formula(dest):
    """
    Copy the formula's parts into ``dest`` (a ``file_roots`` dir of its own) and return it.
    """
    dest = pathlib.Path(dest)
    for part in FORMULA_PARTS:
        shutil.copytree(REPO_ROOT / part, dest / part, dirs_exist_ok=True)
    return dest


def copy_master_keypair(source_pki, target_pki):
    """
    Give the master of ``target_pki`` (not started yet) the keypair of the master of
    ``source_pki``: the content behind ``master.pem``/``master.pub`` (symlinks to
    ``<id>.pem/.pub`` in 3008) as regular files. Salt moves them to ``<target id>.pem/.pub`` on
    first start.
    """
    source, target = pathlib.Path(source_pki), pathlib.Path(target_pki)
    target.mkdir(parents=True, exist_ok=True)
    for name, mode in (("master.pem", 0o400), ("master.pub", 0o644)):
        dst = target / name
        dst.unlink(missing_ok=True)
        dst.write_bytes((source / name).resolve().read_bytes())
        dst.chmod(mode)


def new_rsa_key(bits=2048, exponent=65537):
    """
    A fresh RSA private key (made at run time: no key material is stored in the repository).
    """
    return rsa.generate_private_key(public_exponent=exponent, key_size=bits)


def public_pem(key, fmt=serialization.PublicFormat.SubjectPublicKeyInfo):
    """
    The PEM of the public half of the private key ``key``: SubjectPublicKeyInfo (what Salt
    stores for a minion) unless ``fmt`` asks for another public format.
    """
    return key.public_key().public_bytes(serialization.Encoding.PEM, fmt).decode()


def pkcs1_public_pem(key):
    """
    The public half of ``key`` as a PKCS#1 ``RSA PUBLIC KEY`` PEM (Salt loads it; a canonical
    key store must refuse it).
    """
    return public_pem(key, serialization.PublicFormat.PKCS1)


def private_pem(key):
    """
    The private key ``key`` as an unencrypted PKCS#8 PEM.
    """
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def new_public_pem(bits=2048):
    """
    A fresh RSA SubjectPublicKeyInfo PEM (the private half is thrown away).
    """
    return public_pem(new_rsa_key(bits))


def public_pem_pool(size):
    """
    ``size`` distinct 2048-bit public key PEMs. Bulk key sets reuse a pool: making thousands of
    RSA keys would take minutes, and a key store never compares keys across ids.
    """
    return tuple(new_public_pem() for _ in range(size))


def ec_public_pem():
    """
    A fresh P-256 EC SubjectPublicKeyInfo PEM (a well-formed key that is not RSA).
    """
    return public_pem(ec.generate_private_key(ec.SECP256R1()))


# --- configs ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Ports:
    """
    The publish/ret pair every master of one set binds (each on its own loopback address, as in
    Salt's own multimaster tests), so that a minion's ``master:`` is a plain list of addresses.
    """

    publish: int
    ret: int

    def as_dict(self):
        """The pair as the ``multimaster:ports`` pillar spells it."""
        return {"publish": self.publish, "ret": self.ret}


def write_config(path, data, header=None):
    """
    Write ``data`` as YAML to ``path`` (a daemon config, a ``master.d`` file, a pillar SLS),
    creating parent directories; ``header`` becomes a comment line on top. Returns the path.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Keys in the order the caller built them: the files are meant to be read by people too.
    body = yaml.safe_dump(data, default_flow_style=False, sort_keys=False)
    path.write_text(f"# {header}\n{body}" if header else body)
    return path


def loopback_master(host, ports, worker_threads=3, **extra):
    """
    Options of a master bound to the loopback address ``host`` on ``ports``, plus ``extra``.
    """
    config = {
        "interface": host,
        "publish_port": ports.publish,
        "ret_port": ports.ret,
        # Key acceptance is what the formula manages: a master must never accept by itself.
        "open_mode": False,
        "auto_accept": False,
        # Few workers (Salt's default is 5): several masters and their minions share one small
        # machine. Salt itself raises fewer than 3 to 3 where ``peer`` is set.
        "worker_threads": worker_threads,
    }
    config.update(extra)
    return config


def loopback_minion(master, ports, acceptance_wait=1, **extra):
    """
    Options of a minion of ``master`` (one address or a list) on ``ports``, plus ``extra``.
    """
    config = {
        "master": master,
        "master_port": ports.ret,
        "publish_port": ports.publish,
        # Retry auth every few seconds while the key is pending (Salt's default is 10 s), at a
        # fixed pace: keys are accepted within seconds here.
        "acceptance_wait_time": acceptance_wait,
        "acceptance_wait_time_max": acceptance_wait,
    }
    config.update(extra)
    return config


def master_entry(master_id, host, config_dir, **extra):
    """
    One ``multimaster:masters`` item: the master's id, the address minions use, its config dir.
    """
    return {"id": master_id, "host": host, "config_dir": str(config_dir), **extra}


def multimaster_section(masters, ports, mode="hot", **options):
    """
    The ``multimaster`` pillar section (also what ``master.d/multimaster.conf`` holds) for the
    ``masters`` entries, the first being the primary, on ``ports``; ``options`` add or override.
    """
    return {"mode": mode, "ports": ports.as_dict(), "masters": list(masters), **options}


def multimaster_master_options(section, reactor=None, backends=("roots",)):
    """
    What ``multimaster.master`` renders into a master's ``master.d`` for the runners: the
    ``multimaster`` section, the ``peer_run`` entry its control minions pull transfers with and
    the file server backends (``backends``, then the one serving ``sync_roots`` its content);
    with ``reactor`` (the pillar's ``multimaster:reactor``), the reactors it switches on.
    """
    options = {
        "multimaster": section,
        "peer_run": pull_acl(section),
        "fileserver_backend": fileserver_backends(list(backends)),
    }
    if reactor:
        cluster = {"isolated_filesystem": True, **(section.get("cluster") or {})}
        settings = {"mode": section.get("mode", "hot"), "reactor": reactor, "cluster": cluster}
        options["reactor"] = reactor_config(settings)
    return options


def write_multimaster_pillar(root, section):
    """
    Make ``root`` a ``pillar_roots`` dir that gives every minion the ``multimaster`` section
    (the control minions read their own master's paths from it).
    """
    root = pathlib.Path(root)
    write_config(root / "top.sls", {"base": {"*": ["multimaster"]}})
    write_config(root / "multimaster.sls", {"multimaster": section})
    return root


# --- CLIs ------------------------------------------------------------------------------------


def salt_command(name, config_dir, *args):
    """
    The argv of the Salt CLI ``name`` (``salt``, ``salt-run``, ``salt-key``, ``salt-master`` ...)
    of this virtualenv, run against ``config_dir``.
    """
    return [str(BIN / name), "-c", str(config_dir), *map(str, args)]


class CliResult:
    """
    A finished Salt CLI: ``returncode``, ``stdout``, ``stderr`` and ``data``, the last JSON
    document printed (the return, after any progress events), or None.
    """

    def __init__(self, returncode, stdout, stderr):
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr

    @functools.cached_property
    def data(self):
        # Parsed on first use only: the bench times CLIs whose output it never reads.
        docs = json_docs(self.stdout)
        return docs[-1] if docs else None

    def __str__(self):
        return (
            f"rc={self.returncode}\nstdout:\n{self.stdout[-6000:]}\nstderr:\n{self.stderr[-3000:]}"
        )


def salt_cli(name, config_dir, *args, out="json", timeout=300, cwd=None):
    """
    Run the Salt CLI ``name`` against ``config_dir`` with ``--out=<out>`` (None: no outputter,
    for the daemons and plain ``salt-key -a``) and return a ``CliResult``. A failing CLI is a
    result, not an exception; one still running after ``timeout`` s raises TimeoutExpired.
    """
    cmd = salt_command(name, config_dir, *args)
    if out:
        cmd.append(f"--out={out}")
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def json_docs(text):
    """
    Every JSON document in ``text``: ``salt-run`` prints its progress events before the return,
    and a CLI may print a warning line among them.
    """
    decoder = json.JSONDecoder()
    docs, pos = [], 0
    while True:
        match = re.compile(r"\S").search(text, pos)
        if match is None:
            return docs
        try:
            doc, pos = decoder.raw_decode(text, match.start())
        except ValueError:
            # Not JSON (a warning line): skip the line.
            nl = text.find("\n", match.start())
            if nl < 0:
                return docs
            pos = nl + 1
            continue
        docs.append(doc)


def orch_steps(text):
    """
    The step returns (dicts with ``__id__``, ``result``, ``comment``, ``duration`` ...) of a
    ``salt-run state.orch ... --out=json`` output ``text``, in run order.
    """
    steps = [
        step
        for doc in json_docs(text)
        if isinstance(doc, dict)
        for states in (doc.get("data") or {}).values()
        for step in (states.values() if isinstance(states, dict) else ())
        if isinstance(step, dict) and "__id__" in step
    ]
    return sorted(steps, key=lambda step: step.get("__run_num__", 0))
