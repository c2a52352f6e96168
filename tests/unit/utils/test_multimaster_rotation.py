"""
The rotation plane's planning: generations, fresh pairs, the refusal of a minion a new key
would cut off, the order masters rotate in.
"""

import os

import multimaster_control
import multimaster_keys
import multimaster_masterkey
import multimaster_rotation
import pytest
from cryptography.hazmat.primitives import serialization
from salt.exceptions import CommandExecutionError

SIGNING = {"mode": "failover", "signing": {"enabled": True}}


class Keys:
    def __init__(self, accepted):
        self.accepted = accepted

    def list_status(self, status):
        assert status == "acc"
        return {"minions": list(self.accepted)}


@pytest.fixture
def run(tmp_path):
    return multimaster_control.Run({"pki_dir": str(tmp_path)}, {})


def test_a_new_pair_is_a_valid_master_key_pair():
    pem, pub = multimaster_rotation.new_pair(2048)
    assert multimaster_keys.canonical(pub) == pub
    assert multimaster_keys.private_key_fingerprint(pem) == multimaster_keys.fingerprint(pub)
    # PKCS#1, as Salt writes a master's key: re-encoding it that way gives the same text.
    key = serialization.load_pem_private_key(pem.encode(), None)
    pkcs1 = serialization.PrivateFormat.TraditionalOpenSSL
    encoding, plain = serialization.Encoding.PEM, serialization.NoEncryption()
    assert key.private_bytes(encoding, pkcs1, plain).decode() == pem
    assert multimaster_rotation.new_pair(2048)[1] != pub


@pytest.mark.parametrize("value", [None, 0, -1, "two", True, 1.5, [1]])
def test_a_generation_that_is_not_a_count_is_refused_by_value(value):
    with pytest.raises(multimaster_control.Refused, match="generation: got"):
        multimaster_rotation.checked_generation(value)


def test_the_first_rotation_is_generation_1(run):
    with pytest.raises(multimaster_control.Refused, match="the next is 1"):
        multimaster_rotation.generation_record(run.opts, 2)
    record = multimaster_rotation.generation_record(run.opts, 1)
    assert record == {"generation": 1, "masters": {}, "done": False}


def test_an_unfinished_generation_is_resumed_and_blocks_the_next(run):
    multimaster_rotation.write_record(run.opts, {"generation": 1, "masters": {"m2": "ab"}})
    assert multimaster_rotation.generation_record(run.opts, 1)["masters"] == {"m2": "ab"}
    with pytest.raises(multimaster_control.Refused, match="generation 1 did not finish"):
        multimaster_rotation.generation_record(run.opts, 2)


def test_a_finished_generation_allows_only_the_next(run):
    done = {"generation": 3, "masters": {"m1": "cd"}, "done": True}
    multimaster_rotation.write_record(run.opts, done)
    assert multimaster_rotation.generation_record(run.opts, 3) == done
    assert multimaster_rotation.generation_record(run.opts, 4)["masters"] == {}
    with pytest.raises(multimaster_control.Refused, match="the next is 4"):
        multimaster_rotation.generation_record(run.opts, 2)
    path = multimaster_rotation.record_path(run.opts)
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_peers_rotate_before_the_primary_and_rotated_masters_are_skipped():
    section = {**SIGNING, "masters": [{"id": "m1"}, {"id": "m2"}, {"id": "m3"}]}
    pubs = {m: multimaster_rotation.new_pair(2048)[1] for m in ("m1", "m2", "m3")}
    plan = {"info": {m: {"own_pub": pub} for m, pub in pubs.items()}}
    record = {"masters": {}}
    assert multimaster_rotation.planned(section, plan, record) == ["m2", "m3", "m1"]
    record["masters"]["m2"] = multimaster_keys.fingerprint(pubs["m2"])
    assert multimaster_rotation.planned(section, plan, record) == ["m3", "m1"]


