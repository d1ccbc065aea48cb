"""Quantized probe keys: the shared format (kvstore.contract.probes) and the client's resident keys (engine_client.selection.probes)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_client.selection import exact_chunk_scores
from engine_client.selection.probes import QuantizedKeys, check_probe_bits, quantize_keys
from kvstore.contract.errors import InvalidArgument
from kvstore.contract.probes import dequantize_probe_rows, quantize_probe_rows


def torch_reference(keys: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The client's quantizer as it was written in torch before the store shared the format."""
    k = keys.to(torch.float32)
    qmax = 2 ** (bits - 1) - 1
    scales = k.abs().amax(dim=-1, keepdim=True) / qmax
    safe = scales.clamp(min=torch.finfo(torch.float32).tiny)
    q = torch.clamp(torch.round(k / safe), -qmax, qmax).to(torch.int16)
    if bits == 8:
        return q.to(torch.int8).view(torch.uint8), scales
    u = (q + 8).to(torch.uint8)
    return u[..., 0::2] | (u[..., 1::2] << 4), scales


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([4, 8]),
    st.integers(1, 3),
    st.integers(0, 40),
    st.sampled_from([2, 8, 64]),
    st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    st.integers(0, 2**31),
)
def test_shared_quantizer_is_bitwise_the_torch_one_and_packs_rows(bits, heads, tokens, dim, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    keys = (torch.randn(heads, tokens, dim, generator=g) * torch.rand(heads, tokens, 1, generator=g) * 10).to(dtype)
    keys[:, :1] = keys[:, :1].round()  # exact halves of a step: ties round to even on both sides
    ref_codes, ref_scales = torch_reference(keys, bits)
    q = quantize_keys(keys, bits)
    assert torch.equal(q.codes, ref_codes) and torch.equal(q.scales.view(torch.int32), ref_scales.view(torch.int32))
    rows = quantize_probe_rows(keys.float().numpy(), bits)  # what a quantized probe region holds
    assert rows.dtype == np.uint8 and rows.shape == (heads, tokens, dim * bits // 8 + 4)
    np.testing.assert_array_equal(rows[..., : dim * bits // 8], ref_codes.numpy())
    np.testing.assert_array_equal(rows[..., -4:].copy().view("<f4"), ref_scales.numpy())
    back = QuantizedKeys.from_packed(rows, bits, dim)
    assert torch.equal(back.codes, q.codes) and torch.equal(back.scales, q.scales) and back.nbytes == rows.nbytes
    # the numpy dequantization is the torch one, within half a step of every key
    deq = dequantize_probe_rows(rows, bits, dim)
    np.testing.assert_array_equal(deq, back.dequantize().numpy())
    assert np.all(np.abs(deq - keys.float().numpy()) <= ref_scales.numpy() / 2 * (1 + 1e-5) + 1e-12)


def test_packed_rows_are_refused_when_their_width_is_not_the_bits():
    rows = quantize_probe_rows(np.ones((1, 3, 8), np.float32), 4)  # 4 + 4 bytes a row
    with pytest.raises(InvalidArgument, match="probe_keys"):
        QuantizedKeys.from_packed(rows, 8, 8)
    with pytest.raises(InvalidArgument, match="probe_bits"):
        QuantizedKeys.from_packed(rows, 3, 8)
    with pytest.raises(InvalidArgument, match="probe_keys"):
        quantize_probe_rows(np.ones((1, 3, 7), np.float32), 4)  # odd channels do not pack two to a byte


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([4, 8]), st.integers(1, 3), st.integers(1, 40), st.sampled_from([2, 8, 64]), st.integers(0, 2**31))
def test_every_element_is_within_half_a_step(bits, heads, tokens, dim, seed):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(heads, tokens, dim, generator=g) * torch.rand(heads, tokens, 1, generator=g) * 10
    q = quantize_keys(keys, bits)
    back = q.dequantize()
    qmax = 2 ** (bits - 1) - 1
    step = keys.abs().amax(-1, keepdim=True) / qmax
    assert back.shape == keys.shape
    assert torch.all((back - keys).abs() <= step / 2 * (1 + 1e-5) + 1e-12)
    assert q.nbytes == heads * tokens * (dim * bits // 8 + 4)  # packed codes plus one float32 scale per row


def test_four_bit_codes_are_packed_two_to_a_byte_and_unpack_in_order():
    keys = torch.tensor([[[7.0, -7.0, 1.0, 0.0, -3.0, 3.0]]])  # scale 1: codes are the values
    q = quantize_keys(keys, 4)
    assert q.codes.dtype == torch.uint8 and q.codes.shape == (1, 1, 3)
    assert q.codes[0, 0].tolist() == [(7 + 8) | ((-7 + 8) << 4), (1 + 8) | (8 << 4), (-3 + 8) | ((3 + 8) << 4)]
    assert torch.equal(q.dequantize(), keys)


def test_zero_keys_stay_zero():
    assert torch.equal(quantize_keys(torch.zeros(2, 5, 8), 4).dequantize(), torch.zeros(2, 5, 8))


def test_four_bit_scores_rank_a_planted_chunk_first():
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(2, 160, 64, generator=g)
    query = torch.randn(4, 3, 64, generator=g)
    keys[:, 80:96] = query[::2].mean(1, keepdim=True) * 3  # chunk 5 answers every query of both KV heads
    exact = exact_chunk_scores(query, keys)
    approx = exact_chunk_scores(query, quantize_keys(keys, 4).dequantize())
    assert int(exact.argmax()) == int(approx.argmax()) == 5


def test_bad_bit_widths_are_refused_naming_the_field():
    for bits in (2, 16, True, "4"):
        with pytest.raises(InvalidArgument, match="probe_bits"):
            check_probe_bits(bits)
    with pytest.raises(InvalidArgument, match="probe_bits"):
        quantize_keys(torch.zeros(1, 2, 4), 3)
    with pytest.raises(InvalidArgument, match="probe_keys"):
        quantize_keys(torch.zeros(2, 4), 4)
