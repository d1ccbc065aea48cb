"""A minimal Llama/Qwen2 decoder layer for one fixed shape: the floor the project's layer is measured against.

``MinimalLayer`` computes what ``Decoder.layer_forward`` computes for a
Llama/Qwen2 layer (RMSNorm, fused q/k/v projection with Qwen2's bias, RoPE,
GQA attention over the prefix rows and causally over the new rows, output
projection, residual, RMSNorm, SwiGLU MLP, residual) with the same numerics
(RMSNorm in float32, float32 RoPE tables cast to the compute dtype,
``rotate_half``, softmax scale ``1/sqrt(d)``), on the same ``LayerWeights``.
Everything a call needs beyond its arithmetic is made once, up front:

* ``hidden_in [s, hidden]`` and ``hidden_out [s, hidden]``: the static input
  and output buffers (the caller writes the input, reads the output);
* ``keys`` / ``values [1, Hkv, r + s, d]``: a KV buffer holding the ``r``
  prefix rows, into whose tail each call writes the new rows' keys and values;
* cos/sin ``[s, d]``: the RoPE table's rows at the new rows' positions;
* the attention mask: ``is_causal`` when there is no prefix, else a
  lower-right causal bias (``torch.nn.attention.bias.causal_lower_right``,
  which runs the flash kernel with no mask tensor; CUDA in bf16/fp16) or,
  elsewhere or where that cannot run, a prebuilt boolean ``[s, r + s]`` mask.

A call allocates only its intermediates (from the caching allocator on
CUDA) and reads nothing back to the host, so it can be captured whole in a
CUDA graph (``GraphedLayer``).  GQA goes through SDPA's ``enable_gqa`` (the
pinned torch has it; the project's own kernels rely on it too).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope_rows(theta: float, head_dim: int, start: int, count: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``[count, d]`` in ``dtype`` of positions ``start .. start + count - 1`` (float32 table, then cast)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))  # [d/2]
    table = torch.arange(start + count, device=device, dtype=torch.float32)
    freqs = torch.outer(table, inv_freq)  # [start + count, d/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [start + count, d]
    rows = slice(start, start + count)  # the prebuilt position slice
    return emb.cos()[rows].to(dtype).contiguous(), emb.sin()[rows].to(dtype).contiguous()


def _bool_mask(s: int, r: int, device) -> torch.Tensor:
    """Boolean ``[s, r + s]``, True = attend: every prefix row, then the new rows causally."""
    mask = torch.ones(s, r + s, dtype=torch.bool, device=device)
    mask[:, r:].tril_()
    return mask


def _lower_right_mask(s: int, r: int, device, dtype) -> tuple[object, str]:
    """The mask of ``s`` new rows after ``r`` prefix rows and its kind: the causal bias where the flash kernel takes it
    (CUDA, 16-bit), else the prebuilt boolean mask (elsewhere the bias is materialized on every call)."""
    if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16):
        try:
            from torch.nn.attention.bias import causal_lower_right

            return causal_lower_right(s, r + s), "causal_lower_right"  # a tensor subclass holding only the sizes
        except ImportError:
            pass
    return _bool_mask(s, r, device), "boolean mask"


class MinimalLayer:
    """One Llama/Qwen2 layer over ``weights`` for ``new_tokens`` rows at positions ``start ..`` after ``prefix_kv``.

    ``prefix_kv [2, Hkv, r, d]`` (post-RoPE keys, values; ``r`` may be 0) is copied into the KV buffer once.
    ``forward()`` reads ``hidden_in`` and writes ``hidden_out`` (returned) and the KV buffer's last ``s`` rows.
    """

    def __init__(self, config, weights, prefix_kv: torch.Tensor, start: int, new_tokens: int):
        c = config
        if c.gemma3 or c.hidden_act != "silu":
            raise ValueError(f"the minimal layer is a Llama/Qwen2 layer, not {c.architecture}")
        device, dtype = weights.qkv_weight.device, weights.qkv_weight.dtype
        s, r = new_tokens, prefix_kv.shape[2]
        self.config, self.w, self.s, self.r = c, weights, s, r
        self.heads = (c.num_attention_heads, c.num_key_value_heads, c.num_key_value_heads)
        self.hidden_in = torch.zeros(s, c.hidden_size, device=device, dtype=dtype)  # [s, hidden]
        self.hidden_out = torch.empty_like(self.hidden_in)  # [s, hidden]
        kv = torch.empty(2, 1, c.num_key_value_heads, r + s, c.head_dim, device=device, dtype=dtype)  # [2, 1, Hkv, r+s, d]
        kv[:, 0, :, :r] = prefix_kv
        self.keys, self.values = kv[0], kv[1]  # [1, Hkv, r+s, d] each
        self.cos, self.sin = rope_rows(c.rope_theta, c.head_dim, start, s, dtype, device)  # [s, d] each
        # mask_kind: "is_causal", "causal_lower_right" or "boolean mask"; mask_note: why the causal bias was not used
        self.mask, self.mask_kind = (None, "is_causal") if r == 0 else _lower_right_mask(s, r, device, dtype)
        self.mask_note = None
        if self.mask_kind == "causal_lower_right":
            try:  # its kernels may refuse this shape (GQA heads, head dim): fall back to the boolean mask
                self.forward()
            except RuntimeError as exc:
                self.mask, self.mask_kind = _bool_mask(s, r, device), "boolean mask"
                self.mask_note = f"causal_lower_right refused: {str(exc).strip().splitlines()[0][:160]}"

    def _rope(self, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * self.cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * self.sin

    def forward(self) -> torch.Tensor:
        c, w, s, r = self.config, self.w, self.s, self.r
        hidden = self.hidden_in
        x = _rms_norm(hidden, w.input_norm, c.rms_norm_eps)
        qkv = F.linear(x, w.qkv_weight, w.qkv_bias)  # [s, (Hq + 2*Hkv) * d]
        q, k, v = qkv.view(s, -1, c.head_dim).transpose(0, 1).split(self.heads)  # [H, s, d] each
        self.keys[0, :, r:] = self._rope(k)
        self.values[0, :, r:] = v
        q = self._rope(q).unsqueeze(0)  # [1, Hq, s, d]
        if self.mask is None:
            attn = F.scaled_dot_product_attention(q, self.keys, self.values, is_causal=True, enable_gqa=True)
        else:
            attn = F.scaled_dot_product_attention(q, self.keys, self.values, attn_mask=self.mask, enable_gqa=True)
        hidden = hidden + F.linear(attn[0].transpose(0, 1).reshape(s, -1), w.o_weight)  # attn: [1, Hq, s, d]
        x = _rms_norm(hidden, w.post_norm, c.rms_norm_eps)
        gate, up = F.linear(x, w.gate_up_weight).chunk(2, dim=-1)  # [s, intermediate] each
        return torch.add(hidden, F.linear(F.silu(gate) * up, w.down_weight), out=self.hidden_out)

    def suffix_kv(self) -> torch.Tensor:
        """The new rows' keys and values ``[2, Hkv, s, d]`` (as ``layer_forward`` returns them)."""
        return torch.stack([self.keys[0, :, self.r :], self.values[0, :, self.r :]])


class GraphedLayer:
    """``layer.forward`` captured in a CUDA graph: ``replay()`` reruns it on whatever ``layer.hidden_in`` holds."""

    def __init__(self, layer: MinimalLayer, warmup: int = 3):
        self.layer = layer
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the default stream: kernels chosen, workspaces allocated
            for _ in range(max(1, warmup)):
                layer.forward()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            layer.forward()

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.layer.hidden_out