def test_a_hot_set_that_stopped_half_way_gives_every_master_a_new_key():
    section = {"mode": "hot", "masters": [{"id": "m1"}, {"id": "m2"}, {"id": "m3"}]}
    pub = multimaster_rotation.new_pair(2048)[1]
    plan = {"info": {m: {"own_pub": pub} for m in ("m1", "m2", "m3")}}
    done = dict.fromkeys(("m1", "m2", "m3"), multimaster_keys.fingerprint(pub))
    assert multimaster_rotation.planned(section, plan, {"masters": done}) == []
    half = {**done, "m1": "another"}
    assert multimaster_rotation.planned(section, plan, {"masters": half}) == ["m2", "m3", "m1"]


@pytest.fixture
def minion(tmp_path):
    """
    A minion's opts that verify signed keys, its pki dir trusting a fresh signing pair;
    ``(opts, signing private PEM)``.
    """
    signing_pem, signing_pub = multimaster_rotation.new_pair(2048)
    (tmp_path / "master_sign.pub").write_text(signing_pub)
    (tmp_path / "minion_master.pub").write_text(multimaster_rotation.new_pair(2048)[1])
    (tmp_path / "minion_master.pub").chmod(0o644)
    opts = {"pki_dir": str(tmp_path), "verify_master_pubkey_sign": True}
    return opts, signing_pem


def _cached(opts):
    with open(os.path.join(opts["pki_dir"], "minion_master.pub")) as handle:
        return handle.read()


def test_a_minion_takes_a_key_signed_by_the_pair_it_trusts(minion):
    opts, signing_pem = minion
    pub = multimaster_rotation.new_pair(2048)[1]
    signature = multimaster_rotation.sign_key(signing_pem, pub)
    taken = multimaster_rotation.take_master_key(opts, pub, signature)
    assert taken == {"fingerprint": multimaster_keys.fingerprint(pub), "changed": True}
    assert _cached(opts) == pub
    assert os.stat(os.path.join(opts["pki_dir"], "minion_master.pub")).st_mode & 0o777 == 0o644
    assert multimaster_rotation.take_master_key(opts, pub, signature)["changed"] is False


def test_a_minion_refuses_a_key_another_pair_signed(minion):
    opts, _ = minion
    before = _cached(opts)
    pub = multimaster_rotation.new_pair(2048)[1]
    forged = multimaster_rotation.sign_key(multimaster_rotation.new_pair(2048)[0], pub)
    for signature in (forged, "not base64!", ""):
        with pytest.raises(CommandExecutionError, match="not signed by the signing pair"):
            multimaster_rotation.take_master_key(opts, pub, signature)
    assert _cached(opts) == before


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ({"verify_master_pubkey_sign": False}, "does not verify signed master keys"),
        ({"sign_pub_messages": True}, "sign_pub_messages"),
    ],
)
def test_a_minion_that_cannot_take_a_key_ahead_changes_nothing(minion, setting, says):
    opts, signing_pem = minion
    before = _cached(opts)
    pub = multimaster_rotation.new_pair(2048)[1]
    signature = multimaster_rotation.sign_key(signing_pem, pub)
    with pytest.raises(CommandExecutionError, match=says):
        multimaster_rotation.take_master_key({**opts, **setting}, pub, signature)
    assert _cached(opts) == before


def test_a_minion_that_trusts_no_signing_key_says_so(minion):
    opts, signing_pem = minion
    os.unlink(os.path.join(opts["pki_dir"], "master_sign.pub"))
    pub = multimaster_rotation.new_pair(2048)[1]
    with pytest.raises(CommandExecutionError, match="no readable master_sign.pub"):
        multimaster_rotation.take_master_key(
            opts, pub, multimaster_rotation.sign_key(signing_pem, pub)
        )


def test_a_minion_refuses_what_is_not_a_public_key_by_name(minion):
    opts, signing_pem = minion
    with pytest.raises(CommandExecutionError, match="pub: not exactly one"):
        multimaster_rotation.take_master_key(opts, "junk", "")


def _answers(**minions):
    return {"m1": {"minions": minions}}


def test_a_minion_that_does_not_verify_signed_keys_is_refused_by_name(run, monkeypatch):
    monkeypatch.setattr("salt.key.get_key", lambda opts: Keys(["web1", "web2"]))
    answers = {"m1": {"minions": {"web1": True}}, "m2": {"minions": {"web2": False}}}
    problem = multimaster_rotation.unready_minions(run, answers, False)
    assert "web2" in problem and "web1" not in problem
    assert "verify_master_pubkey_sign" in problem and "multimaster.minion" in problem


