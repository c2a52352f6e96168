"""
``pillar.example`` documents every option of ``parameters/defaults.yaml`` and is itself valid.
"""

import multimaster_settings as ms
import salt.utils.yaml

from tests.support.loading import ROOT


def example():
    with open(ROOT / "pillar.example", encoding="utf-8") as handle:
        return salt.utils.yaml.safe_load(handle)["multimaster"]


def key_paths(data, prefix=""):
    paths = set()
    for key, value in data.items():
        path = f"{prefix}{key}"
        paths.add(path)
        if isinstance(value, dict) and value:
            paths |= key_paths(value, path + ":")
    return paths


def test_every_default_option_is_in_pillar_example(defaults):
    missing = key_paths(defaults) - key_paths(example())
    assert not missing, f"pillar.example lacks {sorted(missing)}"


def test_every_master_entry_option_is_in_pillar_example():
    entries = example()["masters"]
    documented = set().union(*(entry.keys() for entry in entries))
    assert documented >= {"id", "host", "interface", "minion_id", "config_dir"}


def test_pillar_example_passes_validation(defaults):
    settings = ms.build(example(), defaults)
    assert settings["mode"] == "failover"
    assert ms.minion_config(settings)["master_type"] == "failover"
    master = ms.master_config(settings, ms.primary(settings))
    assert "publisher_acl" in master and "external_auth" in master


def test_pillar_example_sets_nothing_unknown(defaults):
    # Every key of pillar.example (outside the free-form acl/config and the masters list) is an
    # option the defaults know: a typo here would be silently ignored by the formula.
    free = ("master:acl:", "master:config:", *(f"master:{key}" for key in ms.OWN_MASTER_KEYS))
    unknown = {
        path
        for path in key_paths(example()) - key_paths(defaults)
        if not path.startswith(free) and not path.startswith("masters")
    }
    assert not unknown, f"pillar.example sets unknown options {sorted(unknown)}"
