"""Two stores (two nodes' data directories) over one in-memory remote tier: write-back, fills, checks, the directory.

The Redis Cluster behind the same interface is exercised in
``tests/integration/test_remote_cluster.py``; here the tier is
``MemoryTier`` so every rule of the store's side runs in milliseconds.
"""

import numpy as np
import pytest
from helpers import GEOMETRIES, make_kv, make_tokens

from kvstore.config import StoreConfig
from kvstore.contract.errors import DataLoss, NotFound
from kvstore.hashing import chunk_hashes
from kvstore.remote.config import RemoteConfig
from kvstore.remote.memory import MemoryTier
from kvstore.store import ChunkStore

GEO = GEOMETRIES[0]  # 5 layers in groups of 2 (3 groups), one head, head dim 1: odd everywhere


def open_node(tmp_path, name: str, tier, **remote):
    cfg = StoreConfig(data_dir=str(tmp_path / name), min_free_bytes=0, index_map_bytes=1 << 20)
    return ChunkStore(cfg, remote=tier, remote_config=RemoteConfig(node_id=name, **remote))


@pytest.fixture
def nodes(tmp_path):
    tier = MemoryTier()
    a, b = open_node(tmp_path, "a", tier), open_node(tmp_path, "b", tier)
    yield tier, a, b
    a.close()
    b.close()


def put(store, tokens, kv, geo=GEO):
    res = store.put(tokens, kv, geo)
    assert store.replicator.wait_idle(10)
    return res


def test_a_prefix_put_on_one_node_is_a_full_hit_on_another_with_the_same_bytes(nodes):
    tier, a, b = nodes
    tokens, kv = make_tokens(100, 1), make_kv(GEO, 100, 1)  # 7 chunks, the last of 4 tokens
    res = put(a, tokens, kv)
    assert a.remote_stats()["replicated_prefixes"] == 1 and a.remote_stats()["pending_prefixes"] == 0
    hit = b.lookup(tokens, GEO)
    assert (hit.matched_chunks, hit.matched_tokens, hit.prefix_id) == (7, 100, res.prefix_id)
    assert b.remote_stats()["fill_chunks"] == 7
    got = b.read(hit.prefix_id, range(7))
    assert np.array_equal(got.to_kv(), kv)
    assert b.describe(res.prefix_id).num_tokens == 100
    # local now: a second look-up moves nothing
    fetched = b.remote_stats()["fill_bytes"]
    b.lookup(tokens, GEO)
    assert b.remote_stats()["fill_bytes"] == fetched


def test_a_lookup_fills_only_the_leading_part_that_matched(nodes):
    tier, a, b = nodes
    tokens, kv = make_tokens(160, 2), make_kv(GEO, 160, 2)  # 10 chunks
    put(a, tokens, kv)
    query = np.concatenate([tokens[:48], make_tokens(40, 99)])  # shares 3 whole chunks
    hit = b.lookup(query, GEO)
    hashes = chunk_hashes(np.asarray(query, dtype="<u4"), GEO, "", "")
    assert (hit.matched_chunks, hit.prefix_id) == (3, hashes[2].hex())
    assert b.remote_stats()["fill_chunks"] == 3
    assert np.array_equal(b.read(hit.prefix_id, range(3)).to_kv(), kv[:, :, :, :48])


def test_a_longer_put_reuses_the_shared_chunks_remotely_and_a_fill_reuses_them_locally(nodes):
    tier, a, b = nodes
    tokens = make_tokens(160, 3)
    kv = make_kv(GEO, 160, 3)
    put(a, tokens[:96], kv[:, :, :, :96])  # 6 chunks
    put(a, tokens, kv)  # 10 chunks, the first 6 shared
    stats = a.remote_stats()
    assert stats["replicated_extents"] == 10 * GEO.num_groups and stats["replication_skipped_extents"] == 6 * GEO.num_groups
    b.lookup(tokens[:96], GEO)  # 6 chunks local on b
    before = b.remote_stats()["fill_chunks"]
    assert b.lookup(tokens, GEO).matched_chunks == 10
    assert b.remote_stats()["fill_chunks"] - before == 4  # only the 4 new ones moved


