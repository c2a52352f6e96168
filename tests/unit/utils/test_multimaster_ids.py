"""
Id hygiene (DESIGN.md §6.1): stricter than Salt's own ``valid_id``.
"""

import multimaster_ids
import pytest
import salt.utils.verify
from salt.exceptions import SaltInvocationError

GOOD = ["master1", "web-01.example.com", "a_b", "A", "_x", "0", "x" * 64]
BAD = [
    "-rf",
    "m*",
    "a,b",
    ".hidden",
    "a\nb",
    "abc\n",
    "x" * 65,
    "x" * 300,
    "../x",
    "a/b",
    "a\\b",
    "a b",
    "a\tb",
    "a\x00b",
    "",
    "m?",
    "[ab]",
    "a;b",
    "a|b",
    "$(id)",
    "é",
    None,
    5,
    ["master1"],
]


@pytest.mark.parametrize("value", GOOD)
def test_good_ids(value):
    assert multimaster_ids.is_valid_id(value)
    assert multimaster_ids.check_id(value) == value


@pytest.mark.parametrize("value", BAD, ids=[repr(v)[:24] for v in BAD])
def test_bad_ids(value):
    assert not multimaster_ids.is_valid_id(value)
    with pytest.raises(SaltInvocationError) as err:
        multimaster_ids.check_id(value, "multimaster:masters[3]:minion_id")
    message = str(err.value)
    assert message.startswith("multimaster:masters[3]:minion_id: ")
    assert repr(value) in message
    assert "expected 1-64 bytes" in message


@pytest.mark.parametrize("value", ["-rf", "m*", "a,b", ".hidden", "x" * 300])
def test_stricter_than_salt(value):
    # DESIGN.md §5: Salt's valid_id lets these through; ours must not.
    assert salt.utils.verify.valid_id({"pki_dir": "/etc/salt/pki/master"}, value)
    assert not multimaster_ids.is_valid_id(value)


def test_limit_is_bytes_not_characters():
    # 64 ASCII bytes pass; the same count of two-byte characters would be refused anyway,
    # but the limit itself counts bytes.
    assert multimaster_ids.MAX_ID_BYTES == 64
    assert multimaster_ids.is_valid_id("a" * 64)
    assert not multimaster_ids.is_valid_id("a" * 65)


def test_problems_name_each_bad_value_and_skip_what_is_left_out():
    found = multimaster_ids.problems({"new": "master3", "gone": "m*", "stop": None, "n": "a\nb"})
    assert found == [
        "gone: 'm*' is not a valid id; expected 1-64 bytes of letters, digits, '_', '.', '-', "
        "not starting with '.' or '-'",
        "n: 'a\\nb' is not a valid id; expected 1-64 bytes of letters, digits, '_', '.', '-', "
        "not starting with '.' or '-'",
    ]
    assert multimaster_ids.problems({"new": "master3", "stop": None}) == []
