"""KV8/KV4 extents: error bounds, sizes, packing, refusals, and the geometry that names them."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.contract import kvquant
from kvstore.contract.errors import InvalidArgument
from kvstore.contract.geometry import ModelSpec, StoreGeometry
from kvstore.contract.kv_values import float32_as_kv, keys_as_float32
from kvstore.contract.layout import SegmentLayout

SCHEMES = list(kvquant.KV_QUANT)


def _extent(rng, layers, heads, tokens, dim, scale=1.0):
    x = rng.standard_normal((layers, 2, heads, tokens, dim)).astype(np.float32) * scale
    x[..., 3 % dim] *= 20  # an outlier channel, as real keys have
    return x


@pytest.mark.parametrize("name", SCHEMES)
@settings(max_examples=25, deadline=None)
@given(
    heads=st.integers(1, 3),
    tokens=st.integers(1, 17),
    half_dim=st.integers(1, 40),
    scale=st.sampled_from([1e-3, 1.0, 300.0]),
    seed=st.integers(0, 2**31),
)
def test_roundtrip_is_within_half_a_step(name, heads, tokens, half_dim, scale, seed):
    dim = 2 * half_dim
    x = _extent(np.random.default_rng(seed), 2, heads, tokens, dim, scale)
    raw = kvquant.encode(name, x)
    assert raw.dtype == np.uint8 and raw.size == 2 * kvquant.layer_bytes(name, heads, tokens, dim)
    back = kvquant.decode(name, raw, 2, heads, tokens, dim)
    assert back.shape == x.shape
    err = np.abs(back - x)
    assert (err <= kvquant.max_error(name, x)).all(), float((err - kvquant.max_error(name, x)).max())


@pytest.mark.parametrize("name", [n for n in SCHEMES if not kvquant.KV_QUANT[n].rotated])
def test_codes_use_the_whole_range_and_constant_groups_are_exact(name):
    bits = kvquant.KV_QUANT[name].bits
    x = np.zeros((1, 2, 1, 16, 64), dtype=np.float32)
    x[..., :] = np.linspace(-1, 1, 16, dtype=np.float32)[:, None]  # keys per token: constant rows
    back = kvquant.decode(name, kvquant.encode(name, x), 1, 1, 16, 64)
    if kvquant.KV_QUANT[name].key_per_token:
        np.testing.assert_allclose(back[0, 0], x[0, 0], atol=1e-3)  # each row is one value: exact up to float16 zero
    step = 2 / ((1 << bits) - 1)
    assert np.abs(back - x).max() <= step / 2 + 1e-3


def test_four_bit_codes_pack_two_channels_low_nibble_first():
    # one head, one token, per-token values: channel c gets code c % 16 exactly (range 0..15, step 1)
    x = np.zeros((1, 2, 1, 1, 64), dtype=np.float32)
    x[0, 1, 0, 0] = np.arange(64) % 16
    raw = kvquant.encode("kv4t", x)
    v_codes = raw[kvquant.layer_bytes("kv4t", 1, 1, 64) // 2 :][:32]
    assert v_codes.tolist() == [(2 * i % 16) | ((2 * i + 1) % 16) << 4 for i in range(32)]
    np.testing.assert_array_equal(kvquant.decode("kv4t", raw, 1, 1, 1, 64)[0, 1], x[0, 1])


def test_sizes_against_bfloat16_for_a_16_token_chunk():
    # SmolLM2-135M's shape: 3 KV heads x 64 dim; bf16 K+V of one layer-chunk = 2 * 3 * 16 * 64 * 2 bytes
    raw = 2 * 3 * 16 * 64 * 2
    sizes = {name: kvquant.layer_bytes(name, 3, 16, 64) for name in SCHEMES}
    # codes H*t*d*bits/8 each for K and V; float16 scale + zero per group
    assert sizes["kv4t"] == 2 * (3 * 16 * 32 + 3 * 16 * 4)
    assert sizes["kv4"] == 3 * 16 * 32 + 3 * 64 * 4 + 3 * 16 * 32 + 3 * 16 * 4
    assert sizes["kv8"] == 3 * 16 * 64 + 3 * 64 * 4 + 3 * 16 * 64 + 3 * 16 * 4
    assert raw / sizes["kv4t"] >= 3.5 and raw / sizes["kv4"] > 3.0 and raw / sizes["kv8"] > 1.7


@pytest.mark.parametrize(("value", "message"), [(np.nan, "finite"), (np.inf, "finite"), (1e6, "within")])
def test_values_it_cannot_hold_are_refused(value, message):
    x = np.zeros((1, 2, 1, 4, 8), dtype=np.float32)
    x[0, 0, 0, 1, 2] = value
    with pytest.raises(InvalidArgument, match=message) as exc:
        kvquant.encode("kv8", x)
    assert exc.value.field == "kv"


def test_decode_refuses_a_short_extent():
    raw = kvquant.encode("kv8", np.ones((1, 2, 1, 4, 8), dtype=np.float32))
    with pytest.raises(InvalidArgument, match="bytes"):
        kvquant.decode("kv8", raw[:-1], 1, 1, 4, 8)


def test_geometry_names_its_scheme_and_keeps_old_ids():
    m = ModelSpec(4, 2, 64, "bfloat16")
    plain, q = StoreGeometry(m), StoreGeometry(m, kv_quant="kv4")
    assert "kv_quant" not in plain.to_record() and q.to_record()["kv_quant"] == "kv4"
    assert plain.digest != q.digest
    assert StoreGeometry.from_dict(q.to_record()) == q
    with pytest.raises(InvalidArgument, match="kv_quant"):
        StoreGeometry(m, kv_quant="kv2")
    with pytest.raises(InvalidArgument, match="odd"):
        StoreGeometry(ModelSpec(2, 1, 7, "float32"), kv_quant="kv4")
    assert StoreGeometry(ModelSpec(2, 1, 7, "float32"), kv_quant="kv8").extent_bytes(0, 16) > 0


@pytest.mark.parametrize("name", SCHEMES)
def test_layout_sizes_each_chunk_including_a_short_last_one(name):
    geo = StoreGeometry(ModelSpec(5, 2, 8, "float16"), chunk_tokens=16, group_layers=2, kv_quant=name)
    lay = SegmentLayout(geo, 37)
    for g in range(geo.num_groups):
        assert lay.extent_lengths[g].tolist() == [geo.extent_bytes(g, t) for t in (16, 16, 5)]
    assert geo.kv_bytes(37) == int(lay.extent_lengths.sum())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_extent_payload_and_array_round_trip_in_the_kv_dtype(dtype):
    geo = StoreGeometry(ModelSpec(3, 2, 16, dtype), chunk_tokens=16, group_layers=2, kv_quant="kv8")
    x = np.random.default_rng(1).standard_normal((2, 2, 2, 16, 16)).astype(np.float32)
    ext = float32_as_kv(x, dtype)
    raw = geo.extent_payload(ext)
    assert raw.size == geo.extent_bytes(0, 16)
    back = geo.extent_array(raw, 0, 16)
    assert back.dtype == geo.model.numpy_dtype() and back.shape == ext.shape
    widened = keys_as_float32(ext, dtype)
    bound = kvquant.max_error("kv8", widened) + np.abs(widened) * 2.0**-7  # plus the KV dtype's own rounding
    assert (np.abs(keys_as_float32(back, dtype) - widened) <= bound).all()


def test_bfloat16_rounding_is_to_nearest_even():
    vals = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5, 0.0], dtype=np.float32)
    got = keys_as_float32(float32_as_kv(vals, "bfloat16"), "bfloat16")
    np.testing.assert_array_equal(got, [1.0, 1.0, 1.0 + 2**-6, -2.5, 0.0])


@pytest.mark.parametrize("name", ["", "kv8", "kv4t"])
def test_a_groups_extents_decode_together_as_one_by_one(name):
    geo = StoreGeometry(ModelSpec(3, 2, 8, "bfloat16"), chunk_tokens=16, group_layers=2, kv_quant=name)
    rng = np.random.default_rng(2)
    counts = [16, 16, 5, 16]  # a short chunk among full ones: each size decodes in its own pass
    exts = [float32_as_kv(rng.standard_normal((2, 2, 2, t, 8)).astype(np.float32), "bfloat16") for t in counts]
    raws = [np.ascontiguousarray(geo.extent_payload(e)).reshape(-1).view(np.uint8) for e in exts]
    one_by_one = np.concatenate([geo.extent_array(r, 0, t) for r, t in zip(raws, counts)], axis=3)
    np.testing.assert_array_equal(geo.group_array(raws, 0, counts), one_by_one)


@pytest.mark.parametrize("dim", [2, 7, 12, 64, 80, 96, 128])
def test_rotation_is_orthogonal_symmetric_and_spreads_within_blocks(dim):
    r = kvquant.rotation(dim).astype(np.float64)
    np.testing.assert_allclose(r @ r, np.eye(dim), atol=1e-6)  # symmetric orthogonal: its own inverse
    np.testing.assert_array_equal(r, r.T)
    block = dim & -dim  # 7 -> 1 (identity), 80 -> 16, 96 -> 32
    nonzero = np.abs(r) > 0
    assert (nonzero.sum(axis=1) == block).all()
    np.testing.assert_allclose(np.abs(r[nonzero]), 1 / np.sqrt(block), rtol=1e-6)
    x = np.random.default_rng(dim).standard_normal((3, 5, dim)).astype(np.float32)
    np.testing.assert_allclose(kvquant.rotate(x), x @ kvquant.rotation(dim), atol=1e-5)  # the transform is the matrix
    np.testing.assert_array_equal(kvquant.rotate(x)[1:2], kvquant.rotate(x[1:2]))  # the same bits whatever the batch


def test_rotated_keys_lose_less_to_an_outlier_channel_than_plain_per_token_keys():
    # the same bytes as kv4t, but an outlier channel no longer sets every token's step
    x = _extent(np.random.default_rng(7), 1, 3, 16, 64)
    assert kvquant.layer_bytes("kv4h", 3, 16, 64) == kvquant.layer_bytes("kv4t", 3, 16, 64)
    err = {n: np.abs(kvquant.decode(n, kvquant.encode(n, x), 1, 3, 16, 64) - x)[0] for n in ("kv4t", "kv4h")}
    assert err["kv4h"][0].mean() < err["kv4t"][0].mean() / 2  # keys
    assert err["kv4h"][1].mean() < err["kv4t"][1].mean() / 2  # values: the outlier is in every row here


def test_a_value_the_rotation_would_push_out_of_range_is_refused():
    x = np.full((1, 2, 1, 2, 64), 5000.0, dtype=np.float32)  # rotated, a row of 5000s has 8 * 5000 in channel 0
    assert kvquant.encode("kv4t", x).size
    with pytest.raises(InvalidArgument, match="within") as exc:
        kvquant.encode("kv4h", x)
    assert exc.value.field == "kv"
    with pytest.raises(InvalidArgument, match="within"):
        kvquant.check_values("kv4h", x)


@pytest.mark.parametrize("name", ["", "kv8"])
def test_a_group_is_gathered_into_the_callers_buffer_when_its_extents_are_plain(name):
    """``out``: plain extents land in the array it gives (a pinned buffer on CUDA); quantized ones decode apart."""
    geo = StoreGeometry(ModelSpec(3, 2, 8, "bfloat16"), chunk_tokens=16, group_layers=2, kv_quant=name)
    rng = np.random.default_rng(5)
    counts = [16, 5, 16]
    exts = [float32_as_kv(rng.standard_normal((2, 2, 2, t, 8)).astype(np.float32), "bfloat16") for t in counts]
    raws = [np.ascontiguousarray(geo.extent_payload(e)).reshape(-1).view(np.uint8) for e in exts]
    given = []

    def out(shape, dtype):
        given.append(np.full(shape, 7, dtype=dtype))
        return given[-1]

    got = geo.group_array(raws, 0, counts, out=out)
    np.testing.assert_array_equal(got, geo.group_array(raws, 0, counts))
    if name:
        assert not given
    else:
        assert len(given) == 1 and got is given[0] and got.shape == (2, 2, 2, sum(counts), 8)
