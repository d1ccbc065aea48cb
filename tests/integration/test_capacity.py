"""Disk capacity on a real store: eviction by score, holds, compaction, accounting."""

import os

import numpy as np
import pytest
from helpers import make_kv, make_tokens

from kvstore.config import StoreConfig
from kvstore.contract.errors import InvalidArgument, StoreFull
from kvstore.contract.geometry import ModelSpec, StoreGeometry
from kvstore.contract.layout import SegmentLayout
from kvstore.store import ChunkStore

GEO = StoreGeometry(ModelSpec(4, 1, 16, "float16"), chunk_tokens=16, group_layers=2)
TOKENS = 256  # 16 chunks
SEG_BYTES = SegmentLayout(GEO, TOKENS).total_bytes


def put(store, seed, tokens=TOKENS):
    t, kv = make_tokens(tokens, seed), make_kv(GEO, tokens, seed)
    return store.put(t, kv, GEO).prefix_id, kv


def assert_exact(store, prefix_id, kv):
    res = store.read(prefix_id, range(store.describe(prefix_id).num_chunks))
    np.testing.assert_array_equal(res.to_kv(), kv)


def warm(store, prefix_id):
    """Give every unit of the prefix a cache score: one access, attention 1."""
    n = store.describe(prefix_id).num_chunks
    store.scoring.record_access(prefix_id, range(n), range(GEO.num_groups))
    for g in range(GEO.num_groups):
        store.scoring.report_attention(prefix_id, g, list(range(n)), [1.0] * n)


def capped(store_config, num_segments: float):
    """max_disk_bytes of ``num_segments`` segments (watermarks 0.95 / 0.85)."""
    return StoreConfig(**{**store_config.__dict__, "max_disk_bytes": int(num_segments * SEG_BYTES)})


def segment_files(store):
    return sorted(os.listdir(store.segment_dir))


def test_put_over_capacity_evicts_the_lowest_score_prefix(store_config):
    # 3 stored + 1 crosses 0.95 x 4; down to 0.85 x 4 with the new one counted: one eviction
    with ChunkStore(capped(store_config, 4)) as store:
        kept = {}
        for seed in range(3):
            pid, kv = put(store, seed)
            kept[pid] = kv
        cold = list(kept)[1]
        for pid in kept:
            if pid != cold:
                warm(store, pid)
        new_pid, new_kv = put(store, 3)
        del kept[cold]
        kept[new_pid] = new_kv
        assert {p["prefix_id"] for p in store.list_prefixes()} == set(kept)
        for pid, kv in kept.items():
            assert_exact(store, pid, kv)
        st = store.stats()
        assert st["evictions"] == 1 and st["evicted_bytes"] == SEG_BYTES
        assert st["disk_used_bytes"] == 3 * SEG_BYTES == st["bytes_stored"]
        assert len(segment_files(store)) == 3


def test_a_held_prefix_is_never_evicted_and_a_put_that_cannot_fit_changes_nothing(store_config):
    # 2 stored + 1 crosses 0.95 x 2.5: one eviction; with both left in use, the third cannot fit
    with ChunkStore(capped(store_config, 2.5)) as store:
        a, kv_a = put(store, 0)
        b, kv_b = put(store, 1)
        warm(store, b)  # a is the cheaper victim, but it is being read
        with store.holds.hold(a):
            c, kv_c = put(store, 2)
            assert {p["prefix_id"] for p in store.list_prefixes()} == {a, c}
            with store.holds.hold(c):
                files = segment_files(store)
                with pytest.raises(StoreFull, match="max_disk_bytes"):
                    put(store, 3)
                assert {p["prefix_id"] for p in store.list_prefixes()} == {a, c}
                assert segment_files(store) == files
                assert store.stats()["disk_reserved_bytes"] == 0
        assert_exact(store, a, kv_a)
        assert_exact(store, c, kv_c)


def test_a_conversation_holds_the_prefix_its_restore_reads_until_it_is_deleted(store_config):
    # 2.5 segments: every third put evicts one prefix; the record's held prefix is never the one
    with ChunkStore(capped(store_config, 2.5)) as store:
        conv = store.conversations
        a, kv_a = put(store, 0)
        conv.append_turn("", "chat", 0, a)  # active: the last turn's history is held
        b, _ = put(store, 1)
        warm(store, b)  # a is the cheaper victim, but the record holds it
        c, kv_c = put(store, 2)
        assert {p["prefix_id"] for p in store.list_prefixes()} == {a, c}
        assert_exact(store, a, kv_a)
        # inactive with a compressed form: the hold moves to it, the uncompressed history is a cache entry again
        conv.mark_inactive("", "chat", c, "kv8", "")
        warm(store, a)
        d, _ = put(store, 3)
        assert {p["prefix_id"] for p in store.list_prefixes()} == {c, d}
        info = conv.info(conv.get("", "chat"))
        assert info["missing_prefixes"] == 1 and info["compressed"]["stored"]
        # everything left held or in use: the put is refused, names the records, and changes nothing
        with store.holds.hold(d):
            with pytest.raises(StoreFull, match="held by conversation records"):
                put(store, 4)
            assert {p["prefix_id"] for p in store.list_prefixes()} == {c, d}
        assert_exact(store, c, kv_c)
        conv.delete("", "chat")  # the hold goes with the record
        warm(store, d)
        put(store, 5)
        assert c not in {p["prefix_id"] for p in store.list_prefixes()}


