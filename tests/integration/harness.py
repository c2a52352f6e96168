"""
Helpers for the integration tests: masters on 127.0.0.x sharing one port pair, explicit key
acceptance with ``salt-key``, per-minion pillar, bounded waits, and clean-up of daemons that
``multimaster.minion_restarted`` re-launched behind the factories' back.
"""

import atexit
import contextlib
import functools
import logging
import os
import pathlib
import shutil
import signal
import tempfile
import time

import psutil
from pytestshellutils.exceptions import FactoryTimeout

from toolkit import devkit

log = logging.getLogger(__name__)

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

# Added to every test module's ports, to run two suites side by side (CI's Salt lines, or by
# hand; docs/development.md): they must not bind the same loopback ports.
PORT_OFFSET_VARIABLE = "MULTIMASTER_TEST_PORT_OFFSET"


def Ports(publish, ret):
    """
    The publish/ret pair every master of one test module binds (each on its own address),
    shifted by ``$MULTIMASTER_TEST_PORT_OFFSET`` (default 0): a ``devkit.Ports``, built under
    the name the test modules use for it.
    """
    offset = port_offset()
    return devkit.Ports(publish=publish + offset, ret=ret + offset)


def port_offset():
    """The integer in ``$MULTIMASTER_TEST_PORT_OFFSET``, 0 when unset."""
    value = os.environ.get(PORT_OFFSET_VARIABLE, "0")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{PORT_OFFSET_VARIABLE}={value!r}: expected an integer") from None


MASTER_HOSTS = ("127.0.0.2", "127.0.0.3")
START_TIMEOUT = 90
# Keep the repo's own tooling out of the file server: only the formula is meant to be served.
FILE_IGNORE_REGEX = [r"^\.venv(/|$)", r"^\.git(/|$)", r"(^|/)__pycache__(/|$)", r"^lab/run(/|$)"]


copy_formula = devkit.copy_formula


@functools.cache
def served_formula():
    """
    The formula as a master's ``file_roots`` hold it: its parts, copied once per test run into a
    directory of their own (removed at exit). Not the checkout: Salt's file server walks every
    directory of a root and filters each file only then, so a master serving the checkout walks
    its virtualenvs (tens of thousands of files in CI) at each file-list refresh.
    """
    root = pathlib.Path(tempfile.mkdtemp(prefix="multimaster-formula-"))
    atexit.register(shutil.rmtree, root, True)
    return copy_formula(root)


def master_overrides(host, ports, pillar_dir, serve_repo=True, **extra):
    """
    Master options for a test master bound to ``host``: keys must be accepted explicitly, and
    (with ``serve_repo``) the formula is on ``file_roots`` (``served_formula``).
    """
    config = devkit.loopback_master(
        host,
        ports,
        gather_job_timeout=5,
        pillar_roots={"base": [str(pillar_dir)]},
        # The factories default to 0 (walk the roots on every request); the repo holds a venv.
        fileserver_list_cache_time=30,
        file_ignore_regex=FILE_IGNORE_REGEX,
    )
    if serve_repo:
        config["file_roots"] = {"base": [str(served_formula())]}
    config.update(extra)
    return config


def minion_overrides(host, ports, **extra):
    """
    Minion options for a minion that knows only the master at ``host`` (or ``master=`` in
    ``extra``, which wins).
    """
    extra = {"retry_dns": 0, **extra}
    return devkit.loopback_minion(extra.pop("master", host), ports, **extra)


class KeyAcceptor:
    """
    Auth-event callback for a master factory: a key submitted by a minion that a fixture is
    starting gets accepted with ``salt-key -a ID -y``; any other pending key stays pending.
    """

    def __init__(self):
        self.expected = set()
        self.accepted = []

    def expect(self, minion_id):
        self.expected.add(minion_id)

    def wants(self, master, minion_id):
        """
        Accept the pending key of ``minion_id`` on ``master`` now? Once per master: a later
        submission is a retry the minion sent before it learnt of the acceptance.
        """
        return minion_id in self.expected and (master.id, minion_id) not in self.accepted

    def __call__(self, master, payload):
        minion_id = payload.get("id")
        if payload.get("act") != "pend" or not self.wants(master, minion_id):
            return
        cli = master.salt_key_cli()
        # A late event may find the key accepted already: then there is nothing to accept.
        cli.run("-a", minion_id, "-y")
        listed = cli.run("-L")
        assert minion_id in (listed.data or {}).get("minions", []), listed
        self.accepted.append((master.id, minion_id))
        log.info("Accepted %s on %s with salt-key", minion_id, master.id)


