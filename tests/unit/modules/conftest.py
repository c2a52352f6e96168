"""
Shared by the execution modules' unit tests: the modules loaded once per test module, and the
control minion of master2 they run as (its config dir, options and pillar).
"""

import os
import pwd

import pytest
import salt.utils.yaml

from tests.support.loading import load_for


@pytest.fixture(scope="module")
def peer(request):
    """
    The control minions' execution module (``_modules/multimaster_peer.py``).
    """
    return load_for(request, "_modules/multimaster_peer.py")


@pytest.fixture
def conf_dir(tmp_path):
    """
    The minion's config dir, with the master config a control minion reads its master's paths from.
    """
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "minion").write_text("")
    with open(conf / "master", "w", encoding="utf-8") as handle:
        salt.utils.yaml.safe_dump(
            {
                "pki_dir": str(tmp_path / "master-pki"),
                "cachedir": str(tmp_path / "master-cache"),
                "pidfile": str(tmp_path / "master.pid"),
                "user": pwd.getpwuid(os.getuid()).pw_name,
            },
            handle,
        )
    return conf


@pytest.fixture
def opts(tmp_path, conf_dir):
    """
    The module's ``__opts__``: the control minion of master2; tests change it in place.
    """
    return {
        "id": "master2",
        "conf_file": str(conf_dir / "minion"),
        "pki_dir": str(tmp_path / "minion-pki"),
        "pidfile": str(tmp_path / "minion.pid"),
    }


@pytest.fixture
def pillar():
    """
    The module's ``__pillar__``, also what its ``pillar.get`` reads; tests change it in place.
    """
    return {
        "multimaster": {
            "masters": [
                {"id": "master1", "host": "10.0.3.61", "config_dir": "/nonexistent/master1"},
                {"id": "master2", "host": "10.0.3.230"},
            ]
        }
    }


@pytest.fixture
def mod_dunders(opts, pillar):
    """
    What Salt's loader would inject into the ``multimaster`` execution module.
    """
    return {
        "__opts__": opts,
        "__pillar__": pillar,
        "__salt__": {
            "pillar.get": lambda key, default=None, **kw: pillar.get(key, default),
        },
        "__context__": {},
        "__grains__": {"os_family": "Debian"},
    }
