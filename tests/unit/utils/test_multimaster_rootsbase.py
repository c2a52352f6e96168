"""
The base of a roots sync and its delta: a peer at the base gets the primary's per-directory
digests exactly from it; anything else (no base, too many changes, a peer elsewhere, a delta
that is not well formed) leaves the peer to pull the full digests.
"""

import multimaster_manifest as manifest
import multimaster_rootsanswer as rootsanswer
import multimaster_rootsbase as rootsbase
import pytest


def local(by_dir, path="/srv/salt"):
    return {
        "file_roots": {"base": [{"path": path, "dir_digests": by_dir}]},
        "pillar_roots": {"base": [{"path": "/srv/pillar", "dir_digests": {"": "f" * 64}}]},
    }


BASE = {"": "0" * 64, "a": "1" * 64, "b": "2" * 64}
NOW = {"": "0" * 64, "a": "3" * 64, "c": "4" * 64}


def test_a_peer_at_the_base_gets_the_primary_s_digests_from_the_delta(tmp_path):
    rootsbase.save(str(tmp_path), local(BASE))
    deltas = rootsbase.deltas(str(tmp_path), local(NOW))
    assert "pillar_roots" not in deltas  # a publish never names pillar directories
    delta = deltas["file_roots"]["base"][0]
    assert delta == {
        "base": manifest.root_digest(BASE),
        "dirs": {"a": "3" * 64, "b": None, "c": "4" * 64},
    }
    mine = {"file_roots": {"base": [manifest.root_digest(BASE)]}}
    theirs = {"file_roots": {"base": [manifest.root_digest(NOW)]}}
    got = rootsanswer.digests_from_deltas(
        {"staged": {}, "delta": deltas}, mine, theirs, {"file_roots": {"base": [BASE]}}
    )
    assert got == {"file_roots": {"base": [NOW]}}


def test_a_peer_elsewhere_or_a_root_without_base_pulls(tmp_path):
    mine = {"file_roots": {"base": ["9" * 64]}}
    theirs = {"file_roots": {"base": [manifest.root_digest(NOW)]}}
    by_dir = {"file_roots": {"base": [{"": "9" * 64}]}}
    rootsbase.save(str(tmp_path), local(BASE))
    deltas = rootsbase.deltas(str(tmp_path), local(NOW))
    assert rootsanswer.digests_from_deltas({"delta": deltas}, mine, theirs, by_dir) is None
    # Another path in the same slot is another root: no base.
    assert rootsbase.deltas(str(tmp_path), local(NOW, "/srv/other")) == {
        "file_roots": {"base": [None]}
    }
    # A root already equal to the primary's needs no delta.
    equal = {"file_roots": {"base": [manifest.root_digest(NOW)]}}
    got = rootsanswer.digests_from_deltas(
        {"delta": {}}, equal, equal, {"file_roots": {"base": [NOW]}}
    )
    assert got == {"file_roots": {"base": [NOW]}}


def test_more_changes_than_a_delta_names_leave_no_delta(tmp_path, monkeypatch):
    monkeypatch.setattr(rootsbase, "MOST_DELTA_DIRS", 2)
    rootsbase.save(str(tmp_path), local(BASE))
    assert rootsbase.deltas(str(tmp_path), local(NOW))["file_roots"]["base"] == [None]


@pytest.mark.parametrize(
    "delta",
    [
        None,
        "garbage",
        {"base": manifest.root_digest(BASE)},
        {"base": manifest.root_digest(BASE), "dirs": ["a"]},
        {"base": manifest.root_digest(BASE), "dirs": {"a": 5}},
    ],
)
def test_a_delta_that_is_not_well_formed_is_not_used(delta):
    mine = {"file_roots": {"base": [manifest.root_digest(BASE)]}}
    theirs = {"file_roots": {"base": [manifest.root_digest(NOW)]}}
    dirs = {"delta": {"file_roots": {"base": [delta]}}}
    assert (
        rootsanswer.digests_from_deltas(dirs, mine, theirs, {"file_roots": {"base": [BASE]}})
        is None
    )


def test_a_damaged_base_file_is_no_base(tmp_path):
    path = tmp_path / "multimaster" / "roots-base.json"
    path.parent.mkdir()
    path.write_text("{not json")
    assert rootsbase.deltas(str(tmp_path), local(NOW)) == {"file_roots": {"base": [None]}}
    path.write_text('{"x": [1]}')
    assert rootsbase.deltas(str(tmp_path), local(NOW)) == {"file_roots": {"base": [None]}}
