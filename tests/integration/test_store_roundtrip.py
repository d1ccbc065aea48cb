"""Round trips through real files, O_DIRECT and LMDB (no mocks)."""

import os

import numpy as np
import pytest
from helpers import GEOMETRIES, ids, make_kv, make_tokens

from kvstore.contract import kvquant
from kvstore.contract.errors import InvalidArgument, NotFound, StoreLocked
from kvstore.contract.geometry import StoreGeometry
from kvstore.contract.kv_values import key_summary
from kvstore.contract.layout import SegmentLayout, split_extents
from kvstore.store import ChunkStore


@pytest.mark.parametrize("geo", GEOMETRIES, ids=ids)
@pytest.mark.parametrize("num_tokens", [1, 37, 160])
def test_roundtrip_bit_exact(store_config, geo, num_tokens):
    kv = make_kv(geo, num_tokens, seed=num_tokens)
    tokens = make_tokens(num_tokens, seed=1)
    rng = np.random.default_rng(7)
    with ChunkStore(store_config) as store:
        res = store.put(tokens, kv, geo, model_fingerprint="test-model")
        m = geo.num_chunks(num_tokens)
        assert res.num_chunks == m and res.reused_chunks == 0 and not res.already_stored
        # the whole prefix, then random subsets and group ranges, with and without coalescing
        np.testing.assert_array_equal(store.read(res.prefix_id, range(m)).to_kv(), kv)
        for trial in range(4):
            chunks = np.sort(rng.choice(m, size=rng.integers(1, m + 1), replace=False))
            groups = sorted(rng.choice(geo.num_groups, size=rng.integers(1, geo.num_groups + 1), replace=False).tolist())
            got = store.read(res.prefix_id, chunks, groups, coalesce=bool(trial % 2))
            c = geo.chunk_tokens
            tok = np.concatenate([np.arange(j * c, min((j + 1) * c, num_tokens)) for j in chunks])
            layers = np.concatenate([list(geo.group_layer_range(g)) for g in groups])
            np.testing.assert_array_equal(got.to_kv(), kv[layers][:, :, :, tok])
            assert got.bytes_useful == sum(geo.extent_bytes(g, min(c, num_tokens - j * c)) for g in groups for j in chunks)
        # summaries and probe keys match what the KV says
        summ = store.read_summaries(res.prefix_id)
        for g, j, ext in split_extents(geo, kv):
            layers = geo.group_layer_range(g)
            np.testing.assert_array_equal(summ[j, layers.start : layers.stop], key_summary(ext, geo.model.dtype))
        np.testing.assert_array_equal(store.read_summaries(res.prefix_id, 3), summ[:, ::3])
        for bad in (0, -1, 1.5, True):
            with pytest.raises(InvalidArgument, match="layer_step"):
                store.read_summaries(res.prefix_id, bad)
        if geo.probe_keys:
            for g in range(geo.num_groups):
                np.testing.assert_array_equal(store.read_probe_keys(res.prefix_id, g), kv[g * geo.group_layers, 0])


def test_read_amplification_is_padding_only(store_config):
    geo = GEOMETRIES[3]  # 24 layers, 2 heads, dim 64, bf16: extent 128 KiB x (8 layers)
    kv = make_kv(geo, 16 * 40, seed=3)
    with ChunkStore(store_config) as store:
        pid = store.put(make_tokens(16 * 40, 3), kv, geo).prefix_id
        got = store.read(pid, [0, 1, 2, 10, 20, 21])
        assert got.read_amplification == 1.0  # 2*2*64*2*8*16 bytes = 64 KiB, aligned
        assert got.num_reads == 3 * 3  # three runs in each of the three groups
        assert store.read(pid, [0, 1, 2, 10, 20, 21], coalesce=False).num_reads == 18
    odd = GEOMETRIES[0]
    lay = SegmentLayout(odd, 37)
    with ChunkStore(store_config.__class__(data_dir=store_config.data_dir + "2", min_free_bytes=0)) as store:
        pid = store.put(make_tokens(37, 4), make_kv(odd, 37, 4), odd).prefix_id
        got = store.read(pid, [0, 2])
        assert got.bytes_read == int(lay.extent_padded[:, [0, 2]].sum())
        assert got.bytes_useful == int(lay.extent_lengths[:, [0, 2]].sum())


