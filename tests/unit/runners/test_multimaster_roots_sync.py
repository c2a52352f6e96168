"""
``sync_roots`` end to end in one process: the runner on the primary and the control minions'
``multimaster_peer`` on both masters, with real manifests, sealing, staging and pulls. Only the
publish (each call runs the peer function directly) and the request channel (a pull is served
from the primary's outbox) are stand-ins; every tree is real, under tmp.
"""

import contextlib
import json
import os
import shutil
import stat

import multimaster_control
import multimaster_daemon
import multimaster_keywrite
import multimaster_manifest
import multimaster_masterkey
import multimaster_returns
import multimaster_rootsanswer
import multimaster_rootsync
import multimaster_safefs
import multimaster_status
import multimaster_transport
import pytest
import salt.client

from tests.support.keyfactory import priv_pem, pub_pem, rsa_private
from tests.support.loading import HOT_PAIR, load_module

PRIMARY_KEY = rsa_private(tag=20)
CONTROL_KEYS = {"cm1": rsa_private(tag=21), "cm2": rsa_private(tag=22)}
SECTION = HOT_PAIR

# A peer whose roots already match; no roots watch engine runs in these tests.
UNCHANGED = {"result": True, "changed": False, "watched": False}


def mode_of(path):
    return stat.S_IMODE(os.stat(path).st_mode)


class Host:
    """
    One master host: its roots (``salt``, ``pillar``), its master's opts and its control
    minion's ``multimaster_peer``, loaded under a name of its own.
    """

    def __init__(self, base, entry, primary_opts=None):
        self.base = base
        self.entry = entry
        self.salt, self.pillar = base / "salt", base / "pillar"
        self.opts = {
            "file_roots": {"base": [str(self.salt)]},
            "pillar_roots": {"base": [str(self.pillar)]},
            "cachedir": str(base / "master-cache"),
            "minimum_auth_version": 3,
            "pidfile": str(base / "salt-master.pid"),
        }
        minion = entry["minion_id"]
        pki = base / "minion-pki"
        pki.mkdir(parents=True)
        (pki / "minion.pem").write_text(priv_pem(CONTROL_KEYS[minion]))
        (pki / "minion_master.pub").write_text(pub_pem(PRIMARY_KEY))
        self.peer = load_module(f"multimaster_peer_sync_{minion}", "_modules/multimaster_peer.py")
        self.peer.__opts__ = {
            "id": minion,
            "pki_dir": str(pki),
            "cachedir": str(base / "minion-cache"),
            "pidfile": str(base / "salt-minion.pid"),
        }
        # Content comes through the primary's file server (serve): never by peer_run here.
        self.peer.__salt__ = {"publish.runner": lambda *a, **k: {"error": "no peer_run here"}}
        self.peer._local = lambda: (dict(self.entry), SECTION)
        self.peer._mopts = lambda: (dict(self.entry), self.opts)
        self.sender = primary_opts or self.opts
        self.returns, self.calls = [], []

    def call(self, fun, kwarg):
        """
        What the control minion returns for ``multimaster_peer.<fun>``, recorded.
        """
        ret = getattr(self.peer, fun.rpartition(".")[2])(**(kwarg or {}))
        self.calls.append(fun.rpartition(".")[2])
        self.returns.append(ret)
        return ret

    def serve(self, ticket, offset):
        """
        The primary's file server answering this control minion's pull.
        """
        return multimaster_transport.serve(
            self.sender, self.entry["minion_id"], ticket, offset, raw=True
        )


