"""Accelerator compute model: FLOPs against the real decoder layer, roofline regimes, profile parsing."""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from engine_client.compute_model import (
    PROFILES,
    AcceleratorProfile,
    attention_pairs,
    h2d_seconds,
    layer_bytes,
    layer_flops,
    layer_seconds,
    model_seconds,
    parse_profile,
)
from engine_client.model.config import ModelConfig
from engine_client.model.decoder import Decoder, DecoderWeights, LayerWeights
from engine_client.model.kernels import _gqa_attention
from kvstore.contract.errors import InvalidArgument


def tiny_config(attention_bias: bool) -> ModelConfig:
    arch = "Qwen2ForCausalLM" if attention_bias else "LlamaForCausalLM"
    return ModelConfig(arch, 32, 64, 96, 1, 4, 2, 16, 10000.0, 1e-6, 512, False, attention_bias)


def random_decoder(config: ModelConfig) -> Decoder:
    g = torch.Generator().manual_seed(0)
    c = config
    qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim

    def rand(*shape):
        return torch.randn(*shape, generator=g) * 0.1

    layer = LayerWeights(
        input_norm=torch.ones(c.hidden_size),
        qkv_weight=rand(qkv, c.hidden_size),
        qkv_bias=rand(qkv) if c.attention_bias else None,
        o_weight=rand(c.hidden_size, c.num_attention_heads * c.head_dim),
        post_norm=torch.ones(c.hidden_size),
        gate_up_weight=rand(2 * c.intermediate_size, c.hidden_size),
        down_weight=rand(c.hidden_size, c.intermediate_size),
    )
    embed = rand(c.vocab_size, c.hidden_size)
    return Decoder(c, DecoderWeights(embed, [layer], torch.ones(c.hidden_size), embed))


def explicit_attention(q, keys, values, context_rows):
    """Per new token ``i``: ``q_i . k^T`` then ``p x v`` over its ``context_rows + i + 1`` rows, every query head."""
    hq, s, d = q.shape
    g = hq // keys.shape[0]
    k = keys.repeat_interleave(g, dim=0)  # [Hq, r+s, d]: query head h reads KV head h // g
    v = values.repeat_interleave(g, dim=0)
    out = []
    for i in range(s):
        seen = context_rows + i + 1
        scores = torch.bmm(q[:, i : i + 1], k[:, :seen].transpose(1, 2)) / d**0.5  # [Hq, 1, seen]
        out.append(torch.bmm(scores.softmax(-1), v[:, :seen]))  # [Hq, 1, d]
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("attention_bias", [False, True])
@pytest.mark.parametrize("new_tokens, context_rows", [(5, 0), (1, 7), (6, 11)])
def test_flops_equal_a_direct_count_of_the_real_layer(attention_bias, new_tokens, context_rows):
    config = tiny_config(attention_bias)
    decoder = random_decoder(config)
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(new_tokens, config.hidden_size, generator=g)
    positions = torch.arange(context_rows, context_rows + new_tokens)
    prefix_kv = torch.randn(2, config.num_key_value_heads, context_rows, config.head_dim, generator=g) if context_rows else None

    # The projections and the MLP: FlopCounterMode over the project's own layer_forward.  The CPU
    # scaled_dot_product_attention kernel is not counted by FlopCounterMode (it reports 0 FLOPs), so
    # everything counted here is the layer's matmuls outside attention.
    with FlopCounterMode(display=False) as counter:
        decoder.layer_forward(0, hidden, positions, prefix_kv)
    want = layer_flops(config, new_tokens, context_rows)
    assert counter.get_total_flops() == want.projections + want.mlp
    assert want.projections == 2 * new_tokens * config.hidden_size * (4 + 2 * 2 + 4) * 16
    assert want.mlp == 2 * new_tokens * config.hidden_size * 3 * 96

    # Attention: an explicit per-token q . k^T and p x v, counted by FlopCounterMode, and checked to be
    # the attention the layer computes (same output as the decoder's kernel on the same q, K, V).
    q = torch.randn(config.num_attention_heads, new_tokens, config.head_dim, generator=g)
    keys = torch.randn(config.num_key_value_heads, context_rows + new_tokens, config.head_dim, generator=g)
    values = torch.randn_like(keys)
    with FlopCounterMode(display=False) as counter:
        out = explicit_attention(q, keys, values, context_rows)
    torch.testing.assert_close(out, _gqa_attention(q, keys, values, context_rows), atol=1e-5, rtol=1e-5)
    assert counter.get_total_flops() == want.attention > 0
    assert want.total == want.projections + want.attention + want.mlp


