"""The worker's model runner: prefill into kvstore, sparse Re-Prefill from it.

``store_prefix`` runs the prefix once and puts its KV (period-major extents,
key summaries and probe keys are derived by the daemon) unless the daemon
already has it.  ``reprefill`` answers a new suffix over a stored prefix:

    for each Period (``period_layers`` layers sharing one chunk selection):
        queries of the period's first layer -> score chunks (selector)
        -> keep sink + local + top chunks within the budget
        -> stream that period's extents group by group from the daemon
           (shared memory when local), computing each layer as its group
           arrives: the suffix attends to the selected prefix rows (their
           stored RoPE) and causally to itself
    -> logits of the first token

After the token, each selected chunk's attention mass (the period's first
layer) is reported to the daemon, the input of its cache score.

Why one file of ~900 lines: ``ReprefillConfig`` and ``ReprefillResult`` are
the request's vocabulary and ``ModelRunner`` its one loop, whose steps
(``check_request``, ``_select``, ``_row_masks``, ``_run_period``, ``_report``) share the
runner's resident state (key summaries, quantized probe keys, the stand-in
layers' value sums: ``standin``; the streaming layout's tails: ``stream_tail``), which
decoding's re-selection (``_decode_reselecting``) scores with too; the dense
prefill (``prefill``), decoding (``generation``, ``reselect``) and the
selectors (``selection``) already live apart.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from kvstore.geometry import ModelSpec, StoreGeometry
from kvstore.wire import InvalidArgument, NotFound

from .client import KVStoreClient, KVStoreRpcError, as_numpy_kv, to_torch
from .generation import GenerationResult, LayerKV, check_max_new_tokens, decode_greedy, eos_ids
from .model.decoder import Decoder
from .prefill import chunked_prefill
from .reselect import WorkingSet, check_every, decode_reselecting
from .selection import PeriodInputs, get_selector, plan_periods, select_chunks
from .selection.heads import kv_head_scores
from .selection.probes import QuantizedKeys, check_probe_bits, quantize_keys
from .sparse_prefill import pattern
from .standin import standin_kv, value_sum
from .stream_tail import fill_tail, get_tail, has_tail, left_out_heads, put_tail, tail_pairs

_TORCH_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


@dataclass(frozen=True)
class ReprefillConfig:
    budget: float = 0.05  # fraction of the prefix's chunks, in (0, 1]
    period_layers: int = 8  # layers sharing one selection (a multiple of the stored group)
    selector: str = "summary"  # exact | summary | full | recent
    head_aggregation: str = "sum"  # sum | max over query heads of each chunk's score (selection.heads)
    follow: int = 0  # each selected chunk brings this many chunks after it (selection.budget.select_chunks)
    # page_chunks > 1: select whole physical pages of that many chunks, each
    # scored by its best chunk (LServe's hierarchical pages; select_chunks)
    page_chunks: int = 1
    # probe_bits 4 or 8: exact scores use probe keys quantized to that many bits,
    # fetched once per prefix and kept resident (selection.probes): as stored
    # when the prefix stores them at these bits (StoreGeometry.probe_bits),
    # else quantized by the client.  0: fetched in full precision at every
    # Period.  A prefix with quantized probe keys serves only its own width.
    probe_bits: int = 0
    # full_layers: the first layers (a multiple of period_layers) load every
    # chunk; their KV is charged to the budget, the other layers share the
    # rest (selection.schedule.plan_periods).
    full_layers: int = 0
    # whole_layers: these layers (Period first layers) load every chunk on top of the
    # budget, the other layers' sets unchanged (selection.schedule.plan_periods): the exact
    # rows where stand-ins only approximate them.  "calibrated": the runner's calibrated
    # layers, as for standin_layers (the layers whose full KV restores most answer margin).
    whole_layers: tuple | str = ()
    sink_chunks: int = 1
    local_chunks: int = 1
    report_attention: bool = True
    # speculate: the daemon loads period i's set for period i+1 as soon as
    # it is known (inter-period prefetch).  overlap: each stored group is
    # computed as soon as it arrives (intra-period); off, a period's layers
    # wait for all its groups.  Both off is the no-prefetch ablation.
    speculate: bool = True
    overlap: bool = True
    # lookahead > 0: speculate from a guess instead of period i's set - right
    # after sending period i's set, score the chunks with period i+1's
    # first-layer queries of the hidden state at hand (period i's input) and
    # hint the top ``lookahead x budget`` of them.  0: period i's set.
    lookahead: float = 0.0
    # push: the daemon hands speculative groups over as they come into
    # memory and the client computes on them without asking (shared memory
    # only); off, every group is asked for by a round trip.
    push: bool = True
    # reselect_every > 0 (generate only): while decoding, every that many
    # generated tokens each Period selects again from the last tokens'
    # queries and fetches the chunks it lacks (engine_client.reselect).
    # Needs scores from resident state: the summary selector, or exact with
    # probe_bits.  0: decoding attends to the first token's sets.
    reselect_every: int = 0
    # first_token_full (with reselect_every; LServe's split of the work): the first token
    # loads every chunk and its retrieval heads attend to all of them, as LServe's dense
    # prefill does; ``budget`` applies from the first decoding step on, whose selection
    # keeps that many of the rows already loaded.  False: the first token's set is the budget.
    first_token_full: bool = False
    # streaming (LServe): the runner's streaming heads (ModelRunner(streaming_heads=))
    # attend only to the loaded rows in the sink and recent window, at the
    # first token and while decoding; the other heads to every loaded row.
    # Selection scores the other heads only (LServe selects for dense heads).
    streaming: bool = False
    # per_head (LServe): each KV head chooses its own chunks at the budget (its query
    # group's max, selection.heads.kv_head_scores) and attends only to them; the Period
    # loads their union (a chunk holds every head).  Streaming heads choose none.
    per_head: bool = False
    # prefill_alpha in (0, 1] (LoopServe's online prefill sparsification): each layer's suffix
    # attends only through the vertical and slash lines covering that share of its last 16
    # queries' attention over the loaded rows and itself (sparse_prefill.pattern). 0: densely.
    prefill_alpha: float = 0.0
    # standin_layers (exact with probe_bits, 1-layer stored groups at those layers): at these
    # layers every prefix row not loaded joins the attention with its resident probe key and
    # the mean value of the rows not loaded (engine_client.standin); each layer's value sum is
    # read once per prefix and kept.  (): only the loaded rows.  "calibrated": the runner's
    # calibrated layers (ModelRunner(standin_layers=), model.standins).
    standin_layers: tuple | str = ()
    # select_queries > 0: the first token's selection scores with the queries of the suffix's
    # last this many tokens only (the answer's opening), not all of them; a long new turn's
    # own text then does not outweigh the question.  0: every suffix token's queries.
    select_queries: int = 0


@dataclass
class PrefixHandle:
    prefix_id: str
    num_tokens: int
    num_chunks: int
    cache_hit: bool  # already stored: nothing was computed or written
    bytes_written: int = 0
    prefill_s: float = 0.0
    tail_batch_id: str = ""  # streaming layout: the page batch this store wrote for the tail ("" if none)


@dataclass
class ReprefillResult:
    logits: torch.Tensor  # [vocab] float32, the first token's
    ttft_s: float
    selected: list[torch.Tensor]  # per period: chunk ids
    chunk_attention: list[torch.Tensor] = field(default_factory=list)  # per period: [selected] mass
    tokens_loaded: int = 0  # selected tokens, summed over periods
    kv_fraction: float = 0.0  # of the prefix's KV loaded: token-layers loaded / (tokens x layers)
    bytes_read: int = 0  # from disk, padding included (speculation included)
    bytes_useful: int = 0  # extent bytes delivered
    bytes_gpu: int = 0  # delivered from the GPU tier
    bytes_cpu: int = 0  # delivered from the CPU tier
    units_disk: int = 0
    units_cpu: int = 0
    units_gpu: int = 0
    spec_bytes_used: int = 0
    spec_bytes_wasted: int = 0
    groups_covered: int = 0  # groups computed on from pushed speculation (no round trip)
    hints: list = field(default_factory=list)  # per period: the look-ahead guess sent for it (None: none)
    daemon_wait_s: float = 0.0  # the daemon's time waiting for reads of groups asked for
    probe_bytes: int = 0  # probe keys fetched for exact selection
    state_bytes_fetched: int = 0  # client state (key summaries) fetched from the daemon for this request
    select_s: float = 0.0
    io_wait_s: float = 0.0
    compute_s: float = 0.0
    period_select_s: list = field(default_factory=list)  # per period: its selection's seconds (its hint's included)
    layer_compute_s: list = field(default_factory=list)  # per layer: seconds of its forward
    reported_units: int = 0
    # keep_kv: per layer, the prefix rows it attended to then the suffix's KV, [2, Hkv, rows + s, d]
    layer_kv: list = field(default_factory=list)
    # streaming / per_head: per layer, which loaded rows each KV head may see ([Hkv, rows] or None: all)
    row_masks: list = field(default_factory=list)
    head_sets: list = field(default_factory=list)  # per_head: per period, each KV head's chunk ids
    prefill_densities: list = field(default_factory=list)  # prefill_alpha: per layer, the share of causal cells computed
    standin_rows: int = 0  # standin_layers: prefix rows attended through stand-ins, summed over those layers
    num_prefix_tokens: int = 0
    prefix_id: str = ""  # the prefix's full id (a request may name it by a leading part)

    @property
    def read_amplification(self) -> float:
        return self.bytes_read / self.bytes_useful if self.bytes_useful else 1.0


def model_geometry(
    model: Decoder, *, chunk_tokens: int = 16, group_layers: int = 4, probe_bits: int = 0, kv_quant: str = "", streaming_heads=None
) -> StoreGeometry:
    """The store geometry of a model's KV: stored groups of ``group_layers`` (the SubPeriod),
    probe keys in the KV dtype or, with ``probe_bits`` 4 or 8, quantized by the daemon;
    ``kv_quant`` ("kv8", "kv4", ...): the KV itself stored quantized (``kvstore.kvquant``);
    ``streaming_heads`` (``model.streaming.StreamingHeads``): extents without those heads' rows
    (``StoreGeometry.streaming_heads``, their sink and recent rows kept by ``stream_tail``)."""
    c = model.config
    spec = ModelSpec(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, _TORCH_DTYPES[model.dtype])
    left_out = () if streaming_heads is None else left_out_heads(streaming_heads)
    return StoreGeometry(
        spec,
        chunk_tokens=chunk_tokens,
        group_layers=group_layers,
        probe_keys=True,
        probe_bits=probe_bits,
        kv_quant=kv_quant,
        streaming_heads=left_out,
    )


class ModelRunner:
    def __init__(
        self,
        model: Decoder,
        client: KVStoreClient,
        *,
        namespace: str = "",
        chunk_tokens: int = 16,
        group_layers: int = 4,
        probe_bits: int = 0,
        streaming_heads=None,
        standin_layers=None,
        kv_quant: str = "",
        streaming_layout: bool = False,
    ):
        """``probe_bits`` 4 or 8: the prefixes this runner stores keep their probe keys quantized
        (``StoreGeometry.probe_bits``), what ``ReprefillConfig.probe_bits`` of the same width reads.
        ``kv_quant``: the prefixes it stores hold their KV quantized (``StoreGeometry.kv_quant``); every
        read dequantizes to the model's dtype.
        ``streaming_heads`` (``model.streaming.StreamingHeads``): what ``ReprefillConfig.streaming`` uses.
        ``standin_layers`` (``model.standins.StandinLayers``): what ``ReprefillConfig.standin_layers="calibrated"`` uses.
        ``streaming_layout``: the prefixes it stores keep only the sink and recent rows of the streaming
        heads (LServe's second layout: extents without them, a per-prefix tail of pages, ``stream_tail``);
        they serve ``ReprefillConfig.streaming`` requests only."""
        self.model = model
        self.streaming_heads = streaming_heads
        self.standin_profile = standin_layers
        self.client = client
        self.namespace = namespace
        if streaming_layout and streaming_heads is None:
            raise InvalidArgument("streaming_layout", "needs the model's streaming heads (streaming_heads=...)")
        self.geometry = model_geometry(
            model,
            chunk_tokens=chunk_tokens,
            group_layers=group_layers,
            probe_bits=probe_bits,
            kv_quant=kv_quant,
            streaming_heads=streaming_heads if streaming_layout else None,
        )
        # resident key summaries of each Period's first layer, per (prefix, period_layers):
        # [chunks, periods, kv_heads, 2, head_dim] in the model's dtype (min/max of stored keys: exact)
        self._summaries: dict[tuple[str, int], torch.Tensor] = {}
        # resident quantized probe keys per (prefix, stored group, bits): ReprefillConfig.probe_bits
        self._probes: dict[tuple[str, int, int], QuantizedKeys] = {}
        # each re-prefilled prefix's stored probe_bits (a prefix id names one geometry, so it never changes)
        self._stored_probe_bits: dict[str, int] = {}
        # resident value sums per (prefix, layer): [Hkv, d] float32 (ReprefillConfig.standin_layers)
        self._value_sums: dict[tuple[str, int], torch.Tensor] = {}
        # resident streaming-head tails per prefix (streaming_layout): (positions [r], rows [pairs, 2, r, d])
        self._tails: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._tail_pair = {pair: i for i, pair in enumerate(tail_pairs(self.geometry))}

    # ------------------------------------------------------------ prefill
    def store_prefix(self, tokens, *, progress=None, kv: torch.Tensor | None = None) -> PrefixHandle:
        """Prefill ``tokens`` and store their KV, unless the daemon has them already.

        ``progress(iterable, desc, total=, unit=)`` wraps the prefill's
        block x layer steps (a bar, see kvstore.progress); None: no bar.
        ``kv [layers, 2, kv_heads, n, head_dim]``: the tokens' KV from this
        model's prefill when the caller has it (stored as given, no prefill).
        """
        toks = _token_tensor(tokens)
        if kv is not None:
            c = self.model.config
            want = (self.model.num_layers, 2, c.num_key_value_heads, toks.numel(), c.head_dim)
            if tuple(kv.shape) != want or kv.dtype != self.model.dtype:
                raise InvalidArgument("kv", f"must be {self.model.dtype} {list(want)} for these tokens, got {kv.dtype} {list(kv.shape)}")
        m = self.geometry.num_chunks(toks.numel())
        hit = self.client.lookup(toks.numpy(), self.geometry, namespace=self.namespace, model_fingerprint=self.model.fingerprint)
        if hit.matched_chunks == m and (not self.geometry.streaming_heads or self._has_tail(hit.prefix_id)):
            return PrefixHandle(hit.prefix_id, toks.numel(), m, cache_hit=True)
        t0 = time.perf_counter()
        if kv is None:
            _, kv = chunked_prefill(self.model, toks, progress=progress)  # [layers, 2, kv_heads, n, head_dim]
        arr = as_numpy_kv(kv)
        res = self.client.put_prefix(toks.numpy(), arr, self.geometry, namespace=self.namespace, model_fingerprint=self.model.fingerprint)
        written, batch = res.bytes_written, ""
        if self.geometry.streaming_heads:  # after the prefix: a put cut short between the two is healed by the next store
            sh = self.streaming_heads
            tail = put_tail(self.client, res.prefix_id, arr, self.geometry, sh.sink_tokens, sh.recent_tokens, **self._page_scope())
            written, batch = written + tail.bytes_written, tail.batch_id
        return PrefixHandle(res.prefix_id, toks.numel(), m, False, written, time.perf_counter() - t0, batch)

    def _page_scope(self) -> dict:
        return {"namespace": self.namespace, "model_fingerprint": self.model.fingerprint}

    def _has_tail(self, prefix_id: str) -> bool:
        sh = self.streaming_heads
        return has_tail(self.client, prefix_id, self.geometry, sh.sink_tokens, sh.recent_tokens, **self._page_scope())

    def _tail(self, prefix_id: str, num_tokens: int, out) -> tuple[torch.Tensor, torch.Tensor]:
        """The prefix's streaming-head tail, fetched once (charged to ``out.state_bytes_fetched``) and kept."""
        if prefix_id not in self._tails:
            sh = self.streaming_heads
            tail = get_tail(self.client, prefix_id, num_tokens, self.geometry, sh.sink_tokens, sh.recent_tokens, **self._page_scope())
            out.state_bytes_fetched += tail.rows.nbytes
            self._tails[prefix_id] = (torch.from_numpy(tail.positions), _as_torch(tail.rows, self.geometry))
        return self._tails[prefix_id]

    # ------------------------------------------------------------ re-prefill
    def check_request(self, prefix_id: str, suffix_tokens, cfg: ReprefillConfig):
        """Validate everything before any work; returns (description, suffix tensor)."""
        if isinstance(cfg.budget, bool) or not isinstance(cfg.budget, (int, float)) or not 0 < cfg.budget <= 1:
            raise InvalidArgument("budget", f"must be a fraction in (0, 1], got {cfg.budget!r}")
        if cfg.period_layers < 1 or cfg.period_layers % self.geometry.group_layers:
            raise InvalidArgument("period_layers", f"must be a positive multiple of the stored group ({self.geometry.group_layers} layers)")
        get_selector(cfg.selector, cfg.head_aggregation)
        if check_probe_bits(cfg.probe_bits) and cfg.selector != "exact":
            raise InvalidArgument("probe_bits", f"quantized probe keys serve the exact selector only, not {cfg.selector!r}")
        if isinstance(cfg.follow, bool) or not isinstance(cfg.follow, int) or cfg.follow < 0:
            raise InvalidArgument("follow", f"must be an int >= 0, got {cfg.follow!r}")
        if isinstance(cfg.select_queries, bool) or not isinstance(cfg.select_queries, int) or cfg.select_queries < 0:
            raise InvalidArgument("select_queries", f"must be an int >= 0 (0: every suffix token), got {cfg.select_queries!r}")
        if isinstance(cfg.page_chunks, bool) or not isinstance(cfg.page_chunks, int) or cfg.page_chunks < 1:
            raise InvalidArgument("page_chunks", f"must be an int >= 1, got {cfg.page_chunks!r}")
        if cfg.page_chunks > 1 and cfg.follow:
            raise InvalidArgument("page_chunks", f"selects whole pages; it does not combine with follow={cfg.follow}")
        if isinstance(cfg.full_layers, bool) or not isinstance(cfg.full_layers, int):
            raise InvalidArgument("full_layers", f"must be an int, got {cfg.full_layers!r}")
        if isinstance(cfg.lookahead, bool) or not isinstance(cfg.lookahead, (int, float)) or not 0 <= cfg.lookahead <= 1 / cfg.budget:
            raise InvalidArgument("lookahead", f"must be in [0, 1 / budget = {1 / cfg.budget:g}], got {cfg.lookahead!r}")
        if check_every(cfg.reselect_every) and not (cfg.selector == "summary" or (cfg.selector == "exact" and cfg.probe_bits)):
            raise InvalidArgument(
                "reselect_every",
                f"re-selecting while decoding needs scores kept in client memory (the summary selector, or exact with probe_bits), not {cfg.selector!r}"
                + (" without probe_bits" if cfg.selector == "exact" else ""),
            )
        if not isinstance(cfg.streaming, bool):
            raise InvalidArgument("streaming", f"must be a bool, got {cfg.streaming!r}")
        if not isinstance(cfg.first_token_full, bool):
            raise InvalidArgument("first_token_full", f"must be a bool, got {cfg.first_token_full!r}")
        if cfg.first_token_full and not cfg.reselect_every:
            raise InvalidArgument("first_token_full", "the budget then applies while decoding only; it needs reselect_every > 0")
        if cfg.first_token_full and cfg.per_head:
            raise InvalidArgument("first_token_full", "per-KV-head sets are chosen at the first token; not with per_head")
        if not isinstance(cfg.per_head, bool):
            raise InvalidArgument("per_head", f"must be a bool, got {cfg.per_head!r}")
        alpha = cfg.prefill_alpha
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or math.isnan(alpha) or not 0 <= alpha <= 1:
            raise InvalidArgument("prefill_alpha", f"must be in [0, 1] (0: a dense prefill), got {alpha!r}")
        if cfg.per_head and cfg.selector not in ("exact", "summary"):
            raise InvalidArgument("per_head", f"per-KV-head sets need per-head scores (exact or summary), not {cfg.selector!r}")
        self._check_standin(cfg)
        self._check_whole(cfg)
        if cfg.streaming and self.streaming_heads is None:
            raise InvalidArgument(
                "streaming", "this runner has no streaming heads (ModelRunner(streaming_heads=...); python -m tools.models calibrate-heads)"
            )
        if self.geometry.streaming_heads and not cfg.streaming:
            raise InvalidArgument(
                "streaming", "this runner's prefixes keep only the sink and recent rows of their streaming heads; ask with streaming=True"
            )
        suffix = _token_tensor(suffix_tokens, field_name="suffix_tokens")
        try:
            desc = self.client.describe(prefix_id)
        except KVStoreRpcError as exc:
            if exc.code.name == "NOT_FOUND":
                raise NotFound(f"prefix_id: {exc.message}") from None
            raise
        self._plan(desc.num_chunks, cfg)  # refuses a full_layers the budget cannot pay for
        stored = desc.geometry
        # how a prefix keeps its probe keys decides only which requests it serves (_check_probe_form)
        if replace(stored, probe_bits=0) != replace(self.geometry, probe_bits=0) or desc.model_fingerprint != self.model.fingerprint:
            raise InvalidArgument(
                "prefix_id",
                f"stored for another model or layout (fingerprint {desc.model_fingerprint[:12] or '-'}, {stored}); "
                f"this runner is {self.model.fingerprint[:12] or '-'}, {self.geometry}",
            )
        _check_probe_form(stored, cfg)
        limit = self.model.config.max_position_embeddings
        if desc.num_tokens + suffix.numel() > limit:
            raise InvalidArgument(
                "suffix_tokens", f"prefix {desc.num_tokens} + suffix {suffix.numel()} tokens exceed the model's context of {limit}"
            )
        self._stored_probe_bits[desc.prefix_id] = stored.probe_bits
        return desc, suffix

    def _standin_layers(self, cfg: ReprefillConfig):
        """``cfg.standin_layers``, with ``"calibrated"`` read from the runner's calibration file."""
        return self._calibrated(cfg, "standin_layers")

    def _calibrated(self, cfg: ReprefillConfig, name: str):
        """``cfg.<name>`` (``standin_layers`` or ``whole_layers``), ``"calibrated"`` read from the runner's calibration file."""
        value = getattr(cfg, name)
        if not isinstance(value, str):
            return value
        if value != "calibrated":
            raise InvalidArgument(name, f'must be a tuple of layer indices or "calibrated", got {value!r}')
        if self.standin_profile is None:
            raise InvalidArgument(
                name,
                "this runner has no calibrated stand-in layers (ModelRunner(standin_layers=...); python -m tools.models calibrate-standins)",
            )
        return self.standin_profile.layers

    def _check_whole(self, cfg: ReprefillConfig) -> None:
        layers = self._calibrated(cfg, "whole_layers")
        if not isinstance(layers, (tuple, list)) or any(isinstance(x, bool) or not isinstance(x, int) for x in layers):
            raise InvalidArgument("whole_layers", f"must be a tuple of layer indices, got {layers!r}")
        if not layers:
            return
        both = set(layers) & set(self._standin_layers(cfg))
        if both:
            raise InvalidArgument("whole_layers", f"layers {sorted(both)} are loaded whole; they need no stand-in rows")
        # whole layers change only the first token's sets: decoding over them, as Re-Prefill's own selection does
        for name in ("reselect_every", "first_token_full", "streaming", "per_head"):
            if getattr(cfg, name):
                raise InvalidArgument("whole_layers", f"does not combine with {name}={getattr(cfg, name)!r}")

    def _check_standin(self, cfg: ReprefillConfig) -> None:
        layers = self._standin_layers(cfg)
        if not isinstance(layers, (tuple, list)) or any(isinstance(x, bool) or not isinstance(x, int) for x in layers):
            raise InvalidArgument("standin_layers", f"must be a tuple of layer indices, got {layers!r}")
        if not layers:
            return
        num = self.model.num_layers
        if len(set(layers)) != len(layers) or not all(0 <= x < num for x in layers):
            raise InvalidArgument("standin_layers", f"must be distinct layers in [0, {num}), got {tuple(layers)}")
        if cfg.selector != "exact" or not cfg.probe_bits:
            raise InvalidArgument(
                "standin_layers", "stand-in rows take their keys from resident probe keys: the exact selector with probe_bits"
            )
        g = self.geometry.group_layers
        if cfg.period_layers != 1 or g != 1:
            raise InvalidArgument(
                "standin_layers",
                f"stand-in keys are each layer's probe keys: 1-layer Periods and stored groups, not {cfg.period_layers} and {g}",
            )
        for name in ("reselect_every", "streaming", "per_head", "prefill_alpha"):
            if getattr(cfg, name):
                raise InvalidArgument("standin_layers", f"does not combine with {name}={getattr(cfg, name)!r}")

    def _value_sum(self, prefix_id: str, layer: int, num_chunks: int, out: ReprefillResult) -> torch.Tensor:
        """The layer's value sum over the whole prefix, read once per prefix (charged to ``out.state_bytes_fetched``) and kept."""
        key = (prefix_id, layer)
        if key not in self._value_sums:
            geo = self.geometry
            group = layer // geo.group_layers
            with self.client.read_chunks(prefix_id, list(range(num_chunks)), layer_start=layer, layer_end=layer + 1, shm=False) as read:
                values = _as_torch(read.group_kv(group), geo)[layer - group * geo.group_layers, 1]  # [Hkv, n, d]
                self._value_sums[key] = value_sum(values)
                out.state_bytes_fetched += read.bytes_useful
        return self._value_sums[key]

    def reprefill(
        self, prefix_id: str, suffix_tokens, cfg: ReprefillConfig = ReprefillConfig(), *, choose=None, keep_kv: bool = False
    ) -> ReprefillResult:
        """First-token logits of ``suffix_tokens`` after the stored prefix, loading only selected chunks.

        ``choose(period, first_layer, queries, num_chunks) -> chunk ids`` replaces
        the configured selector (the baselines' token-level selections).
        ``keep_kv`` keeps each layer's loaded rows and suffix KV in ``layer_kv``
        (what ``generate`` decodes over).
        """
        desc, suffix = self.check_request(prefix_id, suffix_tokens, cfg)
        if cfg.first_token_full:  # the budget is the decoding steps' (_decode_reselecting)
            cfg = replace(cfg, budget=1.0)
        t_start = time.perf_counter()
        model = self.model
        n, m = desc.num_tokens, desc.num_chunks
        positions = torch.arange(n, n + suffix.numel())
        hidden = model.embed(suffix)  # [s, hidden]
        selector = get_selector(cfg.selector, cfg.head_aggregation)
        plan = self._plan(m, cfg)
        out = ReprefillResult(logits=torch.empty(0), ttft_s=0.0, selected=[], num_prefix_tokens=n, prefix_id=desc.prefix_id)
        if keep_kv:
            out.layer_kv = [None] * model.num_layers
        if cfg.streaming or cfg.per_head:
            out.row_masks = [None] * model.num_layers
        mass_inputs = []
        hints = bool(cfg.speculate and cfg.lookahead and choose is None and selector.name != "full" and cfg.budget < 1)
        out.hints = [None] * -(-model.num_layers // cfg.period_layers)
        out.period_select_s = [0.0] * len(out.hints)
        out.layer_compute_s = [0.0] * model.num_layers
        push = None if cfg.push else False  # None: pushed whenever speculating over shared memory
        standins = {layer: self._value_sum(desc.prefix_id, layer, m, out) for layer in self._standin_layers(cfg)}
        tail = self._tail(desc.prefix_id, n, out) if self.geometry.streaming_heads else None
        with self.client.prefetch(
            desc.prefix_id, period_layers=cfg.period_layers, speculate=cfg.speculate, hints=hints, push=push
        ) as stream:
            for p, l0 in enumerate(range(0, model.num_layers, cfg.period_layers)):
                t0 = time.perf_counter()
                q = model.layer_queries(l0, hidden, positions)  # [Hq, s, d]
                head_sets: list[torch.Tensor] = []  # per_head: each KV head's chunks
                if choose is not None:
                    chunks = torch.as_tensor(choose(p, l0, q, m), dtype=torch.long)
                elif plan.periods[p][2] == m:  # a layer loaded in full
                    chunks = torch.arange(m)
                else:
                    chunks = self._select(
                        selector, desc.prefix_id, _choosing(q, cfg), l0, m, replace(cfg, budget=plan.periods[p][2]), out, head_sets
                    )
                out.selected.append(chunks)
                out.head_sets.append(head_sets)
                out.period_select_s[p] += time.perf_counter() - t0
                out.select_s += time.perf_counter() - t0
                stream.send(p, chunks.numpy())
                nxt = l0 + cfg.period_layers
                if hints and nxt < model.num_layers:  # while the daemon loads period p
                    t0 = time.perf_counter()
                    guess = self.model.layer_queries(nxt, hidden, positions)
                    wide = replace(cfg, budget=min(1.0, cfg.budget * cfg.lookahead))
                    out.hints[p + 1] = self._select(selector, desc.prefix_id, _choosing(guess, cfg), nxt, m, wide, out)
                    stream.hint(p + 1, out.hints[p + 1].numpy())
                    out.period_select_s[p] += time.perf_counter() - t0
                    out.select_s += time.perf_counter() - t0
                masks = self._row_masks(chunks, l0, n, cfg, out, head_sets)
                row_pos = self._rows(chunks.tolist(), n) if cfg.prefill_alpha or l0 in standins or tail is not None else None
                standin = None
                if l0 in standins:
                    probe = self._resident_probe(desc.prefix_id, l0, cfg.probe_bits, out).dequantize(model.dtype)
                    standin = (row_pos, probe, standins[l0])
                hidden, first_keys = self._run_period(stream, p, l0, hidden, positions, cfg, out, masks, row_pos, standin, tail)
                chunk_tokens = stream.chunk_tokens(p).tolist()
                out.tokens_loaded += sum(chunk_tokens)
                out.kv_fraction += sum(chunk_tokens) * plan.periods[p][1] / (n * model.num_layers)
                mass_inputs.append((q, first_keys, chunk_tokens))
            t0 = time.perf_counter()
            out.logits = model.final_logits(hidden)
            out.compute_s += time.perf_counter() - t0
            out.ttft_s = time.perf_counter() - t_start
        st = stream.stats
        out.io_wait_s = stream.io_wait_s
        out.bytes_read, out.bytes_useful = st.bytes_disk, st.bytes_useful
        out.bytes_gpu, out.bytes_cpu = st.bytes_gpu, st.bytes_cpu
        out.units_disk, out.units_cpu, out.units_gpu = st.units_disk, st.units_cpu, st.units_gpu
        out.spec_bytes_used, out.spec_bytes_wasted = st.spec_bytes_used, st.spec_bytes_wasted
        out.groups_covered = st.groups_covered
        out.daemon_wait_s = st.daemon_wait_s
        out.chunk_attention = [self._chunk_mass(*inp) for inp in mass_inputs]
        if cfg.report_attention:
            out.reported_units = self._report(desc.prefix_id, out, cfg)
        return out

    def _plan(self, num_chunks: int, cfg: ReprefillConfig):
        """The request's Periods and the chunks each loads (selection.schedule.plan_periods)."""
        return plan_periods(
            self.model.num_layers,
            num_chunks,
            cfg.budget,
            period_layers=cfg.period_layers,
            full_layers=cfg.full_layers,
            whole_layers=tuple(self._calibrated(cfg, "whole_layers")),
            sink_chunks=cfg.sink_chunks,
            local_chunks=cfg.local_chunks,
        )

    def _select(self, selector, prefix_id, q, l0, m, cfg, out, head_sets: list | None = None) -> torch.Tensor:
        """``cfg.budget``: a fraction of the chunks, or an int chunk count (from the Period plan).

        ``cfg.per_head``: the union of each KV head's set, the sets put in ``head_sets``.
        """
        if selector.name == "full" or (isinstance(cfg.budget, float) and cfg.budget >= 1) or cfg.budget == m:
            return torch.arange(m)
        inputs = PeriodInputs(q, chunk_tokens=self.geometry.chunk_tokens)
        if selector.name == "exact" and cfg.probe_bits:
            keys = self._resident_probe(prefix_id, l0 // self.geometry.group_layers, cfg.probe_bits, out)
            inputs = PeriodInputs(q, chunk_tokens=self.geometry.chunk_tokens, probe_keys=keys.dequantize(self.model.dtype))
        elif selector.name == "exact":
            probe = self.client.get_probe_keys(prefix_id, l0 // self.geometry.group_layers)  # [Hkv, n, d]
            out.probe_bytes += probe.nbytes
            inputs = PeriodInputs(q, chunk_tokens=self.geometry.chunk_tokens, probe_keys=_as_torch(probe, self.geometry))
        elif selector.name == "summary":
            summ = self.summaries(prefix_id, cfg.period_layers, out)
            inputs = PeriodInputs.from_store_summaries(q, summ, l0 // cfg.period_layers, chunk_tokens=self.geometry.chunk_tokens)
        elif selector.name == "recent":
            inputs = PeriodInputs(q, chunk_tokens=self.geometry.chunk_tokens, key_min=torch.zeros(m, 1, 1), key_max=torch.zeros(m, 1, 1))
        pick = dict(sink_chunks=cfg.sink_chunks, local_chunks=cfg.local_chunks, follow=cfg.follow, page_chunks=cfg.page_chunks)
        if not cfg.per_head:
            hkv = self.geometry.model.num_kv_heads
            retrieval = [h for h in range(hkv) if not self._streams_whole_period(l0, cfg, h)]
            if selector.name != "recent" and 0 < len(retrieval) < hkv:  # streaming heads see sink + recent only: not scored
                inputs = inputs.of_kv_heads(retrieval, hkv)
            return select_chunks(selector.score(inputs), cfg.budget, **pick)
        scores = kv_head_scores(selector.head_scores(inputs), self.geometry.model.num_kv_heads)  # [Hkv, m]
        sets = []
        for h in range(scores.shape[0]):
            if self._streams_whole_period(l0, cfg, h):  # sees sink + recent only: the forced chunks
                sets.append(
                    select_chunks(scores[h], cfg.sink_chunks + cfg.local_chunks, sink_chunks=cfg.sink_chunks, local_chunks=cfg.local_chunks)
                )
            else:
                sets.append(select_chunks(scores[h], cfg.budget, **pick))
        if head_sets is not None:
            head_sets[:] = sets
        return torch.unique(torch.cat(sets))

    def _streams_whole_period(self, l0: int, cfg, head: int) -> bool:
        """KV head ``head`` is a streaming head in every layer of the Period at ``l0`` (and ``cfg.streaming``)."""
        if not cfg.streaming:
            return False
        layers = range(l0, min(l0 + cfg.period_layers, self.model.num_layers))
        return all(self.streaming_heads.streaming[layer][head] for layer in layers)

    def summaries(self, prefix_id: str, period_layers: int, out: ReprefillResult | None = None) -> torch.Tensor:
        """Key summaries of each Period's first layer, ``[chunks, periods, kv_heads, 2, head_dim]``.

        Fetched once per prefix and kept resident (``resident_bytes``); the
        bytes of a fetch are added to ``out.state_bytes_fetched``.
        """
        key = (prefix_id, period_layers)
        if key not in self._summaries:
            full = self.client.get_summaries(prefix_id)  # [chunks, layers, kv_heads, 2, head_dim] float32
            if out is not None:
                out.state_bytes_fetched += full.nbytes
            firsts = np.ascontiguousarray(full[:, ::period_layers])  # [chunks, periods, kv_heads, 2, head_dim]
            self._summaries[key] = torch.from_numpy(firsts).to(self.model.dtype)
        return self._summaries[key]

    def _resident_probe(self, prefix_id: str, group: int, bits: int, out: ReprefillResult) -> QuantizedKeys:
        """A stored group's probe keys, quantized to ``bits`` and kept; the first fetch is charged to ``out.probe_bytes``.

        A prefix storing them at ``bits`` hands over the packed rows the
        client keeps as they are; one storing full-precision keys hands
        those over, and the client quantizes them (the same format).
        """
        key = (prefix_id, group, bits)
        if key not in self._probes:
            probe = self.client.get_probe_keys(prefix_id, group)  # [Hkv, n, d] keys, or [Hkv, n, row_bytes] packed rows
            out.probe_bytes += probe.nbytes
            if self._stored_probe_bits[prefix_id] == bits:
                self._probes[key] = QuantizedKeys.from_packed(probe, bits, self.geometry.model.head_dim)
            else:
                self._probes[key] = quantize_keys(_as_torch(probe, self.geometry), bits)
        return self._probes[key]

    def forget(self, prefix_id: str) -> None:
        """Drop the client state kept for ``prefix_id`` (summaries, probe keys); the stored prefix stays,
        and a later request fetches the state again."""
        for cache in (self._summaries, self._probes, self._value_sums):
            for key in [k for k in cache if k[0] == prefix_id]:
                del cache[key]
        self._tails.pop(prefix_id, None)

    def resident_bytes(self) -> int:
        """Bytes of client state kept between requests (key summaries, quantized probe keys, value sums, tails)."""
        tensors = [*self._summaries.values(), *self._value_sums.values(), *(t for pair in self._tails.values() for t in pair)]
        return sum(t.numel() * t.element_size() for t in tensors) + sum(p.nbytes for p in self._probes.values())

    @staticmethod
    def summary_bytes(geometry: StoreGeometry, num_tokens: int, period_layers: int) -> int:
        """What ``summaries`` keeps resident for one prefix of ``num_tokens``."""
        m = geometry.model
        periods = -(-m.num_layers // period_layers)
        itemsize = np.dtype(m.numpy_dtype()).itemsize
        return geometry.num_chunks(num_tokens) * periods * m.num_kv_heads * 2 * m.head_dim * itemsize

    def _row_masks(self, chunks: torch.Tensor, l0: int, n: int, cfg, out, head_sets=()) -> dict[int, torch.Tensor | None]:
        """Per layer of the Period at ``l0``, each KV head's view of the loaded rows (empty when every head sees all)."""
        if not (cfg.streaming or head_sets):
            return {}
        masks = {}
        for layer in range(l0, min(l0 + cfg.period_layers, self.model.num_layers)):
            masks[layer] = out.row_masks[layer] = self._layer_mask(layer, chunks.tolist(), n, cfg, head_sets)
        return masks

    def _rows(self, chunks: list[int], n: int) -> torch.Tensor:
        """The prefix positions of the rows ``chunks`` deliver, in their order."""
        ct = self.geometry.chunk_tokens
        rows = (torch.as_tensor(chunks, dtype=torch.long)[:, None] * ct + torch.arange(ct)).reshape(-1)
        return rows[rows < n]  # the last chunk may be short

    def _layer_mask(self, layer: int, chunks: list[int], n: int, cfg, head_sets=()) -> torch.Tensor | None:
        """``[Hkv, rows of chunks]``: streaming heads see the sink and recent rows, with ``head_sets`` each head its own chunks."""
        ct = self.geometry.chunk_tokens
        rows = self._rows(chunks, n)
        mask = self.streaming_heads.row_mask(layer, rows, n) if cfg.streaming else None
        if head_sets:
            mine = torch.stack([torch.isin(rows // ct, hs) for hs in head_sets])  # [Hkv, rows]
            mask = mine if mask is None else mask & mine
        return mask

    def _run_period(self, stream, period: int, l0: int, hidden, positions, cfg, out, masks=None, row_pos=None, standin=None, tail=None):
        """Compute the period's layers, each group as soon as it has arrived (``masks``: ``_row_masks``;
        ``row_pos``: the loaded rows' positions, for ``cfg.prefill_alpha``'s lines and ``tail``; ``standin``:
        ``(row_pos, probe keys, value sum)`` of a stand-in layer, ``engine_client.standin``; ``tail``: the
        streaming heads' rows of a streaming-layout prefix, ``_tail``)."""
        model, geo = self.model, self.geometry
        first_keys = None
        groups = stream.groups(period)
        if not cfg.overlap:  # the whole period before any layer
            groups = list(groups)
        for group, raw in groups:
            t0 = time.perf_counter()
            kv = _as_torch(raw, geo)  # [group layers, 2, kv_heads, rows, head_dim]
            if tail is not None:
                kv = fill_tail(kv, geo, group, row_pos, *tail, self._tail_pair)
            for i, layer in enumerate(geo.group_layer_range(group)):
                t1 = time.perf_counter()
                lines = None
                if cfg.prefill_alpha:
                    keys = torch.cat([kv[i, 0], model.layer_keys(layer, hidden, positions)], dim=1)
                    q = model.layer_queries(layer, hidden, positions)
                    lines, density = pattern(q, keys, positions, torch.cat([row_pos, positions]), cfg.prefill_alpha)
                    out.prefill_densities.append(density)
                rows = kv[i]
                if standin is not None:  # 1-layer Periods: this is the stand-in layer
                    rows = standin_kv(kv[i], *standin)
                    out.standin_rows += rows.shape[2] - kv[i].shape[2]
                hidden, suffix_kv = model.layer_forward(layer, hidden, positions, rows, (masks or {}).get(layer), lines)
                out.layer_compute_s[layer] += time.perf_counter() - t1
                if out.layer_kv:
                    out.layer_kv[layer] = torch.cat([rows, suffix_kv], dim=2)  # [2, Hkv, rows + s, d]
                if layer == l0:
                    first_keys = (kv[i, 0].clone(), suffix_kv[0])
            out.compute_s += time.perf_counter() - t0
        return hidden, first_keys

    def _chunk_mass(self, q, first_keys, chunk_tokens: list[int]) -> torch.Tensor:
        """Attention mass of each selected chunk at the period's first layer: ``[selected]``."""
        prefix_k, suffix_k = first_keys
        rows = self.model.attention_mass(q, prefix_k, suffix_k)  # [selected rows]
        return torch.stack([part.sum() for part in torch.split(rows, chunk_tokens)])

    def _report(self, prefix_id: str, out: ReprefillResult, cfg: ReprefillConfig) -> int:
        units = 0
        groups_per_period = cfg.period_layers // self.geometry.group_layers
        for p, (chunks, mass) in enumerate(zip(out.selected, out.chunk_attention)):
            first = p * groups_per_period
            for g in range(first, min(first + groups_per_period, self.geometry.num_groups)):
                units += self.client.report_attention(prefix_id, g, chunks.numpy(), mass.numpy())
        return units

    # ------------------------------------------------------------ generation
    def generate(
        self,
        prefix_id: str,
        suffix_tokens,
        cfg: ReprefillConfig = ReprefillConfig(),
        max_new_tokens: int = 16,
        *,
        tokenizer=None,
        eos_token_ids=None,
        choose=None,
        forced=None,
    ):
        """Re-Prefill, then greedy decoding of up to ``max_new_tokens`` tokens (the first included).

        Each layer decodes over the prefix rows its Period loaded, the suffix
        and the tokens generated so far; decoding stops at an EOS id (the
        tokenizer's unless ``eos_token_ids`` is given).  Returns a
        ``GenerationResult``: tokens, text (with a tokenizer), the first
        token's TTFT, per-step seconds and the ``ReprefillResult``.
        ``forced`` (token ids): teacher forcing instead of greedy choice, so
        ``answer_margins`` says how firmly this KV gives that answer
        (``generation.answer_margins`` is the full KV's).
        """
        max_new_tokens = check_max_new_tokens(max_new_tokens)
        if cfg.reselect_every and choose is not None:
            raise InvalidArgument("reselect_every", "re-selecting while decoding uses the configured selector; it cannot follow choose=")
        margins: list[float] | None = None
        if forced is not None:
            forced_ids = _token_tensor(forced, field_name="forced")
            vocab = self.model.config.vocab_size
            if int(forced_ids.min()) < 0 or int(forced_ids.max()) >= vocab:
                raise InvalidArgument("forced", f"token ids must be in [0, {vocab}), got {int(forced_ids.min())}..{int(forced_ids.max())}")
            forced = forced_ids.tolist()
            if cfg.reselect_every:
                raise InvalidArgument("forced", "teacher forcing decodes over the rows the first token loaded; not with reselect_every")
            max_new_tokens, margins = check_max_new_tokens(len(forced)), []
        res = self.reprefill(prefix_id, suffix_tokens, cfg, choose=choose, keep_kv=True)
        attention_before = self.model.attention_s  # timed when a benchmark set it (Decoder.attention_s)
        s = _token_tensor(suffix_tokens, field_name="suffix_tokens").numel()
        kv = LayerKV(res.layer_kv, max_new_tokens)
        rows = [kv.rows(i) - s for i in range(len(kv))]
        stops, start = eos_ids(tokenizer, eos_token_ids), res.num_prefix_tokens + s
        kv_rows: list[int] = []
        if cfg.reselect_every:
            tokens, steps, stop, stats = self._decode_reselecting(res.prefix_id, res, cfg, kv, start, max_new_tokens, stops, kv_rows)
        else:
            decoded = decode_greedy(
                self.model,
                res.logits,
                kv,
                start,
                max_new_tokens,
                stops,
                res.row_masks or None,
                kv_rows=kv_rows,
                forced=forced,
                margins=margins,
            )
            (tokens, steps, stop), stats = decoded, None
        res.layer_kv = []
        text = None if tokenizer is None else tokenizer.decode(tokens, skip_special_tokens=True)
        density = float(np.mean(res.prefill_densities)) if res.prefill_densities else None
        gen = GenerationResult(
            tokens,
            res.ttft_s,
            steps,
            stop,
            res.logits,
            text,
            reprefill=res,
            rows_attended=rows,
            reselect=stats,
            step_kv_rows=kv_rows,
            prefill_density=density,
            answer_margins=margins,
        )
        if attention_before is not None:
            gen.decode_attention_s = self.model.attention_s - attention_before
        return gen

    def _decode_reselecting(self, prefix_id, res: ReprefillResult, cfg: ReprefillConfig, kv, start, max_new_tokens, stops, kv_rows):
        """``decode_reselecting`` over this request's loaded rows, re-selecting with the request's selector.

        With ``cfg.streaming`` the streaming heads see only the sink and
        recent rows of each new set, with ``cfg.per_head`` each KV head its
        own chunks, as at the first token.
        """
        geo, n = self.geometry, res.num_prefix_tokens
        m = geo.num_chunks(n)
        plan = self._plan(m, cfg)
        sets = [sorted(int(c) for c in chunks.tolist()) for chunks in res.selected]
        tokens = [[min(geo.chunk_tokens, n - c * geo.chunk_tokens) for c in chunks] for chunks in sets]
        working = WorkingSet.from_loaded(res.layer_kv, [(l0, k) for l0, k, _ in plan.periods], sets, tokens)
        selector = get_selector(cfg.selector, cfg.head_aggregation)
        head_sets = list(res.head_sets)  # per Period: each KV head's current chunks (per_head)
        period_of = {layer: p for p, (l0, k, _) in enumerate(plan.periods) for layer in range(l0, l0 + k)}

        def select(p, l0, q, count):
            sets_now: list[torch.Tensor] = []
            union = self._select(selector, prefix_id, q, l0, m, replace(cfg, budget=count), res, sets_now)
            head_sets[p] = sets_now
            return union

        def fetch(l0, layers, chunks):
            with self.client.read_chunks(prefix_id, sorted(chunks), layer_start=l0, layer_end=l0 + layers, shm=False) as read:
                rows: dict[int, dict[int, torch.Tensor]] = {}
                for g in read.groups:
                    for c in chunks:
                        ext = _as_torch(read.extent(g, c), geo)  # [layers in group, 2, Hkv, tokens, d]
                        if geo.streaming_heads:
                            ext = fill_tail(ext, geo, g, self._rows([c], n), *self._tails[prefix_id], self._tail_pair)
                        for i, layer in enumerate(geo.group_layer_range(g)):
                            rows.setdefault(layer, {})[c] = ext[i].clone()
                return rows, read.bytes_read, read.bytes_useful

        def row_mask(layer, chunks):
            return self._layer_mask(layer, chunks, n, cfg, head_sets[period_of[layer]])

        return decode_reselecting(
            self.model,
            res.logits,
            kv,
            periods=plan.periods,
            sets=sets,
            working=working,
            select=select,
            fetch=fetch,
            num_chunks=m,
            next_position=start,
            max_new_tokens=max_new_tokens,
            every=cfg.reselect_every,
            select_first=cfg.first_token_full,
            stop_ids=stops,
            row_mask=row_mask if cfg.streaming or cfg.per_head else None,
            kv_rows=kv_rows,
        )

    # ------------------------------------------------------------ baselines
    def full_recompute(self, prefix_tokens, suffix_tokens, *, progress=None) -> tuple[torch.Tensor, float]:
        """Logits of the first token by running prefix + suffix from scratch (no store); ``progress``: see store_prefix."""
        toks = torch.cat([_token_tensor(prefix_tokens), _token_tensor(suffix_tokens, field_name="suffix_tokens")])
        t0 = time.perf_counter()
        logits, _ = chunked_prefill(self.model, toks, progress=progress)
        return logits, time.perf_counter() - t0


def _token_tensor(tokens, field_name: str = "tokens") -> torch.Tensor:
    t = torch.as_tensor(np.asarray(tokens), dtype=torch.long).reshape(-1)
    if t.numel() == 0:
        raise InvalidArgument(field_name, "must not be empty")
    return t


def _check_probe_form(stored: StoreGeometry, cfg: ReprefillConfig) -> None:
    """A prefix storing quantized probe keys serves exact selection at its own width only."""
    if cfg.selector != "exact" or not stored.probe_bits or cfg.probe_bits == stored.probe_bits:
        return
    asked = f"{cfg.probe_bits}-bit" if cfg.probe_bits else "full-precision"
    raise InvalidArgument(
        "probe_bits",
        f"the prefix stores its probe keys quantized to {stored.probe_bits} bits, not the {asked} keys "
        f"probe_bits={cfg.probe_bits} scores with; ask with probe_bits={stored.probe_bits}",
    )


def _choosing(queries: torch.Tensor, cfg: ReprefillConfig) -> torch.Tensor:
    """The suffix queries ``[Hq, s, d]`` the first token's selection scores with (``cfg.select_queries``)."""
    return queries[:, -cfg.select_queries :] if cfg.select_queries else queries


def _as_torch(arr: np.ndarray, geo: StoreGeometry) -> torch.Tensor:
    return to_torch(np.ascontiguousarray(arr), geo.model.dtype)
