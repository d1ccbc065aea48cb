import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.contract.errors import InvalidArgument
from kvstore.contract.geometry import ALIGN_BYTES, ModelSpec, StoreGeometry
from kvstore.contract.kv_values import key_summary, keys_as_float32
from kvstore.contract.layout import SegmentLayout, split_extents


def test_token_bytes_of_qwen7b_bf16_is_2kib_per_layer():
    # 4 KV heads x 128 dim x (K and V) x 2 bytes
    assert ModelSpec(28, 4, 128, "bfloat16").token_layer_bytes == 2048


def test_odd_sizes_layout_exact_offsets():
    # L=5 not a multiple of p=2 (groups of 2, 2, 1); n=37 not a multiple of c=16 (16, 16, 5)
    geo = StoreGeometry(ModelSpec(5, 1, 1, "bfloat16"), chunk_tokens=16, group_layers=2)
    lay = SegmentLayout(geo, 37)
    assert geo.num_groups == 3
    assert [geo.layers_in_group(g) for g in range(3)] == [2, 2, 1]
    assert lay.chunk_tokens.tolist() == [16, 16, 5]
    # one token of one layer: 2 (K,V) * 1 head * 1 dim * 2 bytes = 4 bytes
    assert lay.extent_lengths.tolist() == [[128, 128, 40], [128, 128, 40], [64, 64, 20]]
    assert (lay.extent_padded == ALIGN_BYTES).all()
    assert lay.extent_offsets.tolist() == [[0, 4096, 8192], [12288, 16384, 20480], [24576, 28672, 32768]]
    assert lay.summaries_offset == 36864
    assert lay.summaries_length == 3 * 5 * 1 * 2 * 1 * 4
    assert lay.probe_offsets == [40960, 45056, 49152]
    assert lay.probe_length == 1 * 37 * 1 * 2
    assert lay.total_bytes == 53248
    assert lay.payload_bytes == (128 * 4 + 40 * 2 + 64 * 2 + 20) + 120 + 3 * 74
    assert lay.padding_bytes == lay.total_bytes - lay.payload_bytes


def test_period_major_adjacent_chunks_are_adjacent_on_disk():
    geo = StoreGeometry(ModelSpec(28, 4, 128, "bfloat16"), chunk_tokens=16, group_layers=8)
    lay = SegmentLayout(geo, 16 * 100)
    # one extent = 8 layers * 16 tokens * 2 KiB = 256 KiB, already aligned
    assert lay.extent_lengths[0, 0] == 256 * 1024
    assert (lay.extent_padded == lay.extent_lengths).all()
    for g in range(geo.num_groups):
        ends = lay.extent_offsets[g, :-1] + lay.extent_padded[g, :-1]
        assert (ends == lay.extent_offsets[g, 1:]).all()
    # last group: 28 - 3*8 = 4 layers
    assert lay.extent_lengths[3, 0] == 128 * 1024


@settings(max_examples=200, deadline=None)
@given(
    layers=st.integers(1, 40),
    heads=st.integers(1, 8),
    dim=st.integers(1, 160),
    dtype=st.sampled_from(["bfloat16", "float16", "float32"]),
    chunk=st.integers(1, 64),
    period=st.integers(1, 12),
    tokens=st.integers(1, 3000),
    probe=st.booleans(),
)
def test_layout_regions_aligned_disjoint_and_cover_payload(layers, heads, dim, dtype, chunk, period, tokens, probe):
    geo = StoreGeometry(ModelSpec(layers, heads, dim, dtype), chunk_tokens=chunk, group_layers=period, probe_keys=probe)
    lay = SegmentLayout(geo, tokens)
    regions = [(int(o), int(n)) for o, n in zip(lay.extent_offsets.ravel(), lay.extent_lengths.ravel())]
    regions.append((lay.summaries_offset, lay.summaries_length))
    regions += [(o, lay.probe_length) for o in lay.probe_offsets]
    regions.sort()
    for (o1, n1), (o2, _) in zip(regions, regions[1:]):
        assert o1 + n1 <= o2
    assert all(o % ALIGN_BYTES == 0 for o, _ in regions)
    assert regions[-1][0] + regions[-1][1] <= lay.total_bytes
    assert lay.total_bytes % ALIGN_BYTES == 0
    assert sum(n for _, n in regions) == lay.payload_bytes
    assert int(lay.chunk_tokens.sum()) == tokens
    assert sum(geo.layers_in_group(g) for g in range(geo.num_groups)) == layers


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(num_layers=0, num_kv_heads=1, head_dim=1), "num_layers"),
        (dict(num_layers=2, num_kv_heads=-1, head_dim=1), "num_kv_heads"),
        (dict(num_layers=2, num_kv_heads=1, head_dim=1.5), "head_dim"),
        (dict(num_layers=2, num_kv_heads=1, head_dim=1, dtype="int4"), "dtype"),
    ],
)
def test_invalid_model_spec_names_field(kwargs, field):
    with pytest.raises(InvalidArgument) as err:
        ModelSpec(**kwargs)
    assert err.value.field == field
    assert field in str(err.value)


