"""Sparse Re-Prefill on a transformers model: the suffix over a budget of stored chunks the product's selection chooses.

    sparse = SparseReprefill(cache)                                     # over a KVStorePrefixCache
    out = sparse.generate(prefix_id, suffix_ids, ReprefillConfig(), max_new_tokens=16)
    out.tokens, out.reprefill.selected, out.reprefill.kv_fraction

What ``ModelRunner.generate`` does with the project's decoder, done inside transformers' own
forward.  The runner's pieces decide, unchanged: the request is checked (``reprefill.checks``),
planned (``selection.plan_periods``), and each Period's chunks are chosen by
``reprefill.select.PeriodSelection`` from the Period's first layer's queries over the state the
runner keeps (4-bit probe keys, key summaries: ``reprefill.state.ResidentState``).  What this
module adds is where those queries and rows meet transformers: a forward pre-hook on each layer's
attention takes its input (after the layer's norm) and its RoPE tables, computes the queries as
the attention will (``q_proj``, then the rotation), chooses at a Period's first layer and reads
the Period's rows of the chosen chunks (``ReadChunks`` of its layers), puts the layer's rows
(with stand-in rows at calibrated layers, ``standin.standin_kv``) into the layer's
``DynamicCache`` slot, and hands the attention its own mask: every loaded row visible, the suffix
causal.  The stored keys keep their own RoPE; the suffix runs at positions ``n, n+1, ...`` after
the full prefix (``position_ids``), not after the rows loaded.  Decoding goes on greedily over
those rows, the suffix and the tokens generated, as the runner's does by default.

Not here (each refused in one line naming the field): per-KV-head sets and streaming heads (a row
mask per head), LoopServe's sparse prefill, re-selection while decoding, a first token over the
whole prefix; the attention masses are not reported to the daemon (no ``ReportAttention``).
Attention must be transformers' ``sdpa`` or ``eager`` (the kernels that take an explicit mask).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from transformers import DynamicCache

from kvstore.contract import InvalidArgument

from ..generation import check_max_new_tokens, eos_ids
from ..reprefill.checks import check_prefix, check_runner, describe, resolve_layers, resolve_selection
from ..reprefill.config import ReprefillConfig
from ..reprefill.period import row_positions
from ..reprefill.result import ReprefillResult
from ..reprefill.select import PeriodSelection
from ..reprefill.state import DEFAULT_STATE_LIMIT, ResidentState
from ..selection import Budget, plan_periods
from ..standin import standin_kv
from .transformers_cache import KVStorePrefixCache, layer_batches, read_kv

ATTENTION_KERNELS = ("sdpa", "eager")  # transformers' attention implementations that take a 4D additive mask


@dataclass
class SparseGeneration:
    """``SparseReprefill.generate``'s answer (the fields of the runner's ``GenerationResult`` it has)."""

    tokens: list[int]
    text: str | None  # decoded without special tokens, with the cache's tokenizer
    logits: torch.Tensor  # [vocab] float32: the first token's
    stop: str  # "eos" | "length"
    reprefill: ReprefillResult  # the chunks each Period loaded (selected), tokens_loaded, kv_fraction, bytes_useful, stand-in rows


def unsupported(cfg: ReprefillConfig) -> tuple[str, str] | None:
    """The first field of ``cfg`` this path does not run, and why; None when it runs all of them."""
    if cfg.selection.per_head:
        return "per_head", "per-KV-head sets need a row mask per head"
    if cfg.attention.streaming:
        return "streaming", "streaming heads need a row mask per head"
    if cfg.attention.prefill_alpha:
        return "prefill_alpha", "LoopServe's sparse prefill is the project decoder's"
    if cfg.decode.reselect_every:
        return "reselect_every", "decoding goes on over the rows the first token loaded"
    if cfg.decode.first_token_full:
        return "first_token_full", "the first token runs over the budget's rows"
    return None


class SparseReprefill:
    """Sparse Re-Prefill and greedy decoding of a transformers model over prefixes in kvstore (module docstring)."""

    def __init__(self, cache: KVStorePrefixCache, *, standin_layers=None, selection_profile=None, state_limit_bytes=DEFAULT_STATE_LIMIT):
        """``cache``: the model, client, geometry and fingerprint.  ``standin_layers``: the calibrated stand-in
        layers (``model.standins.StandinLayers``, what ``ModelRunner.standin_profile`` holds) that
        ``standin_layers="auto"`` and ``"calibrated"`` read; None: none.  ``selection_profile``
        (``model.selection_profile.SelectionProfile``, what ``ModelRunner.selection_profile`` holds): what
        ``follow_top``, ``probe_bits`` and ``local_chunks`` "auto" read; None: 0, 4 bits and one chunk.  ``state_limit_bytes``: as ``ModelRunner``'s, the per-prefix
        state kept between requests (least recently used dropped past it); None: no limit."""
        kernel = cache.model.config._attn_implementation
        if kernel not in ATTENTION_KERNELS:
            raise InvalidArgument(
                "model", f"attention {kernel!r} takes no per-layer mask; load it with attn_implementation='sdpa' or 'eager'"
            )
        self.cache, self.model, self.client, self.geometry = cache, cache.model, cache.client, cache.geometry
        self.standin_profile = standin_layers
        self.selection_profile = selection_profile
        self.follow_top_auto = 0 if selection_profile is None else selection_profile.follow_top
        self.device = self.model.device
        scope = {"namespace": cache.namespace, "model_fingerprint": cache.model_fingerprint}
        self.state = ResidentState(cache.client, cache.geometry, self.device, cache.dtype, scope, state_limit_bytes)
        self.attention = [layer.self_attn for layer in self.model.get_decoder().layers]  # Llama/Qwen2 decoder layers

    def check(self, prefix_id: str, suffix_tokens, cfg: ReprefillConfig):
        """The runner's checks (``reprefill.checks``) and this path's own; returns (description, suffix, layers)."""
        if not isinstance(cfg, ReprefillConfig):
            raise InvalidArgument("cfg", f"must be a ReprefillConfig, got {type(cfg).__name__}")
        refused = unsupported(cfg)
        if refused:
            raise InvalidArgument(refused[0], f"not in the transformers sparse path: {refused[1]}")
        check_runner(cfg, self.geometry, None)
        layers = resolve_layers(cfg, self.standin_profile, self.cache.config.num_hidden_layers, self.geometry.group_layers)
        suffix = self.cache.token_ids(suffix_tokens, field_name="suffix_tokens")
        desc = describe(self.client, prefix_id)
        check_prefix(desc, cfg, self.geometry, SimpleNamespace(fingerprint=self.cache.model_fingerprint, config=self.cache.config), suffix)
        self.state.prefix(desc.prefix_id).stored_probe_bits = desc.geometry.probe_bits
        return desc, suffix, layers

    def generate(
        self, prefix_id: str, suffix_tokens, cfg: ReprefillConfig | None = None, max_new_tokens: int = 16, *, eos_token_ids=None
    ) -> SparseGeneration:
        """Re-Prefill of ``suffix_tokens`` after the stored prefix, then greedy decoding of up to ``max_new_tokens``
        tokens (the first included), stopping at an EOS id (the tokenizer's unless ``eos_token_ids``)."""
        cfg = resolve_selection(ReprefillConfig() if cfg is None else cfg, self.selection_profile)
        max_new_tokens = check_max_new_tokens(max_new_tokens)
        desc, suffix, layers = self.check(prefix_id, suffix_tokens, cfg)
        req = SparseRequest(self, desc, suffix, cfg, layers)
        kv = DynamicCache(config=self.model.config)
        hooks = [attn.register_forward_pre_hook(req.hook(i, kv), with_kwargs=True) for i, attn in enumerate(self.attention)]
        stops = eos_ids(self.cache.tokenizer, eos_token_ids)
        try:
            logits = req.step(suffix, kv)
            req.out.logits, req.out.ttft_s = logits, time.perf_counter() - req.t_start
            tokens = [int(logits.argmax())]
            while tokens[-1] not in stops and len(tokens) < max_new_tokens:
                tokens.append(int(req.step(torch.tensor(tokens[-1:]), kv).argmax()))
        finally:
            for h in hooks:
                h.remove()
        tok = self.cache.tokenizer
        text = None if tok is None else tok.decode(tokens, skip_special_tokens=True)
        return SparseGeneration(tokens, text, logits, "eos" if tokens[-1] in stops else "length", req.out)


class SparseRequest:
    """One request's plan, selection and rows, and the hook that puts them into transformers' attention."""

    def __init__(self, owner: SparseReprefill, desc, suffix: torch.Tensor, cfg: ReprefillConfig, layers):
        self.t_start = time.perf_counter()
        self.owner, self.cfg, self.geometry = owner, cfg, owner.geometry
        self.prefix_id, self.n, self.m = desc.prefix_id, desc.num_tokens, desc.num_chunks
        self.num_layers = owner.cache.config.num_hidden_layers
        self.plan = plan = plan_request(self.num_layers, self.m, cfg, layers)
        self.period_of = {layer: p for p, (l0, k, _) in enumerate(plan.periods) for layer in range(l0, l0 + k)}
        self.next_position = self.n  # the suffix continues after the full prefix, not after the rows loaded
        self.decoding = False
        self.out = ReprefillResult(logits=torch.empty(0), ttft_s=0.0, selected=[], num_prefix_tokens=self.n, prefix_id=self.prefix_id)
        self.out.standin_layers = layers.standins
        self.standins = {layer: owner.state.value_sum(self.prefix_id, layer, self.m, self.out) for layer in layers.standins}
        self.selection = PeriodSelection(cfg, owner.state, self.prefix_id, self.m, None, self.out, follow_top=owner.follow_top_auto)
        self.select_queries = cfg.selection.select_queries
        self.period_rows: torch.Tensor | None = None  # [period layers, 2, Hkv, rows, d] of the Period being run

    @torch.no_grad()
    def step(self, ids: torch.Tensor, kv: DynamicCache) -> torch.Tensor:
        """Run ``ids`` (the suffix, then one token at a time) at the next positions; the last token's logits ``[vocab]`` float32."""
        s = ids.numel()
        positions = torch.arange(self.next_position, self.next_position + s, device=self.owner.device)
        placeholder = torch.zeros(1, 1, s, s, dtype=self.owner.cache.dtype, device=self.owner.device)  # replaced per layer (hook)
        out = self.owner.model(
            input_ids=ids[None].to(self.owner.device),
            position_ids=positions[None],
            attention_mask=placeholder,
            past_key_values=kv,
            use_cache=True,
        )
        self.next_position += s
        self.decoding = True
        return out.logits[0, -1].float()

    def hook(self, layer: int, kv: DynamicCache):
        """The forward pre-hook of ``layer``'s attention: its rows into the cache, its mask into the call."""

        def before_attention(module, args, kwargs):
            if self.decoding:  # one query: every row it has is visible
                kwargs["attention_mask"] = None
                return args, kwargs
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]  # [1, s, hidden], after the layer's norm
            rows = self.layer_rows(layer, module, hidden, kwargs["position_embeddings"])  # [2, Hkv, r, d]
            kv.layers[layer].update(rows[0][None], rows[1][None])
            kwargs["attention_mask"] = suffix_mask(rows.shape[2], hidden.shape[1], rows.dtype, rows.device)
            return args, kwargs

        return before_attention

    def layer_rows(self, layer: int, attn, hidden: torch.Tensor, rope) -> torch.Tensor:
        """``layer``'s prefix rows ``[2, Hkv, r, d]``: the Period's chosen chunks (chosen and read at its first layer), stand-ins added."""
        p = self.period_of[layer]
        l0, num_layers, count = self.plan.periods[p]
        if layer == l0:
            t0 = time.perf_counter()
            chunks = self.choose(l0, count, rotated_queries(attn, hidden, rope))
            self.out.selected.append(chunks)
            self.out.select_s += time.perf_counter() - t0
            self.period_rows = self.read(chunks, l0, num_layers)
        rows = self.period_rows[layer - l0]
        if layer in self.standins:  # 1-layer Periods: the rows not loaded stand in
            probe = self.owner.state.probe(self.prefix_id, l0, self.cfg.selection.probe_bits, self.out).dequantize(rows.dtype)
            loaded = rows.shape[2]
            rows = standin_kv(rows, row_positions(self.out.selected[p], self.n, self.geometry.chunk_tokens), probe, self.standins[layer])
            self.out.standin_rows += rows.shape[2] - loaded
        return rows

    def choose(self, l0: int, count: int, q: torch.Tensor) -> torch.Tensor:
        """Ascending chunk ids (host) for the Period at ``l0``: every chunk, or the selection's ``count`` best (``q [Hq, s, d]``)."""
        if count == self.m:
            return torch.arange(self.m)
        q = q[:, -self.select_queries :] if self.select_queries else q
        return self.selection.choose(q, l0, Budget.chunks(count)).cpu()

    def read(self, chunks: torch.Tensor, l0: int, num_layers: int) -> torch.Tensor:
        """The chunks' rows of layers ``[l0, l0 + num_layers)``: ``[layers, 2, Hkv, rows, d]`` on the model's device."""
        t0 = time.perf_counter()
        tokens = int(self.geometry.chunk_token_counts(self.n)[chunks.numpy()].sum())
        parts = [
            read_kv(self.owner.client, self.prefix_id, chunks, a, b, self.owner.cache.dtype)
            for a, b in layer_batches(self.geometry, tokens, l0, l0 + num_layers)
        ]
        rows = torch.cat(parts).to(self.owner.device)
        self.out.bytes_useful += rows.numel() * rows.element_size()
        self.out.tokens_loaded += tokens
        self.out.kv_fraction += tokens * num_layers / (self.n * self.num_layers)
        self.out.io_wait_s += time.perf_counter() - t0
        return rows


