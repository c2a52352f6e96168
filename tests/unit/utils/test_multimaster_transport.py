"""
The pull transport: staged bytes reach only the minion they were staged for, once, in bounded
chunks, checked against the published size and SHA-256.
"""

import base64
import os
import pathlib
import re
import stat

import multimaster_settings
import multimaster_transport as transport
import pytest

from tests.support.jobs import running


@pytest.fixture
def sender(tmp_path):
    # Salt's default: every request's minion id is signed (the transport requires it).
    return {"cachedir": str(tmp_path), "minimum_auth_version": 3}


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(transport, "CHUNK", 1000)


def puller(sender, requester):
    calls = []

    def pull(ticket, offset):
        calls.append(offset)
        return transport.serve(sender, requester, ticket, offset)

    pull.calls = calls
    return pull


def test_bytes_arrive_in_bounded_chunks_and_the_ticket_is_used_up(sender, small_chunks):
    data = os.urandom(4500)
    descriptor = transport.stage(sender, "cm2", data)
    pull = puller(sender, "cm2")
    assert transport.fetch(descriptor, pull) == data
    assert pull.calls == [0, 1000, 2000, 3000, 4000]  # the last chunk uses the ticket up
    # Only the spent ticket's record is left, until the sender settles.
    assert [n for n in os.listdir(transport.outbox(sender)) if not n.startswith(".")] == [
        descriptor["ticket"] + ".meta"
    ]
    transport.settle(sender)
    assert [n for n in os.listdir(transport.outbox(sender)) if not n.startswith(".")] == []


def test_a_replayed_ticket_is_refused(sender):
    descriptor = transport.stage(sender, "cm2", b"actions")
    transport.fetch(descriptor, puller(sender, "cm2"))
    with pytest.raises(transport.TransferError, match="unknown or used ticket"):
        transport.fetch(descriptor, puller(sender, "cm2"))


def test_a_foreign_minion_is_refused_and_the_recipient_still_gets_it(sender):
    descriptor = transport.stage(sender, "cm2", b"sealed")
    with pytest.raises(transport.TransferError, match="not issued to 'web1'"):
        transport.fetch(descriptor, puller(sender, "web1"))
    assert transport.fetch(descriptor, puller(sender, "cm2")) == b"sealed"


def test_an_expired_ticket_is_refused(sender):
    descriptor = transport.stage(sender, "cm2", b"sealed", ttl=-1)
    with pytest.raises(transport.TransferError, match="expired"):
        transport.fetch(descriptor, puller(sender, "cm2"))


def test_chunks_are_served_in_order_only(sender, small_chunks):
    descriptor = transport.stage(sender, "cm2", os.urandom(3000))
    answer = transport.serve(sender, "cm2", descriptor["ticket"], 1000)
    assert answer == {"error": "offset 1000 is not the next one (0)"}


@pytest.mark.parametrize(
    "ticket", ["../../etc/passwd", "t" + "0" * 47, 12345, None, "T" + "a" * 48]
)
def test_malformed_tickets_are_refused(sender, ticket):
    assert transport.serve(sender, "cm2", ticket, 0) == {"error": "malformed ticket"}


def test_a_tampered_descriptor_is_detected(sender):
    descriptor = transport.stage(sender, "cm2", b"the real actions")
    forged = dict(descriptor, sha256="0" * 64)
    with pytest.raises(transport.TransferError, match="does not match its descriptor"):
        transport.fetch(forged, puller(sender, "cm2"))


def test_a_transfer_over_the_limit_is_refused_before_pulling(sender):
    descriptor = transport.stage(sender, "cm2", b"x" * 100)
    pull = puller(sender, "cm2")
    with pytest.raises(transport.TransferError, match="exceeds the limit of 10"):
        transport.fetch(descriptor, pull, limit=10)
    assert pull.calls == []


def test_an_empty_transfer_arrives(sender):
    assert transport.fetch(transport.stage(sender, "cm2", b""), puller(sender, "cm2")) == b""