def test_invalid_geometry_names_field():
    with pytest.raises(InvalidArgument, match="chunk_tokens"):
        StoreGeometry(ModelSpec(2, 1, 1), chunk_tokens=0)
    with pytest.raises(InvalidArgument, match="group_layers"):
        StoreGeometry(ModelSpec(2, 1, 1), group_layers=True)
    with pytest.raises(InvalidArgument, match="geometry.model"):
        StoreGeometry.from_dict({"model": {"num_layers": 2, "num_kv_heads": 1, "head_dim": 1, "bogus": 1}})


def test_geometry_roundtrip_and_digest_depends_on_layout():
    geo = StoreGeometry(ModelSpec(3, 2, 4, "float32"), chunk_tokens=7, group_layers=3)
    assert StoreGeometry.from_dict(geo.to_dict()) == geo
    other = StoreGeometry(ModelSpec(3, 2, 4, "float32"), chunk_tokens=8, group_layers=3)
    assert geo.digest != other.digest


def test_split_extents_and_key_summary():
    geo = StoreGeometry(ModelSpec(3, 1, 2, "float32"), chunk_tokens=4, group_layers=2)
    kv = np.arange(3 * 2 * 1 * 6 * 2, dtype=np.float32).reshape(3, 2, 1, 6, 2)
    ext = {(g, j): e for g, j, e in split_extents(geo, kv)}
    assert sorted(ext) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert ext[(1, 1)].shape == (1, 2, 1, 2, 2)
    np.testing.assert_array_equal(ext[(1, 1)], kv[2:3, :, :, 4:6])
    s = key_summary(ext[(0, 1)], "float32")  # [layers, heads, 2, dim]
    np.testing.assert_array_equal(s[:, :, 0], kv[0:2, 0, :, 4:6].min(axis=2))
    np.testing.assert_array_equal(s[:, :, 1], kv[0:2, 0, :, 4:6].max(axis=2))


def test_bfloat16_summary_widens_bits_exactly():
    vals = np.array([1.5, -2.0, 0.25], dtype=np.float32)
    bf = (vals.view(np.uint32) >> 16).astype(np.uint16).reshape(1, 1, 1, 3, 1)
    ext = np.concatenate([bf, bf], axis=1)  # K and V
    s = key_summary(ext, "bfloat16")
    assert s[0, 0, 0, 0] == -2.0 and s[0, 0, 1, 0] == 1.5


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("shape", [(8, 2, 2, 16, 64), (3, 2, 4, 5, 128), (1, 2, 1, 1, 8)])
def test_key_summary_is_the_min_and_max_over_tokens_bit_for_bit(dtype, shape):
    """Signed zeros included: the summary is stored, so the same keys must always give the same bytes."""
    rng = np.random.default_rng(len(shape) + shape[3])
    values = rng.standard_normal(shape).astype(np.float32)
    values.reshape(-1)[::7] = -0.0
    values.reshape(-1)[::11] = 0.0
    ext = (values.view(np.uint32) >> 16).astype(np.uint16) if dtype == "bfloat16" else values.astype(dtype)
    keys = keys_as_float32(ext[:, 0], dtype)
    expected = np.stack([keys.min(axis=2), keys.max(axis=2)], axis=2)
    got = key_summary(ext, dtype)
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_records_keep_the_stored_group_under_its_first_name_so_ids_do_not_change():
    import hashlib
    import json

    geo = StoreGeometry(ModelSpec(30, 3, 64, "float32"), chunk_tokens=16, group_layers=2)
    rec = geo.to_record()
    assert rec["period_layers"] == 2 and "group_layers" not in rec
    assert geo.to_dict()["group_layers"] == 2 and "period_layers" not in geo.to_dict()
    assert StoreGeometry.from_dict(rec) == StoreGeometry.from_dict(geo.to_dict()) == geo
    # the digest (in every chunk hash and prefix id) is the one records written before the rename give
    old = {"model": {"num_layers": 30, "num_kv_heads": 3, "head_dim": 64, "dtype": "float32"}}
    old |= {"chunk_tokens": 16, "period_layers": 2, "probe_keys": True}
    blob = json.dumps(old, sort_keys=True, separators=(",", ":")).encode()
    assert geo.digest == hashlib.sha256(b"kvstore.geometry.v1\0" + blob).digest()
    with pytest.raises(InvalidArgument, match="twice"):
        StoreGeometry.from_dict(rec | {"group_layers": 2})
    # probe keys stored quantized are another layout, hence another digest; the
    # record names probe_bits only then, so a default geometry's digest above holds
    quantized = StoreGeometry(ModelSpec(30, 3, 64, "float32"), chunk_tokens=16, group_layers=2, probe_bits=4)
    assert quantized.to_record() == rec | {"probe_bits": 4} and "probe_bits" not in rec
    assert quantized.digest != geo.digest
    assert StoreGeometry.from_dict(quantized.to_record()) == quantized
    assert StoreGeometry.from_dict(old) == geo  # a record written before probe_bits existed