def test_shared_leading_chunks_store_only_the_tail(store_config):
    geo = GEOMETRIES[2]
    c = geo.chunk_tokens
    tokens_a = make_tokens(100, 1)
    kv_a = make_kv(geo, 100, 1)
    # B shares the first 5 full chunks (80 tokens) of A, then diverges
    tokens_b = np.concatenate([tokens_a[:85], make_tokens(60, 2)])
    kv_b = make_kv(geo, 145, 2)
    kv_b[:, :, :, :80] = kv_a[:, :, :, :80]
    with ChunkStore(store_config) as store:
        a = store.put(tokens_a, kv_a, geo)
        b = store.put(tokens_b, kv_b, geo)
        assert b.reused_chunks == 5
        assert b.bytes_written == SegmentLayout(geo, 145 - 5 * c).total_bytes
        assert store.lookup(tokens_b[:90], geo).matched_chunks == 5
        assert store.lookup(tokens_b, geo).matched_chunks == geo.num_chunks(145)
        for pid, kv in ((a.prefix_id, kv_a), (b.prefix_id, kv_b)):
            m = kv.shape[3]
            np.testing.assert_array_equal(store.read(pid, range(geo.num_chunks(m))).to_kv(), kv)
        np.testing.assert_array_equal(store.read_probe_keys(b.prefix_id, 0), kv_b[0, 0])
        # deleting A keeps B whole; deleting B frees every file
        store.delete(a.prefix_id)
        np.testing.assert_array_equal(store.read(b.prefix_id, range(geo.num_chunks(145))).to_kv(), kv_b)
        store.delete(b.prefix_id)
        assert store.list_prefixes() == []
        assert os.listdir(store.segment_dir) == []
        with pytest.raises(NotFound):
            store.read(b.prefix_id, [0])


def test_same_tokens_twice_is_a_hit_and_namespaces_are_apart(store_config):
    geo = GEOMETRIES[1]
    tokens, kv = make_tokens(50, 5), make_kv(GEOMETRIES[1], 50, 5)
    with ChunkStore(store_config) as store:
        first = store.put(tokens, kv, geo, namespace="tenant-a")
        again = store.put(tokens, kv, geo, namespace="tenant-a")
        assert again.already_stored and again.bytes_written == 0 and again.prefix_id == first.prefix_id
        assert store.lookup(tokens, geo, namespace="tenant-b").matched_chunks == 0
        other = store.put(tokens, kv, geo, namespace="tenant-b")
        assert other.prefix_id != first.prefix_id and other.reused_chunks == 0
        sub = store.lookup(tokens[:30], geo, namespace="tenant-a")
        assert sub.matched_chunks == 30 // geo.chunk_tokens and sub.prefix_id == first.prefix_id
        # a prefix of a stored prefix is stored without writing anything
        head = store.put(tokens[:28], kv[:, :, :, :28], geo, namespace="tenant-a")
        assert head.bytes_written == 0 and head.reused_chunks == 4
        np.testing.assert_array_equal(store.read(head.prefix_id, range(4)).to_kv(), kv[:, :, :, :28])
        assert len(store.list_prefixes()) == 3


def test_reopen_keeps_everything_and_resolves_short_ids(store_config):
    geo = GEOMETRIES[0]
    kv = make_kv(geo, 40, 9)
    with ChunkStore(store_config) as store:
        pid = store.put(make_tokens(40, 9), kv, geo).prefix_id
    with ChunkStore(store_config) as store:
        assert store.resolve(pid[:10]) == pid
        np.testing.assert_array_equal(store.read(pid, range(3)).to_kv(), kv)
        assert store.verify() and all(r["ok"] for r in store.verify())
        with pytest.raises(InvalidArgument, match="prefix_id"):
            store.resolve("xyz")


def test_data_dir_is_locked_against_a_second_process_store(store_config):
    with ChunkStore(store_config):
        with pytest.raises(StoreLocked):
            ChunkStore(store_config)


@pytest.mark.parametrize("name", ["kv8", "kv4", "kv4t", "kv4h"])
def test_quantized_extents_roundtrip_within_their_bound(store_config, name):
    plain = GEOMETRIES[2]  # 4 layers, 2 heads, dim 64, float16
    geo = StoreGeometry(plain.model, chunk_tokens=plain.chunk_tokens, group_layers=2, kv_quant=name)
    n = 37
    kv = make_kv(geo, n, seed=3)
    tokens = make_tokens(n, seed=3)
    with ChunkStore(store_config) as store:
        res = store.put(tokens, kv, geo, model_fingerprint="m")
        assert store.put(tokens, kv, plain, model_fingerprint="m").prefix_id != res.prefix_id  # another layout, another prefix
        got = store.read(res.prefix_id, range(geo.num_chunks(n)))
        back = got.to_kv()
        assert back.dtype == kv.dtype and back.shape == kv.shape
        x = kv.astype(np.float32)
        assert (np.abs(back.astype(np.float32) - x) <= kvquant.max_error(name, x) + np.abs(x) * 2.0**-10).all()
        assert got.bytes_useful == geo.kv_bytes(n) < plain.kv_bytes(n) / (1.5 if name == "kv8" else 2.5)
        # summaries and probe keys are those of the stored (dequantized) keys, never of the bytes sent
        summ = store.read_summaries(res.prefix_id)
        for g, j, ext in split_extents(geo, back):
            layers = geo.group_layer_range(g)
            np.testing.assert_array_equal(summ[j, layers.start : layers.stop], key_summary(ext, geo.model.dtype))
        for g in range(geo.num_groups):
            np.testing.assert_array_equal(store.read_probe_keys(res.prefix_id, g), back[g * geo.group_layers, 0])