def test_usage_counter_survives_restart_and_matches_the_index(store_config):
    cfg = capped(store_config, 4)
    with ChunkStore(cfg) as store:
        for seed in range(5):
            put(store, seed)
        used = store.stats()["disk_used_bytes"]
        assert used == store.stats()["bytes_stored"] <= cfg.max_disk_bytes
    with ChunkStore(cfg) as store:
        assert store.stats()["disk_used_bytes"] == used


def shared_pair(store):
    """A (16 chunks) and B (A's first 4 chunks + 2 of its own): A's segment is shared."""
    a, kv_a = put(store, 10)
    t_b, kv_b = make_tokens(TOKENS, 10)[: 6 * 16].copy(), make_kv(GEO, 6 * 16, 11)
    t_b[64:] = make_tokens(32, 11)
    kv_b[:, :, :, :64] = kv_a[:, :, :, :64]
    res = store.put(t_b, kv_b, GEO)
    assert res.reused_chunks == 4
    return a, kv_a, res.prefix_id, kv_b


def test_delete_compacts_a_mostly_dead_shared_segment(store_config):
    with ChunkStore(store_config) as store:
        a, kv_a, b, kv_b = shared_pair(store)
        warm(store, b)
        old_seg = store.describe(a).segment_ids[0]
        before = store.stats()["disk_used_bytes"]
        store.delete(a)
        view = store.describe(b)
        assert old_seg not in view.segment_ids  # 4 of 16 chunks live: copied out
        new_seg = view.pieces[0].segment_id
        assert view.pieces[0].segment_chunk == 0
        assert_exact(store, b, kv_b)
        assert all(r["ok"] for r in store.verify())
        st = store.stats()
        assert st["compactions"] == 1
        assert st["disk_used_bytes"] == st["bytes_stored"] < before - SEG_BYTES // 2
        assert st["compaction_reclaimed_bytes"] == SEG_BYTES - SegmentLayout(GEO, 64).total_bytes
        assert len(segment_files(store)) == 2
        assert store.scores.get((new_seg, 3, 1)).score == 1.0  # scores moved with their chunks
        assert store.scores.get((old_seg, 3, 1)).score == 0.0
        np.testing.assert_array_equal(store.read_summaries(b).shape[0], 6)
    with ChunkStore(store_config) as store:  # all of it is in the index
        assert_exact(store, b, kv_b)
        assert store.scores.get((new_seg, 3, 1)).score == 1.0
        assert store.stats()["compactions"] == 0 and len(segment_files(store)) == 2


def test_compaction_waits_for_a_reader_of_any_referencing_prefix(store_config):
    with ChunkStore(store_config) as store:
        a, _, b, kv_b = shared_pair(store)
        with store.holds.hold(b):
            store.delete(a)
            assert store.stats()["compactions"] == 0
            assert_exact(store, b, kv_b)
        assert store.capacity.compact()["segments_compacted"] == 1
        assert_exact(store, b, kv_b)


def test_evict_to_bytes_by_hand_and_bad_watermarks(store_config):
    with ChunkStore(store_config) as store:
        pids = [put(store, s)[0] for s in range(3)]
        res = store.capacity.evict_to(SEG_BYTES)
        assert res["evicted"] == pids[:2]  # unscored: oldest first
        assert res["disk_used_bytes"] == SEG_BYTES
    with pytest.raises(InvalidArgument, match="disk_low_watermark"):
        StoreConfig(data_dir=store_config.data_dir, disk_low_watermark=0.9, disk_high_watermark=0.8)
    with pytest.raises(InvalidArgument, match="max_disk_bytes"):
        StoreConfig(data_dir=store_config.data_dir, max_disk_bytes=-1)


def test_eviction_unlocks_a_segment_only_shared_prefixes_reference(store_config):
    with ChunkStore(store_config) as store:
        a, kv_a = put(store, 0)
        res = store.put(make_tokens(TOKENS, 0)[:128], kv_a[:, :, :, :128], GEO)
        assert res.bytes_written == 0  # all 8 chunks reused: both prefixes share one segment
        out = store.capacity.evict_to(0)
        assert out["evicted"] == [a, res.prefix_id]  # a freed nothing alone; without it, the other frees all
        assert out["disk_used_bytes"] == 0 and segment_files(store) == []


def test_compaction_rewrites_quantized_probe_keys_bit_exact(store_config):
    from dataclasses import replace

    from kvstore.contract.probes import quantize_probe_rows

    geo = replace(GEO, probe_bits=4)  # 4-bit probe rows, quantized per token: a copied span's rows are unchanged
    with ChunkStore(store_config) as store:
        t_a, kv_a = make_tokens(TOKENS, 10), make_kv(geo, TOKENS, 10)
        a = store.put(t_a, kv_a, geo).prefix_id
        t_b, kv_b = t_a[: 6 * 16].copy(), make_kv(geo, 6 * 16, 11)
        t_b[64:] = make_tokens(32, 11)
        kv_b[:, :, :, :64] = kv_a[:, :, :, :64]
        b = store.put(t_b, kv_b, geo).prefix_id
        old_seg = store.describe(a).segment_ids[0]
        store.delete(a)
        assert old_seg not in store.describe(b).segment_ids and store.stats()["compactions"] == 1
        for g in range(geo.num_groups):
            np.testing.assert_array_equal(store.read_probe_keys(b, g), quantize_probe_rows(kv_b[2 * g, 0].astype(np.float32), 4))
        assert all(r["ok"] for r in store.verify())