def test_a_master_without_peer_run_gives_a_clear_error(sender):
    descriptor = transport.stage(sender, "cm2", b"x")
    with pytest.raises(transport.TransferError, match="is peer_run for multimaster_transfer.pull"):
        transport.fetch(descriptor, lambda ticket, offset: {})


def test_staged_files_are_private(sender):
    transport.stage(sender, "cm2", b"sealed")
    box = transport.outbox(sender)
    assert stat.S_IMODE(os.stat(box).st_mode) == 0o700
    for name in os.listdir(box):
        assert stat.S_IMODE(os.stat(os.path.join(box, name)).st_mode) == 0o600


def test_expired_transfers_are_pruned_when_the_next_is_staged(sender):
    old = transport.stage(sender, "cm2", b"old", ttl=-1)
    transport.stage(sender, "cm2", b"new")
    assert not any(n.startswith(old["ticket"]) for n in os.listdir(transport.outbox(sender)))


@pytest.mark.parametrize("malformed", [None, {}, {"ticket": "x", "size": 1, "sha256": "0" * 64}])
def test_malformed_descriptors_are_refused(malformed):
    with pytest.raises(transport.TransferError, match="malformed transfer descriptor"):
        transport.check_descriptor(malformed)


def test_peer_run_admits_exactly_the_control_minions_and_the_pull():
    settings = {"masters": [{"id": "m1", "minion_id": "cm.1"}, {"id": "m2"}]}
    ((who, what),) = multimaster_settings.pull_acl(settings).items()
    # Salt's minion_runner checks both with re.match.
    assert [bool(re.match(who, i)) for i in ("cm.1", "m2", "cmx1", "cm.10", "m2x", "xm2")] == [
        True,
        True,
        False,
        False,
        False,
        False,
    ]
    assert [bool(re.match(what[0], f)) for f in (transport.PULL, transport.PULL + "x")] == [
        True,
        False,
    ]


def test_files_stream_encrypted_and_split_back_into_files(sender, small_chunks, tmp_path):
    sizes = [0, 2500, 1, 1999]
    paths = []
    for n, size in enumerate(sizes):
        path = tmp_path / f"f{n}"
        path.write_bytes(os.urandom(size))
        paths.append(path)
    key = os.urandom(32)
    descriptor = transport.stage_files(
        sender, "cm2", [(tmp_path, p.name, s) for p, s in zip(paths, sizes, strict=True)], key
    )
    assert descriptor["size"] == sum(sizes) and descriptor["sha256"] is None
    seen = []

    def pull(ticket, offset):
        answer = transport.serve(sender, "cm2", ticket, offset)
        seen.append(base64.b64decode(answer.get("data", "")))
        return answer

    reader = transport.Reader(transport.chunks(descriptor, pull, key))
    for path, size in zip(paths, sizes, strict=True):
        assert b"".join(reader.blocks(size, block=700)) == path.read_bytes()
    # What crossed the wire (and a job cache would keep) is ciphertext.
    assert not any(paths[1].read_bytes()[:64] in chunk for chunk in seen)


def test_the_reader_hands_out_the_stream_in_order_across_chunks_of_any_size():
    reader = transport.Reader(iter([b"ab", b"", b"cde", b"fghij", b"k"]))
    assert [reader.read(n) for n in (4, 1, 0, 3, 9, 1)] == [b"abcd", b"e", b"", b"fgh", b"ijk", b""]


def test_the_meta_rewritten_at_each_chunk_does_not_carry_the_member_list(
    sender, small_chunks, tmp_path
):
    members = []
    for n in range(200):
        (tmp_path / f"file-{n:03}").write_bytes(b"x" * 30)
        members.append((tmp_path, f"file-{n:03}", 30))
    descriptor = transport.stage_files(sender, "cm2", members)
    meta = pathlib.Path(transport.outbox(sender)) / (descriptor["ticket"] + ".meta")
    assert meta.stat().st_size < 512
    reader = transport.Reader(transport.chunks(descriptor, puller(sender, "cm2")))
    assert b"".join(reader.blocks(200 * 30)) == b"x" * 6000
    assert meta.stat().st_size < 512


