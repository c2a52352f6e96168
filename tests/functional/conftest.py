"""
Functional-test harness: Salt's own loader, renderers and state system in-process, on a masterless
minion with the formula on ``file_roots`` and a pillar of our choosing, everything under tmp.

The formula reaches Salt as a user would deliver it: ``file_roots`` holds ``multimaster/`` and the
``_modules``/``_states``/``_utils`` dirs, and ``saltutil.sync_all`` installs the modules.

Every call goes through pytest-salt-factories' ``Loaders``, one per environment (as saltext
projects have one ``loaders`` fixture per minion config), with its ``reset_state()`` after each
use, so each call starts as a new ``salt-call --local`` would: no ``__context__`` and an empty
cachedir.

Several minions live in this one process, and Salt's loader keeps one module object per module
name in ``sys.modules``. So each environment's ``Loaders`` loads under a namespace of its own
(``loaded_base_name``), and the state functions build a fresh ``HighState`` (loader, pillar) from
that environment's opts for every call: one environment's calls never run on another's modules.
"""

import contextlib
import itertools
import os
import pathlib
import pwd
import shutil

import pytest
import salt.config
import salt.utils.yaml
from saltfactories.utils.functional import Loaders

ROOT = pathlib.Path(__file__).resolve().parents[2]

_NAMESPACES = itertools.count()


def _dump(data, path):
    with open(path, "w", encoding="utf-8") as handle:
        salt.utils.yaml.safe_dump(data, handle, default_flow_style=False)


class SaltEnv:
    """
    One masterless minion: its own config dir (with a ``master`` file, so the host is also a
    master), pki/cache/run dirs, pillar and ``Loaders``; the synced modules are shared between
    environments (one ``extension_modules`` dir).
    """

    def __init__(self, base, file_root, extmods, minion_id, pillar, grains=None):
        self.base = base
        self.minion_id = minion_id
        self.extmods = extmods
        self.conf_dir = base / "conf"
        self.pillar_dir = base / "pillar"
        self.minion_pki = base / "pki" / "minion"
        self.master_pki = base / "pki" / "master"
        for path in (self.conf_dir, self.pillar_dir, self.minion_pki, self.master_pki):
            path.mkdir(parents=True)
        user = pwd.getpwuid(os.getuid()).pw_name
        _dump(
            {
                "pki_dir": str(self.master_pki),
                "cachedir": str(base / "cache" / "master"),
                # Salt's default is not below cachedir: /var/cache/salt/master/extmods.
                "extension_modules": str(base / "cache" / "master" / "extmods"),
                "pidfile": str(base / "run" / "salt-master.pid"),
                "sock_dir": str(base / "run" / "master"),
                "user": user,
            },
            self.conf_dir / "master",
        )
        _dump(
            {
                "id": minion_id,
                "file_client": "local",
                "file_roots": {"base": [str(file_root)]},
                "pillar_roots": {"base": [str(self.pillar_dir)]},
                "cachedir": str(base / "cache" / "minion"),
                "extension_modules": str(extmods),
                "utils_dirs": [str(extmods / "utils")],
                "pki_dir": str(self.minion_pki),
                "pidfile": str(base / "run" / "salt-minion.pid"),
                "sock_dir": str(base / "run" / "minion"),
                "log_file": str(base / "minion.log"),
                "user": user,
                # Static grains (os_family ...) override what this machine reports.
                "grains": grains or {},
            },
            self.conf_dir / "minion",
        )
        (self.pillar_dir / "top.sls").write_text("base:\n  '*':\n    - multimaster\n")
        if isinstance(pillar, str):
            (self.pillar_dir / "multimaster.sls").write_text(pillar)
        else:
            _dump({"multimaster": pillar}, self.pillar_dir / "multimaster.sls")
        self.made = {self.conf_dir / "master", self.conf_dir / "minion"}
        # Constructing a Loaders loads grains and pillar and runs saltutil.sync_all.
        opts = salt.config.minion_config(str(self.conf_dir / "minion"))
        # As salt-call sets it: state functions start from the pillar the minion compiled.
        opts["__cli"] = "salt-call"
        self._loaders = Loaders(
            opts,
            loaded_base_name=f"{__name__}.loaded.env{next(_NAMESPACES)}",
        )

    @contextlib.contextmanager
    def loaders(self):
        """
        This environment's ``Loaders``; its state is reset when the block ends.
        """
        try:
            yield self._loaders
        finally:
            self._loaders.reset_state()

    def render(self, mods):
        """
        ``{sls: state.show_sls(sls)}`` for each SLS in ``mods``: the high data when it renders,
        the list of errors when it does not. Each SLS is rendered on its own, by its own call.
        """
        results = {}
        for sls in mods:
            with self.loaders() as loaders:
                results[sls] = loaders.modules.state.show_sls(sls)
        return results

    def written(self):
        """
        Every file under the config and pki dirs, except those the harness made.
        """
        return sorted(
            str(path.relative_to(self.base))
            for top in (self.conf_dir, self.base / "pki")
            for path in top.rglob("*")
            if path.is_file() and path not in self.made
        )


@pytest.fixture(scope="session")
def formula_root(tmp_path_factory):
    """
    A file root holding the formula the way a user adds it (links into this checkout).
    """
    root = tmp_path_factory.mktemp("file_root")
    for entry in ROOT.iterdir():
        if entry.name == "multimaster" or (entry.name.startswith("_") and entry.is_dir()):
            os.symlink(entry, root / entry.name)
    return root


@pytest.fixture(scope="session")
def salt_env(tmp_path_factory, formula_root):
    """
    ``salt_env(minion_id, pillar, grains=None)``: a new masterless minion with the formula's
    modules synced, that pillar (a dict for ``multimaster:``, or the text of a pillar SLS) and
    those static grains.
    """
    extmods = tmp_path_factory.mktemp("extmods")

    def new(minion_id, pillar, grains=None):
        base = tmp_path_factory.mktemp(f"env-{minion_id}")
        return SaltEnv(base, formula_root, extmods, minion_id, pillar, grains)

    # Constructing a Loaders syncs; start again from nothing so that this sync_all, as a user
    # would run it, is the one that installs the formula's modules.
    sync = new("sync", {})
    shutil.rmtree(extmods)
    with sync.loaders() as loaders:
        result = loaders.modules.saltutil.sync_all()
    assert "modules.multimaster" in result["modules"], result
    assert "states.multimaster" in result["states"], result
    assert "utils.multimaster_settings" in result["utils"], result
    assert "utils.multimaster_pillarcheck" in result["utils"], result
    assert "utils.multimaster_safefs" in result["utils"], result
    assert "returners.multimaster_pgjsonb" in result["returners"], result
    return new
