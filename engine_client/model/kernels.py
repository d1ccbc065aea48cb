"""The decoder's tensor kernels: linear layers, RMSNorm, GELU, RoPE rotation, the attention masks and the
GQA attention with its fused-kernel paths.

``decoder.Decoder`` is their one caller: every public step (prefill, layer
queries and keys, layer forward, attention mass) goes through these same
functions, so the steps stay numerically identical to one another.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Below this many rows a bfloat16 matmul on a CPU without native bf16 stays in
# bf16 (upcasting the weight would cost more than the matmul saves).
_UPCAST_MIN_ROWS = 16


def _cpu_lacks_bf16() -> bool:
    cpu = torch.cpu
    native = getattr(cpu, "_is_avx512_bf16_supported", lambda: False)() or getattr(cpu, "_is_amx_tile_supported", lambda: False)()
    return not native


_CPU_LACKS_BF16 = _cpu_lacks_bf16()


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``; bfloat16 on a CPU without bf16 instructions runs the GEMM in float32.

    oneDNN's bf16 fallback on AVX2 is several times slower than its float32
    GEMM.  Upcasting the bf16 operands is exact and the GEMM accumulates in
    float32 either way, so the result differs from a native bf16 GEMM only by
    summation order before the final rounding to bf16.
    """
    if x.dtype == torch.bfloat16 and x.device.type == "cpu" and _CPU_LACKS_BF16 and x.shape[0] >= _UPCAST_MIN_ROWS:
        return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(torch.bfloat16)
    return F.linear(x, weight, bias)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _scaled_rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm: normalized and scaled in float32 (``scale`` = ``1 + weight``, float32), then cast."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * scale).to(x.dtype)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [H, s, d]`` by ``cos, sin [s, d]`` (HF ``rotate_half`` convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _attention_mask(r: int, s: int, device) -> torch.Tensor:
    """Boolean ``[s, r+s]``, True = attend: every prefix row, then the suffix causally."""
    mask = torch.ones(s, r + s, dtype=torch.bool, device=device)
    mask[:, r:] = torch.ones(s, s, dtype=torch.bool, device=device).tril()
    return mask


def _window_mask(positions: torch.Tensor, r: int, prefix_positions: torch.Tensor | None, window: int) -> torch.Tensor | None:
    """Boolean ``[s, r+s]``, True where key position ``> query position - window``; None when no key falls out.

    ``positions [s]`` are the queries' (and suffix keys') positions; the ``r`` prefix rows sit at
    ``prefix_positions [r]``, by default the ``r`` positions right before ``positions[0]``.
    """
    if prefix_positions is None:
        first = int(positions[0]) if positions.numel() else 0
        prefix_positions = torch.arange(first - r, first, device=positions.device)
    keys = torch.cat([prefix_positions, positions])  # [r+s]
    if not keys.numel() or int(keys.min()) > int(positions.max()) - window:
        return None  # every key is inside every query's window: the plain masks suffice
    return keys[None, :] > positions[:, None] - window


