"""
What a control minion answers a runner: given the runner's ``answer_nonce``, every
``multimaster_peer`` function's answer, or the reason it failed, comes back signed with the
control minion's own key over the function, its master id, the nonce and the answer's digest.
Salt takes a return's minion id on the sender's word (3008's ``resource_id``): the signature is
what proves the answer is this minion's, for this call.
"""

import inspect

import multimaster_seal
import pytest
import salt.minion
from salt.exceptions import CommandExecutionError, SaltInvocationError

from tests.support.keyfactory import priv_pem, pub_pem, rsa_private

CONTROL = rsa_private(tag=70)
MASTER = {"id": "m2", "host": "10.0.0.2", "config_dir": "/etc/salt", "minion_id": "cm2"}
SECTION = {"ports": {"publish": 4505, "ret": 4506}, "masters": [MASTER]}
NONCE = "ab" * 32
SERVED = {"served": True, "reason": "signed in"}


@pytest.fixture
def configure_loader_modules(peer, tmp_path):
    """
    m2's control minion cm2, its own key in its pki dir, the set in its pillar.
    """
    pki = tmp_path / "pki"
    pki.mkdir()
    (pki / "minion.pem").write_text(priv_pem(CONTROL))
    pillar = {"multimaster": SECTION}
    return {
        peer: {
            "__opts__": {"id": "cm2", "conf_file": "/etc/salt/minion", "pki_dir": str(pki)},
            "__salt__": {"pillar.get": lambda key, default=None, **kw: pillar.get(key, default)},
            "__context__": {},
        }
    }


@pytest.fixture
def serves(peer, monkeypatch):
    """
    ``serves(outcome)``: the sign-in behind ``verify_master_key`` returns or raises ``outcome``.
    """

    def serves(outcome):
        def verify(*args, **kwargs):
            if isinstance(outcome, Exception):
                raise outcome
            return outcome["served"], outcome["reason"]

        monkeypatch.setattr(peer.multimaster_masterkey, "verify_served", verify)

    return serves


def opened(document, function="verify_master_key", nonce=NONCE):
    return multimaster_seal.open_answer(document, function, nonce, pub_pem(CONTROL))


def test_an_answer_for_a_runner_is_signed_by_the_control_minion(peer, serves):
    serves(SERVED)
    document = peer.verify_master_key("10.0.0.2", 4506, "PUB", answer_nonce=NONCE)
    assert opened(document) == ("m2", False, SERVED)


def test_without_a_nonce_the_answer_is_returned_as_it_is(peer, serves):
    # The CLI, and this module's own functions calling each other (master_report).
    serves(SERVED)
    assert peer.verify_master_key("10.0.0.2", 4506, "PUB") == SERVED


def test_a_refusal_comes_back_signed_with_its_reason(peer, serves):
    serves(CommandExecutionError("m2: the sign-in was refused"))
    document = peer.verify_master_key("10.0.0.2", 4506, "PUB", answer_nonce=NONCE)
    assert opened(document) == ("m2", True, "m2: the sign-in was refused")


def test_an_unexpected_error_is_named_by_its_type_not_its_text(peer, serves):
    serves(KeyError("/var/cache/salt/secret-path"))
    document = peer.verify_master_key("10.0.0.2", 4506, "PUB", answer_nonce=NONCE)
    master, failed, reason = opened(document)
    assert failed and "secret-path" not in reason, reason
    assert "verify_master_key failed on cm2: KeyError" in reason and "log" in reason, reason


def test_a_control_minion_missing_from_the_pillar_signs_its_refusal_for_no_master(
    peer, monkeypatch
):
    monkeypatch.setitem(peer.__opts__, "id", "cm9")
    document = peer.master_settled(answer_nonce=NONCE)
    master, failed, reason = opened(document, "master_settled")
    assert (master, failed) == (None, True) and "cm9 is not the control minion" in reason


def test_a_nonce_that_is_not_one_is_refused_unsigned(peer, serves):
    serves(SERVED)
    with pytest.raises(multimaster_seal.SealError, match="answer_nonce: got 'x'"):
        peer.verify_master_key("10.0.0.2", 4506, "PUB", answer_nonce="x")


def test_salt_passes_the_nonce_and_still_refuses_unknown_arguments(peer):
    """
    Salt's minion matches a publish's keyword arguments against the function's signature: the
    nonce must be in it, and an argument the function does not take must still be refused.
    """
    args = ["10.0.0.2", 4506, "PUB"]
    _, kwargs = salt.minion.load_args_and_kwargs(
        peer.verify_master_key, [*args, {"__kwarg__": True, "answer_nonce": NONCE}]
    )
    assert kwargs == {"answer_nonce": NONCE}
    with pytest.raises(SaltInvocationError, match="bogus"):
        salt.minion.load_args_and_kwargs(
            peer.verify_master_key, [*args, {"__kwarg__": True, "bogus": 1}]
        )


def test_every_function_of_the_module_answers_signed(peer):
    public = [
        name
        for name, value in vars(peer).items()
        if inspect.isfunction(value)
        and not name.startswith("_")
        and value.__module__ == peer.__name__
    ]
    assert "key_inventory" in public and "apply_roots" in public, public
    unsigned = [
        n for n in public if "answer_nonce" not in inspect.signature(getattr(peer, n)).parameters
    ]
    assert unsigned == []
