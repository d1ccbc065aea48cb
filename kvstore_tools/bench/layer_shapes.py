"""Decoder shapes of the models the benches time one layer of, and a one-layer ``Decoder`` of random weights.

``calibrate`` (the layer fixed cost of a profile) and ``prefill --shapes``
(the per-layer comparison) time layer 0 of these shapes: only the layer's
weights exist, and a 256-row table stands in for the vocabulary (the
embedding is never timed).  No torch import at module level: the parsers
read ``SHAPES`` for their help.
"""

from __future__ import annotations

import dataclasses

# Hugging Face config.json fields of each shape (rope_theta as the model ships it).
SHAPES = {
    "smollm2-135m": dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        rope_theta=1e5,
        attention_bias=False,
    ),
    "qwen2.5-0.5b": dict(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_attention_heads=14,
        num_key_value_heads=2,
        head_dim=64,
        rope_theta=1e6,
        attention_bias=True,
    ),
    "llama3-8b": dict(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rope_theta=5e5,
        attention_bias=False,
    ),
}
_STANDIN_VOCAB_ROWS = 256
DEPTHS = {"smollm2-135m": 30, "qwen2.5-0.5b": 24, "llama3-8b": 32}  # decoder layers of each model
# whole models of these shapes with random weights made in memory on the device (``seeded_model``): the benches'
# ``--model NAME-shape`` where writing the checkpoint would take longer than the run (16 GB for Llama-3-8B)
IN_MEMORY_MODELS = {"llama3-8b-shape": "llama3-8b", "smollm2-135m-shape": "smollm2-135m"}


def shape_config(shape: str):
    """The one-layer ``ModelConfig`` of ``shape`` (Qwen2 where the shape has attention bias, else Llama)."""
    from engine_client.model.config import ModelConfig

    s = SHAPES[shape]
    return ModelConfig(
        architecture="Qwen2ForCausalLM" if s["attention_bias"] else "LlamaForCausalLM",
        num_hidden_layers=1,
        rms_norm_eps=1e-6,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        **s,
    )


def random_decoder(shape: str, device: str, dtype, seed: int = 0):
    """``(config, Decoder)`` of one layer of ``shape`` with random weights (drawn on the CPU from ``seed``, so
    every device gets the same ones); norm scales near 1, projections of std 0.02."""
    import torch

    from engine_client.model.decoder import Decoder, DecoderWeights

    cfg = shape_config(shape)
    h = cfg.hidden_size
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape, std=0.02, mean=0.0):
        return (torch.randn(*shape, generator=gen) * std + mean).to(device=device, dtype=dtype)

    layer = _layer_weights(cfg, rand)
    embed = rand(_STANDIN_VOCAB_ROWS, h)  # [256, hidden]: stands in for the vocabulary
    return cfg, Decoder(cfg, DecoderWeights(embed, [layer], torch.ones(h, device=device, dtype=dtype), embed))


def _layer_weights(cfg, rand):
    """One layer's weights drawn by ``rand(*dims, std=, mean=)``: norm scales near 1, projections of std 0.02."""
    from engine_client.model.decoder import LayerWeights

    h, hq, hkv, d, i = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size
    return LayerWeights(
        input_norm=rand(h, std=0.1, mean=1.0),
        qkv_weight=rand((hq + 2 * hkv) * d, h),  # rows q | k | v
        qkv_bias=rand((hq + 2 * hkv) * d) if cfg.attention_bias else None,
        o_weight=rand(h, hq * d),
        post_norm=rand(h, std=0.1, mean=1.0),
        gate_up_weight=rand(2 * i, h),  # rows gate | up
        down_weight=rand(h, i),
    )


def seeded_model(name: str, device, dtype, seed: int = 0):
    """A whole ``Decoder`` of ``IN_MEMORY_MODELS[name]``'s shape at its full depth and vocabulary, random weights
    drawn on ``device`` from ``seed`` (an accelerator draws 16 GB in well under a second; the same seed on another
    device gives other weights): for timing only, its answers mean nothing."""
    import torch

    from engine_client.model.decoder import Decoder, DecoderWeights

    shape = IN_MEMORY_MODELS[name]
    cfg = dataclasses.replace(shape_config(shape), num_hidden_layers=DEPTHS[shape], tie_word_embeddings=False)
    h = cfg.hidden_size
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(*dims, std=0.02, mean=0.0):
        out = torch.empty(*dims, device=device, dtype=dtype)
        return out.normal_(mean, std, generator=gen)

    layers = [_layer_weights(cfg, rand) for _ in range(cfg.num_hidden_layers)]
    weights = DecoderWeights(rand(cfg.vocab_size, h), layers, rand(h, std=0.1, mean=1.0), rand(cfg.vocab_size, h))
    return Decoder(cfg, weights, fingerprint=f"seeded-{name}-seed{seed}-{str(dtype).removeprefix('torch.')}-{torch.device(device).type}")
