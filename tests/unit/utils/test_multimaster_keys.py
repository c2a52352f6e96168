"""
Minion key hygiene, digests, inventory entries and the check of a control minion's inventory
return (_utils/multimaster_keys.py). The plan itself: test_multimaster_keys_plan.py.
"""

import multimaster_keys
import pytest

from tests.support.keyfactory import ec_pub_pem, fp, pkcs1_pub_pem, priv_pem, pub_pem, rsa_private

GOOD = pub_pem(rsa_private())
OTHER = pub_pem(rsa_private(tag=1))


A, X = fp("A"), fp("X")


def test_canonical_accepts_one_rsa_spki_and_keeps_its_fingerprint():
    out = multimaster_keys.canonical(GOOD)
    assert out == GOOD
    assert multimaster_keys.fingerprint(out) == multimaster_keys.fingerprint(GOOD)
    assert multimaster_keys.fingerprint(GOOD) == multimaster_keys.private_key_fingerprint(
        priv_pem(rsa_private())
    )


@pytest.mark.parametrize(
    "bad, words",
    [
        (GOOD + "junk\n", "exactly one"),
        (GOOD + GOOD, "exactly one"),
        (pub_pem(rsa_private(bits=1024)), "1024 bits"),
        (ec_pub_pem(), "not an RSA"),
        (pkcs1_pub_pem(rsa_private()), "exactly one"),
        (priv_pem(rsa_private()), "exactly one"),
        (pub_pem(rsa_private(exponent=3)), "exponent 3"),
        ("", "exactly one"),
        (None, "exactly one"),
    ],
    ids=["trailing-junk", "two-pems", "1024-bit", "ec", "pkcs1", "private", "e3", "empty", "none"],
)
def test_canonical_refuses_anything_else_with_a_clear_message(bad, words):
    with pytest.raises(multimaster_keys.InvalidKeyError, match=words):
        multimaster_keys.canonical(bad, "key of 'web1'")


def test_fingerprint_is_sha256_of_der_and_differs_from_salt_finger():
    fingerprint = multimaster_keys.fingerprint(GOOD)
    assert len(fingerprint.split(":")) == 32
    assert multimaster_keys.is_fingerprint(fingerprint)
    assert multimaster_keys.salt_finger(GOOD) != fingerprint
    assert multimaster_keys.fingerprint("not a key") is None


def test_digests_are_equal_for_equal_inventories_and_bounded():
    a = {f"m{i}": ["accepted", fp(str(i))] for i in range(5000)}
    b = dict(a)
    total_a, buckets_a = multimaster_keys.digests(a)
    total_b, _ = multimaster_keys.digests(b)
    assert total_a == total_b
    assert len(buckets_a) <= multimaster_keys.BUCKETS
    b["m7"] = ["rejected", fp("7")]
    total_c, buckets_c = multimaster_keys.digests(b)
    assert total_c != total_a
    changed = [k for k in buckets_a if buckets_a[k] != buckets_c.get(k)]
    assert changed == [multimaster_keys.bucket_of("m7")]


def test_digests_of_entries_equal_digests_of_their_wire_form():
    wire = {"a": ["accepted", A], "b": ["accepted", A, X], "c": ["denied", None, X]}
    entries = {i: multimaster_keys.Entry.from_wire(e) for i, e in wire.items()}
    assert multimaster_keys.digests(entries) == multimaster_keys.digests(wire)


# --- Entry -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "wire",
    [["accepted", A], ["pending", A, X], ["rejected", None], ["denied", None, X]],
    ids=["key", "key-and-denied", "not-a-key", "denied-alone"],
)
def test_entry_round_trips_every_wire_shape(wire):
    entry = multimaster_keys.Entry.from_wire(wire)
    assert entry.to_wire() == wire
    assert multimaster_keys.Entry.from_wire(entry) == entry
    assert multimaster_keys.Entry.from_wire(tuple(wire)) == entry


def test_entry_names_its_fields():
    entry = multimaster_keys.Entry.from_wire(["accepted", A, X])
    assert (entry.state, entry.fp, entry.denied_fp) == ("accepted", A, X)
    assert entry.has_denied
    assert not multimaster_keys.Entry.from_wire(["accepted", A]).has_denied


@pytest.mark.parametrize(
    "wire, words",
    [
        ("accepted", "list of 2 or 3"),
        ({"state": "accepted"}, "list of 2 or 3"),
        (["accepted"], "list of 2 or 3"),
        (["accepted", A, X, X], "list of 2 or 3"),
        (["bogus", A], "state 'bogus'"),
        ([["accepted"], A], "state"),
        (["accepted", "A"], "fingerprint 'A'"),
        (["accepted", A.upper()], "fingerprint"),
        (["accepted", A + ":00"], "fingerprint"),
        (["accepted", 5], "fingerprint 5"),
        (["accepted", A, "X"], "denied fingerprint 'X'"),
        (["denied", None], "denied entry"),
        (["denied", A, X], "denied entry"),
    ],
)
def test_entry_refuses_other_shapes_naming_the_problem(wire, words):
    with pytest.raises(multimaster_keys.ReturnError, match=words) as caught:
        multimaster_keys.Entry.from_wire(wire, "entry of 'web'")
    assert isinstance(caught.value, ValueError)
    assert "entry of 'web'" in str(caught.value)


# --- check_inventory_return ------------------------------------------------------------------

HEX16, HEX64 = "0123456789abcdef", "ab" * 32


