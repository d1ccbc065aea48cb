"""Streaming heads left out of extents (LServe's second layout): sizes, round trips, records, validation,
and where a prefix's tail rows come from (engine_client.stream_tail)."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_client.stream_tail import tail_bytes, tail_geometry, tail_keys, tail_pages, tail_pairs, tail_positions
from kvstore.contract.codec import geometry_from_pb, geometry_to_pb
from kvstore.contract.errors import InvalidArgument
from kvstore.contract.geometry import ModelSpec, StoreGeometry
from kvstore.contract.kv_values import float32_as_kv
from kvstore.contract.layout import SegmentLayout

MODEL = ModelSpec(4, 3, 8, "bfloat16")
LEFT_OUT = ((0,), (), (1, 2), (2,))  # 4 of 12 (layer, head) pairs


def kv_of(model, tokens, seed=0):
    x = np.random.default_rng(seed).standard_normal((model.num_layers, 2, model.num_kv_heads, tokens, model.head_dim))
    return float32_as_kv(x.astype(np.float32), model.dtype)


@pytest.mark.parametrize("quant", ["", "kv8", "kv4", "kv4h"])
def test_extents_hold_the_stored_heads_exactly_as_the_full_layout_and_read_back_zero_for_the_others(quant):
    small = StoreGeometry(MODEL, chunk_tokens=16, group_layers=3, kv_quant=quant, streaming_heads=LEFT_OUT)
    full = dataclasses.replace(small, streaming_heads=())
    kv = kv_of(MODEL, 37)
    for g in range(small.num_groups):
        layers = small.group_layer_range(g)
        for t0, t in ((0, 16), (32, 5)):
            ext = np.ascontiguousarray(kv[layers.start : layers.stop, :, :, t0 : t0 + t])
            payload = small.extent_payload(ext, g)
            assert payload.size == small.extent_bytes(g, t)
            back, ref = small.extent_array(payload, g, t), full.extent_array(full.extent_payload(ext, g), g, t)
            for i, layer in enumerate(layers):
                for h in range(MODEL.num_kv_heads):
                    if h in LEFT_OUT[layer]:
                        assert not back[i, :, h].any()
                    else:
                        np.testing.assert_array_equal(back[i, :, h], ref[i, :, h])


def test_sizes_shrink_by_the_heads_left_out_and_the_layout_follows():
    small = StoreGeometry(MODEL, chunk_tokens=16, group_layers=2, streaming_heads=LEFT_OUT)
    full = dataclasses.replace(small, streaming_heads=())
    row = 2 * MODEL.head_dim * 2  # K and V of one head, one token, bfloat16
    assert small.extent_bytes(0, 16) == (2 + 3) * 16 * row  # layer 0 keeps 2 heads, layer 1 all 3
    assert small.extent_bytes(1, 5) == (1 + 2) * 5 * row
    assert small.kv_bytes(37) * 12 == full.kv_bytes(37) * 8
    assert small.streaming_fraction() == pytest.approx(4 / 12)
    lay = SegmentLayout(small, 37)
    assert lay.extent_lengths.tolist() == [[small.extent_bytes(g, t) for t in (16, 16, 5)] for g in range(2)]
    assert small.stored_heads(2) == (0,) and small.stored_heads(1) == (0, 1, 2)


def test_the_record_and_the_wire_carry_the_heads_and_no_heads_keeps_the_old_digest():
    small = StoreGeometry(MODEL, streaming_heads=[[0], [], [2, 1], [2]])  # lists, unsorted: normalised
    assert small.streaming_heads == LEFT_OUT
    assert small.to_record()["streaming_heads"] == [[0], [], [1, 2], [2]]
    assert StoreGeometry.from_dict(small.to_record()) == small
    assert geometry_from_pb(geometry_to_pb(small)) == small
    full = StoreGeometry(MODEL)
    assert "streaming_heads" not in full.to_record()
    assert StoreGeometry(MODEL, streaming_heads=((),) * 4) == full  # none left out is the full layout
    assert StoreGeometry(MODEL, streaming_heads=((),) * 4).digest == full.digest != small.digest
    assert geometry_from_pb(geometry_to_pb(full)) == full


@pytest.mark.parametrize(
    "heads, field, words",
    [
        ([[0]], "streaming_heads", "one entry per layer"),
        ("0,1", "streaming_heads", "one list"),
        ([[0], [], [3], []], "streaming_heads[2]", r"must be in \[0, 2\]"),
        ([[0], [1, 1], [], []], "streaming_heads[1]", "twice"),
        ([[0], [0, 1, 2], [], []], "streaming_heads[1]", "leaves none"),
        ([[0], [True], [], []], "streaming_heads[1]", "integer"),
        ([[0], 1, [], []], "streaming_heads[1]", "list of KV heads"),
    ],
)
def test_bad_streaming_heads_are_named(heads, field, words):
    with pytest.raises(InvalidArgument, match=words) as exc:
        StoreGeometry(MODEL, streaming_heads=heads)
    assert exc.value.field == field


def test_pages_refuse_a_streaming_layout():
    from kvstore.store.pages import check_geometry

    with pytest.raises(InvalidArgument, match="streaming_heads"):
        check_geometry(StoreGeometry(MODEL, streaming_heads=LEFT_OUT))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), sink=st.integers(1, 40), recent=st.integers(1, 100))
def test_tail_positions_cover_the_sink_and_the_recent_window_page_by_page(n, sink, recent):
    pos = tail_positions(n, sink, recent, 16)
    assert pos.size % 16 == 0
    held = set(pos[pos >= 0].tolist())
    assert set(range(min(sink, n))) <= held
    assert set(range(max(0, n - recent), n)) <= held
    assert all(0 <= p < n for p in held)
    kv = kv_of(ModelSpec(2, 3, 4, "float32"), n, seed=n)
    pairs = [(0, 2), (1, 0), (1, 1)]
    pages = tail_pages(kv, pairs, sink, recent, 16)  # [pages, pairs, 2, 1, 16, d]
    assert pages.shape == (pos.size // 16, 3, 2, 1, 16, 4)
    rows = pages[:, :, :, 0].transpose(1, 2, 0, 3, 4).reshape(3, 2, -1, 4)
    for i, (layer, h) in enumerate(pairs):
        np.testing.assert_array_equal(rows[i][:, pos >= 0], kv[layer, :, h][:, pos[pos >= 0]])
    assert not rows[:, :, pos < 0].any()


def test_the_tail_geometry_holds_one_single_head_layer_per_left_out_pair():
    small = StoreGeometry(MODEL, chunk_tokens=16, group_layers=2, streaming_heads=LEFT_OUT)
    assert tail_pairs(small) == [(0, 0), (2, 1), (2, 2), (3, 2)]
    tail = tail_geometry(small)
    assert tail.model == ModelSpec(4, 1, 8, "bfloat16") and tail.num_groups == 1 and not tail.probe_keys
    assert tail_bytes(small, 16, 32) == 3 * 16 * 4 * 2 * 8 * 2  # 3 pages x 16 rows x 4 pairs x K,V x 8 dims x 2 bytes
    with pytest.raises(ValueError, match="no tail"):
        tail_geometry(dataclasses.replace(small, streaming_heads=()))


def test_tail_keys_name_one_prefix_and_one_window():
    a, b = "ab" * 32, "cd" * 32
    keys = tail_keys(a, 16, 64, 16)
    assert len(keys) == 1 + 4 and len(set(keys)) == 5 and all(len(k) == 32 for k in keys)
    assert keys == tail_keys(a, 16, 64, 16)
    assert not set(keys) & set(tail_keys(b, 16, 64, 16)) and not set(keys) & set(tail_keys(a, 16, 48, 16))


def test_a_streaming_heads_extent_is_encoded_only_with_its_group():
    small = StoreGeometry(MODEL, chunk_tokens=16, group_layers=3, streaming_heads=LEFT_OUT)
    ext = np.ascontiguousarray(kv_of(MODEL, 16)[:3])
    with pytest.raises(InvalidArgument, match="needs its group"):
        small.extent_payload(ext)
    with pytest.raises(InvalidArgument, match="needs its group"):
        small.extent_payload(ext, 1)  # group 1 has one layer
