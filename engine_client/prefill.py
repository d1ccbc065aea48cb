"""Dense prefill in blocks: the KV a prefix is stored with, and the full-recompute baseline.

``chunked_prefill`` is what ``ModelRunner.store_prefix`` stores and what the
full-KV references decode over; ``prefill_with_attention`` also gathers the
attention mass H2O ranks tokens by.
"""

from __future__ import annotations

import torch

from .model.decoder import Decoder
from .selection.tokens import window_attention_mass


def chunked_prefill(
    model: Decoder, tokens: torch.Tensor, block_tokens: int = 1024, *, progress=None, observe=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill in blocks of ``block_tokens``, each attending to the KV before it.

    The same result as a dense prefill, with attention memory bounded by
    ``heads x block x n`` instead of ``heads x n x n`` (16k tokens would need
    gigabytes).  Returns ``(last logits [vocab], kv [L, 2, Hkv, n, d])``.
    ``progress``, ``observe``: see ``prefill_with_attention``.
    """
    logits, kv, _ = prefill_with_attention(model, tokens, (), block_tokens, progress=progress, observe=observe)
    return logits, kv


@torch.inference_mode()
def prefill_with_attention(
    model: Decoder, tokens: torch.Tensor, layers, block_tokens: int = 1024, *, progress=None, observe=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``chunked_prefill`` that also accumulates H2O's attention scores at ``layers``.

    Returns ``(logits [vocab], kv [L, 2, Hkv, n, d], mass [len(layers), n])``:
    ``mass[i, t]`` is the causal softmax mass every prefix query pays to
    token ``t`` at layer ``layers[i]``, summed over query heads (each row
    sums to ``Hq * n``), accumulated block by block as the prefill runs.

    ``progress(iterable, desc, total=, unit=)`` wraps the (block, layer)
    steps - a long prefix takes minutes on a CPU, one step a few seconds -
    e.g. ``kvstore.progress.progress``, a bar on a terminal; None: no bar.

    ``observe(layer, hidden, positions, keys)`` is called after each layer of
    each block with the layer's input, the block's positions and the keys
    ``[Hkv, end, d]`` it attended to (e.g. ``krul.AttentionEstimator.observe``).
    """
    c = model.config
    n = tokens.numel()
    watch = {layer: i for i, layer in enumerate(layers)}
    kv = torch.empty(c.num_hidden_layers, 2, c.num_key_value_heads, n, c.head_dim, dtype=model.dtype)
    mass = torch.zeros(len(watch), n, dtype=torch.float32)  # [len(layers), n]
    steps = [(start, layer) for start in range(0, n, block_tokens) for layer in range(c.num_hidden_layers)]
    if progress is not None:
        steps = progress(steps, f"prefill {n} tokens", total=len(steps), unit="layer")
    hidden = positions = None
    for start, layer in steps:
        end = min(start + block_tokens, n)
        if layer == 0:  # a new block
            positions = torch.arange(start, end)
            hidden = model.embed(tokens[start:end])
        q = model.layer_queries(layer, hidden, positions) if layer in watch else None  # [Hq, block, d]
        prefix = kv[layer, :, :, :start] if start else None
        layer_input = hidden
        hidden, kv[layer, :, :, start:end] = model.layer_forward(layer, hidden, positions, prefix)
        if observe is not None:
            observe(layer, layer_input, positions, kv[layer, 0, :, :end])
        if q is not None:
            mass[watch[layer], :end] += window_attention_mass(q, kv[layer, 0, :, :end], start).cpu()
    return model.final_logits(hidden), kv, mass