def copy_master_keypair(source, target):
    """
    Give factory ``target`` (not started yet) the master keypair of factory ``source``.
    """
    devkit.copy_master_keypair(source.config["pki_dir"], target.config["pki_dir"])


def give_keypair(minion):
    """
    Give ``minion`` (a factory not started yet) a keypair of its own; returns the public PEM.
    """
    key = devkit.new_rsa_key()
    pki = pathlib.Path(minion.config["pki_dir"])
    pki.mkdir(parents=True, exist_ok=True)
    (pki / "minion.pem").write_text(devkit.private_pem(key))
    (pki / "minion.pem").chmod(0o400)
    (pki / "minion.pub").write_text(devkit.public_pem(key))
    return devkit.public_pem(key)


def preaccept(minion, masters):
    """
    Give ``minion`` (a factory not started yet) a keypair and place its public key as accepted
    on each of ``masters``: set-up that fires no key event.
    """
    pub = give_keypair(minion)
    for master in masters:
        accepted = pathlib.Path(master.config["pki_dir"]) / "minions" / minion.id
        accepted.parent.mkdir(parents=True, exist_ok=True)
        accepted.write_text(pub)


def formula_master_options(formula, pillar_dir):
    """
    The pillar's ``multimaster:master`` section of a test set: every master serves the copied
    ``formula`` and the test's ``pillar_dir``, and keeps the repository tooling out of it.
    """
    return {
        "file_roots": {"base": [str(formula)]},
        "pillar_roots": {"base": [str(pillar_dir)]},
        "config": {"file_ignore_regex": FILE_IGNORE_REGEX},
    }


def share_minion_key(minion_id, source, targets):
    """
    Test setup only (key sync is the formula's next job): copy the accepted key of
    ``minion_id`` from ``source`` to every master in ``targets``.
    """
    accepted = pathlib.Path(source.config["pki_dir"]) / "minions" / minion_id
    for target in targets:
        dst = pathlib.Path(target.config["pki_dir"]) / "minions" / minion_id
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(accepted, dst)


def _uses_config_dir(cmdline, config_dir):
    """
    Does ``cmdline`` run with ``config_dir`` (``--config-dir=DIR`` or ``-c DIR``), or is it a
    restart watcher whose JSON spec holds such a command line?
    """
    flag = f"--config-dir={config_dir}"
    for prev, arg in zip(["", *cmdline], cmdline, strict=False):
        if arg == flag or (prev in ("-c", "--config-dir") and arg == config_dir):
            return True
        if arg.startswith("{") and (f'"{flag}"' in arg or f'"{config_dir}"' in arg):
            return True
    return False


def _processes_using(config_dir):
    """
    Our processes that run with ``config_dir``: a daemon, its forked job processes, and restart
    watchers (whose spec names it).
    """
    config_dir = str(config_dir)
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid == os.getpid():
            continue
        if _uses_config_dir(proc.info["cmdline"] or [], config_dir):
            found.append(proc)
    return found


