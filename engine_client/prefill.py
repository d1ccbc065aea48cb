"""Dense prefill in blocks: the KV a prefix is stored with, and the full-recompute baseline.

``chunked_prefill`` is what ``ModelRunner.store_prefix`` stores and what the
full-KV references decode over; ``prefill_with_attention`` also gathers the
attention mass H2O ranks tokens by.
"""

from __future__ import annotations

import torch

from .model.decoder import Decoder
from .selection.tokens import window_attention_mass

# A block on a GPU with a fused (flash) attention kernel in half precision: attention memory grows with the
# tokens, not their square, so one block covers a 16k prefix and the layers run 24-32 times, not 16 times that
_FUSED_BLOCK_TOKENS = 16384


def chunked_prefill(
    model: Decoder, tokens: torch.Tensor, block_tokens: int | None = None, *, progress=None, observe=None, keep_kv: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Prefill in blocks of ``block_tokens``, each attending to the KV before it.

    The same result as a dense prefill, with attention memory bounded by
    ``heads x block x n`` instead of ``heads x n x n`` (16k tokens would need
    gigabytes).  ``block_tokens`` None: 1024, or 16384 on CUDA in bfloat16 or
    float16 with no ``observe`` (the flash kernel keeps no ``n x n`` scores;
    an H200 spent 322 ms on 16 blocks of a 16k prefix through a 0.5B model,
    every layer step launch-bound).  Returns ``(last logits [vocab], kv [L, 2, Hkv, n, d])``, the
    KV on the host; ``keep_kv=False``: None in its place (a full recompute
    wants the logits only, and skips the copy of the KV off the device).
    ``progress``, ``observe``: see ``prefill_with_attention``.
    """
    if block_tokens is None:
        fused = model.device.type == "cuda" and model.dtype in (torch.bfloat16, torch.float16) and observe is None
        block_tokens = _FUSED_BLOCK_TOKENS if fused else 1024
    logits, kv, _ = prefill_with_attention(model, tokens, (), block_tokens, progress=progress, observe=observe, keep_kv=keep_kv)
    return logits, kv


@torch.inference_mode()
def prefill_with_attention(
    model: Decoder, tokens: torch.Tensor, layers, block_tokens: int = 1024, *, progress=None, observe=None, keep_kv: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
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

    Everything stays on the model's device while the blocks run (the KV, the
    positions, the mass): on an accelerator no layer waits on a host copy or
    reads a value back.  The KV and the mass cross to the host once, at the
    end (``keep_kv=False``: the KV not at all, None in its place).
    """
    c = model.config
    n = tokens.numel()
    watch = {layer: i for i, layer in enumerate(layers)}
    dev = model.device
    tokens = torch.as_tensor(tokens).to(dev)
    kv = torch.empty(c.num_hidden_layers, 2, c.num_key_value_heads, n, c.head_dim, dtype=model.dtype, device=dev)
    mass = torch.zeros(len(watch), n, dtype=torch.float32, device=dev)  # [len(layers), n]
    steps = [(start, layer) for start in range(0, n, block_tokens) for layer in range(c.num_hidden_layers)]
    if progress is not None:
        steps = progress(steps, f"prefill {n} tokens", total=len(steps), unit="layer")
    hidden = positions = None
    for start, layer in steps:
        end = min(start + block_tokens, n)
        if layer == 0:  # a new block
            positions = model.position_range(start, end - start)  # checked once, on the host
            hidden = model.embed(tokens[start:end])
        q = model.layer_queries(layer, hidden, positions) if layer in watch else None  # [Hq, block, d]
        prefix = kv[layer, :, :, :start] if start else None
        layer_input = hidden
        hidden, kv[layer, :, :, start:end] = model.layer_forward(layer, hidden, positions, prefix)
        if observe is not None:
            observe(layer, layer_input, positions.tensor, kv[layer, 0, :, :end])
        if q is not None:
            mass[watch[layer], :end] += window_attention_mass(q, kv[layer, 0, :, :end], start)
    return model.final_logits(hidden), (kv.cpu() if keep_kv else None), mass.cpu()