def test_quantized_probe_region_is_packed_rows_of_codes_and_a_scale():
    # SmolLM2-135M: 3 KV heads of 64 dims, float32; a 4-bit row is 32 bytes of codes + 4 of scale
    full = StoreGeometry(ModelSpec(30, 3, 64, "float32"), group_layers=1)
    q4 = StoreGeometry(ModelSpec(30, 3, 64, "float32"), group_layers=1, probe_bits=4)
    q8 = StoreGeometry(ModelSpec(30, 3, 64, "float32"), group_layers=1, probe_bits=8)
    assert full.probe_bytes(37) == 3 * 37 * 64 * 4
    assert q4.probe_bytes(37) == 3 * 37 * 36 and q8.probe_bytes(37) == 3 * 37 * 68
    lay, lay4 = SegmentLayout(full, 37), SegmentLayout(q4, 37)
    assert lay4.probe_length == 3 * 37 * 36 and lay4.probe_offsets[0] == lay.probe_offsets[0]  # regions follow the summaries
    assert all(o % ALIGN_BYTES == 0 for o in lay4.probe_offsets) and lay4.total_bytes < lay.total_bytes
    region = np.zeros(lay4.probe_length, dtype=np.uint8)
    assert q4.probe_array(region, 37).shape == (3, 37, 36)
    assert full.probe_array(np.zeros(lay.probe_length, dtype=np.uint8), 37).dtype == np.float32


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"probe_bits": 2}, "must be one of 0, 4, 8"),
        ({"probe_bits": True}, "must be one of"),
        ({"probe_bits": "4"}, "must be one of"),
        ({"probe_bits": 4, "probe_keys": False}, "needs probe_keys"),
    ],
)
def test_bad_probe_bits_are_refused_naming_the_field(kwargs, message):
    with pytest.raises(InvalidArgument, match=message) as err:
        StoreGeometry(ModelSpec(2, 1, 4, "float32"), **kwargs)
    assert err.value.field == "probe_bits" and "\n" not in str(err.value)
    with pytest.raises(InvalidArgument, match="head_dim 5 is odd"):
        StoreGeometry(ModelSpec(2, 1, 5, "float32"), probe_bits=4)
    assert StoreGeometry(ModelSpec(2, 1, 5, "float32"), probe_bits=8).probe_bytes(3) == 3 * (5 + 4)  # 8 bits: any head_dim


@settings(max_examples=60, deadline=None)
@given(
    layers=st.integers(1, 33),
    group=st.integers(1, 8),
    tokens=st.integers(0, 5000),
    quant=st.sampled_from(["", "kv8", "kv4", "kv8t", "kv4t", "kv8h", "kv4h"]),
)
def test_kv_bytes_is_every_chunks_extent_summed(layers, group, tokens, quant):
    """A request prices a whole prefix with ``kv_bytes`` (per group, not per chunk): it must be the layout's sum."""
    geo = StoreGeometry(ModelSpec(layers, 2, 64, "bfloat16"), group_layers=group, kv_quant=quant)
    each = sum(geo.extent_bytes(g, int(t)) for g in range(geo.num_groups) for t in geo.chunk_token_counts(tokens))
    assert geo.kv_bytes(tokens) == each
