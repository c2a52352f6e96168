"""
Master key pair install and checks (_utils/multimaster_masterkeyfiles.py): crash-safe for
localfs_key, under the key store's lock, the pair always consistent.
"""

import os
import stat
import threading
import time

import multimaster_keys
import multimaster_keystore as ks
import multimaster_masterkeyfiles as mkf
import pytest
import salt.config
import salt.crypt
from salt.exceptions import CommandExecutionError, SaltCacheError

from tests.support import loading
from tests.support.keyfactory import priv_pem, pub_pem, rsa_private
from tests.support.keystore import holding_the_lock

OLD, NEW = (rsa_private(tag=10), rsa_private(tag=11))


def pair(key):
    return priv_pem(key), pub_pem(key)


@pytest.fixture
def mopts(tmp_path):
    return loading.master_opts(tmp_path, **{"keys.cache_driver": "localfs_key"})


def on_disk(mopts, name):
    path = os.path.join(mopts["pki_dir"], name)
    if not os.path.lexists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def test_install_stores_a_regular_0400_pair_with_the_compat_links(mopts):
    pem, pub = pair(NEW)
    mkf.install_master_key(mopts, pem, pub)
    pki = mopts["pki_dir"]
    for name, text in (("master1.pem", pem), ("master1.pub", pub)):
        st = os.lstat(os.path.join(pki, name))
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o400
        assert st.st_uid == os.getuid() and on_disk(mopts, name) == text
    for legacy, current in (("master.pem", "master1.pem"), ("master.pub", "master1.pub")):
        assert os.readlink(os.path.join(pki, legacy)) == os.path.join(pki, current)
    assert os.listdir(os.path.join(pki, ks.TMP_DIR)) == []
    assert mkf.read_master_key(mopts) == pub and mkf.read_master_key(mopts, private=True) == pem
    assert mkf.master_key_pair_problems(mopts) == []


def test_install_replaces_the_pair_a_master_made_itself(mopts):
    salt.crypt.MasterKeys(mopts)  # first start: master1.pem/.pub and the links
    pem, pub = pair(NEW)
    mkf.install_master_key(mopts, pem, pub)
    assert on_disk(mopts, "master1.pem") == pem and on_disk(mopts, "master.pub") == pub


def test_install_refuses_a_pair_that_does_not_match(mopts):
    mkf.install_master_key(mopts, *pair(OLD))
    with pytest.raises(CommandExecutionError, match="does not match"):
        mkf.install_master_key(mopts, priv_pem(NEW), pub_pem(OLD))
    assert on_disk(mopts, "master1.pem") == priv_pem(OLD)


def test_the_signing_pair_goes_beside_the_master_key(mopts):
    mkf.install_master_key(mopts, *pair(OLD))
    mkf.install_master_key(mopts, *pair(NEW), signing=True)
    assert on_disk(mopts, "master_sign.pem") == priv_pem(NEW)
    assert on_disk(mopts, "master.pem") == priv_pem(OLD)
    assert mkf.master_key_pair_problems(mopts, signing=True) == []


def test_a_cluster_master_keeps_its_pair_in_its_own_pki_dir(mopts, tmp_path):
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    mopts.update(cluster_id="c1", cluster_pki_dir=str(cluster))
    mkf.install_master_key(mopts, *pair(NEW))
    assert on_disk(mopts, "master1.pem") == priv_pem(NEW)
    assert sorted(os.listdir(cluster)) == [".multimaster.lock"]


class FailAt:
    """
    Make the ``n``-th filesystem change (rename, replace, unlink) raise, like a crash there.
    """

    NAMES = ("replace", "rename", "unlink", "remove")

    def __init__(self, monkeypatch, n):
        self.n, self.calls = n, 0
        for name in self.NAMES:
            monkeypatch.setattr(os, name, self.wrap(getattr(os, name)))

    def wrap(self, real):
        def call(*args, **kwargs):
            self.calls += 1
            if self.calls == self.n:
                raise OSError(f"injected failure at change {self.n}")
            return real(*args, **kwargs)

        return call


@pytest.mark.parametrize("step", range(1, 4))
def test_an_interrupted_install_leaves_a_pair_the_master_starts_with(mopts, monkeypatch, step):
    mkf.install_master_key(mopts, *pair(OLD))
    failing = FailAt(monkeypatch, step)
    try:
        mkf.install_master_key(mopts, *pair(NEW))
    except (OSError, CommandExecutionError, SaltCacheError):
        pass
    monkeypatch.undo()
    assert failing.calls >= step, "the failure was injected"
    pem = mkf.read_master_key(mopts, private=True)
    assert pem in (priv_pem(OLD), priv_pem(NEW))  # never no key, never a fresh one
    pub = mkf.read_master_key(mopts)
    fp = multimaster_keys.private_key_fingerprint(pem)
    assert pub is None or multimaster_keys.fingerprint(pub) == fp
    # What the master serves after a restart is the public half of the key it loads.
    served = salt.crypt.MasterKeys(mopts).get_pub_str()
    assert multimaster_keys.fingerprint(served) == fp
    # A re-run converges.
    mkf.install_master_key(mopts, *pair(NEW))
    assert mkf.master_key_pair_problems(mopts) == []
    assert os.listdir(os.path.join(mopts["pki_dir"], ks.TMP_DIR)) == []


def test_pair_problems_name_a_pub_that_does_not_match_or_is_missing(mopts):
    mkf.install_master_key(mopts, *pair(OLD))
    path = os.path.join(mopts["pki_dir"], "master1.pub")
    os.chmod(path, 0o600)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(pub_pem(NEW))
    (problem,) = mkf.master_key_pair_problems(mopts)
    assert "master1.pub" in problem and "does not match" in problem
    assert multimaster_keys.fingerprint(pub_pem(NEW)) in problem
    os.unlink(path)
    (problem,) = mkf.master_key_pair_problems(mopts)
    assert "master1.pub" in problem and "missing" in problem


def test_pair_problems_without_any_key(mopts):
    (problem,) = mkf.master_key_pair_problems(mopts)
    assert "master1.pem" in problem


def test_install_waits_for_the_lock(mopts):
    release, holder = holding_the_lock(mopts)
    worker = threading.Thread(target=mkf.install_master_key, args=(mopts, *pair(NEW)))
    worker.start()
    time.sleep(0.3)
    assert worker.is_alive() and on_disk(mopts, "master1.pem") is None
    release.set()
    holder.join()
    worker.join(5)
    assert on_disk(mopts, "master1.pem") == priv_pem(NEW)
