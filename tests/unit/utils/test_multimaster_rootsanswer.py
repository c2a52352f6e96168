"""
A peer's answer to the roots round: its manifest cut to the directories that differ plans as
the whole one, the primary's per-directory digests are pulled where they were staged for it,
and one answer carries what fits and counts the rest.
"""

import json

import multimaster_manifest as manifest
import multimaster_rootsanswer as rootsanswer
import multimaster_rootsplan as rootsplan
import multimaster_rootsread as rootsread
import multimaster_transport as transport
import pytest

FILES = {
    "top.sls": "base: {'*': [web]}\n",
    "nested/deep/run.sh": "#!/bin/sh\n",
    "blob.bin": "0123456789" * 256,
    "with space.sls": "x: 1\n",
}


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "src"
    for relpath, text in FILES.items():
        (src / relpath).parent.mkdir(parents=True, exist_ok=True)
        (src / relpath).write_text(text)
    (src / "nested" / "deep" / "run.sh").chmod(0o755)
    return src


def test_a_peer_manifest_cut_to_the_differing_directories_plans_as_the_whole_one(tree):
    dirs = {}
    files = manifest.manifest(tree, dirs=dirs)[0]
    local = {
        "file_roots": {
            "base": [
                {
                    "path": str(tree),
                    "files": files,
                    "dirs": dirs,
                    "dir_digests": rootsread.dir_digests(files, dirs),
                    "skipped": {},
                }
            ]
        }
    }
    theirs = dict(files)
    theirs["nested/deep/run.sh"] = {**theirs["nested/deep/run.sh"], "sha256": "1" * 64}
    theirs["gone/old.sls"] = {"size": 1, "mode": 0o644, "sha256": "0" * 64}
    del theirs["blob.bin"]
    their_dirs = dict(dirs, nested=0o777, gone=0o755)
    whole = {"file_roots": {"base": [theirs]}}
    modes = {"file_roots": {"base": [their_dirs]}}
    sent = rootsplan.published_dir_digests(local)
    cut, cut_modes, partial = rootsanswer.narrowed(whole, modes, sent)
    assert partial == {"file_roots": {"base": [["", "gone", "nested", "nested/deep"]]}}
    assert "top.sls" in cut["file_roots"]["base"][0]  # same directory as the missing blob
    assert "with space.sls" in cut["file_roots"]["base"][0]
    assert cut_modes["file_roots"]["base"][0] == manifest.modes_within(
        their_dirs, partial["file_roots"]["base"][0]
    )
    assert rootsplan.sync_plan(local, cut, cut_modes, partial) == rootsplan.sync_plan(
        local, whole, modes
    )
    pairs, _ = rootsplan.sync_plan(local, cut, cut_modes, partial)
    assert [w["path"] for w in pairs[0]["write"]] == ["blob.bin", "nested/deep/run.sh"]
    assert pairs[0]["delete"] == ["gone/old.sls"]
    assert pairs[0]["dirs"] == [["nested", dirs["nested"]]]
    # Digests the publish cannot carry, or garbage in their place: the whole manifest.
    assert rootsanswer.narrowed(whole, modes, None) == (
        whole,
        modes,
        {"file_roots": {"base": [None]}},
    )
    garbage = {"file_roots": {"base": [{"x": 1}]}}
    assert rootsanswer.narrowed(whole, modes, garbage)[0] == whole


def test_digests_too_large_for_a_publish_are_pulled_from_where_the_primary_staged_them(tmp_path):
    """
    The primary's per-directory digests of a tree with thousands of directories do not fit a
    publish: it stages them for each peer, and the peer pulls those staged for its master. A
    peer without them would seal its whole manifest, over what a Salt 3008 minion returns
    untrimmed (1 MiB).
    """
    primary = {"cachedir": str(tmp_path), "minimum_auth_version": 3}
    digests = {"file_roots": {"base": [{"": "a" * 64, "deep/er": "b" * 64}]}}
    staged = {
        "staged": {
            m: transport.stage(primary, f"cm-{m}", json.dumps(digests).encode())
            for m in ("master2", "master3")
        }
    }

    def pull_as(requester):
        return lambda ticket, offset: transport.serve(primary, requester, ticket, offset)

    assert rootsanswer.staged_dir_digests(staged, "master2", pull_as("cm-master2")) == digests
    # Digests that came in the publish are used as they are; none staged for this master, or a
    # pull the primary refuses (another minion's ticket): no digests, the whole manifest.
    assert rootsanswer.staged_dir_digests(digests, "master2", None) is digests
    assert rootsanswer.staged_dir_digests(staged, "master4", pull_as("cm-master4")) is None
    assert rootsanswer.staged_dir_digests(staged, "master3", pull_as("cm-master2")) is None


def test_an_answer_carries_the_leading_differing_directories_that_fit_and_counts_the_rest():
    entry = {"size": 1, "mode": 0o644, "sha256": "0" * 64}
    files = {f"d{n}/f{i}.sls": entry for n in range(4) for i in range(3)}
    probe = rootsanswer.AnswerBudget(10**6)
    probe.take(["d0"], files)
    one_dir = 10**6 - probe.room
    budget = rootsanswer.AnswerBudget(one_dir * 5 // 2)
    assert budget.take(["d0", "d1", "d2"], files) == ["d0", "d1"]
    # Once one directory did not fit, the rest of the answer is left too (a sorted prefix).
    assert budget.take(["d3"], files) == [] and budget.left == 2
    # The first directory of an answer always goes, however large: each round makes progress.
    assert rootsanswer.AnswerBudget(0).take(["d2", "d3"], files) == ["d2"]
