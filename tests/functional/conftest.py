"""
Functional-test harness: Salt's own loader, renderers and state system in-process, on a masterless
minion with the formula on ``file_roots`` and a pillar of our choosing, everything under tmp.

The formula reaches Salt as a user would deliver it: ``file_roots`` holds ``multimaster/`` and the
``_modules``/``_states``/``_utils`` dirs, and ``saltutil.sync_all`` installs the modules.

Several minions live in this one process, and Salt's loader keeps one module object per module
name in ``sys.modules`` whose ``__opts__`` is that of the loader that loaded it last. So every
call goes through a loader made for it (a fresh ``Caller``/``HighState``), and the work of one
environment is never interleaved with another's.
"""

import os
import pathlib
import pwd

import pytest
import salt.client
import salt.config
import salt.loader
import salt.state
import salt.utils.yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _dump(data, path):
    with open(path, "w", encoding="utf-8") as handle:
        salt.utils.yaml.safe_dump(data, handle, default_flow_style=False)


class SaltEnv:
    """
    One masterless minion: its own config dir (with a ``master`` file, so the host is also a
    master), pki/cache/run dirs and pillar; the synced modules are shared between environments.
    """

    def __init__(self, base, file_root, extmods, minion_id, pillar):
        self.base = base
        self.minion_id = minion_id
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
            },
            self.conf_dir / "minion",
        )
        (self.pillar_dir / "top.sls").write_text("base:\n  '*':\n    - multimaster\n")
        if isinstance(pillar, str):
            (self.pillar_dir / "multimaster.sls").write_text(pillar)
        else:
            _dump({"multimaster": pillar}, self.pillar_dir / "multimaster.sls")
        self.made = {self.conf_dir / "master", self.conf_dir / "minion"}
        self.grains = None

    def load_grains(self):
        self.grains = salt.loader.grains(self.opts())
        return self.grains

    def opts(self):
        return salt.config.minion_config(str(self.conf_dir / "minion"))

    def cmd(self, fun, *args, **kwargs):
        """
        ``salt-call --local fun *args **kwargs`` in-process, with a loader of its own.
        """
        return salt.client.Caller(mopts=self.opts()).cmd(fun, *args, **kwargs)

    def render(self, mods):
        """
        Render each SLS in ``mods`` as ``state.show_sls`` does: ``{sls: high data}`` when it
        renders, ``{sls: [errors]}`` when it does not. One HighState (loader, pillar) for all.
        """
        opts = self.opts()
        opts["grains"] = self.grains
        highstate = salt.state.HighState(opts)
        results = {}
        for sls in mods:
            # State ids are checked for uniqueness across one highstate build: start each SLS
            # afresh, as a new state.show_sls would.
            highstate.building_highstate = type(highstate.building_highstate)()
            highstate.push_active()
            try:
                high, errors = highstate.render_highstate({"base": [sls]})
            finally:
                highstate.pop_active()
            errors += highstate.state.verify_high(high)
            results[sls] = errors or high
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
    ``salt_env(minion_id, pillar)``: a new masterless minion with the formula's modules synced and
    that pillar (a dict for ``multimaster:``, or the text of a pillar SLS).
    """
    extmods = tmp_path_factory.mktemp("extmods")

    grains = {}

    def new(minion_id, pillar):
        base = tmp_path_factory.mktemp(f"env-{minion_id}")
        env = SaltEnv(base, formula_root, extmods, minion_id, pillar)
        # Grains describe the host, the same for every environment: load them once.
        env.grains = dict(grains.get("host") or env.load_grains(), id=minion_id)
        grains.setdefault("host", env.grains)
        return env

    # Sync once, as a user would; every environment loads the synced modules.
    result = new("sync", {}).cmd("saltutil.sync_all")
    assert "modules.multimaster" in result["modules"], result
    assert "states.multimaster" in result["states"], result
    assert "utils.multimaster_settings" in result["utils"], result
    return new