def big_config() -> ModelConfig:
    # Llama-3-8B shapes.
    return ModelConfig("LlamaForCausalLM", 128256, 4096, 14336, 32, 32, 8, 128, 5e5, 1e-5, 8192, False, False)


def test_decode_is_memory_bound_and_long_prefill_compute_bound_on_h100():
    config, h100 = big_config(), PROFILES["h100"]
    decode = layer_seconds(config, 1, 4096, h100)
    prefill = layer_seconds(config, 8192, 0, h100)
    for part in (decode.projections, decode.attention, decode.mlp):
        assert part.bound == "memory" and part.seconds == part.memory_s > 10 * part.compute_s
    for part in (prefill.projections, prefill.attention, prefill.mlp):
        assert part.bound == "compute" and part.seconds == part.compute_s > part.memory_s
    # Decode reads the layer's weights (~218 MB in bf16) once: about their bytes over the effective bandwidth.
    weights = 2 * (4096 * (32 + 16) * 128 + 32 * 128 * 4096 + 3 * 4096 * 14336)
    assert decode.mlp.memory_s + decode.projections.memory_s == pytest.approx(weights / (3.35e12 * 0.8), rel=0.01)
    # A compute-bound prefill: its FLOPs over peak x efficiency, plus the overhead.
    assert prefill.total == pytest.approx(layer_flops(config, 8192, 0).total / (989e12 * 0.6) + h100.layer_overhead_s)

    doubled = dataclasses.replace(h100, peak_flops=2 * h100.peak_flops)
    fast_prefill = layer_seconds(config, 8192, 0, doubled)
    fast_decode = layer_seconds(config, 1, 4096, doubled)
    assert fast_prefill.total - doubled.layer_overhead_s == pytest.approx((prefill.total - h100.layer_overhead_s) / 2)
    assert fast_decode.total == pytest.approx(decode.total)  # memory-bound: more FLOP/s buys nothing


def test_time_grows_with_context_and_bytes_count_the_kv_rows():
    config = big_config()
    short, long = layer_bytes(config, 32, 0), layer_bytes(config, 32, 1000)
    assert long.attention - short.attention == 1000 * 8 * 128 * 2 * 2  # K and V rows of every KV head, bf16
    assert long.projections == short.projections and long.mlp == short.mlp
    h100 = PROFILES["h100"]
    assert layer_seconds(config, 32, 1000, h100).total > layer_seconds(config, 32, 0, h100).total
    assert h2d_seconds(long.attention, h100) == pytest.approx(long.attention / h100.h2d_bytes_per_s)
    assert PROFILES["a100"].h2d_bytes_per_s == pytest.approx(PROFILES["h100"].h2d_bytes_per_s / 2)


def test_parse_profile_names_and_custom():
    assert parse_profile("h100") is PROFILES["h100"] and parse_profile(" A800 ") is PROFILES["a800"]
    assert PROFILES["a800"].peak_flops == PROFILES["a100"].peak_flops == 312e12
    p = parse_profile("custom:flops=1e15,bw=2.5e12,h2d=5e10,eff=0.5,overhead=1e-5")
    assert (p.peak_flops, p.mem_bytes_per_s, p.h2d_bytes_per_s) == (1e15, 2.5e12, 5e10)
    assert (p.matmul_efficiency, p.mem_efficiency, p.layer_overhead_s) == (0.5, 0.8, 1e-5)
    assert p == AcceleratorProfile("custom", 1e15, 2.5e12, 5e10, matmul_efficiency=0.5, layer_overhead_s=1e-5)


