"""
Helpers for the key-plane tests: keys generated at test time (never stored in the repo), key
store snapshots, the salt CLIs run as a user would, and a scanner for leaked key material.
"""

import base64
import contextlib
import functools
import hashlib
import json
import os
import pathlib
import re
import signal
import threading

import psutil
import salt.config
from cryptography.hazmat.primitives import serialization

from ..harness import devkit, read_pid, wait_for  # noqa: F401  (the key tests use keytools.*)

KEY_DIRS = ("minions", "minions_pre", "minions_rejected", "minions_denied")
TMP_DIR = ".multimaster-tmp"


# --- keys ------------------------------------------------------------------------------------

# A fresh RSA SubjectPublicKeyInfo PEM (the private half is thrown away).
new_public_pem = devkit.new_public_pem


@functools.cache
def pem_pool(size=24):
    """
    Distinct 2048-bit public keys, generated once per test run and shared by bulk key sets.
    """
    return devkit.public_pem_pool(size)


def fingerprint(pem):
    """
    SHA-256 of the DER SubjectPublicKeyInfo, colon hex (computed here, not by the product).
    """
    der = serialization.load_pem_public_key(pem.encode()).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    digest = hashlib.sha256(der).hexdigest()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def bad_pems():
    """
    Public keys Salt's own loader accepts but a key store must not: ``{name: text}``.
    """
    good = new_public_pem()
    rsa_key = devkit.new_rsa_key()
    return {
        "trailing-junk": good + "junk after the key\n",
        "two-pems": good + new_public_pem(),
        "rsa-1024": new_public_pem(bits=1024),
        "ec-p256": devkit.ec_public_pem(),
        "pkcs1": devkit.pkcs1_public_pem(rsa_key),
        "private-key": devkit.private_pem(rsa_key),
    }


def pem_body(pem):
    """
    The base64 body of a PEM (no armour lines, no line breaks).
    """
    return "".join(line for line in pem.splitlines() if line and not line.startswith("-----"))


# --- key stores ------------------------------------------------------------------------------


def pki_dir(master):
    return pathlib.Path(master.config["pki_dir"])


def write_key(master, state_dir, minion_id, pem):
    """
    Plant a key file directly in a master's key store (as an older tool or a hand copy would).
    """
    path = pki_dir(master) / state_dir / minion_id
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(pem)
    return path


