"""
What the ``multimaster`` states do beyond one execution-module call: the job cache returner
installed where the master loads it, the 0600 files that may hold a secret.
"""

import os
import pwd

import multimaster_states as states
import pytest


@pytest.fixture
def opts():
    """
    The minion's options as the state module passes them; tests switch on test mode in place.
    """
    return {"test": False}


def synced_returner(opts, tmp_path, content=b"# the formula's returner\n"):
    """
    This minion's ``extension_modules`` with the returner ``saltutil.sync_all`` put there.
    """
    opts["extension_modules"] = str(tmp_path / "minion-extmods")
    synced = tmp_path / "minion-extmods" / "returners" / "multimaster_pgjsonb.py"
    synced.parent.mkdir(parents=True)
    synced.write_bytes(content)
    return synced


def test_job_cache_returner_installed_where_the_master_loads_it(opts, tmp_path):
    """
    Copied from what was synced to this minion, 0644, owned by the master's user, into
    directories it creates owned by that user as well; a second run changes nothing.
    """
    synced = synced_returner(opts, tmp_path)
    user = pwd.getpwuid(os.getuid()).pw_name
    target = tmp_path / "master-cache" / "extmods" / "returners" / "multimaster_pgjsonb.py"
    opts["test"] = True
    ret = states.job_cache_returner_ret(str(target), user, opts)
    assert ret["result"] is None and ret["changes"] == {"returner": "installed"}
    assert not target.parent.exists()
    opts["test"] = False
    ret = states.job_cache_returner_ret(str(target), user, opts)
    assert ret["result"] is True and ret["changes"] == {"returner": "installed"}, ret
    assert target.read_bytes() == synced.read_bytes()
    assert target.stat().st_mode & 0o777 == 0o644
    for path in (target, target.parent, target.parent.parent):
        assert path.stat().st_uid == os.getuid()
    again = states.job_cache_returner_ret(str(target), user, opts)
    assert again["result"] is True and again["changes"] == {}
    synced.write_bytes(b"# a newer formula\n")
    ret = states.job_cache_returner_ret(str(target), user, opts)
    assert ret["changes"] == {"returner": "updated"}
    assert target.read_bytes() == b"# a newer formula\n"


def test_job_cache_returner_installed_needs_the_synced_returner(opts, tmp_path):
    opts["extension_modules"] = str(tmp_path / "minion-extmods")
    target = tmp_path / "extmods" / "returners" / "multimaster_pgjsonb.py"
    ret = states.job_cache_returner_ret(str(target), None, opts)
    assert ret["result"] is False and "run saltutil.sync_all on it" in ret["comment"]
    assert not target.exists()


def test_job_cache_returner_installed_installs_only_the_formulas_returner(opts, tmp_path):
    synced_returner(opts, tmp_path)
    target = tmp_path / "extmods" / "returners" / "pgjsonb.py"
    ret = states.job_cache_returner_ret(str(target), None, opts)
    assert ret["result"] is False
    assert ret["comment"] == f"{target}: expected a file named multimaster_pgjsonb.py"
    assert not target.exists()


def test_secret_config_written_0600_and_never_shown(tmp_path):
    user = pwd.getpwuid(os.getuid()).pw_name
    target = tmp_path / "master.d" / "multimaster.conf"
    config = {"cluster_secret": "s3cret"}
    ret = states.secret_config_ret(str(target), config, "cluster", user, test=True)
    assert ret["result"] is None and ret["changes"] == {"diff": "<secret: not shown>"}
    assert not target.exists()
    ret = states.secret_config_ret(str(target), config, "cluster", user, test=False)
    assert ret["result"] is True and ret["comment"] == f"{target} updated"
    assert "s3cret" not in repr(ret)
    assert target.stat().st_mode & 0o777 == 0o600
    assert "cluster_secret: s3cret" in target.read_text()
    again = states.secret_config_ret(str(target), config, "cluster", user, test=False)
    assert again["changes"] == {} and again["comment"] == f"{target} is up to date"
    missing = states.secret_config_ret(str(target), {}, "cluster", user, test=False)
    assert missing["result"] is False
    assert missing["comment"] == "no cluster options in the pillar for this master"