@pytest.mark.parametrize(
    "text, field",
    [
        ("b200", "profile"),
        ("custom:flops=1e15,bw=2e12,h2d=5e10,speed=3", "profile.speed"),
        ("custom:flops=-1e15,bw=2e12,h2d=5e10", "profile.flops"),
        ("custom:flops=1e15,bw=2e12,h2d=5e10,eff=1.5", "profile.eff"),
        ("custom:flops=1e15,bw=2e12,h2d=5e10,mem_eff=0", "profile.mem_eff"),
        ("custom:flops=1e15,bw=fast,h2d=5e10", "profile.bw"),
        ("custom:flops=1e15,bw=2e12,h2d=inf", "profile.h2d"),
        ("custom:flops=1e15,bw=2e12", "profile.h2d"),
    ],
)
def test_parse_profile_errors_name_the_field(text, field):
    with pytest.raises(InvalidArgument) as err:
        parse_profile(text)
    assert err.value.field == field


@pytest.mark.parametrize(
    "field, value",
    [("peak_flops", 0.0), ("mem_bytes_per_s", float("nan")), ("matmul_efficiency", 1.01), ("layer_overhead_s", -1e-6), ("dtype_bytes", 0)],
)
def test_profile_fields_are_validated(field, value):
    with pytest.raises(InvalidArgument) as err:
        dataclasses.replace(PROFILES["h100"], **{field: value})
    assert err.value.field == field


def gemma3_270m(layer_types=True) -> ModelConfig:
    """Gemma 3 270M's shape: 18 layers, every 6th global, the others sliding over 512 positions."""
    kinds = tuple("full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18))
    return ModelConfig(
        "Gemma3ForCausalLM", 262144, 640, 2048, 18, 4, 1, 256, 1e6, 1e-6, 32768, True, False, hidden_act="gelu_pytorch_tanh",
        layer_types=kinds if layer_types else None, sliding_window=512 if layer_types else None,
        rope_local_theta=1e4 if layer_types else None, query_pre_attn_scalar=256,
    )  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 200), st.integers(0, 300), st.integers(1, 400))
def test_a_sliding_layers_pairs_are_a_direct_count(new_tokens, context_rows, window):
    direct = sum(min(context_rows + i + 1, window) for i in range(new_tokens))
    assert attention_pairs(new_tokens, context_rows, window) == direct
    assert attention_pairs(new_tokens, context_rows) == sum(context_rows + i + 1 for i in range(new_tokens))


def test_a_model_prices_each_layer_by_its_kind():
    h100 = PROFILES["h100"]
    llama = big_config()
    assert model_seconds(llama, 64, 4096, h100) == 32 * layer_seconds(llama, 64, 4096, h100).total
    gemma, unwindowed = gemma3_270m(), gemma3_270m(layer_types=False)
    assert layer_flops(gemma, 2048, 0, window=512).attention == 4 * 4 * 256 * sum(min(i + 1, 512) for i in range(2048))
    assert layer_bytes(gemma, 64, 32768, window=512).attention == layer_bytes(gemma, 64, 511).attention  # no row before the window
    for tokens in (2048, 8192, 32768):  # a recompute: 3 global layers grow with the square, 15 sliding ones linearly
        want = 3 * layer_seconds(gemma, tokens, 0, h100).total + 15 * layer_seconds(gemma, tokens, 0, h100, window=512).total
        assert model_seconds(gemma, tokens, 0, h100) == pytest.approx(want)
    short, long = (model_seconds(gemma, n, 0, h100) / model_seconds(unwindowed, n, 0, h100) for n in (2048, 32768))
    assert long < short < 1  # the window saves more the longer the prompt
    # a Re-Prefill: the global layers over the loaded rows, the sliding ones over their window tail whatever the budget
    loaded = model_seconds(gemma, 64, 1638, h100, sliding_rows=32768)
    sliding = layer_seconds(gemma, 64, 32768, h100, window=512).total
    assert loaded == pytest.approx(3 * layer_seconds(gemma, 64, 1638, h100).total + 15 * sliding)
    assert sliding == layer_seconds(gemma, 64, 4096, h100, window=512).total > layer_seconds(gemma, 64, 100, h100, window=512).total
    with pytest.raises(InvalidArgument, match="window"):
        layer_flops(gemma, 8, 0, window=0)
