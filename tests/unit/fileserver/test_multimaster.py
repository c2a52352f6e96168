"""
The file server backend that serves sync_roots its content and plan: only transfers staged for
it, by the ticket the recipient alone learns or, for a published ticket, to the recipient's
authenticated id only; raw chunks, used up by the last one; every other path falls through to
the next backend.
"""

import os
import types

import multimaster_transport as transport
import pytest


@pytest.fixture
def opts(tmp_path):
    return {"cachedir": str(tmp_path), "minimum_auth_version": 3}


@pytest.fixture
def configure_loader_modules(backend, opts):
    return {backend: {"__opts__": opts}}


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(transport, "FILESERVER_CHUNK", 1000)


def staged(opts, tmp_path, data, fileserver=True):
    source = tmp_path / "source"
    source.write_bytes(data)
    key = os.urandom(32)
    descriptor = transport.stage_files(
        opts, "cm2", [(str(tmp_path), "source", len(data))], key, fileserver=fileserver
    )
    return descriptor, key


def path_of(descriptor):
    return transport.FILESERVER_PREFIX + descriptor["ticket"]


def served(backend, descriptor, offset, **load):
    path = path_of(descriptor)
    fnd = backend.find_file(path, "base")
    return backend.serve_file({"path": path, "loc": offset, "saltenv": "base", **load}, fnd)


def test_a_staged_stream_arrives_raw_and_the_ticket_is_used_up(
    backend, opts, tmp_path, small_chunks
):
    data = os.urandom(2500)
    descriptor, key = staged(opts, tmp_path, data)
    assert backend.find_file(path_of(descriptor), "prod")["path"] == path_of(descriptor)

    offsets = []

    def pull(ticket, offset):
        assert ticket == descriptor["ticket"]
        offsets.append(offset)
        answer = served(backend, descriptor, offset, id="cm2")
        assert "data" not in answer and isinstance(answer["bytes"], bytes)
        return answer

    assert b"".join(transport.chunks(descriptor, pull, key)) == data
    assert offsets == [0, 1000, 2000]
    assert backend.find_file(path_of(descriptor), "base") == {"path": "", "rel": ""}
    assert "error" in served(backend, descriptor, 0, id="cm2")


def test_a_transfer_staged_for_peer_run_only_is_not_served(backend, opts, tmp_path):
    # A keys bundle's ticket travels in a publish every minion sees: never here.
    descriptor, _ = staged(opts, tmp_path, b"bundle", fileserver=False)
    assert backend.find_file(path_of(descriptor), "base") == {"path": "", "rel": ""}
    answer = transport.serve_fileserver(opts, {"path": path_of(descriptor), "loc": 0})
    assert "error" in answer and "bytes" not in answer


def test_another_minion_naming_itself_is_refused(backend, opts, tmp_path):
    descriptor, _ = staged(opts, tmp_path, b"content")
    assert "not issued" in served(backend, descriptor, 0, id="intruder")["error"]
    assert "bytes" in served(backend, descriptor, 0, id="cm2")


def published(opts, data):
    """A sealed document whose ticket a publish carries (the roots plan)."""
    return transport.stage(opts, "cm2", data, fileserver=True)


def test_a_published_ticket_is_served_to_the_recipients_authenticated_id_only(backend, opts):
    descriptor = published(opts, b"sealed plan")
    # Every minion saw the ticket: neither another id nor a request without one gets it ...
    assert "not issued" in served(backend, descriptor, 0, id="intruder")["error"]
    assert served(backend, descriptor, 0)["error"] == transport.NEEDS_ID
    # ... and neither used it up.
    answer = served(backend, descriptor, 0, id="cm2")
    assert answer["bytes"] == b"sealed plan" and answer["done"] is True
    assert "replay" in served(backend, descriptor, 0, id="cm2")["error"]


@pytest.mark.parametrize("version", [None, 2, "x"])
def test_a_master_that_accepts_unsigned_requests_serves_no_ticket_by_any_path(
    backend, opts, version
):
    # Below version 3 a request is encrypted with the AES key every minion holds and its id
    # is not checked, on the file server as on peer_run: any minion could name itself the
    # recipient and use the ticket up.
    descriptor = published(opts, b"sealed plan")
    opts["minimum_auth_version"] = version
    assert "minimum_auth_version" in served(backend, descriptor, 0, id="cm2")["error"]
    answer = transport.serve(opts, "cm2", descriptor["ticket"], 0)
    assert "expected 3" in answer["error"] and "data" not in answer
    with pytest.raises(transport.CommandExecutionError, match=f"minimum_auth_version {version!r}"):
        published(opts, b"another plan")
    # Refused without being used up: back on 3, the recipient gets it.
    opts["minimum_auth_version"] = 3
    assert served(backend, descriptor, 0, id="cm2")["bytes"] == b"sealed plan"