def test_an_unknown_prefix_id_is_filled_on_first_use_and_missing_ones_stay_not_found(nodes):
    tier, a, b = nodes
    tokens, kv = make_tokens(64, 4), make_kv(GEO, 64, 4)
    res = put(a, tokens, kv)
    assert b.resolve(res.prefix_id) == res.prefix_id
    assert np.array_equal(b.read(res.prefix_id, range(4)).to_kv(), kv)
    with pytest.raises(NotFound):
        b.describe(b.resolve("ab" * 32))


def test_a_damaged_remote_value_is_never_served(nodes):
    tier, a, b = nodes
    tokens, kv = make_tokens(64, 5), make_kv(GEO, 64, 5)
    res = put(a, tokens, kv)
    keys = sorted(k for k in tier.values if k.startswith("kvx:"))
    victim = next(k for k in keys if f"{{{res.prefix_id}}}" in k)  # an extent of the last chunk
    tier.values[victim] = tier.values[victim][:-1] + bytes([tier.values[victim][-1] ^ 1])  # one bit flipped
    with pytest.raises(DataLoss, match="chunk 3"):
        b.resolve(res.prefix_id)
    assert b.remote_stats()["remote_checksum_failures"] == 1
    hit = b.lookup(tokens, GEO)  # a look-up keeps the chunks before the damaged one
    assert hit.matched_chunks == 3
    assert np.array_equal(b.read(hit.prefix_id, range(3)).to_kv(), kv[:, :, :, :48])


def test_truncated_or_overwritten_values_are_detected(nodes):
    tier, a, b = nodes
    tokens, kv = make_tokens(32, 6), make_kv(GEO, 32, 6)
    res = put(a, tokens, kv)
    first, second = sorted(k for k in tier.values if k.startswith(f"kvx:{{{res.prefix_id}}}"))[:2]
    tier.values[first] = tier.values[first][:20]  # truncated
    with pytest.raises(DataLoss):
        b.resolve(res.prefix_id)
    tier.values[first] = tier.values[second]  # another extent's well-formed value under this key
    with pytest.raises(DataLoss):
        b.resolve(res.prefix_id)
    assert b.remote_stats()["remote_checksum_failures"] == 2
    with pytest.raises(NotFound):
        b.describe(res.prefix_id)


def test_an_evicted_remote_value_is_a_miss_not_an_error(nodes):
    tier, a, b = nodes
    tokens, kv = make_tokens(80, 7), make_kv(GEO, 80, 7)  # 5 chunks
    put(a, tokens, kv)
    hashes = chunk_hashes(np.asarray(tokens, dtype="<u4"), GEO, "", "")
    for k in [k for k in tier.values if k.startswith(f"kvx:{{{hashes[2].hex()}}}")]:
        del tier.values[k]  # as maxmemory would
    assert b.lookup(tokens, GEO).matched_chunks == 2
    assert b.remote_stats()["remote_checksum_failures"] == 0
    for k in [k for k in tier.values if k.startswith("kvx:")]:
        del tier.values[k]
    c_tokens = np.concatenate([tokens[:16], make_tokens(16, 70)])
    assert b.lookup(c_tokens, GEO).matched_chunks == 1  # chunk 0 is local on b now; nothing remote is left


def test_with_the_tier_down_puts_succeed_locally_and_catch_up(nodes):
    tier, a, b = nodes
    tier.available = False
    tokens, kv = make_tokens(48, 8), make_kv(GEO, 48, 8)
    res = a.put(tokens, kv, GEO)
    assert res.bytes_written > 0
    assert b.lookup(tokens, GEO).matched_chunks == 0  # b serves its own tier
    assert a.remote_stats()["remote_state"].startswith("degraded") or a.remote_stats()["pending_prefixes"] == 1
    assert not a.replicator.wait_idle(0.3)
    tier.available = True
    a.remote_link.check_health()
    b.remote_link.check_health()
    assert a.replicator.wait_idle(10)
    assert a.remote_stats()["remote_state"] == "ok"
    assert b.lookup(tokens, GEO).matched_chunks == 3