def test_an_encrypted_stream_with_the_wrong_key_fails(sender, tmp_path):
    (tmp_path / "f").write_bytes(b"pillar secret")
    descriptor = transport.stage_files(sender, "cm2", [(tmp_path, "f", 13)], os.urandom(32))
    with pytest.raises(transport.TransferError, match="fails authentication"):
        list(transport.chunks(descriptor, puller(sender, "cm2"), os.urandom(32)))


def test_a_symlink_swapped_in_after_staging_is_not_served(sender, tmp_path):
    (tmp_path / "secret").write_text("root only\n")
    (tmp_path / "f").write_text("0123456789")
    descriptor = transport.stage_files(sender, "cm2", [(tmp_path, "f", 10)])
    (tmp_path / "f").unlink()
    (tmp_path / "f").symlink_to(tmp_path / "secret")
    answer = transport.serve(sender, "cm2", descriptor["ticket"], 0)
    assert answer["error"].startswith("cannot read the staged data")


def test_a_directory_swapped_for_a_symlink_after_staging_is_not_read_through(sender, tmp_path):
    # A local user who can write below the primary's roots turns a staged file's directory
    # into a link to /etc-like content between the scan and the pull.
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "sub" / "f").write_text("0123456789")
    (outside / "f").write_text("root only!")
    descriptor = transport.stage_files(sender, "cm2", [(root, "sub/f", 10)])
    (root / "sub").rename(tmp_path / "moved")
    (root / "sub").symlink_to(outside)
    answer = transport.serve(sender, "cm2", descriptor["ticket"], 0)
    assert answer["error"].startswith("cannot read the staged data")
    assert "data" not in answer


def test_a_fifo_swapped_in_after_staging_is_refused_not_waited_on(sender, tmp_path):
    (tmp_path / "f").write_text("0123456789")
    descriptor = transport.stage_files(sender, "cm2", [(tmp_path, "f", 10)])
    (tmp_path / "f").unlink()
    os.mkfifo(tmp_path / "f")
    answer = transport.serve(sender, "cm2", descriptor["ticket"], 0)
    assert answer["error"].startswith("cannot read the staged data")


def test_pull_jobs_leave_the_job_cache_as_the_transfer_proceeds(sender, small_chunks):
    sender.update(master_job_cache="local_cache", job_cache=True, hash_type="sha256")
    jobs = os.path.join(sender["cachedir"], "jobs")
    descriptor = transport.stage(sender, "cm2", os.urandom(2500))
    jids = iter(["20261122000000000001", "20261122000000000002", "20261122000000000003"])
    kept = []

    def pull(ticket, offset):
        jid = next(jids, None)
        answer = transport.serve(sender, "cm2", ticket, offset, jid)
        if jid:
            # What Salt does after the runner returned: store the job.
            path = transport.salt.utils.jid.jid_dir(jid, jobs, "sha256")
            os.makedirs(path)
            kept.append(path)
        return answer

    transport.fetch(descriptor, pull)
    # The last pull's job holds the last chunk: it goes when the sender settles.
    assert [os.path.exists(path) for path in kept] == [False, False, True]
    transport.settle(sender)
    assert [os.path.exists(path) for path in kept] == [False, False, False]


def test_a_spent_ticket_is_forgotten_when_the_next_transfer_is_staged(sender):
    sender.update(master_job_cache="local_cache", job_cache=True, hash_type="sha256")
    descriptor = transport.stage(sender, "cm2", b"data")
    jid = "20261122000000000009"
    assert transport.serve(sender, "cm2", descriptor["ticket"], 0, jid)["done"] is True
    path = transport.salt.utils.jid.jid_dir(jid, os.path.join(sender["cachedir"], "jobs"), "sha256")
    os.makedirs(path)
    transport.stage(sender, "cm3", b"next")
    assert not os.path.exists(path)