def test_the_peer_pulls_a_published_ticket_by_peer_run_where_salt_sends_no_id(peer):
    pull = peer.pull()
    pull._fileserver_pull = lambda t, o: {"error": transport.NEEDS_ID}
    assert pull("t1", 0) == {"o": 0}
    assert pull.via == "peer_run" and peer.calls == [("peer_run", 0)]


def test_chunks_are_served_in_order_only(backend, opts, tmp_path, small_chunks):
    descriptor, _ = staged(opts, tmp_path, os.urandom(2500))
    assert "not the next one" in served(backend, descriptor, 1000)["error"]
    assert served(backend, descriptor, 0)["offset"] == 0


@pytest.mark.parametrize(
    "path",
    [
        "top.sls",
        "multimaster-transfer/../top.sls",
        "multimaster-transfer/t" + "0" * 48,
        "multimaster-transfer/T" + "0" * 48,
        "multimaster-transfer/t" + "0" * 48 + "/x",
    ],
)
def test_other_paths_fall_through(backend, path):
    assert backend.find_file(path, "base") == {"path": "", "rel": ""}


def test_it_adds_no_environment_and_lists_nothing(backend, opts, tmp_path):
    staged(opts, tmp_path, b"content")
    load = {"saltenv": "base"}
    assert backend.envs() == []
    assert backend.file_list(load) == backend.dir_list(load) == []
    assert backend.file_list_emptydirs(load) == []
    assert backend.file_hash(load, {"path": "x", "rel": "x"}) == {}


def test_a_chunk_salt_handed_over_as_str_is_restored():
    # Salt's request channel decodes bytes that happen to be valid UTF-8.
    assert transport._decoded({"bytes": "é\x00"}) == "é\x00".encode()
    assert transport._decoded({"bytes": 3}) is None


class Peer:
    """
    cm2's side of a pull: ``pull()`` is its ``ContentPull``, whose ``peer_run`` pulls are
    recorded in ``calls``.
    """

    def __init__(self):
        self.calls = []

    def pull(self):
        peer_run = lambda t, o: self.calls.append(("peer_run", o)) or {"o": o}  # noqa: E731
        return transport.ContentPull({"id": "cm2"}, peer_run)


@pytest.fixture
def peer():
    return Peer()


def test_the_peer_falls_back_to_peer_run_where_the_file_server_does_not_serve(peer):
    # Salt's answer when no backend has the path: a master without the multimaster backend.
    pull = peer.pull()
    pull._fileserver_pull = lambda t, o: peer.calls.append(("fileserver", o)) or {"data": ""}
    assert pull("t1", 0) == {"o": 0} and pull("t1", 4) == {"o": 4}
    assert pull.via == "peer_run"
    assert peer.calls == [("fileserver", 0), ("peer_run", 0), ("peer_run", 4)]


def test_a_stream_the_file_server_stops_serving_mid_way_goes_on_by_peer_run(peer):
    # A master worker that has not loaded the backend answers as Salt does for a missing path.
    answers = {0: {"bytes": b"x", "offset": 0, "size": 3}, 1: {"data": "", "dest": ""}}
    pull = peer.pull()
    pull._fileserver_pull = lambda t, o: answers[o]
    assert pull("t1", 0)["bytes"] == b"x"
    assert pull("t1", 1) == {"o": 1} and pull("t1", 2) == {"o": 2}
    assert pull.via == "peer_run" and peer.calls == [("peer_run", 1), ("peer_run", 2)]


def test_a_refusal_of_the_file_server_is_never_retried_by_peer_run(peer):
    pull = peer.pull()
    pull._fileserver_pull = lambda t, o: {"error": "unknown or used ticket: refusing a replay"}
    assert pull("t1", 0)["error"].startswith("unknown or used ticket")
    assert pull.via == "fileserver" and peer.calls == []


class Channel:
    """A request channel whose auth loads the minion's key at its first send, as 3008's does."""

    made = []

    def __init__(self, opts):
        self.auth = types.SimpleNamespace(_private_key=None)
        self.loads = 0
        Channel.made.append(self)

    def send(self, load, timeout=None):
        if self.auth._private_key is None:
            self.loads += 1
            self.auth._private_key = object()
        return {"bytes": b"x", "offset": load["loc"], "size": 10**6}

    def close(self):
        pass


def test_a_stream_loads_the_minions_key_once_however_many_channels_it_opens(monkeypatch, peer):
    monkeypatch.setattr(transport.salt.channel.client.ReqChannel, "factory", Channel)
    Channel.made.clear()
    with peer.pull() as pull:
        for offset in range(3 * transport.ContentPull.REQUESTS_PER_CHANNEL):
            assert pull("t1", offset)["bytes"] == b"x"
    assert len(Channel.made) == 3
    assert [c.loads for c in Channel.made] == [1, 0, 0]
    assert len({id(c.auth._private_key) for c in Channel.made}) == 1