def _gqa_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    num_prefix_rows: int,
    row_mask: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    window_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of ``q [Hq, s, d]`` over ``keys``/``values [Hkv, r+s, d]`` -> ``[Hq, s, d]``.

    The ``s`` queries attend to all ``r = num_prefix_rows`` prefix rows and
    causally to themselves.  Query head ``h`` reads KV head ``h // g`` (HF
    ``repeat_kv`` order) through ``enable_gqa``: no KV copy.  Inputs are given
    4-D (``[1, H, t, d]``), the layout for which PyTorch picks its fused
    (flash) kernel on CPU, and a mask is built only where the kernel cannot do
    without one:

    * ``r == 0`` (dense prefill): ``is_causal=True``, the whole causal square;
    * ``s == 1`` (one new token): no mask, it sees every key;
    * otherwise: the prefix rows unmasked and the suffix ``is_causal``, joined
      by their log-sum-exps (``_prefix_then_causal``, on a CPU), or a boolean
      ``[s, r+s]`` mask.  ``is_causal`` over all ``r+s`` keys would align the
      triangle top-left (query ``i`` sees keys ``<= i``), which is wrong when
      the queries are the last ``s`` of ``r+s`` keys.

    ``row_mask [Hkv, r]`` hides prefix rows per KV head: the mask becomes
    ``[Hq, s, r+s]`` (query head ``h`` takes KV head ``h // g``'s row);
    ``attn_mask [Hq, s, r+s]`` is and-ed with it.  ``window_mask [s, r+s]``
    (a sliding-window layer, ``_window_mask``) is and-ed with the plain mask.
    ``scale``: the softmax scale, None for ``1/sqrt(d)``.
    """
    s = q.shape[1]
    q4, k4, v4 = q.unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0)  # [1, H, t, d]
    if (row_mask is not None and num_prefix_rows) or attn_mask is not None:
        g = q.shape[0] // keys.shape[0]
        mask = _attention_mask(num_prefix_rows, s, q.device).repeat(q.shape[0], 1, 1)  # [Hq, s, r+s]
        if row_mask is not None and num_prefix_rows:
            mask[:, :, :num_prefix_rows] &= row_mask.to(q.device).repeat_interleave(g, dim=0)[:, None, :]
        if attn_mask is not None:
            mask &= attn_mask.to(q.device)
        if window_mask is not None:
            mask &= window_mask.to(q.device)
        out = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask.unsqueeze(0), enable_gqa=True, scale=scale)
    elif window_mask is not None:
        mask = _attention_mask(num_prefix_rows, s, q.device) & window_mask.to(q.device)  # [s, r+s]
        out = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, enable_gqa=True, scale=scale)
    elif num_prefix_rows == 0:
        out = F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, enable_gqa=True, scale=scale)
    elif s == 1:
        out = F.scaled_dot_product_attention(q4, k4, v4, enable_gqa=True, scale=scale)
    elif q.device.type == "cpu" and _FLASH_CPU is not None:
        out = _prefix_then_causal(q4, k4, v4, num_prefix_rows, scale)
    elif q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16) and _LOWER_RIGHT["ok"]:
        out = _lower_right_causal(q4, k4, v4, num_prefix_rows, scale)
    else:
        mask = _attention_mask(num_prefix_rows, s, q.device)  # [s, r+s]
        out = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, enable_gqa=True, scale=scale)
    return out[0]


def _flash_cpu():
    try:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    except (AttributeError, RuntimeError):
        return None


# SDPA's fused CPU kernel, called directly for the (output, log-sum-exp) pair it returns
_FLASH_CPU = _flash_cpu()


def _prefix_then_causal(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, r: int, scale: float | None = None) -> torch.Tensor:
    """``[1, Hq, s, d]`` queries over ``r`` prefix rows and causally over the last ``s`` rows, with no mask.

    The fused CPU kernel takes no bottom-right causal mask, and with a boolean
    one it reads the mask for every cell: 11-33% slower for a 1024-token
    block over 1-7k rows (SmolLM2's shapes, one thread; README, "Prefill").  So the two parts
    run unmasked (the prefix rows) and ``is_causal`` (the block itself), and
    their outputs are joined by their log-sum-exps: the softmax over both.
    """
    o1, lse1 = _FLASH_CPU(q4, k4[:, :, :r], v4[:, :, :r], scale=scale)[:2]  # lse [1, Hq, s], float32
    o2, lse2 = _FLASH_CPU(q4, k4[:, :, r:], v4[:, :, r:], is_causal=True, scale=scale)[:2]
    top = torch.maximum(lse1, lse2)
    w1, w2 = (lse1 - top).exp().unsqueeze(-1), (lse2 - top).exp().unsqueeze(-1)
    return ((o1.float() * w1 + o2.float() * w2) / (w1 + w2)).to(q4.dtype)


# Whether SDPA's bottom-right causal bias ran on this machine's CUDA build (False after the first failure)
_LOWER_RIGHT = {"ok": True}


def _lower_right_causal(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, r: int, scale: float | None = None) -> torch.Tensor:
    """``[1, Hq, s, d]`` queries over ``r`` prefix rows and causally over the last ``s`` rows, on CUDA, with no mask.

    SDPA's ``causal_lower_right`` bias aligns the causal triangle bottom-right (the queries are the last
    ``s`` of the ``r+s`` keys) and runs the flash kernel, which takes no mask tensor: no ``[s, r+s]`` mask
    is built per layer and no mask is read per cell.  Where this torch build cannot run it (its flash
    kernel refusing grouped heads, say), the boolean mask is used from then on and a warning says why once.
    """
    from torch.nn.attention.bias import causal_lower_right

    s = q4.shape[2]
    try:
        return F.scaled_dot_product_attention(q4, k4, v4, attn_mask=causal_lower_right(s, r + s), enable_gqa=True, scale=scale)
    except RuntimeError as exc:
        _LOWER_RIGHT["ok"] = False
        import logging

        logging.getLogger(__name__).warning("attention: the lower-right causal bias failed on CUDA (%s); using a boolean mask", exc)
    mask = _attention_mask(r, s, q4.device)
    return F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, enable_gqa=True, scale=scale)