def test_an_expired_ticket_goes_with_the_job_of_its_last_pull(sender, small_chunks, monkeypatch):
    sender.update(master_job_cache="local_cache", job_cache=True, hash_type="sha256")
    descriptor = transport.stage(sender, "cm2", os.urandom(1500))
    jid = "20261122000000000010"
    assert "done" not in transport.serve(sender, "cm2", descriptor["ticket"], 0, jid)
    path = transport.salt.utils.jid.jid_dir(jid, os.path.join(sender["cachedir"], "jobs"), "sha256")
    os.makedirs(path)
    monkeypatch.setattr(transport.time, "time", lambda: 10**10)  # long after it expired
    transport.stage(sender, "cm3", b"next")
    assert not os.path.exists(path)
    assert "used ticket" in transport.serve(sender, "cm2", descriptor["ticket"], 1000)["error"]


def test_files_no_ticket_owns_are_pruned_when_the_next_transfer_is_staged(sender):
    # What a staging or a serve cut short leaves: a data file without its meta, a meta's temp.
    first = transport.stage(sender, "cm2", b"data")
    box = pathlib.Path(transport.outbox(sender))
    (box / (first["ticket"] + ".meta")).unlink()
    (box / "t0123.meta.tmp").write_text("{}")
    second = transport.stage(sender, "cm3", b"next")
    assert sorted(p.name for p in box.iterdir()) == sorted(
        [".lock", second["ticket"] + ".data", second["ticket"] + ".meta"]
    )


def test_a_stream_being_pulled_outlives_its_ttl(sender, small_chunks, monkeypatch):
    # A first sync of a large tree on a slow link takes longer than the ticket's 300 s.
    now = [1_000_000]
    monkeypatch.setattr(transport.time, "time", lambda: now[0])
    descriptor = transport.stage(sender, "cm2", os.urandom(3000), ttl=300)
    for offset in (0, 1000, 2000):
        now[0] += 200  # each chunk comes 200 s after the last: 600 s in all
        assert "data" in transport.serve(sender, "cm2", descriptor["ticket"], offset)
    # Left alone, it expires ttl seconds after its last chunk.
    stalled = transport.stage(sender, "cm2", os.urandom(3000), ttl=300)
    assert "data" in transport.serve(sender, "cm2", stalled["ticket"], 0)
    now[0] += 301
    assert "expired" in transport.serve(sender, "cm2", stalled["ticket"], 1000)["error"]


def test_the_last_chunk_uses_the_ticket_up(sender):
    descriptor = transport.stage(sender, "cm2", b"data")
    answer = transport.serve(sender, "cm2", descriptor["ticket"], 0)
    assert answer["done"] is True and base64.b64decode(answer["data"]) == b"data"
    assert "used ticket" in transport.serve(sender, "cm2", descriptor["ticket"], 0)["error"]
    assert "used ticket" in transport.serve(sender, "cm2", descriptor["ticket"], 4)["error"]


def test_a_transfer_not_pulled_to_its_end_keeps_its_ticket(sender, small_chunks):
    descriptor = transport.stage(sender, "cm2", os.urandom(1500))
    assert "done" not in transport.serve(sender, "cm2", descriptor["ticket"], 0)
    transport.settle(sender)
    assert transport.serve(sender, "cm2", descriptor["ticket"], 1000)["done"] is True


