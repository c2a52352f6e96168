"""
Applying the formula on a minion whose modules were never synced (``state.apply`` does not sync
by itself) fails with what to do, not with Jinja's "'AliasedLoader object' has no attribute".
"""

import shutil

from .conftest import SaltEnv


def test_unsynced_modules_say_to_sync(tmp_path, formula_root):
    env = SaltEnv(tmp_path / "env", formula_root, tmp_path / "extmods", "master2", "")
    # Constructing its Loaders synced the formula's modules: take them away again.
    shutil.rmtree(env.extmods)
    with env.loaders() as loaders:
        loaders.reload_all()
    errors = env.render(["multimaster.minion"])["multimaster.minion"]
    text = " ".join(map(str, errors))
    assert isinstance(errors, list) and "saltutil.sync_all" in text, errors
    assert "AliasedLoader" not in text, errors
