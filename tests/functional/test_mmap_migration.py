"""
A master migrated from ``localfs_key`` to ``mmap_key`` with Salt's own ``salt-run
pki.migrate_to_mmap`` keeps working with the tool: its key store reads the same through the
tool's inventory, and the tool's writes (compare-and-set, one state per id) land in the migrated
store. Salt 3008's runner and cache drivers, loaded as a master loads them; no daemon needed
(the claim is about the store, the daemons' key plane on mmap_key is tests/integration/keys).
"""

import multimaster_keys
import multimaster_keystore
import multimaster_keywrite
import multimaster_saltcompat
import pytest
import salt.config
import salt.loader

from toolkit import devkit

pytestmark = pytest.mark.skipif(
    not multimaster_saltcompat.has_key_cache(), reason="mmap_key is a Salt 3008 key-cache driver"
)

# id -> (state dir, key index in the pool)
STORE = {
    "web1": ("minions", 0),
    "web2": ("minions", 1),
    "new1": ("minions_pre", 2),
    "bad1": ("minions_rejected", 3),
    "spoof1": ("minions_denied", 4),
}


def master_opts(tmp_path, driver):
    opts = salt.config.master_config(str(tmp_path / "conf" / "master"))
    opts.update(
        pki_dir=str(tmp_path / "pki"),
        cachedir=str(tmp_path / "cache"),
        sock_dir=str(tmp_path / "sock"),
        user=None,
    )
    opts["keys.cache_driver"] = driver
    (tmp_path / "cache").mkdir(exist_ok=True)
    return opts


def test_a_store_migrated_to_mmap_reads_and_writes_through_the_tool(tmp_path):
    pool = [multimaster_keys.canonical(pem) for pem in devkit.public_pem_pool(6)]
    for minion_id, (state_dir, index) in STORE.items():
        path = tmp_path / "pki" / state_dir / minion_id
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(pool[index])
    localfs = master_opts(tmp_path, "localfs_key")
    before, _ = multimaster_keystore.inventory(localfs)
    assert before["web1"] == ["accepted", multimaster_keys.fingerprint(pool[0])]

    mmap = master_opts(tmp_path, "mmap_key")
    runners = salt.loader.runner(mmap)
    assert "Accepted: 2" in runners["pki.migrate_to_mmap"]()
    after, _ = multimaster_keystore.inventory(mmap)
    assert after == before

    # The tool's own write on the migrated store: web2 rejected (compare-and-set on its entry),
    # and the master told to rotate its AES key, as for any revocation.
    action = {"id": "web2", "op": "reject", "fp": after["web2"][1], "expect": after["web2"]}
    done = multimaster_keywrite.apply_actions(mmap, [(action, pool[1])])
    assert done["done"] == [{"id": "web2", "op": "reject"}] and done["rotated"] is True
    entries, _ = multimaster_keystore.inventory(mmap)
    assert entries["web2"] == ["rejected", multimaster_keys.fingerprint(pool[1])]
    assert {k: v for k, v in entries.items() if k != "web2"} == {
        k: v for k, v in before.items() if k != "web2"
    }