def digests_return(**over):
    ret = {
        "alive": True,
        "digest": HEX64,
        "buckets": {3: HEX16, "17": HEX16},
        "count": 2,
        "repair": False,
        "binding": {"challenge": "c"},
    }
    ret.update(over)
    return ret


def test_digests_return_is_normalised():
    checked = multimaster_keys.check_inventory_return(digests_return(), "digests")
    assert checked == {
        "alive": True,
        "digest": HEX64,
        "buckets": {3: HEX16, 17: HEX16},
        "count": 2,
        "repair": False,
    }


@pytest.mark.parametrize(
    "over, words",
    [
        ({"alive": "yes"}, "alive"),
        ({"digest": "ab"}, "digest"),
        ({"digest": "zz" * 32}, "digest"),
        ({"buckets": []}, "buckets"),
        ({"buckets": {multimaster_keys.BUCKETS: HEX16}}, "bucket"),
        ({"buckets": {-1: HEX16}}, "bucket"),
        ({"buckets": {"x": HEX16}}, "bucket 'x'"),
        ({"buckets": {True: HEX16}}, "bucket"),
        ({"buckets": {1: "abc"}}, "bucket 1"),
        ({"buckets": {1: HEX16, "1": HEX16}}, "twice"),
        ({"count": -1}, "count"),
        ({"count": True}, "count"),
        ({"count": "3"}, "count"),
        ({"repair": None}, "repair"),
    ],
)
def test_digests_return_of_another_shape_is_refused(over, words):
    with pytest.raises(multimaster_keys.ReturnError, match=words):
        multimaster_keys.check_inventory_return(digests_return(**over), "digests")


def test_digests_return_with_too_many_buckets_is_refused():
    buckets = {str(b): HEX16 for b in range(multimaster_keys.BUCKETS)}
    buckets["01"] = HEX16
    with pytest.raises(multimaster_keys.ReturnError, match="buckets"):
        multimaster_keys.check_inventory_return(digests_return(buckets=buckets), "digests")


def test_a_return_that_is_not_a_mapping_is_refused():
    for kind in ("digests", "entries"):
        with pytest.raises(multimaster_keys.ReturnError, match="not a mapping"):
            multimaster_keys.check_inventory_return(["alive"], kind)


def entries_return(**over):
    ret = {
        "alive": True,
        "entries": {"web": ["accepted", A, X], "-rf": ["pending", None]},
        "pubs": {"web": {"key": GOOD, "denied": OTHER}},
        "binding": {"challenge": "c"},
    }
    ret.update(over)
    return ret


def test_entries_return_is_normalised_to_entries():
    checked = multimaster_keys.check_inventory_return(entries_return(), "entries")
    assert checked["alive"] is True
    # Ids a key store can hold but the formula refuses are kept: the plan reports them.
    assert checked["entries"] == {
        "web": multimaster_keys.Entry("accepted", A, X),
        "-rf": multimaster_keys.Entry("pending", None),
    }
    assert isinstance(checked["entries"]["web"], multimaster_keys.Entry)
    assert checked["pubs"] == {"web": {"key": GOOD, "denied": OTHER}}


@pytest.mark.parametrize(
    "over, words",
    [
        ({"alive": 1}, "alive"),
        ({"entries": [["accepted", A]]}, "entries"),
        ({"entries": {"web": ["accepted", "A"]}}, "entry of 'web'"),
        ({"entries": {"a/b": ["accepted", A]}}, "'a/b'"),
        ({"entries": {"x" * 256: ["accepted", A]}}, "id"),
        ({"entries": {5: ["accepted", A]}}, "id 5"),
        ({"pubs": None}, "pubs"),
        ({"pubs": {"other": {"key": GOOD}}}, "'other'"),
        ({"pubs": {"web": GOOD}}, "pubs of 'web'"),
        ({"pubs": {"web": {"private": GOOD}}}, "'private'"),
        ({"pubs": {"web": {"key": None}}}, "pubs of 'web'"),
        ({"pubs": {"web": {"key": "x" * (16 * 1024 + 1)}}}, "16384"),
    ],
)
def test_entries_return_of_another_shape_is_refused(over, words):
    with pytest.raises(multimaster_keys.ReturnError, match=words):
        multimaster_keys.check_inventory_return(entries_return(**over), "entries")


def test_entries_return_is_capped():
    ret = entries_return(entries={f"m{i}": ["accepted", A] for i in range(11)}, pubs={})
    assert len(multimaster_keys.check_inventory_return(ret, "entries", max_entries=11)["entries"])
    with pytest.raises(multimaster_keys.ReturnError, match="at most 10"):
        multimaster_keys.check_inventory_return(ret, "entries", max_entries=10)


def test_unknown_return_kind_is_a_programming_error():
    with pytest.raises(ValueError, match="kind"):
        multimaster_keys.check_inventory_return({}, "everything")


def test_peer_keys_reads_each_pub_canonically_skips_links_and_marks_invalid(tmp_path):
    (tmp_path / "10.0.0.1.pub").write_text(GOOD)
    (tmp_path / "10.0.0.2.pub").write_text(GOOD + "junk\n")
    (tmp_path / "10.0.0.3.pub").symlink_to(tmp_path / "10.0.0.1.pub")
    (tmp_path / "notes.txt").write_text(OTHER)
    assert multimaster_keys.peer_keys(str(tmp_path)) == {"10.0.0.1": GOOD, "10.0.0.2": None}
    assert multimaster_keys.peer_keys(str(tmp_path / "absent")) == {}