@pytest.fixture
def hosts(tmp_path, monkeypatch):
    """
    ``(runner, primary, peer)``: the runner with m1's opts, and both hosts; a runner call on a
    control minion runs its ``multimaster_peer`` function here.
    """
    primary = Host(tmp_path / "m1", SECTION["masters"][0])
    peer = Host(tmp_path / "m2", SECTION["masters"][1], primary.opts)
    runner = load_module("multimaster_runner_sync", "_runners/multimaster.py")
    runner.__opts__ = dict(primary.opts, multimaster=SECTION, conf_file=str(tmp_path / "none"))
    runner.__context__ = {}
    by_minion = {h.entry["minion_id"]: h for h in (primary, peer)}
    # One pull class for both control minions: each pull is served to the minion that made it.
    monkeypatch.setattr(
        multimaster_transport.ContentPull,
        "_fileserver_pull",
        lambda pull, ticket, offset: by_minion[pull._opts["id"]].serve(ticket, offset),
    )

    def cmd_returns(client, minions, fun, kwarg=None, timeout=None, find_job_timeout=None):
        return {m: {"ret": by_minion[m].call(fun, kwarg), "retcode": 0} for m in minions}

    monkeypatch.setattr(multimaster_returns, "cmd_returns", cmd_returns)
    monkeypatch.setattr(salt.client, "get_local_client", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(multimaster_control, "signer_key", lambda run: priv_pem(PRIMARY_KEY))
    monkeypatch.setattr(
        multimaster_control,
        "primary_key_entry",
        lambda run, minion_id: ("accepted", pub_pem(CONTROL_KEYS[minion_id]), None),
    )
    for path in (primary.salt, peer.salt):
        path.mkdir()
    return runner, primary, peer


def private_pillar(root):
    """
    A pillar tree its owner keeps to itself: 0700 root and subdirectory, 0644 files.
    """
    (root / "customers").mkdir(parents=True)
    (root / "top.sls").write_text("base:\n  '*': [customers.acme]\n")
    (root / "customers" / "acme.sls").write_text("acme: {}\n")
    for path in (root / "top.sls", root / "customers" / "acme.sls"):
        path.chmod(0o644)
    for path in (root / "customers", root):
        path.chmod(0o700)


@pytest.fixture
def modes_at_writes(hosts, monkeypatch):
    """
    The modes of the peer's pillar root and of the directory written into, at each write.
    """
    _, _, peer = hosts
    seen = []
    safefs = multimaster_safefs
    real = safefs.write_file

    def write_file(root, relpath, *args, **kwargs):
        directory = os.path.dirname(os.path.join(root, relpath))
        seen.append([mode_of(p) for p in (peer.pillar, directory) if os.path.isdir(p)])
        return real(root, relpath, *args, **kwargs)

    monkeypatch.setattr(safefs, "write_file", write_file)
    return seen


def test_a_sync_asks_each_master_once_for_its_manifests_and_no_settle_round(hosts):
    """
    While nothing restarts, the manifest round is the only question before the apply: its
    answers say whether a restart is pending (what ``master_settled`` would answer).
    """
    runner, primary, peer = hosts
    (primary.salt / "top.sls").write_text("base: {}\n")
    assert runner.sync_roots(roots="file")["retcode"] == 0
    assert runner.sync_roots(roots="file")["masters"]["m2"] == UNCHANGED
    assert primary.calls == ["roots_manifest"] * 2
    assert peer.calls == ["roots_manifest", "apply_roots", "roots_manifest"]


def test_a_peer_whose_restart_is_pending_is_waited_for_then_asked_again(hosts, monkeypatch):
    """
    The peer's manifest answer says its master's restart is pending: the sync waits (polls
    ``master_settled`` until the restart has happened), asks for the manifests again, and
    syncs from that answer, not from the one given before the restart.
    """
    runner, primary, peer = hosts
    (primary.salt / "top.sls").write_text("base: {}\n")
    restarts = iter([True, True])
    real = multimaster_daemon.host_restart_pending

    def pending(mopts, minion_pidfile):
        if mopts is peer.opts:
            return next(restarts, False)
        return real(mopts, minion_pidfile)

    monkeypatch.setattr(multimaster_daemon, "host_restart_pending", pending)
    monkeypatch.setattr(multimaster_control.time, "sleep", lambda seconds: None)
    ret = runner.sync_roots(roots="file")
    assert ret["retcode"] == 0, ret
    assert peer.calls == [
        "roots_manifest",
        "master_settled",
        "master_settled",
        "roots_manifest",
        "apply_roots",
    ]
    assert (peer.salt / "top.sls").read_text() == "base: {}\n"


@pytest.mark.parametrize("before", ["missing", "world-readable"])
def test_a_peer_s_pillar_is_never_readable_wider_than_the_primary_s(hosts, before, modes_at_writes):
    runner, primary, peer = hosts
    private_pillar(primary.pillar)
    if before == "world-readable":
        (peer.pillar / "customers").mkdir(parents=True, mode=0o755)
        (peer.pillar / "customers").chmod(0o755)
        peer.pillar.chmod(0o755)
    ret = runner.sync_roots(roots="pillar")
    assert ret["retcode"] == 0, ret
    # Narrowed before any file went in, never wider meanwhile.
    assert modes_at_writes and all(mode == 0o700 for modes in modes_at_writes for mode in modes)
    assert (peer.pillar / "customers" / "acme.sls").read_text() == "acme: {}\n"
    assert mode_of(peer.pillar) == 0o700
    assert mode_of(peer.pillar / "customers") == 0o700
    assert mode_of(peer.pillar / "customers" / "acme.sls") == 0o644
    # Equal now, directory modes included: a re-run finds nothing to do.
    again = runner.sync_roots(roots="pillar")
    assert again["masters"]["m2"] == UNCHANGED, again


def test_a_peer_s_wider_pillar_directory_is_narrowed_when_the_files_are_equal(hosts):
    runner, primary, peer = hosts
    private_pillar(primary.pillar)
    assert runner.sync_roots(roots="pillar")["retcode"] == 0
    (peer.pillar / "customers").chmod(0o755)
    ret = runner.sync_roots(roots="pillar")
    assert ret["retcode"] == 0 and ret["masters"]["m2"]["changes"]["counts"]["dir_modes"] == 1
    assert mode_of(peer.pillar / "customers") == 0o700


def test_file_root_directories_get_the_primary_s_modes(hosts):
    # Through the directory digests the publish carries: only the differing directories move.
    runner, primary, peer = hosts
    (primary.salt / "web" / "conf").mkdir(parents=True)
    (primary.salt / "web" / "conf" / "app.conf").write_text("x\n")
    (primary.salt / "top.sls").write_text("base: {}\n")
    (primary.salt / "web").chmod(0o750)
    (primary.salt / "web" / "conf").chmod(0o755)
    ret = runner.sync_roots(roots="file")
    assert ret["retcode"] == 0, ret
    assert mode_of(peer.salt / "web") == 0o750
    assert mode_of(peer.salt / "web" / "conf") == 0o755
    (peer.salt / "web").chmod(0o777)
    ret = runner.sync_roots(roots="file")
    assert ret["masters"]["m2"]["changes"]["dir_modes"] == [str(primary.salt / "web")], ret
    assert mode_of(peer.salt / "web") == 0o750
    assert runner.sync_roots(roots="file")["masters"]["m2"] == UNCHANGED


@pytest.fixture
def many_dirs_synced(hosts, monkeypatch):
    """
    200 directories synced, their digests too large for a publish; the peer's pulls of the
    staged digests are counted: ``(runner, primary, peer, pulls)``.
    """
    runner, primary, peer = hosts
    monkeypatch.setattr(multimaster_manifest, "DIR_DIGESTS_LIMIT", 0)
    for n in range(200):
        (primary.salt / f"d{n}").mkdir()
        (primary.salt / f"d{n}" / "init.sls").write_text(f"{n}: {{}}\n")
    assert runner.sync_roots(roots="file")["retcode"] == 0
    pulls = []
    staged = multimaster_rootsanswer.staged_dir_digests
    monkeypatch.setattr(
        multimaster_rootsanswer,
        "staged_dir_digests",
        lambda *a: pulls.append(a[1]) or staged(*a),
    )
    return runner, primary, peer, pulls


def test_directory_digests_too_large_for_a_publish_are_pulled_and_still_narrow_the_answer(
    many_dirs_synced, monkeypatch
):
    """
    A tree of thousands of directories: the primary's per-directory digests do not fit in a
    publish, so they are staged for the peer, which pulls them (no base here to give them)
    and still seals only the directories that differ (its whole manifest would be over what
    its minion returns).
    """
    runner, primary, peer, pulls = many_dirs_synced
    (primary.salt / "d7" / "init.sls").write_text("changed: {}\n")
    os.unlink(os.path.join(primary.opts["cachedir"], "multimaster", "roots-base.json"))
    asked = []
    real = peer.peer.roots_manifest
    monkeypatch.setattr(peer.peer, "roots_manifest", lambda **kw: asked.append(kw) or real(**kw))
    ret = runner.sync_roots(roots="file")
    assert ret["retcode"] == 0, ret
    assert ret["masters"]["m2"]["changes"]["counts"]["changed"] == 1, ret
    assert (peer.salt / "d7" / "init.sls").read_text() == "changed: {}\n"
    assert set(asked[0]["dirs"]["staged"]) == {"m2"} and pulls == ["m2"]
    assert asked[0]["dirs"]["delta"] == {"file_roots": {"base": [None]}}
    # What the peer sealed: the one differing directory's manifest, not all 200 (30 KB).
    sealed = [r["answer"]["sealed"] for r in peer.returns if (r.get("answer") or {}).get("sealed")]
    assert len(json.dumps(sealed[-1])) < 4000, len(json.dumps(sealed[-1]))


def test_a_peer_still_at_the_last_sync_s_state_compares_the_changed_directories_only(
    many_dirs_synced,
):
    """
    The publish names the directories changed since the last sync (the delta): a peer whose
    roots are still those of that sync pulls nothing and seals only what differs.
    """
    runner, primary, peer, pulls = many_dirs_synced
    (primary.salt / "d7" / "init.sls").write_text("changed: {}\n")
    (primary.salt / "new").mkdir()
    (primary.salt / "new" / "init.sls").write_text("new: {}\n")
    shutil.rmtree(primary.salt / "d9")
    ret = runner.sync_roots(roots="file")
    assert ret["retcode"] == 0, ret
    counts = ret["masters"]["m2"]["changes"]["counts"]
    assert (counts["added"], counts["changed"], counts["deleted"]) == (1, 1, 1), ret
    assert pulls == []
    assert (peer.salt / "d7" / "init.sls").read_text() == "changed: {}\n"
    assert (peer.salt / "new" / "init.sls").exists() and not (peer.salt / "d9").exists()
    sealed = [r["answer"]["sealed"] for r in peer.returns if (r.get("answer") or {}).get("sealed")]
    assert len(json.dumps(sealed[-1])) < 4000, len(json.dumps(sealed[-1]))
    assert runner.sync_roots(roots="file")["masters"]["m2"]["changed"] is False


def test_a_peer_changed_since_the_last_sync_pulls_the_full_digests(many_dirs_synced):
    """
    A peer whose roots changed on their own since the last sync is not at the delta's base:
    it pulls the primary's full digests, and both its change and the primary's are undone.
    """
    runner, primary, peer, pulls = many_dirs_synced
    (primary.salt / "d7" / "init.sls").write_text("changed: {}\n")
    (peer.salt / "d3" / "init.sls").write_text("drifted: {}\n")
    ret = runner.sync_roots(roots="file")
    assert ret["retcode"] == 0, ret
    assert ret["masters"]["m2"]["changes"]["counts"]["changed"] == 2, ret
    assert pulls == ["m2"]
    assert (peer.salt / "d3" / "init.sls").read_text() == "3: {}\n"
    assert runner.sync_roots(roots="file")["masters"]["m2"]["changed"] is False


@pytest.fixture
def five_changed(hosts):
    """
    Five directories synced, then changed on the primary: ``(runner, primary, peer)``.
    """
    runner, primary, peer = hosts
    for n in range(5):
        (primary.salt / f"d{n}").mkdir()
        (primary.salt / f"d{n}" / "init.sls").write_text(f"{n}: {{}}\n")
    assert runner.sync_roots(roots="file")["retcode"] == 0
    for n in range(5):
        (primary.salt / f"d{n}" / "init.sls").write_text(f"changed {n}: {{}}\n")
    return hosts


def test_a_peer_whose_differing_manifests_exceed_one_answer_is_synced_in_rounds(
    five_changed, monkeypatch
):
    """
    Each answer carries at most ANSWER_LIMIT of manifests (a Salt 3008 minion trims a return
    over 1 MiB): here one directory per answer, so five changed directories take five rounds
    of one sync_roots, whose report adds them up.
    """
    runner, primary, peer = five_changed
    monkeypatch.setattr(multimaster_rootsanswer, "ANSWER_LIMIT", 1)
    ret = runner.sync_roots(roots="file")
    assert ret["retcode"] == 0, ret
    result = ret["masters"]["m2"]
    assert result["changes"]["counts"]["changed"] == 5 and "left" not in result, result
    for n in range(5):
        assert (peer.salt / f"d{n}" / "init.sls").read_text() == f"changed {n}: {{}}\n"
    assert runner.sync_roots(roots="file")["masters"]["m2"] == UNCHANGED


def test_rounds_are_bounded_and_a_re_run_goes_on(five_changed, monkeypatch):
    runner, primary, peer = five_changed
    monkeypatch.setattr(multimaster_rootsanswer, "ANSWER_LIMIT", 1)
    monkeypatch.setattr(multimaster_rootsync, "MAX_ROUNDS", 2)
    ret = runner.sync_roots(roots="file")
    assert ret["retcode"] == 1
    assert ret["masters"]["m2"]["error"] == (
        "3 differing directories left after 2 rounds: run 'salt-run multimaster.sync_roots' again"
    )
    assert ret["masters"]["m2"]["changes"]["counts"]["changed"] == 2
    assert runner.sync_roots(roots="file")["masters"]["m2"]["error"].startswith(
        "1 differing directory left"
    )
    assert runner.sync_roots(roots="file")["retcode"] == 0


SECRET = "secret-customer-name"


def named_pillar(primary, peer, tmp_path):
    """
    Pillar whose every kind of entry carries a name that is itself a secret: a file, a
    directory, a symlink (skipped), a stale file on the peer (deleted), a file of another mode
    and a directory of another mode there, and a symlinked directory there (its write fails).
    """
    for root in (primary.pillar, peer.pillar):
        (root / f"{SECRET}-dir").mkdir(parents=True)
        (root / f"{SECRET}-mode.sls").write_text("same\n")
    (primary.pillar / f"{SECRET}.sls").write_text("customer: acme\n")
    (primary.pillar / f"{SECRET}-dir" / "init.sls").write_text("x: 1\n")
    (primary.pillar / f"{SECRET}-link.sls").symlink_to(primary.pillar / f"{SECRET}.sls")
    (primary.pillar / f"{SECRET}-linked").mkdir()
    (primary.pillar / f"{SECRET}-linked" / "init.sls").write_text("y: 1\n")
    (peer.pillar / f"{SECRET}-dir" / "init.sls").write_text("x: 1\n")
    (peer.pillar / f"{SECRET}-dir").chmod(0o777)
    (peer.pillar / f"{SECRET}-mode.sls").chmod(0o666)
    (peer.pillar / f"{SECRET}-stale.sls").write_text("old\n")
    (tmp_path / "elsewhere").mkdir()
    (peer.pillar / f"{SECRET}-linked").symlink_to(tmp_path / "elsewhere")


def leaked(*documents):
    return SECRET in json.dumps(documents, default=str)


def test_pillar_file_names_are_in_no_runner_or_peer_return(hosts, tmp_path):
    runner, primary, peer = hosts
    named_pillar(primary, peer, tmp_path)
    dry = runner.sync_roots(roots="pillar", test=True)
    assert dry["masters"]["m2"]["planned"]["counts"]["added"] == 2, dry
    synced = runner.sync_roots(roots="pillar")
    # The write below the peer's symlinked directory fails: reported, without its name.
    [failed, *_] = synced["masters"]["m2"]["failed"]
    assert synced["retcode"] == 1 and "not a plain directory" in failed, synced
    assert (peer.pillar / f"{SECRET}.sls").read_text() == "customer: acme\n"
    assert not leaked(dry, synced, primary.returns, peer.returns)


def test_status_names_no_pillar_file_of_a_differing_root(hosts, tmp_path, monkeypatch):
    runner, primary, peer = hosts
    named_pillar(primary, peer, tmp_path)

    # The same answers on both hosts, but for the binding each names its own master in.
    def binding(master):
        return {"challenge": "c" * 64, "target": master["id"], "config_dir": "/etc/salt"}

    keys = {"alive": True, "digest": "0" * 64, "buckets": {}, "count": 0, "repair": False}
    monkeypatch.setattr(
        multimaster_keywrite,
        "peer_inventory",
        lambda minion_opts, master, mopts: dict(keys, binding=binding(master)),
    )
    monkeypatch.setattr(
        multimaster_masterkey,
        "master_key_info",
        lambda minion_opts, master, mopts, signing=False: {"pub": None, "binding": binding(master)},
    )
    monkeypatch.setattr(multimaster_status, "store_problems", lambda mopts, signing: [])
    monkeypatch.setattr(multimaster_status, "ping_minions", lambda config_dir, timeout=5: [])
    ret = runner.status()
    assert ret["roots_equal"] is False and "pillar_roots base 0" in ret["roots_differ"], ret
    assert ret["roots_differ"]["pillar_roots base 0"]["m2"], ret
    assert not leaked(ret, primary.returns, peer.returns)
