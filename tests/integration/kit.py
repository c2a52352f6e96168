"""
The integration tests' daemon kit: one ``DaemonSet`` per test module makes its masters and
minions (pytest-salt-factories), starts them (several at once where order does not matter), places
or accepts their keys, syncs the formula, and stops every one of them at the end.

Order is the caller's: ``start`` starts the factories of one call together and returns once all
of them are up, so a master that needs another's keypair, or a minion that needs its master up,
goes in a later call.
"""

import concurrent.futures
import contextlib
import logging
import threading

from . import harness
from .harness import START_TIMEOUT, kill_daemons_of, master_overrides
from .keys import keytools

log = logging.getLogger(__name__)

# Threads for starting or stopping daemons at once: a set's daemons that need nothing of each
# other (the key plane's masters, the pre-accepted minions of a started set) overlap their
# waits for the start event; a teardown kills them all at once.
MAX_THREADS = 8


def in_threads(fun, items):
    """
    ``[fun(item) ...]`` run in threads, in ``items``' order; the first exception is raised once
    every call has returned.
    """
    items = list(items)
    if len(items) <= 1:
        return [fun(item) for item in items]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(items), MAX_THREADS)) as pool:
        return list(pool.map(fun, items))


def leave_keys_pending(master, payload):
    """
    Auth-event callback that does nothing: the factories accept every pending key by default,
    and here only ``salt-key`` (or a key placed before the minion starts) does.
    """


def stop(factory):
    """
    Stop the factory's process and whatever replaced it: the code under test may have stopped a
    factory's daemon and started its own (``-d``: a restart by ``multimaster.minion_restarted``
    or a master restarted by the formula, which may also leave a watcher waiting), which the
    factory does not track; it is found by its config dir. An error of the factory's own stop
    is logged: what counts is that nothing still runs with that config dir.
    """
    try:
        factory.terminate()
    except Exception:
        log.exception("Stopping %s", factory.id)
    kill_daemons_of(factory.config_dir)


def no_start_event(overrides):
    """
    Minion ``overrides`` for a minion whose start is only checked as a process: it sends no
    start event to wait for (its key is left pending).
    """
    return {**overrides, "pytest-minion": {"master-id": None}}


class DaemonSet:
    """
    The masters and minions of one test module. Use it as a context manager: on exit (also when
    the set-up failed halfway) every factory it made or started is stopped, with whatever
    replaced it, all at once. ``stack`` is the ExitStack that does it; callbacks added to it
    run before the daemons stop.
    """

    def __init__(self, salt_factories):
        self.salt_factories = salt_factories
        self.stack = contextlib.ExitStack()
        self.factories = []
        self._lock = threading.Lock()

    def __enter__(self):
        self.stack.__enter__()
        self.stack.callback(self.stop_all)
        return self

    def __exit__(self, *exc):
        return self.stack.__exit__(*exc)

    def _track(self, factory):
        with self._lock:
            if not any(f is factory for f in self.factories):
                self.factories.append(factory)
        return factory

    def master(self, master_id, host, ports, pillar_dir, auth=leave_keys_pending, **options):
        """
        A master factory (not started) bound to ``host`` on ``ports`` with ``pillar_dir`` as its
        pillar_roots: ``harness.master_overrides`` with ``options``. ``auth`` is its auth-event
        callback (e.g. a ``harness.KeyAcceptor``).
        """
        overrides = master_overrides(host, ports, pillar_dir, **options)
        factory = self.salt_factories.salt_master_daemon(
            master_id, overrides=overrides, on_auth_event_callback=auth
        )
        return self._track(factory)

    def minion(self, master, minion_id, overrides, preaccept_on=(), acceptor=None, wait=True):
        """
        A minion factory (not started) made from ``master``'s factory with ``overrides``. Its
        key is placed as accepted on the masters of ``preaccept_on`` (no key event), or, with
        ``acceptor``, expected by that ``harness.KeyAcceptor``, which accepts it with ``salt-key``
        when the minion submits it. ``wait=False``: see ``no_start_event``.
        """
        if not wait:
            overrides = no_start_event(overrides)
        factory = self._track(master.salt_minion_daemon(minion_id, overrides=overrides))
        if preaccept_on:
            harness.preaccept(factory, preaccept_on)
        if acceptor is not None:
            acceptor.expect(minion_id)
        return factory

    def start(self, *factories, keypair_from=None, timeout=START_TIMEOUT):
        """
        Start ``factories`` at once; return them once every one is up. ``keypair_from``: a
        started master whose keypair each of them (masters) gets before it first starts.
        """
        for factory in factories:
            self._track(factory)
            if keypair_from is not None:
                harness.copy_master_keypair(keypair_from, factory)
        in_threads(lambda f: f.start(start_timeout=timeout), factories)
        return list(factories)

    def stop_all(self):
        """
        Stop every factory of the set and whatever replaced it, all at once.
        """
        with self._lock:
            factories = list(self.factories)
        in_threads(stop, factories)


def sync_minions(master, minions, salt_timeout=60, timeout=300, check=False):
    """
    ``salt saltutil.sync_all`` through ``master`` on ``minions`` (factories, or a glob), as a
    user syncs the formula: it must succeed; ``check`` (factories only): each minion synced the
    execution module. ``--static`` runs as a batch whose first step pings the target and drops
    whoever has not answered within ``salt_timeout``; a minion just started can take longer than
    Salt's default 5 s on a loaded host, so wait longer (the ping ends once every one answered).
    """
    assert not (check and isinstance(minions, str)), "check needs the minion factories"
    if isinstance(minions, str):
        target = [minions]
    else:
        target = ["-L", ",".join(m.id for m in minions)]
    ret = keytools.run_cli(
        "salt",
        master.config_dir,
        f"--timeout={salt_timeout}",
        "--static",
        *target,
        "saltutil.sync_all",
        timeout=timeout,
    )
    assert ret.returncode == 0, ret
    if check:
        for minion in minions:
            assert "modules.multimaster" in ret.data[minion.id]["modules"], ret
    return ret


def sync_runners(master, timeout=300, check=False):
    """
    ``salt-run saltutil.sync_all`` with ``master``'s config (it needs no running master): it
    must succeed; ``check``: the runner was synced.
    """
    ret = keytools.run_cli("salt-run", master.config_dir, "saltutil.sync_all", timeout=timeout)
    assert ret.returncode == 0, ret
    if check:
        assert "runners.multimaster" in ret.data["runners"], ret
    return ret