def test_a_minion_that_answers_no_master_is_refused_unless_skipped(run, monkeypatch):
    monkeypatch.setattr("salt.key.get_key", lambda opts: Keys(["web1", "down1"]))
    answers = _answers(web1=True)
    problem = multimaster_rotation.unready_minions(run, answers, False)
    assert "down1" in problem and "skip_unanswered=True" in problem
    assert multimaster_rotation.unready_minions(run, answers, True) is None


def test_every_verifying_minion_is_ready(run, monkeypatch):
    monkeypatch.setattr("salt.key.get_key", lambda opts: Keys(["web1", "web2"]))
    answers = {"m1": {"minions": {"web1": True}}, "m2": {"minions": {"web2": True}}}
    assert multimaster_rotation.unready_minions(run, answers, False) is None


@pytest.mark.parametrize(
    "answer", [{"minions": {"web1": "yes"}}, {"minions": ["web1"]}, {"minions": {1: True}}]
)
def test_a_malformed_readiness_answer_is_refused(answer):
    with pytest.raises(ValueError):
        multimaster_rotation.check_verifying(answer)


def test_only_a_hot_or_failover_set_that_signs_can_rotate():
    assert multimaster_rotation.unrotatable(SIGNING) is None
    assert multimaster_rotation.unrotatable({"mode": "hot", "signing": {"enabled": True}}) is None
    for mode in ("hot", "failover", "cluster"):
        section = {"mode": mode, "signing": {"enabled": mode == "cluster"}}
        assert "do not share a signing pair" in multimaster_rotation.unrotatable(section)


def test_a_master_that_signs_proves_its_new_key_with_its_signature(monkeypatch):
    stored = {True: "SIGN-PUB"}
    monkeypatch.setattr(
        multimaster_masterkey.multimaster_masterkeyfiles,
        "read_master_key",
        lambda mopts, signing=False: stored.get(signing),
    )
    signs = {"master_sign_pubkey": True}
    assert multimaster_masterkey.served_args(signs, "NEW", False) == ("NEW", "SIGN-PUB")
    assert multimaster_masterkey.served_args({}, "NEW", False) == ("NEW", None)


def test_a_minion_that_did_not_return_to_a_master_is_not_counted_there(monkeypatch):
    class Client:
        def __enter__(self):
            return self

        def __exit__(self, *_):
            return False

    def cmd(client, tgt, fun, timeout, arg, full_return):
        assert (tgt, fun, arg, full_return) == (
            "*",
            "config.get",
            ["verify_master_pubkey_sign"],
            True,
        )
        return {
            "web1": {"ret": True, "retcode": 0},
            "web2": False,
            "web3": {"ret": "", "retcode": 0},
            "web4": {"ret": False, "retcode": 0},
            "web5": {"out": "no_return", "ret": "Minion did not return. [No response]"},
        }

    monkeypatch.setattr("salt.client.get_local_client", lambda path: Client())
    monkeypatch.setattr(multimaster_rotation.multimaster_returns, "cmd", cmd)
    said = multimaster_rotation.minions_verifying("/etc/salt")
    assert said == {"web1": True, "web3": False, "web4": False}


def test_a_primary_that_cannot_be_stopped_is_reported_not_raised(tmp_path, monkeypatch):
    def refuse(*args):
        raise multimaster_rotation.CommandExecutionError("/run/salt-master.pid: not salt-master")

    opts = {"pidfile": "/run/salt-master.pid"}
    monkeypatch.setattr(multimaster_rotation.multimaster_keystore, "master_opts", lambda d: opts)
    monkeypatch.setattr(multimaster_rotation.multimaster_daemon, "stop_now", refuse)
    run = multimaster_control.Run({"conf_file": str(tmp_path / "master")}, {})
    section = {"masters": [{"id": "m1", "host": "127.0.0.1"}], "ports": {"ret": 4506}}
    report = multimaster_rotation.install_here(run, section, ("PEM", "PUB"), 1)
    assert report == {"result": False, "error": "/run/salt-master.pid: not salt-master"}