def kill_daemons_of(config_dir, timeout=15):
    """
    Stop every process using ``config_dir``: restart watchers first (so they cannot re-launch a
    daemon we just stopped), then daemons and their children. SIGTERM, then SIGKILL.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs = _processes_using(config_dir)
        if not procs:
            return
        watchers = [p for p in procs if any(a.startswith("{") for a in p.info["cmdline"])]
        for proc in watchers or procs:
            with contextlib.suppress(psutil.Error):
                for child in proc.children(recursive=True):
                    child.send_signal(signal.SIGTERM)
                proc.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(watchers or procs, timeout=5)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
    leftover = _processes_using(config_dir)
    assert not leftover, f"processes still using {config_dir}: {leftover}"


# The live (not zombie) pid in a pidfile, else None; the tests import it from here.
read_pid = devkit.read_pid


def wait_for(predicate, timeout, interval=1.0, what="condition"):
    """
    Call ``predicate`` until it returns something truthy; return it. AssertionError naming
    ``what`` after ``timeout`` s.
    """
    return devkit.wait_until(what, predicate, timeout, interval)


def ping(salt_cli, minion_id, timeout=3):
    """
    True when ``minion_id`` answers ``test.ping`` through the master of ``salt_cli``.
    """
    try:
        ret = salt_cli.run(f"--timeout={timeout}", "test.ping", minion_tgt=minion_id)
    except FactoryTimeout:
        return False
    return ret.returncode == 0 and ret.data is True


def wait_for_ping(salt_cli, minion_id, timeout):
    wait_for(
        lambda: ping(salt_cli, minion_id),
        timeout,
        what=f"{minion_id} to answer test.ping through {salt_cli.config['id']}",
    )


class PillarTree:
    """
    A ``pillar_roots`` directory with one SLS per minion and a generated ``top.sls``.
    """

    def __init__(self, root):
        self.root = pathlib.Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.data = {}
        self._write_top()

    def _sls(self, minion_id):
        return "minion_" + minion_id.replace(".", "_").replace("-", "_")

    def _write_top(self):
        top = {"base": {mid: [self._sls(mid)] for mid in sorted(self.data)}}
        devkit.write_config(self.root / "top.sls", top)

    def set(self, minion_id, data):
        self.data[minion_id] = data
        devkit.write_config(self.root / f"{self._sls(minion_id)}.sls", data)
        self._write_top()

    @contextlib.contextmanager
    def changed(self, minion_id, data):
        """
        Use ``data`` as the pillar of ``minion_id`` for the duration of the block.
        """
        before = self.data.get(minion_id)
        self.set(minion_id, data)
        try:
            yield
        finally:
            self.set(minion_id, before)


def master_entry(master, host, **extra):
    """
    One ``multimaster:masters`` item for a factory master bound to ``host``.
    """
    return devkit.master_entry(master.id, host, master.config_dir, **{"interface": host, **extra})


def multimaster_pillar(masters, ports, **options):
    """
    The ``multimaster`` pillar for the lab: configure only, services managed.
    """
    options = {"install_packages": False, "manage_services": True, **options}
    return {"multimaster": devkit.multimaster_section(masters, ports, **options)}


def state_returns(ret):
    """
    The per-state dicts of a ``state.apply`` CLI return; fails with the output if it is not one.
    """
    assert isinstance(ret.data, dict), f"not a state return: {ret}"
    return ret.data


def assert_states_ok(ret):
    states = state_returns(ret)
    failed = {sid: st["comment"] for sid, st in states.items() if st["result"] is not True}
    assert not failed, f"states failed: {failed}"
    assert ret.returncode == 0, ret
    return states


def state_by_id(states, state_id):
    """
    The return of the one state whose id is ``state_id``.
    """
    matches = [st for st in states.values() if st["__id__"] == state_id]
    assert len(matches) == 1, f"{state_id} not in {sorted(states)}"
    return matches[0]


def changed_states(states):
    return {sid: st["changes"] for sid, st in states.items() if st["changes"]}


def tree_snapshot(root):
    """
    ``{relative path: (mode, bytes)}`` of every file under ``root`` (to show nothing changed).
    """
    root = pathlib.Path(root)
    snapshot = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            snapshot[str(path.relative_to(root))] = (path.stat().st_mode, path.read_bytes())
    return snapshot


def failed_steps(ret):
    """
    ``{step id: what it returned}`` of the orchestration steps that failed (for the message).
    """
    steps = {
        step["__id__"]: f"{step.get('comment')} {step.get('changes') or ''}"[:3000]
        for step in devkit.orch_steps(ret.stdout)
        if step.get("result") is False
    }
    return steps or ret.stdout[-3000:]