def plan_request(num_layers: int, num_chunks: int, cfg: ReprefillConfig, layers):
    """The request's Periods and chunk counts, as ``ModelRunner.plan`` makes them."""
    sel = cfg.selection
    return plan_periods(
        num_layers,
        num_chunks,
        cfg.budget,
        period_layers=cfg.schedule.period_layers,
        full_layers=cfg.schedule.full_layers,
        whole_layers=layers.whole,
        sink_chunks=sel.sink_chunks,
        local_chunks=sel.local_chunks,
    )


def rotated_queries(attn, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The attention's post-RoPE queries ``[Hq, s, d]`` for its input ``hidden [1, s, hidden]`` (Llama/Qwen2: no q norm)."""
    cos, sin = rope  # [1, s, d]
    d = attn.head_dim
    q = attn.q_proj(hidden).view(*hidden.shape[:-1], -1, d).transpose(1, 2)  # [1, Hq, s, d]
    half = torch.cat([-q[..., d // 2 :], q[..., : d // 2]], dim=-1)
    return (q * cos[:, None] + half * sin[:, None])[0]


def suffix_mask(rows: int, s: int, dtype: torch.dtype, device) -> torch.Tensor:
    """``[1, 1, s, rows + s]`` additive: every prefix row visible, the suffix causal."""
    mask = torch.zeros(1, 1, s, rows + s, dtype=dtype, device=device)
    mask[0, 0, :, rows:] = torch.full((s, s), torch.finfo(dtype).min, dtype=dtype, device=device).triu(1)
    return mask
