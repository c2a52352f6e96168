"""
A roots sync's plan and the checks of a peer's answers: plans mirror the source, roots that
overlap unlike the primary's are refused, a peer's directory lists and modes must match its
manifests, and differences name file_roots paths but only count pillar ones.
"""

import multimaster_rootsplan as rootsplan
import pytest


def test_plan_mirrors_the_source():
    entry = {"size": 1, "mode": 0o644, "sha256": "a" * 64}
    source = {"same": entry, "new": entry, "edited": entry, "chmod": dict(entry, mode=0o755)}
    target = {"same": entry, "edited": dict(entry, sha256="b" * 64), "chmod": entry, "stale": entry}
    assert rootsplan.plan(source, target) == {
        "add": ["new"],
        "change": ["edited"],
        "mode": ["chmod"],
        "delete": ["stale"],
    }


def test_a_peer_s_directory_list_that_does_not_match_its_manifests_is_refused():
    files = {"file_roots": {"base": [{}]}}
    assert rootsplan.partial_check(None, files) is None
    for bad in ({}, {"file_roots": {"base": []}}, {"file_roots": {"base": [[1]]}}):
        with pytest.raises(rootsplan.RootsRefused):
            rootsplan.partial_check(bad, files)


def test_overlaps_names_how_two_roots_share_directories():
    layout = {
        "file_roots": {"base": ["/srv/salt", "/srv/other"], "dev": ["/srv/salt"]},
        "pillar_roots": {"base": ["/srv/salt/pillar"]},
    }
    assert rootsplan.overlaps(layout) == {
        (("file_roots", "base", 0), ("file_roots", "dev", 0)): "same",
        (("file_roots", "base", 0), ("pillar_roots", "base", 0)): "contains",
        (("file_roots", "dev", 0), ("pillar_roots", "base", 0)): "contains",
    }
    assert rootsplan.overlaps({"file_roots": {"base": ["/srv/salt", "/srv/salted"]}}) == {}


def test_a_peer_whose_roots_nest_unlike_the_primary_s_is_refused():
    # The primary keeps pillar beside the states; the peer inside them: syncing the peer's
    # file_roots would delete its pillar files as extra, and the pillar sync write them back.
    apart = {"file_roots": {"base": ["/p/salt"]}, "pillar_roots": {"base": ["/p/pillar"]}}
    nested = {"file_roots": {"base": ["/q/salt"]}, "pillar_roots": {"base": ["/q/salt/pillar"]}}
    summary = {"m1": {"real": apart}, "m2": {"real": nested}}
    with pytest.raises(rootsplan.RootsRefused) as refused:
        rootsplan.check_overlaps("m1", summary)
    message = str(refused.value)
    assert "'/q/salt/pillar'" in message and "the second inside the first on m2" in message
    assert "apart on m1" in message and "nothing written" in message
    # Nested alike on both sides mirrors fine; so do roots apart on the peer (the demo lab's
    # primary serves the formula checkout, which holds its second root).
    rootsplan.check_overlaps("m1", {"m1": {"real": nested}, "m2": {"real": nested}})
    rootsplan.check_overlaps("m1", {"m1": {"real": nested}, "m2": {"real": apart}})


def test_the_directory_plan_names_what_is_missing_or_of_another_mode():
    source = {"": 0o700, "a": 0o700, "a/b": 0o755}
    target = {"": 0o755, "a": 0o700, "stale": 0o777}
    assert rootsplan.dir_plan(source, target) == [["", 0o700], ["a/b", 0o755]]


@pytest.mark.parametrize(
    "modes",
    [None, {}, {"file_roots": {"base": []}}, {"file_roots": {"base": [{"a": "0755"}]}}],
)
def test_a_peer_s_directory_modes_that_do_not_match_its_manifests_are_refused(modes):
    files = {"file_roots": {"base": [{}]}}
    assert rootsplan.modes_check({"file_roots": {"base": [{"": 0o700}]}}, files)
    with pytest.raises(rootsplan.RootsRefused, match="directory modes"):
        rootsplan.modes_check(modes, files)


def test_differences_name_file_roots_paths_and_count_pillar_ones():
    entry = {"size": 1, "mode": 0o644, "sha256": "0" * 64}
    files = {"a.sls": entry, "b.sls": entry, "d/c.sls": entry}
    theirs = {"a.sls": {**entry, "sha256": "1" * 64}, "b.sls": {**entry, "mode": 0o600}, "x": entry}
    modes, their_modes = {"": 0o755, "d": 0o755}, {"": 0o700}
    assert rootsplan.differences(files, modes, theirs, their_modes, shown=50) == {
        "missing": ["d/c.sls"],
        "changed": ["a.sls"],
        "mode": ["b.sls"],
        "extra": ["x"],
        "dir_mode": [""],
    }
    assert rootsplan.differences(files, modes, theirs, their_modes, shown=50, named=False) == {
        "missing": 1,
        "changed": 1,
        "mode": 1,
        "extra": 1,
        "dir_mode": 1,
    }
    assert rootsplan.differences(files, modes, files, modes, shown=50) == {}
