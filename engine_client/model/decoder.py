"""Plain-torch Llama/Qwen2/Gemma 3 decoder, driven layer by layer by a Re-Prefill runner.

Notation: ``n`` prefix tokens, ``r`` selected prefix rows (any subset of the
``n`` prefix positions), ``s`` suffix tokens, ``L`` layers, ``Hq`` query heads,
``Hkv`` KV heads, ``g = Hq // Hkv`` query heads per KV head, ``d`` head dim.

KV is always **post-RoPE**: a stored key was rotated by its own absolute
position when it was computed, so a sparse set of prefix rows can be attended
to as is.  The suffix then takes positions ``n, n+1, ...`` (after the *full*
prefix, whatever ``r`` is), which keeps every query-key distance what it was
in the dense forward.

Numerics follow Hugging Face transformers: RMSNorm in float32, RoPE with the
``rotate_half`` convention and float32 cos/sin tables cast to the compute
dtype, softmax scale ``1/sqrt(d)``.  Logits are returned as float32.

Gemma 3 (``config.gemma3``) follows transformers' ``Gemma3ForCausalLM``:
embeddings times ``sqrt(hidden)`` (rounded to the compute dtype), every
RMSNorm scaled by ``1 + weight`` in float32 (``_scaled_rms_norm``; the
weights hold ``1 + weight`` already), q and k normed per head before RoPE,
the attention and MLP outputs normed again before their residual adds
(sandwich norms), GeGLU (tanh GELU), softmax scale
``query_pre_attn_scalar ** -0.5``, and a RoPE table per base (sliding layers
use ``rope_local_theta``).  A sliding layer's query at position ``p`` sees
keys at positions ``> p - window`` only; ``layer_forward`` needs the
positions of the prefix rows for that (``prefix_positions``; by default
the ``r`` rows are the ones right before the suffix).

Positions as a tensor are checked, and the RoPE table sized, by reading the
tensor back: a host sync per layer call on an accelerator.  A caller that
knows its positions on the host makes them once with ``position_range``
(``Positions``: a run ``start .. start+count-1`` on the device, its bounds
on the host), and every layer call given those makes no host sync (a
sliding layer's window mask still reads the prefix rows' positions).

Why one file of ~470 lines: the public steps (``prefill``, ``layer_queries``,
``layer_keys``, ``layer_forward`` with its row, pattern and window masks,
``attention_mass``) and the checks of their inputs are one API over one set
of weights and RoPE tables; the tensor kernels they share (RMSNorm, RoPE,
the GQA attention with its mask rules) are in ``kernels``, the RoPE tables and
``Positions`` in ``rope``, the CUDA graphs of a layer's parts in ``graphs``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .config import ModelConfig
from .graphs import LayerGraphs
from .kernels import (
    _apply_rope,
    _attention_mask,
    _gelu_tanh,
    _gqa_attention,
    _linear,
    _rms_norm,
    _scaled_rms_norm,
    _window_mask,
)
from .rope import ROPE_PREALLOC_POSITIONS, Positions, RopeTable

# RoPE tables are built up front to this many positions at most; positions
# past it (or past max_position_embeddings) grow the tables on demand.
# attention_mass materializes [Hq, block, r+s] float32 scores per query block.
_MASS_BLOCK_ELEMENTS = 1 << 25


@dataclass
class LayerWeights:
    """One decoder layer, with q/k/v and gate/up fused for one matmul each.

    Gemma 3 norms (all float32 ``1 + weight`` scales) fill the optional fields;
    ``input_norm`` is then the pre-attention and ``post_norm`` the pre-MLP norm.
    """

    input_norm: torch.Tensor  # [hidden]
    qkv_weight: torch.Tensor  # [(Hq + 2*Hkv) * d, hidden]: rows q | k | v
    qkv_bias: torch.Tensor | None  # [(Hq + 2*Hkv) * d]
    o_weight: torch.Tensor  # [hidden, Hq * d]
    post_norm: torch.Tensor  # [hidden]: the norm before the MLP
    gate_up_weight: torch.Tensor  # [2 * intermediate, hidden]: rows gate | up
    down_weight: torch.Tensor  # [hidden, intermediate]
    q_norm: torch.Tensor | None = None  # [d] (Gemma 3)
    k_norm: torch.Tensor | None = None  # [d] (Gemma 3)
    attn_out_norm: torch.Tensor | None = None  # [hidden]: on the attention output before the residual add (Gemma 3)
    mlp_out_norm: torch.Tensor | None = None  # [hidden]: on the MLP output before the residual add (Gemma 3)


@dataclass
class DecoderWeights:
    embed: torch.Tensor  # [vocab, hidden]
    layers: list[LayerWeights]
    norm: torch.Tensor  # [hidden]
    lm_head: torch.Tensor  # [vocab, hidden]; the embed tensor itself when tied


class Decoder:
    """Inference-only decoder over already-validated weights (build it with ``loader.load_checkpoint``).

    Public methods run under ``torch.inference_mode``: what they return are
    inference tensors, which cannot be updated in place outside inference
    mode (copy them into your own buffers, or ``clone()`` them, instead).
    """

    def __init__(self, config: ModelConfig, weights: DecoderWeights, fingerprint: str = ""):
        if len(weights.layers) != config.num_hidden_layers:
            raise ValueError(f"{len(weights.layers)} layers of weights for num_hidden_layers={config.num_hidden_layers}")
        self.config = config
        self.weights = weights
        self.fingerprint = fingerprint  # model_fingerprint for the store; see config.model_fingerprint
        self.dtype = weights.embed.dtype
        self.device = weights.embed.device
        c = config
        self._split = (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim, c.num_key_value_heads * c.head_dim)
        prealloc = min(c.max_position_embeddings, ROPE_PREALLOC_POSITIONS)
        tables = {
            theta: RopeTable(theta, c.head_dim, prealloc, self.device) for theta in {c.rope_theta_of(i) for i in range(c.num_hidden_layers)}
        }
        self._ropes = [tables[c.rope_theta_of(i)] for i in range(c.num_hidden_layers)]  # one table per base, shared
        self._windows = [c.window_of(i) for i in range(c.num_hidden_layers)]  # None: full attention
        self._scale = c.attention_scale  # None: the kernels' default 1/sqrt(d)
        self._norm = _scaled_rms_norm if c.gemma3 else _rms_norm
        self._act = _gelu_tanh if c.hidden_act == "gelu_pytorch_tanh" else F.silu
        # Gemma: sqrt(hidden) as a float32 scalar, then rounded to the compute dtype (transformers' embed_scale)
        self._embed_scale = torch.tensor(c.hidden_size**0.5).to(self.dtype) if c.gemma3 else None
        # a float: every layer adds the seconds its attention kernel took (benchmarks set it to 0.0); None: not timed
        self.attention_s: float | None = None
        # on CUDA, each layer's parts before and after attention run as CUDA graphs for short suffixes (layer_graphs);
        # None: every kernel launched one by one (use_layer_graphs(False))
        self.layer_graphs = LayerGraphs(self) if self.device.type == "cuda" else None

    def use_layer_graphs(self, on: bool) -> None:
        """Replay the layers' parts before and after attention as CUDA graphs (on CUDA; the default), or launch every kernel."""
        self.layer_graphs = LayerGraphs(self) if on and self.device.type == "cuda" else None

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    # ------------------------------------------------------------------ whole model

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Dense forward of ``tokens [n]``.

        Returns ``(logits_last [vocab] float32, kv [L, 2, Hkv, n, d])`` where
        ``kv`` holds every layer's post-RoPE keys and values in the compute
        dtype: the layout the store keeps.
        """
        tokens = self._check_tokens(tokens)
        c = self.config
        n = tokens.numel()
        kv = torch.empty(c.num_hidden_layers, 2, c.num_key_value_heads, n, c.head_dim, dtype=self.dtype, device=self.device)
        positions = torch.arange(n, device=self.device)
        hidden = self._embed(tokens)
        for layer in range(c.num_hidden_layers):
            hidden, kv[layer] = self._layer(layer, hidden, positions, None)
        return self._logits(hidden[-1:])[0], kv

    @torch.inference_mode()
    def forward_full(self, tokens: torch.Tensor) -> torch.Tensor:
        """Dense causal forward of ``tokens [n]``: logits ``[n, vocab]`` float32."""
        tokens = self._check_tokens(tokens)
        positions = torch.arange(tokens.numel(), device=self.device)
        hidden = self._embed(tokens)
        for layer in range(self.config.num_hidden_layers):
            hidden, _ = self._layer(layer, hidden, positions, None)
        return self._logits(hidden)

    # ------------------------------------------------------------------ layer level (Re-Prefill)

    @torch.inference_mode()
    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token embeddings: ``tokens [s]`` -> hidden ``[s, hidden]`` (the input of layer 0)."""
        return self._embed(self._check_tokens(tokens))

    @torch.inference_mode()
    def layer_queries(self, layer: int, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Post-RoPE queries ``[Hq, s, d]`` of ``layer`` for its input ``hidden [s, hidden]``.

        ``hidden`` is the layer's *input* (residual stream); the layer's input
        RMSNorm is applied here, exactly as ``layer_forward`` does.
        """
        w = self._layer_weights(layer)
        hidden, positions = self._check_hidden(hidden, positions)
        x = self._norm(hidden, w.input_norm, self.config.rms_norm_eps)
        q_rows = self._split[0]
        bias = None if w.qkv_bias is None else w.qkv_bias[:q_rows]
        q = _linear(x, w.qkv_weight[:q_rows], bias)  # [s, Hq*d]
        q = q.view(-1, self.config.num_attention_heads, self.config.head_dim).transpose(0, 1)  # [Hq, s, d]
        if w.q_norm is not None:
            q = _scaled_rms_norm(q, w.q_norm, self.config.rms_norm_eps)
        cos, sin = self._rope(positions, layer)
        return _apply_rope(q, cos, sin)

    @torch.inference_mode()
    def layer_keys(self, layer: int, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Post-RoPE keys ``[Hkv, s, d]`` of ``layer`` for its input ``hidden [s, hidden]`` (as ``layer_forward`` makes them)."""
        w = self._layer_weights(layer)
        hidden, positions = self._check_hidden(hidden, positions)
        x = self._norm(hidden, w.input_norm, self.config.rms_norm_eps)
        q_rows, k_rows = self._split[0], self._split[1]
        bias = None if w.qkv_bias is None else w.qkv_bias[q_rows : q_rows + k_rows]
        k = _linear(x, w.qkv_weight[q_rows : q_rows + k_rows], bias)
        k = k.view(-1, self.config.num_key_value_heads, self.config.head_dim).transpose(0, 1)
        if w.k_norm is not None:
            k = _scaled_rms_norm(k, w.k_norm, self.config.rms_norm_eps)
        cos, sin = self._rope(positions, layer)
        return _apply_rope(k, cos, sin)

    @torch.inference_mode()
    def layer_forward(
        self,
        layer: int,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        prefix_kv: torch.Tensor | None,
        row_mask: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        prefix_positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``layer`` on the suffix.

        ``hidden [s, hidden]`` is the layer input; ``positions [s]`` the suffix
        positions (``n, n+1, ...`` after the full prefix length ``n``);
        ``prefix_kv [2, Hkv, r, d]`` any ``r`` prefix rows, keys already rotated
        at their own positions (cast to the compute dtype), or None.  The suffix
        attends to all ``r`` rows and causally to itself.

        ``row_mask [Hkv, r]`` (bool, optional) hides rows from single KV heads:
        KV head ``h`` and its query heads attend only to the rows where
        ``row_mask[h]`` is True (streaming heads, ``model.streaming``).
        ``attn_mask [Hq, s, r+s]`` (bool, optional) is a per-query-head pattern
        over the prefix rows then the suffix, applied on top of causality
        (a sparse prefill, ``sparse_prefill``).

        ``prefix_positions [r]`` (integers, optional) are the positions the
        prefix rows were computed at; only a sliding-window layer reads them
        (it hides rows at ``<= position - window`` from each query).  By
        default the rows are the ``r`` positions right before the suffix (the
        dense prefix, or its last ``r`` rows): a caller passing any other
        subset of rows to a sliding layer must pass their positions.

        Returns ``(hidden_out [s, hidden], suffix_kv [2, Hkv, s, d])``.
        """
        self._layer_weights(layer)
        hidden, positions = self._check_hidden(hidden, positions)
        if prefix_kv is not None:
            prefix_kv = self._check_prefix_kv(prefix_kv)
        if row_mask is not None:
            r = 0 if prefix_kv is None else prefix_kv.shape[2]
            if row_mask.dtype != torch.bool or tuple(row_mask.shape) != (self.config.num_key_value_heads, r):
                raise ValueError(
                    f"row_mask must be bool [{self.config.num_key_value_heads}, {r}], got {row_mask.dtype} {list(row_mask.shape)}"
                )
        if attn_mask is not None:
            r = 0 if prefix_kv is None else prefix_kv.shape[2]
            want = (self.config.num_attention_heads, hidden.shape[0], r + hidden.shape[0])
            if attn_mask.dtype != torch.bool or tuple(attn_mask.shape) != want:
                raise ValueError(f"attn_mask must be bool {list(want)}, got {attn_mask.dtype} {list(attn_mask.shape)}")
        if prefix_positions is not None:
            r = 0 if prefix_kv is None else prefix_kv.shape[2]
            prefix_positions = torch.as_tensor(prefix_positions, device=self.device)
            if prefix_positions.shape != (r,) or prefix_positions.is_floating_point():
                raise ValueError(f"prefix_positions must be [{r}] integers, got {list(prefix_positions.shape)} {prefix_positions.dtype}")
            prefix_positions = prefix_positions.long()
        return self._layer(layer, hidden, positions, prefix_kv, row_mask, attn_mask, prefix_positions)

    @torch.inference_mode()
    def final_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``[vocab]`` float32 of the last position of ``hidden [s, hidden]`` (the last layer's output)."""
        hidden = self._check_hidden(hidden, None)[0]
        return self._logits(hidden[-1:])[0]

    @torch.inference_mode()
    def position_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``[s, vocab]`` float32 of every position of ``hidden [s, hidden]`` (the last layer's output)."""
        return self._logits(self._check_hidden(hidden, None)[0])

    @torch.inference_mode()
    def attention_mass(self, q: torch.Tensor, prefix_k: torch.Tensor, suffix_k: torch.Tensor, layer: int | None = None) -> torch.Tensor:
        """Attention the suffix queries pay to each prefix row: ``[r]`` float32.

        ``q [Hq, s, d]`` (from ``layer_queries``), ``prefix_k [Hkv, r, d]`` and
        ``suffix_k [Hkv, s, d]`` (``layer_forward``'s ``suffix_kv[0]``), all
        post-RoPE.  The softmax runs jointly over the ``r`` prefix rows and the
        suffix keys (causal), as in ``layer_forward`` (without a row mask); the probabilities on the
        prefix rows are summed over heads and queries, so ``result.sum()`` is at
        most ``Hq * s``.  Per-chunk mass is a segment sum of this over the rows.

        ``layer`` is needed only on a model with sliding-window layers (Gemma 3), and there it is
        refused for a sliding layer: the mass over a window needs the rows' positions (not done yet).
        """
        c = self.config
        if c.sliding_layers and (layer is None or self._windows[self._check_layer(layer)] is not None):
            c.require_full_attention("attention_mass on a sliding-window layer (or without layer=)")
        hq, hkv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        s = q.shape[1] if q.dim() == 3 else -1
        if q.shape != (hq, s, d) or prefix_k.dim() != 3 or prefix_k.shape[::2] != (hkv, d) or suffix_k.shape != (hkv, s, d):
            raise ValueError(
                f"attention_mass wants q [{hq}, s, {d}], prefix_k [{hkv}, r, {d}], suffix_k [{hkv}, s, {d}]; "
                f"got {list(q.shape)}, {list(prefix_k.shape)}, {list(suffix_k.shape)}"
            )
        q = q.to(self.device, torch.float32)
        prefix_k = prefix_k.to(self.device, torch.float32)
        suffix_k = suffix_k.to(self.device, torch.float32)
        r = prefix_k.shape[1]
        g = c.num_query_groups
        keys = torch.cat([prefix_k, suffix_k], dim=1)  # [Hkv, r+s, d]
        q = q.reshape(hkv, g, s, d)  # query head h uses KV head h // g
        mask = _attention_mask(r, s, self.device)  # [s, r+s]
        mass = torch.zeros(r, dtype=torch.float32, device=self.device)
        block = max(1, _MASS_BLOCK_ELEMENTS // max(1, hq * (r + s)))
        for start in range(0, s, block):  # bounds memory; not a per-token loop
            qb = q[:, :, start : start + block]  # [Hkv, g, b, d]
            scores = torch.einsum("hgbd,htd->hgbt", qb, keys)  # [Hkv, g, b, r+s]
            scores = scores / math.sqrt(d) if self._scale is None else scores * self._scale
            scores.masked_fill_(~mask[start : start + block], float("-inf"))
            mass += scores.softmax(dim=-1)[..., :r].sum(dim=(0, 1, 2))
        return mass

    # ------------------------------------------------------------------ internals

    def _layer(self, layer, hidden, positions, prefix_kv, row_mask=None, attn_mask=None, prefix_positions=None):
        cos, sin = self._rope(positions, layer)
        graphs = self._graphs_for(hidden, positions)
        if graphs is not None:  # the parts before and after attention replayed as CUDA graphs
            q, k, v = graphs.pre(layer, hidden, positions, cos, sin)
        else:
            q, k, v = self._pre_attention(layer, hidden, cos, sin)
        suffix_kv = torch.stack([k, v])  # [2, Hkv, s, d]
        if prefix_kv is None:
            r, keys, values = 0, k, v
        else:
            r = prefix_kv.shape[2]
            keys = torch.cat([prefix_kv[0], k], dim=1)  # [Hkv, r+s, d]
            values = torch.cat([prefix_kv[1], v], dim=1)  # [Hkv, r+s, d]
        window = self._windows[layer]
        pos = positions.tensor if isinstance(positions, Positions) else positions
        window_mask = None if window is None else _window_mask(pos, r, prefix_positions, window)  # [s, r+s] or None
        if self.attention_s is None:
            attn = _gqa_attention(q, keys, values, r, row_mask, attn_mask, window_mask, self._scale)  # [Hq, s, d]
        else:
            t0 = time.perf_counter()
            attn = _gqa_attention(q, keys, values, r, row_mask, attn_mask, window_mask, self._scale)
            self.attention_s += time.perf_counter() - t0
        if graphs is not None:
            return graphs.post(layer, attn), suffix_kv
        return self._post_attention(layer, hidden, attn), suffix_kv

    def _pre_attention(self, layer, hidden, cos, sin):
        """The layer up to attention: ``q [Hq, s, d]``, ``k, v [Hkv, s, d]`` (q and k rotated by ``cos, sin [s, d]``)."""
        c = self.config
        w = self.weights.layers[layer]
        s = hidden.shape[0]
        x = self._norm(hidden, w.input_norm, c.rms_norm_eps)
        hq, hkv = c.num_attention_heads, c.num_key_value_heads
        qk, v = _linear(x, w.qkv_weight, w.qkv_bias).split((self._split[0] + self._split[1], self._split[2]), dim=-1)
        v = v.view(s, hkv, c.head_dim).transpose(0, 1)  # [Hkv, s, d]
        if w.q_norm is None:  # q and k rotated in one pass (the same elementwise ops, half the kernel launches)
            qk = _apply_rope(qk.view(s, hq + hkv, c.head_dim).transpose(0, 1), cos, sin)  # [Hq+Hkv, s, d]
            return qk[:hq], qk[hq:], v
        q = qk[:, : self._split[0]].view(s, hq, c.head_dim).transpose(0, 1)  # [Hq, s, d]
        k = qk[:, self._split[0] :].view(s, hkv, c.head_dim).transpose(0, 1)  # [Hkv, s, d]
        q = _apply_rope(_scaled_rms_norm(q, w.q_norm, c.rms_norm_eps), cos, sin)
        k = _apply_rope(_scaled_rms_norm(k, w.k_norm, c.rms_norm_eps), cos, sin)
        return q, k, v

    def _post_attention(self, layer, hidden, attn):
        """The layer after attention: the output projection and the MLP, with their residual adds; ``attn [Hq, s, d]``."""
        c = self.config
        w = self.weights.layers[layer]
        s = hidden.shape[0]
        if w.attn_out_norm is None:
            hidden = hidden + _linear(attn.transpose(0, 1).reshape(s, -1), w.o_weight)
        else:
            hidden = hidden + _scaled_rms_norm(_linear(attn.transpose(0, 1).reshape(s, -1), w.o_weight), w.attn_out_norm, c.rms_norm_eps)
        x = self._norm(hidden, w.post_norm, c.rms_norm_eps)
        gate, up = _linear(x, w.gate_up_weight).chunk(2, dim=-1)  # [s, intermediate] each
        if w.mlp_out_norm is None:
            return hidden + _linear(self._act(gate) * up, w.down_weight)
        return hidden + _scaled_rms_norm(_linear(self._act(gate) * up, w.down_weight), w.mlp_out_norm, c.rms_norm_eps)

    def _graphs_for(self, hidden, positions):
        """The CUDA graphs of this suffix length, or None: off, not on CUDA, positions not ``Positions``, too many tokens."""
        if self.layer_graphs is None or hidden.device.type != "cuda" or not isinstance(positions, Positions):
            return None
        return self.layer_graphs.for_tokens(hidden.shape[0])

    def _embed(self, tokens):
        if self._embed_scale is None:
            return F.embedding(tokens, self.weights.embed)  # [s, hidden]
        return F.embedding(tokens, self.weights.embed) * self._embed_scale

    def _logits(self, hidden):
        x = self._norm(hidden, self.weights.norm, self.config.rms_norm_eps)
        return _linear(x, self.weights.lm_head).float()  # [s, vocab]

    def _rope(self, positions, layer: int = 0):
        """cos, sin ``[s, d]`` in the compute dtype for ``positions [s]`` (or ``Positions``) in ``layer`` (its RoPE base)."""
        if isinstance(positions, Positions):
            table = self._ropes[layer]
            key = (id(table), self.dtype)
            if key not in positions.rope:  # one lookup per request and base, not per layer
                positions.rope[key] = table.lookup(positions.tensor, self.dtype, positions.top)
            return positions.rope[key]
        return self._ropes[layer].lookup(positions, self.dtype)

    def position_range(self, start: int, count: int) -> Positions:
        """``Positions`` ``start .. start + count - 1`` on the model's device, checked here once (host integers)."""
        for name, value, least in (("start", start, 0), ("count", count, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"position_range {name} must be an integer >= {least}, got {value!r}")
        out = Positions(torch.arange(start, start + count, device=self.device), start, count)
        for table in set(self._ropes):
            table.reserve(out.top)  # sized now, not inside a layer
        return out

    @property
    def _rope_cos(self) -> torch.Tensor:
        """The cos table ``[P, d]`` of layer 0's base (its size shows how far the tables have grown)."""
        return self._ropes[0].cos

    def _check_layer(self, layer) -> int:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.config.num_hidden_layers:
            raise ValueError(f"layer must be in [0, {self.config.num_hidden_layers}), got {layer!r}")
        return layer

    def _layer_weights(self, layer: int) -> LayerWeights:
        return self.weights.layers[self._check_layer(layer)]

    def _check_tokens(self, tokens) -> torch.Tensor:
        tokens = torch.as_tensor(tokens, device=self.device)
        if tokens.dim() != 1 or tokens.numel() == 0 or tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"tokens must be a non-empty 1-D integer tensor, got shape {list(tokens.shape)} {tokens.dtype}")
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= self.config.vocab_size:
            raise ValueError(f"token ids must be in [0, {self.config.vocab_size}), got range [{lo}, {hi}]")
        return tokens.long()

    def _check_hidden(self, hidden, positions):
        hidden = hidden.to(self.device, self.dtype)
        if hidden.dim() != 2 or hidden.shape[1] != self.config.hidden_size or hidden.shape[0] == 0:
            raise ValueError(f"hidden must be [s, {self.config.hidden_size}] with s >= 1, got {list(hidden.shape)}")
        if isinstance(positions, Positions):
            if positions.count != hidden.shape[0] or positions.tensor.device != self.device:
                raise ValueError(
                    f"positions must be {hidden.shape[0]} on {self.device}, got {positions.count} on {positions.tensor.device}"
                )
        elif positions is not None:
            positions = torch.as_tensor(positions, device=self.device)
            s = hidden.shape[0]
            if positions.shape != (s,) or positions.is_floating_point() or int(positions.min()) < 0:
                raise ValueError(f"positions must be [{s}] non-negative integers, got {list(positions.shape)} {positions.dtype}")
            positions = positions.long()
        return hidden, positions

    def _check_prefix_kv(self, prefix_kv):
        c = self.config
        if prefix_kv.dim() != 4 or prefix_kv.shape[:2] != (2, c.num_key_value_heads) or prefix_kv.shape[3] != c.head_dim:
            raise ValueError(f"prefix_kv must be [2, {c.num_key_value_heads}, r, {c.head_dim}], got {list(prefix_kv.shape)}")
        return prefix_kv.to(self.device, self.dtype)
