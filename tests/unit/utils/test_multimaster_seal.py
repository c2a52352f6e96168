"""
Sealed delivery of secrets and signed orders (_utils/multimaster_seal.py): bound to a
single-use challenge, a target and an expiry, so a copy cannot be replayed.
"""

import copy
import hashlib
import json
import time

import multimaster_seal
import pytest

from tests.support.keyfactory import priv_pem, pub_pem, rsa_private

RECIPIENT = rsa_private(tag=10)
SENDER = rsa_private(tag=11)
STRANGER = rsa_private(tag=12)
SECRET = {"pem": "PRIVATE-MARKER-" + "x" * 64, "pub": "pub"}
TARGET = {"target": "master2", "config_dir": "/etc/salt"}


@pytest.fixture
def store(tmp_path):
    return multimaster_seal.ChallengeStore(str(tmp_path / "challenges"))


def sealed(store, **bound_extra):
    bound = multimaster_seal.bind(store.issue(), "master2", "/etc/salt", fp="ab")
    bound.update(bound_extra)
    return multimaster_seal.seal(
        SECRET, "master_key", "cm2", pub_pem(RECIPIENT), priv_pem(SENDER), bound
    )


def unseal(envelope, store, expect=TARGET, recipient_key=RECIPIENT, signer=SENDER):
    return multimaster_seal.unseal(
        envelope,
        "master_key",
        "cm2",
        priv_pem(recipient_key),
        pub_pem(signer),
        expect,
        store,
    )


def test_round_trip_and_no_plaintext_in_the_envelope(store):
    envelope = sealed(store)
    assert "PRIVATE-MARKER" not in repr(envelope)
    body, bound = unseal(envelope, store)
    assert body == SECRET
    assert bound["fp"] == "ab"


def test_the_same_envelope_opens_once(store):
    envelope = sealed(store)
    unseal(copy.deepcopy(envelope), store)
    with pytest.raises(multimaster_seal.SealError, match="already used"):
        unseal(envelope, store)


def test_a_challenge_the_recipient_never_issued_is_refused(store, tmp_path):
    other = multimaster_seal.ChallengeStore(str(tmp_path / "elsewhere"))
    envelope = sealed(other)
    with pytest.raises(multimaster_seal.SealError, match="unknown or already used"):
        unseal(envelope, store)


def test_expired_or_overlong_envelopes_are_refused(store):
    with pytest.raises(multimaster_seal.SealError, match="expired"):
        unseal(sealed(store, expires=int(time.time()) - 1), store)
    with pytest.raises(multimaster_seal.SealError, match="more than"):
        unseal(sealed(store, expires=int(time.time()) + 86400), store)


@pytest.mark.parametrize(
    "expect",
    [
        {"target": "master3", "config_dir": "/etc/salt"},
        {"target": "master2", "config_dir": "/srv/other"},
    ],
    ids=["other-target", "other-config-dir"],
)
def test_an_envelope_bound_to_another_target_is_refused(store, expect):
    with pytest.raises(multimaster_seal.SealError, match="bound to"):
        unseal(sealed(store), store, expect=expect)


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda e: e.update(recipient="cm3"), "not for"),
        (lambda e: e.update(purpose="master_sign"), "not for"),
        (lambda e: e.update(ciphertext=e["ciphertext"][:-8] + "AAAAAAA="), "signature"),
        (lambda e: e["bound"].update(target="master3"), "signature"),
        (lambda e: e["bound"].update(expires=e["bound"]["expires"] + 60), "signature"),
        (lambda e: e.update(v=1), "version"),
    ],
    ids=["other-recipient", "other-purpose", "tampered", "rebound", "extended", "version"],
)
def test_tampered_or_misaddressed_envelopes_are_refused(store, change, words):
    envelope = copy.deepcopy(sealed(store))
    change(envelope)
    with pytest.raises(multimaster_seal.SealError, match=words):
        unseal(envelope, store, expect={})


def test_wrong_signer_or_wrong_recipient_key_is_refused(store):
    with pytest.raises(multimaster_seal.SealError, match="signature"):
        unseal(sealed(store), store, signer=STRANGER)
    with pytest.raises(multimaster_seal.SealError, match="cannot be opened"):
        unseal(sealed(store), store, recipient_key=STRANGER)


def test_a_refused_forgery_does_not_burn_the_challenge(store):
    envelope = sealed(store)
    forged = copy.deepcopy(envelope)
    forged["bound"]["fp"] = "cd"
    with pytest.raises(multimaster_seal.SealError, match="signature"):
        unseal(forged, store)
    unseal(envelope, store)


def test_signed_orders_cover_the_instruction_and_open_once(store):
    instruction = {"actions": [{"id": "m1", "op": "accept", "fp": "ab"}]}
    bound = multimaster_seal.bind(store.issue(), "master2", "/etc/salt")
    signed = multimaster_seal.order(instruction, "key_actions", "cm2", priv_pem(SENDER), bound)

    def check(document, what):
        return multimaster_seal.check_order(
            document, what, "key_actions", "cm2", pub_pem(SENDER), TARGET, store
        )

    changed = {"actions": [{"id": "m1", "op": "accept", "fp": "cd"}]}
    with pytest.raises(multimaster_seal.SealError, match="does not match"):
        check(copy.deepcopy(signed), changed)
    assert check(copy.deepcopy(signed), instruction)["target"] == "master2"
    with pytest.raises(multimaster_seal.SealError, match="already used"):
        check(signed, instruction)


