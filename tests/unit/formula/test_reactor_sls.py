"""
The key reactor's SLS (``multimaster/reactor/keys.sls``) rendered as Salt's reactor renders it:
the ``salt/key`` event's act is mapped onto the operations ``multimaster.key_event`` takes, and
what must not propagate renders nothing.
"""

import pytest
import salt.utils.templates
import salt.utils.yaml

from tests.support.loading import ROOT

KEYS_SLS = ROOT / "multimaster" / "reactor" / "keys.sls"
RUNNERS_SYNCED = {"file.file_exists": lambda path: True, "log.error": lambda msg: None}


def render(data):
    ret = salt.utils.templates.render_jinja_tmpl(
        KEYS_SLS.read_text(),
        {
            "data": data,
            "tag": "salt/key",
            "saltenv": "base",
            "sls": "multimaster.reactor.keys",
            "opts": {
                "extension_modules": "/var/cache/salt/master/extmods",
                "cachedir": "/var/cache/salt/master",
            },
            "salt": RUNNERS_SYNCED,
        },
    )
    return salt.utils.yaml.safe_load(ret) or {}


def runner_args(high):
    (state,) = high.values()
    (args,) = (item["args"] for item in state["runner.multimaster.key_event"])
    return {k: v for arg in args for k, v in arg.items()}


@pytest.mark.parametrize(
    "act, op",
    [
        ("accepted", "accept"),
        ("accept", "accept"),
        ("rejected", "reject"),
        ("reject", "reject"),
        ("delete", "delete"),
    ],
)
def test_each_act_salt_fires_maps_onto_an_operation_key_event_takes(act, op):
    assert runner_args(render({"act": act, "id": "web1"})) == {"minion": "web1", "act": op}


@pytest.mark.parametrize(
    "data",
    [
        {"act": "pend", "id": "web1"},
        {"act": "denied", "id": "web1"},
        {"act": ["accept"], "id": "web1"},
        {"act": "accept", "id": ["web1"]},
        {"act": "accept", "id": "web1", "__peer_id": "10.0.0.2"},
        {"act": "accept", "id": "web1", "multimaster_replayed": True},
    ],
    ids=["pend", "denied", "act-list", "id-list", "forwarded", "replayed"],
)
def test_what_must_not_propagate_renders_nothing(data):
    assert render(data) == {}