def store_snapshot(master):
    """
    ``{relative path: sha256 or link target}`` of everything under the master's pki dir.
    """
    root = pki_dir(master)
    snap = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            snap[rel] = "-> " + str(path.readlink())
        elif path.is_file():
            snap[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return snap


def key_ids(master):
    """
    ``{state dir: sorted ids}`` read from the files (what ``salt-key`` would list).
    """
    root = pki_dir(master)
    return {
        name: sorted(p.name for p in (root / name).iterdir()) if (root / name).is_dir() else []
        for name in KEY_DIRS
    }


def stray_files(master):
    """
    Temp files an interrupted write could leave: anything in the tool's temp dir, ``tmp*`` in
    the state dirs.
    """
    root = pki_dir(master)
    stray = [str(p) for p in (root / TMP_DIR).glob("*")] if (root / TMP_DIR).is_dir() else []
    for name in KEY_DIRS:
        if (root / name).is_dir():
            stray += [str(p) for p in (root / name).glob("tmp*")]
    return stray


def stored_master_pair(master):
    """
    Where the running Salt stores ``master``'s key pair: ``<id>.pem/.pub`` behind
    ``master.pem/.pub`` links with 3008's key cache, ``master.pem/.pub`` themselves before.
    """
    pki = pki_dir(master)
    if "keys.cache_driver" in salt.config.VALID_OPTS:
        return pki / f"{master.id}.pem", pki / f"{master.id}.pub"
    return pki / "master.pem", pki / "master.pub"


def master_public_pem(master):
    return (pki_dir(master) / "master.pub").resolve().read_text()


def master_private_pem(master):
    return (pki_dir(master) / "master.pem").resolve().read_text()


# --- CLIs ------------------------------------------------------------------------------------


# The dev toolkit's Salt CLI runner, under the names the key tests use: ``run_cli(name,
# config_dir, *args, timeout=300)`` runs ``salt``/``salt-run``/``salt-key`` against a master's
# config dir with ``--out=json``; ``.data`` of its result is the last JSON document printed.
Result = devkit.CliResult
run_cli = devkit.salt_cli
json_docs = devkit.json_docs
cli_cmd = devkit.salt_command


def salt_run(master, fun, *args, timeout=300):
    return run_cli("salt-run", master.config_dir, fun, *args, timeout=timeout)


def salt_key_list(master):
    """
    ``salt-key -L --out=json`` of ``master`` as a dict.
    """
    ret = run_cli("salt-key", master.config_dir, "-L", timeout=60)
    assert ret.returncode == 0 and isinstance(ret.data, dict), ret
    return {state: sorted(ids) for state, ids in ret.data.items()}


def salt_cmd(master, tgt, fun, *args, timeout=10, list_tgt=False):
    """
    ``salt <tgt> <fun> ...`` through ``master``; the returns as a dict (minion: return). A
    CLI that printed no returns at all (bad usage, master down) yields ``{}`` only when it said
    why on stderr; anything else fails the test.
    """
    extra = ["-L"] if list_tgt else []
    ret = run_cli(
        "salt",
        master.config_dir,
        *extra,
        f"--timeout={timeout}",
        "--static",
        tgt,
        fun,
        *args,
        timeout=timeout + 120,
    )
    if isinstance(ret.data, dict):
        return ret.data
    assert ret.returncode != 0 and (ret.stderr or ret.stdout), ret
    assert "Usage:" not in ret.stderr and "error:" not in ret.stderr, ret
    return {}


def pingers(master, among, timeout=10):
    """
    The minions of ``among`` (the ids of the running minions) that answer ``test.ping`` from
    ``master``. Naming them, not ``*``, lets the CLI return once they have answered: ``*``
    also waits ``timeout`` plus ``gather_job_timeout`` for the planted keys, which have no
    daemon and cannot answer anyway.
    """
    returns = salt_cmd(master, ",".join(among), "test.ping", timeout=timeout, list_tgt=True)
    return sorted(m for m, r in returns.items() if r is True)


# --- processes -------------------------------------------------------------------------------


def master_pids(masters):
    """
    ``{master id: pid}`` read from each master's pidfile (a restart changes it).
    """
    return {m.id: read_pid(m.config["pidfile"]) for m in masters}


def last_job_kwargs(master, fun, target):
    """
    The keyword arguments of the newest job of ``fun`` published to ``target`` that
    ``master``'s job cache holds (what anyone reading the job cache could replay).
    """
    import salt.payload

    jobs = pathlib.Path(master.config["cachedir"]) / "jobs"
    found = []
    for path in jobs.rglob(".load.p"):
        load = salt.payload.loads(path.read_bytes())
        if load.get("fun") == fun and target in (load.get("tgt") or []):
            kwargs = next(a for a in load["arg"] if isinstance(a, dict) and a.get("__kwarg__"))
            found.append((load["jid"], kwargs))
    assert found, f"no {fun} job to {target} in {jobs}"
    return max(found, key=lambda item: item[0])[1]


def job_loads(master):
    """
    ``{jid: (fun, size of its .load.p)}`` in ``master``'s job cache: what each job stored.
    """
    import salt.payload

    jobs = pathlib.Path(master.config["cachedir"]) / "jobs"
    found = {}
    for path in jobs.rglob(".load.p"):
        data = path.read_bytes()
        load = salt.payload.loads(data)
        fun = load.get("fun") or (load.get("return") or {}).get("fun")
        found[path.parent.parent.name + path.parent.name] = (fun, len(data))
    return found


def largest_publish(loads):
    """
    The largest ``.load.p`` of a job the runner published to control minions, and the largest
    of the pull jobs (runner returns Salt keeps in the job cache), from ``job_loads`` output.
    """
    published = [size for fun, size in loads.values() if str(fun).startswith("multimaster_peer.")]
    pulls = [size for fun, size in loads.values() if str(fun).endswith("multimaster_transfer.pull")]
    return max(published, default=0), max(pulls, default=0)


def _pulled_in(value, marker):
    """
    JSON documents holding ``marker`` among the base64 chunks found anywhere in ``value``.
    """
    if isinstance(value, dict):
        return [doc for item in value.values() for doc in _pulled_in(item, marker)]
    if isinstance(value, list):
        return [doc for item in value for doc in _pulled_in(item, marker)]
    if isinstance(value, str) and len(value) > 64:
        with contextlib.suppress(ValueError):
            data = base64.b64decode(value, validate=True)
            if marker.encode() in data:
                return [json.loads(data)]
    return []


def pulled_documents(master, marker):
    """
    The JSON documents containing ``marker`` that control minions pulled from ``master`` and
    that ``master``'s job cache still holds (the pull runner's returns are jobs too).
    """
    import salt.payload

    jobs = pathlib.Path(master.config["cachedir"]) / "jobs"
    found = []
    for path in list(jobs.rglob("return.p")) + list(jobs.rglob(".load.p")):
        found += _pulled_in(salt.payload.loads(path.read_bytes()), marker)
    return found


def pulled_from_events(capture, marker):
    """
    The JSON documents containing ``marker`` that pull-runner returns carried on the event bus
    while ``capture`` (an ``EventCapture``) listened.
    """
    return [doc for e in capture.events.values() for doc in _pulled_in(e.full_data, marker)]


def stage_for(master, recipient, document):
    """
    Stage ``document`` (JSON) in ``master``'s outbox for ``recipient``, as the runner does.
    """
    import multimaster_transport

    return multimaster_transport.stage(master.config, recipient, json.dumps(document).encode())


# --- secrets ---------------------------------------------------------------------------------

WINDOW = 40
_CHUNK = WINDOW // 2


class SecretScanner:
    """
    Finds any ``WINDOW``-character run of a secret (e.g. a private key's base64 body) in bytes.

    ``public`` texts (the public key's encodings: a private RSA key's base64 shares the
    modulus with its public key) are not secret: runs that also occur in them are not searched.
    Every 40-character run of the secret contains one of its 20-character chunks at a multiple
    of 20, so those chunks are searched first and a hit is confirmed against the full runs.
    """

    def __init__(self, secret, public=()):
        self.secret = secret.encode()
        public_windows = set()
        for text in public:
            text = text.encode()
            public_windows.update(text[i : i + WINDOW] for i in range(len(text) - WINDOW + 1))
        self.windows = {
            self.secret[i : i + WINDOW] for i in range(len(self.secret) - WINDOW + 1)
        } - public_windows
        starts = {
            i
            for i in range(len(self.secret) - WINDOW + 1)
            if self.secret[i : i + WINDOW] in self.windows
        }
        self.chunks = [
            self.secret[i : i + _CHUNK]
            for i in range(0, len(self.secret) - _CHUNK + 1, _CHUNK)
            if any(i - _CHUNK <= s <= i for s in starts)
        ]

    @classmethod
    def for_private_key(cls, pem):
        """
        A scanner for the private-only material of an RSA private key PEM.
        """
        key = serialization.load_pem_private_key(pem.encode(), password=None)
        public = [pem_body(devkit.public_pem(key)), pem_body(devkit.pkcs1_public_pem(key))]
        return cls(pem_body(pem), public=public)

    def find(self, data):
        """
        Offset of the first run of the secret in ``data``, or None.
        """
        for chunk in self.chunks:
            start = data.find(chunk)
            while start >= 0:
                for lo in range(max(0, start - _CHUNK), start + 1):
                    if data[lo : lo + WINDOW] in self.windows:
                        return lo
                start = data.find(chunk, start + 1)
        return None

    def scan_tree(self, root, skip_dirs=("pki",)):
        """
        ``[(path, offset)]`` of files under ``root`` (not under a dir named in ``skip_dirs``)
        holding a run of the secret. Also looks inside base64 runs (an encoded copy).
        """
        hits = []
        root = pathlib.Path(root)
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root).parts
            if any(part in skip_dirs for part in rel[:-1]) or not path.is_file():
                continue
            if path.is_symlink():
                continue
            try:
                data = path.read_bytes()
            except OSError:
                continue
            offset = self.find(data)
            if offset is None:
                offset = self.find_encoded(data)
            if offset is not None:
                hits.append((str(path), offset))
        return hits

    def find_encoded(self, data):
        """
        Offset of a base64 run in ``data`` whose decoded bytes hold a run of the secret.
        """
        for match in re.finditer(rb"[A-Za-z0-9+/]{80,}={0,2}", data):
            blob = match.group()
            with contextlib.suppress(ValueError):
                if self.find(base64.b64decode(blob[: len(blob) - len(blob) % 4])) is not None:
                    return match.start()
        return None