def test_a_restart_replicates_what_was_put_while_the_tier_was_away(tmp_path):
    tier = MemoryTier()
    a = ChunkStore(StoreConfig(data_dir=str(tmp_path / "a"), min_free_bytes=0, index_map_bytes=1 << 20))  # no remote tier yet
    tokens, kv = make_tokens(48, 9), make_kv(GEO, 48, 9)
    a.put(tokens, kv, GEO)
    a.close()
    a = open_node(tmp_path, "a", tier)
    b = open_node(tmp_path, "b", tier)
    try:
        assert a.replicator.wait_idle(10)
        assert b.lookup(tokens, GEO).matched_chunks == 3
    finally:
        a.close()
        b.close()


def test_pages_put_on_one_node_are_found_and_read_on_another(nodes):
    tier, a, b = nodes
    geo = GEOMETRIES[2]
    keys = [b"k%d" % i for i in range(5)]
    pages = np.stack([make_kv(geo, 16, 20 + i) for i in range(5)])  # [pages, layers, 2, heads, 16, dim]
    a.pages.put(keys, pages, geo)
    assert a.replicator.wait_idle(10)
    present = b.pages.exists(keys + [b"absent"], geo)
    assert present.exists.tolist() == [True] * 5 + [False]
    got = b.pages.get(keys[1:4], geo)
    assert np.array_equal(got.to_array(), pages[1:4])
    assert b.remote_stats()["fill_pages"] == 3
    assert np.array_equal(b.pages.get(keys, geo).to_array(), pages)  # the other two filled, the three read locally


def test_the_directory_follows_local_puts_fills_and_deletes(nodes):
    tier, a, b = nodes
    tokens, kv = make_tokens(48, 11), make_kv(GEO, 48, 11)
    res = put(a, tokens, kv)
    hashes = [h.hex() for h in chunk_hashes(np.asarray(tokens, dtype="<u4"), GEO, "", "")]
    assert tier.directory(hashes) == [frozenset({"a"})] * 3
    b.lookup(tokens, GEO)
    b.remote_fill.settle()  # the fill is committed behind the look-up, and the directory follows the commit
    assert b.replicator.wait_idle(10)
    assert tier.directory(hashes) == [frozenset({"a", "b"})] * 3
    a.delete(res.prefix_id)
    assert a.replicator.wait_idle(10)
    assert tier.directory(hashes) == [frozenset({"b"})] * 3


def test_a_fill_goes_through_the_local_capacity_policy(tmp_path):
    tier = MemoryTier()
    a = open_node(tmp_path, "a", tier)
    cfg = StoreConfig(data_dir=str(tmp_path / "b"), min_free_bytes=0, index_map_bytes=1 << 20, max_disk_bytes=6 << 20)
    b = ChunkStore(cfg, remote=tier, remote_config=RemoteConfig(node_id="b"))
    try:
        geo = GEOMETRIES[2]
        prefixes = [(make_tokens(1024, 30 + i), make_kv(geo, 1024, 30 + i)) for i in range(4)]
        for tokens, kv in prefixes:
            put(a, tokens, kv, geo)
        for tokens, _ in prefixes:  # each fill needs 2.5 MiB: the oldest ones are evicted to make room
            assert b.lookup(tokens, geo).matched_chunks == 64
        assert b.stats()["evictions"] >= 1 and b.stats()["disk_used_bytes"] <= 6 << 20
        huge = make_tokens(4096, 40)
        put(a, huge, make_kv(geo, 4096, 40), geo)  # 10 MiB: more than b may hold
        assert b.lookup(huge, geo).matched_chunks == 0  # a remote hit the local tier cannot take is a miss, not an error
        assert b.remote_stats()["fill_failures"] == 1
    finally:
        a.close()
        b.close()