def test_a_recorded_pull_is_stored_without_listing_every_key(tmp_path, monkeypatch):
    # Salt's own job store, on a real local_cache: with the pull's load recorded first it does not
    # glob the requester's id over the accepted keys (O(keys) per pull), and the stored load
    # holds no chunk.
    import salt.config
    import salt.loader
    import salt.utils.job
    import salt.utils.minions

    opts = salt.config.master_config(os.devnull)
    opts.update(
        cachedir=str(tmp_path / "cache"), pki_dir=str(tmp_path / "pki"), sock_dir=str(tmp_path)
    )
    listed = []
    real = salt.utils.minions.CkMinions.check_minions
    monkeypatch.setattr(
        salt.utils.minions.CkMinions,
        "check_minions",
        lambda self, *a, **k: listed.append(a) or real(self, *a, **k),
    )

    def store(jid):
        ret = {"jid": jid, "fun": "runner." + transport.PULL, "return": {"data": "CHUNK"}}
        load = {"id": "cm2", "tgt": "cm2", "jid": jid, "return": ret}
        salt.utils.job.store_job(opts, load)
        loader = salt.loader.returners(opts, {})
        return loader["local_cache.get_load"](jid), loader["local_cache.get_jid"](jid)

    load, returns = store("20261125000000000001")
    assert listed and "CHUNK" in repr(load)  # without the record: every key listed, chunk kept
    listed.clear()
    running(opts, "20261125000000000002", "runner." + transport.PULL)
    transport.record_pull(opts, "cm2", "20261125000000000002")
    load, returns = store("20261125000000000002")
    assert listed == []
    assert load["Minions"] == ["cm2"] and "CHUNK" not in repr(load)
    assert "CHUNK" in repr(returns["cm2"])  # the return is kept, for the transport to forget


def test_a_recorded_pull_job_is_not_scrubbed_by_salt_s_job_cleaner(tmp_path):
    # Salt's Maintenance runs clean_old_jobs every minute and removes a job directory without a
    # jid file as corrupt; during a pull that lost the pull's answer (seen in CI: the runner
    # failed with ".minions.p does not exist" and the peer's apply with it).
    import salt.config
    import salt.loader

    opts = salt.config.master_config(os.devnull)
    opts.update(cachedir=str(tmp_path / "cache"), pki_dir=str(tmp_path / "pki"))
    jid = "20261125000000000003"
    running(opts, jid, "runner." + transport.PULL)
    transport.record_pull(opts, "cm2", jid)
    loader = salt.loader.returners(opts, {})
    loader["local_cache.clean_old_jobs"]()
    assert loader["local_cache.get_load"](jid)["Minions"] == ["cm2"]


def test_the_next_chunk_is_pulled_while_the_recipient_handles_this_one(sender, small_chunks):
    import threading

    descriptor = transport.stage(sender, "cm2", os.urandom(3000))
    second = threading.Event()
    pull = puller(sender, "cm2")

    def watched(ticket, offset):
        if offset:
            second.set()
        return pull(ticket, offset)

    stream = transport.chunks(descriptor, watched)
    first = next(stream)
    # The recipient still holds the first chunk: the second is pulled meanwhile.
    assert second.wait(5)
    assert len(first) + sum(len(chunk) for chunk in stream) == 3000
    assert pull.calls == [0, 1000, 2000]


def test_a_failed_pull_is_raised_after_the_chunks_before_it(sender, small_chunks):
    descriptor = transport.stage(sender, "cm2", os.urandom(3000))
    pull = puller(sender, "cm2")

    def failing(ticket, offset):
        return {"error": "gone"} if offset == 2000 else pull(ticket, offset)

    stream = transport.chunks(descriptor, failing)
    assert len(next(stream)) == len(next(stream)) == 1000
    with pytest.raises(transport.TransferError, match="gone"):
        next(stream)


def test_a_stream_closed_early_stops_pulling(sender, small_chunks):
    import threading

    descriptor = transport.stage(sender, "cm2", os.urandom(10000))
    pull = puller(sender, "cm2")
    before = threading.active_count()
    stream = transport.chunks(descriptor, pull)
    next(stream)
    stream.close()
    assert threading.active_count() == before
    assert len(pull.calls) <= 3  # the one handed out, at most one waiting and one in flight


def test_the_pull_runs_in_the_callers_context(sender):
    # Salt resolves a module's __salt__ through a context variable: the worker must see it.
    import contextvars

    loader = contextvars.ContextVar("loader")
    loader.set("the minion's loader")
    seen = []
    pull = puller(sender, "cm2")

    def in_context(ticket, offset):
        seen.append(loader.get(None))
        return pull(ticket, offset)

    descriptor = transport.stage(sender, "cm2", b"data")
    assert b"".join(transport.chunks(descriptor, in_context)) == b"data"
    assert seen == ["the minion's loader"]