class EventCapture(devkit.Poller):
    """
    Keeps every event the factories' event listener receives while active (the listener itself
    drops events after two minutes).
    """

    def __init__(self, event_listener, interval=0.5):
        super().__init__(interval)
        self.listener = event_listener
        self.events = {}

    def poll(self):
        for event in list(self.listener.store):
            self.events.setdefault(id(event), event)

    def dumps(self):
        """
        ``[(daemon id, tag, serialized data)]`` of every captured event.
        """
        return [
            (e.daemon_id, e.tag, json.dumps(e.full_data, default=str, sort_keys=True))
            for e in self.events.values()
        ]


# --- forged returns --------------------------------------------------------------------------


class ReturnForger(threading.Thread):
    """
    An ordinary minion answering, under ``victim``'s id, every job of ``fun`` that ``master``
    publishes to ``victim``: it watches ``master``'s event bus for the job and sends the
    ``_return`` over its own authenticated request channel with ``resource_id`` set to
    ``victim``, which Salt 3008 takes as the return's id without checking it. ``sent`` lists
    the jids it answered; ``ready`` is set once it listens; ``error`` is what stopped it.
    """

    def __init__(self, master, minion, victim, fun, answer):
        super().__init__(daemon=True)
        self.master, self.minion, self.victim = master, minion, victim
        self.fun, self.answer = fun, answer
        self.sent = []
        self.error = None
        self.ready = threading.Event()
        self.done = threading.Event()

    def run(self):
        try:
            self._forge()
        except Exception as exc:  # reported by the test through ``error``
            self.error = exc
            raise

    def _forge(self):
        import salt.channel.client
        import salt.minion
        import salt.utils.event

        opts = salt.config.minion_config(self.minion.config_file)
        opts.update(salt.minion.resolve_dns(opts))
        master_opts = salt.config.master_config(self.master.config_file)
        with (
            salt.utils.event.get_master_event(
                master_opts, master_opts["sock_dir"], listen=True
            ) as bus,
            contextlib.closing(salt.channel.client.ReqChannel.factory(opts)) as channel,
        ):
            bus.get_event(wait=0.1)  # subscribed from here on
            self.ready.set()
            while not self.done.is_set():
                event = bus.get_event(wait=0.2, tag="salt/job/", match_type="startswith", full=True)
                if event and self._wanted(event):
                    channel.send(self._forged(opts["id"], event["data"]["jid"]), timeout=30)
                    self.sent.append(event["data"]["jid"])

    def _wanted(self, event):
        data = event["data"]
        return (
            event["tag"].endswith("/new")
            and data.get("fun") == self.fun
            and self.victim in (data.get("minions") or [])
        )

    def _forged(self, own_id, jid):
        return {
            "cmd": "_return",
            "id": own_id,
            "resource_id": self.victim,
            "jid": jid,
            "fun": self.fun,
            "fun_args": [],
            "return": self.answer,
            "retcode": 0,
            "success": True,
        }


@contextlib.contextmanager
def paused(daemon):
    """
    ``daemon`` (a factory) and its child processes stopped with SIGSTOP inside the block, then
    continued: what a publish finds when that host is busy or its minion restarts.
    """
    procs = [psutil.Process(daemon.pid)]
    procs += procs[0].children(recursive=True)
    for proc in procs:
        os.kill(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