@pytest.mark.parametrize("sent, here, opens", [(2, 2, True), (3, 2, True), (1, 2, False)])
def test_an_order_from_an_older_epoch_is_refused(store, sent, here, opens):
    instruction = {"actions": []}
    challenge = store.issue()
    bound = multimaster_seal.bind(challenge, "master2", "/etc/salt", epoch=sent)
    signed = multimaster_seal.order(instruction, "key_actions", "cm2", priv_pem(SENDER), bound)
    sealed = multimaster_seal.seal(
        SECRET, "master_key", "cm2", pub_pem(RECIPIENT), priv_pem(SENDER), dict(bound)
    )
    order_args = (instruction, "key_actions", "cm2", pub_pem(SENDER), TARGET, store, here)
    seal_args = ("master_key", "cm2", priv_pem(RECIPIENT), pub_pem(SENDER), TARGET, store, here)
    if opens:
        assert multimaster_seal.check_order(signed, *order_args)["epoch"] == sent
        return
    for check, document, args in (
        (multimaster_seal.check_order, signed, order_args),
        (multimaster_seal.unseal, sealed, seal_args),
    ):
        with pytest.raises(multimaster_seal.SealError, match="older than this set's epoch 2"):
            check(document, *args)
    # Refused before its challenge was spent: an order of the current epoch still opens.
    bound = multimaster_seal.bind(challenge, "master2", "/etc/salt", epoch=2)
    signed = multimaster_seal.order(instruction, "key_actions", "cm2", priv_pem(SENDER), bound)
    assert multimaster_seal.check_order(signed, *order_args)["epoch"] == 2


def test_an_order_of_a_formula_without_epochs_counts_as_the_first():
    bound = multimaster_seal.bind("ab" * 32, "master2", "/etc/salt")
    assert "epoch" not in bound
    multimaster_seal._check_epoch(bound.get("epoch", 1), 1)
    with pytest.raises(multimaster_seal.SealError):
        multimaster_seal._check_epoch(bound.get("epoch", 1), 2)


# --- signed answers --------------------------------------------------------------------------

NONCE = "ab" * 32
ANSWER = {"alive": True, "buckets": {7: "d" * 16, 12: "e" * 16}, "ids": ["a", "b"], "n": 1.5}


def signed_answer(answer=ANSWER, function="key_inventory", master="master2", nonce=NONCE):
    return multimaster_seal.sign_answer(answer, function, master, nonce, priv_pem(RECIPIENT))


def open_answer(document, function="key_inventory", nonce=NONCE, signer=RECIPIENT):
    return multimaster_seal.open_answer(document, function, nonce, pub_pem(signer))


def test_a_signed_answer_opens_with_its_signer_s_key():
    assert open_answer(signed_answer()) == ("master2", False, ANSWER)


@pytest.mark.parametrize(
    "change, opener",
    [
        (lambda d: d["answer"].update(alive=False), {}),
        (lambda d: d.update(master="master1"), {}),
        (lambda d: d.update(failed=True), {}),
        (lambda d: None, {"function": "master_settled"}),
        (lambda d: None, {"nonce": "cd" * 32}),
        (lambda d: None, {"signer": STRANGER}),
    ],
    ids=["altered", "other-master", "made-a-failure", "other-function", "other-nonce", "other-key"],
)
def test_an_answer_altered_or_for_another_call_is_refused(change, opener):
    document = copy.deepcopy(signed_answer())
    change(document)
    with pytest.raises(multimaster_seal.SealError, match="does not verify"):
        open_answer(document, **opener)


@pytest.mark.parametrize(
    "document",
    [ANSWER, "ERROR: refused", None, dict(signed_answer(), v=1), dict(signed_answer(), extra=1)],
    ids=["plain", "string", "none", "other-version", "extra-field"],
)
def test_what_is_not_a_signed_answer_is_refused(document):
    with pytest.raises(multimaster_seal.SealError, match="not a signed answer"):
        open_answer(document)


def test_the_answer_digest_is_that_of_the_canonical_json():
    plain = {"b": [1, {"z": None, "a": "\u00e9"}], "a": True, "c": 2.5}
    canonical = json.dumps(plain, sort_keys=True, separators=(",", ":")).encode()
    assert multimaster_seal.answer_digest(plain) == hashlib.sha256(canonical).hexdigest()


def test_an_answer_read_back_from_a_json_job_cache_still_verifies():
    # JSON turns integer keys into strings (and their order with them): the digest must not see it.
    document = signed_answer()
    document["answer"] = json.loads(json.dumps(document["answer"]))
    assert open_answer(document)[2]["buckets"] == {"7": "d" * 16, "12": "e" * 16}


def test_an_answer_json_cannot_carry_is_refused():
    with pytest.raises(multimaster_seal.SealError, match="a bytes"):
        signed_answer({"raw": b"\x00"})
