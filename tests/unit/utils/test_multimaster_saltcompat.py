"""
The Salt-line adapter (_utils/multimaster_saltcompat.py), the key store and the master's key
files on both layouts: the 3008 key cache (``<id>.pem`` + ``master.pem`` links) and 3006/3007
(``master.pem`` itself). Runs on every Salt line CI tests: the running Salt's own ``MasterKeys``
loads what was installed.
"""

import os
import stat
import sys

import multimaster_keystore as ks
import multimaster_masterkeyfiles as mkf
import multimaster_pillarcheck
import multimaster_saltcompat as layout
import multimaster_settings
import pytest
import salt.config
import salt.crypt
import salt.version
from salt.exceptions import CommandExecutionError

from tests.support import loading
from tests.support.keyfactory import priv_pem, pub_pem, rsa_private

KEY = rsa_private(tag=21)
IS_3008 = salt.version.__saltstack_version__.major >= 3008


def _legacy_opts(tmp_path):
    opts = loading.master_opts(tmp_path)
    opts.pop(layout.KEY_CACHE_OPTION, None)
    return opts


def test_the_adapter_reads_the_running_salt_not_its_version_string():
    # Cross-checked against the version here, and only here.
    assert layout.has_key_cache() is IS_3008
    assert layout.can_cluster() is (salt.version.__saltstack_version__.major >= 3007)


def test_the_legacy_layout_keeps_master_pem_as_the_files_themselves(tmp_path):
    mopts = _legacy_opts(tmp_path)
    pem, pub = priv_pem(KEY), pub_pem(KEY)
    assert mkf.master_key_files(mopts) == ("master.pem", "master.pub")
    mkf.install_master_key(mopts, pem, pub)
    for name, text in (("master.pem", pem), ("master.pub", pub)):
        path = os.path.join(mopts["pki_dir"], name)
        st = os.lstat(path)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o400
        with open(path, encoding="utf-8") as handle:
            assert handle.read() == text
    assert not os.path.lexists(os.path.join(mopts["pki_dir"], "master1.pem"))
    assert mkf.read_master_key(mopts) == pub and mkf.read_master_key(mopts, private=True) == pem
    assert mkf.master_key_pair_problems(mopts) == []


def test_the_legacy_layout_reads_minion_keys_from_the_files(tmp_path):
    mopts = _legacy_opts(tmp_path)
    accepted = tmp_path / "pki" / "minions"
    accepted.mkdir()
    (accepted / "web1").write_text(pub_pem(KEY))
    state, pem, denied = ks.key_entry(mopts, "web1")
    assert (state, pem, denied) == ("accepted", pub_pem(KEY), False)
    assert ks.key_entry(mopts, "nobody") == (None, None, False)
    with pytest.raises(CommandExecutionError, match="no key cache"):
        layout.key_cache(mopts)


def test_an_installed_pair_is_what_the_running_salt_loads(tmp_path):
    mopts = loading.master_opts(tmp_path)
    pem, pub = priv_pem(KEY), pub_pem(KEY)
    mkf.install_master_key(mopts, pem, pub)
    keys = salt.crypt.MasterKeys(mopts)
    assert keys.get_pub_str().strip() == pub.strip()
    assert mkf.read_master_key(mopts) == pub


def test_cluster_mode_is_refused_where_salt_has_no_cluster(monkeypatch):
    monkeypatch.setattr(layout, "can_cluster", lambda: False)
    settings = {"cluster": {"secret": "s" * 64}, "masters": []}
    with pytest.raises(multimaster_pillarcheck.SettingsError, match="Salt 3007 or newer"):
        multimaster_settings.cluster_config(settings, {}, "/etc/salt/pki/master")


def test_no_key_cache_option_is_rendered_for_a_salt_without_one(monkeypatch):
    monkeypatch.setattr(layout, "has_key_cache", lambda: False)
    monkeypatch.setattr(layout, "can_cluster", lambda: True)
    master = {"id": "127.0.0.2", "host": "127.0.0.2"}
    settings = {
        "cluster": {
            "secret": "s" * 64,
            "id": "c1",
            "pki_dir": "",
            "pool_port": 4520,
            "isolated_filesystem": True,
            "keys_cache_driver": "",
            "publish_session": 86400,
            "auto_replace_voters": True,
        },
        "masters": [master, {"id": "127.0.0.3", "host": "127.0.0.3"}],
    }
    config = multimaster_settings.cluster_config(settings, master, "/etc/salt/pki/master")
    assert layout.KEY_CACHE_OPTION not in config and config["cluster_peers"] == ["127.0.0.3"]


@pytest.mark.parametrize(
    ("relenv", "salt_dir", "install", "gitfs"),
    [
        (True, "/opt/saltstack/salt/lib/python3.10/site-packages/salt", "onedir", "pip"),
        # A onedir Salt is onedir wherever its files are.
        (True, "/usr/lib/python3/dist-packages/salt", "onedir", "pip"),
        (False, "/usr/lib/python3/dist-packages/salt", "package", "pkg"),
        (False, "/usr/lib64/python3.9/site-packages/salt", "package", "pkg"),
        (False, "/usr/local/lib/python3.11/dist-packages/salt", "pip", "pip"),
        (False, "/srv/venv/lib/python3.11/site-packages/salt", "pip", "pip"),
    ],
)
def test_python_deps_go_where_the_masters_python_sees_it(
    monkeypatch, relenv, salt_dir, install, gitfs
):
    if relenv:
        monkeypatch.setattr(sys, "RELENV", "/opt/saltstack/salt", raising=False)
    else:
        monkeypatch.delattr(sys, "RELENV", raising=False)
    monkeypatch.setattr(layout.os.path, "realpath", lambda path: path)
    monkeypatch.setattr(layout.salt, "__file__", f"{salt_dir}/__init__.py")
    assert layout.salt_install() == install
    for part in multimaster_pillarcheck.PYTHON_DEPS:
        settings = {"lookup": {"master": {f"{part}_install": "auto"}}}
        assert multimaster_settings.python_install(settings, part, install) == gitfs
        settings["lookup"]["master"][f"{part}_install"] = "pkg"
        assert multimaster_settings.python_install(settings, part, install) == "pkg"
