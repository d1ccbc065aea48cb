"""The worker's model runner: prefill into kvstore, sparse Re-Prefill from it.

``store_prefix`` runs the prefix once and puts its KV (period-major extents;
the daemon derives key summaries and probe keys) unless the daemon already
has it.  ``reprefill`` answers a new suffix over a stored prefix: the request
is checked (``checks``), planned (``selection.plan_periods``) and run Period by
Period (``pipeline``); ``generate`` decodes after it (``decode``); ``answer`` takes a request's
cheapest path (recompute, whole load or sparse) for a machine's profile
(``choice``).  What the runner keeps between requests is per prefix, in
``state``.

By default a runner stores 1-layer groups with probe keys at the width
``ReprefillConfig()`` reads (every layer its own set, from resident keys of
4 bits, or the model's selection profile's width: 8 on Gemma 3).
Everything it keeps and computes is on the model's device.

A model with sliding-window layers (Gemma 3) is stored, by default, in the
window-tail layout (``window``): extents hold its global layers only, and
each sliding layer's last window is kept per prefix as pages, fetched once
and kept; a sliding layer's Period computes on those rows, whatever the
budget, with no selection, read, stand-in rows or attention report.  With
``window_tail=False`` every layer is stored whole, and a sliding Period loads
the last chunks its window still sees (``selection.window_chunk_count``).
The global layers' Periods select as usual.  Periods must not mix the two
kinds.

Why one file of ~410 lines: it is the worker's one public object, each
entry point a few lines that check and resolve a request and hand it to the
module that runs it (``pipeline``, ``decode``, ``choice``, ``state``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import torch

from kvstore.contract import InvalidArgument
from kvstore.contract.geometry import ModelSpec, StoreGeometry

from ..client import KVStoreClient, as_numpy_kv
from ..model.decoder import Decoder
from ..model.selection_profile import calibrated_probe_bits, packaged_selection
from ..model.standins import packaged_standins
from ..path_choice import PathHistory
from ..prefill import chunked_prefill
from ..selection import Budget, PeriodPlan, plan_periods, window_chunk_count
from ..stream_tail import has_tail, left_out_heads, put_tail, tail_pairs
from . import choice, decode, pipeline
from .checks import Layers, check_prefix, check_runner, describe, resolve_layers, resolve_selection, token_tensor
from .config import AUTO, CALIBRATED, ReprefillConfig
from .device import resolve_device, wait
from .result import PrefixHandle, ReprefillResult
from .staging import PinnedStaging
from .state import DEFAULT_STATE_LIMIT, ResidentState, summary_bytes
from .window import StoredLayers, stored_layers

log = logging.getLogger(__name__)

_TORCH_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
DEFAULT_CONFIG = ReprefillConfig()


def window_periods(config, period_layers: int) -> tuple[int, ...]:
    """First layers of the Periods of sliding-window layers (a sliding layer's Period loads its window, whatever
    the budget); InvalidArgument for a Period mixing sliding and global layers."""
    if not config.sliding_layers:
        return ()
    firsts = []
    for first in range(0, config.num_hidden_layers, period_layers):
        kinds = {config.window_of(layer) is not None for layer in range(first, min(first + period_layers, config.num_hidden_layers))}
        if len(kinds) > 1:
            raise InvalidArgument(
                "period_layers",
                f"{period_layers}-layer Periods mix sliding-window and global layers (layers {first}..); use period_layers=1",
            )
        if kinds == {True}:
            firsts.append(first)
    return tuple(firsts)


def model_geometry(
    model: Decoder,
    *,
    chunk_tokens: int = 16,
    group_layers: int = 4,
    probe_bits: int = 0,
    kv_quant: str = "",
    streaming_heads=None,
    layers: StoredLayers | None = None,
) -> StoreGeometry:
    """The store geometry of a model's KV: stored groups of ``group_layers`` (the SubPeriod),
    probe keys in the KV dtype or, with ``probe_bits`` 4 or 8, quantized by the daemon;
    ``kv_quant`` ("kv8", "kv4", ...): the KV itself stored quantized (``kvstore.contract.kvquant``);
    ``streaming_heads`` (``model.streaming.StreamingHeads``): extents without those heads' rows
    (``StoreGeometry.streaming_heads``, their sink and recent rows kept by ``stream_tail``);
    ``layers`` (``window.StoredLayers``): the model layers the extents hold, every one by default."""
    c = model.config
    num_layers = c.num_hidden_layers if layers is None else len(layers.layers)
    spec = ModelSpec(num_layers, c.num_key_value_heads, c.head_dim, _TORCH_DTYPES[model.dtype])
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
        group_layers: int = 1,
        probe_bits: int | str = AUTO,
        streaming_heads=None,
        standin_layers="shipped",
        selection_profile="shipped",
        kv_quant: str = "",
        streaming_layout: bool = False,
        window_tail: bool | None = None,
        device=None,
        state_limit_bytes: int | None = DEFAULT_STATE_LIMIT,
    ):
        """``group_layers``: the layers of a stored group (1: every layer can select its own chunks, what
        ``ReprefillConfig()`` does).  ``probe_bits`` 4 or 8: the prefixes this runner stores keep their probe
        keys quantized (``StoreGeometry.probe_bits``), what ``SelectionConfig.probe_bits`` of the same width
        reads (0: in the KV dtype, which exact selection at any width can read); "auto" (the default): the
        model's calibrated width (``selection_profile``), 4 without one, what ``probe_bits="auto"`` asks for.
        ``kv_quant``: the prefixes it stores hold their KV quantized (``StoreGeometry.kv_quant``); every
        read dequantizes to the model's dtype.
        ``streaming_heads`` (``model.streaming.StreamingHeads``): what ``AttentionConfig.streaming`` uses.
        ``standin_layers`` (``model.standins.StandinLayers``): the calibrated layers "auto" and "calibrated" read;
        by default ("shipped") the calibration the package ships for this model (matched by fingerprint), if any;
        None: none.
        ``selection_profile`` (``model.selection_profile.SelectionProfile``): what ``follow_top``,
        ``probe_bits`` and ``local_chunks`` "auto" read; by default ("shipped") the profile the package ships
        for this model, if any; None: none.
        ``streaming_layout``: the prefixes it stores keep only the sink and recent rows of the streaming
        heads (LServe's second layout, ``stream_tail``); they serve streaming requests only.
        ``window_tail``: on a model with sliding-window layers, store its global layers as extents and each
        sliding layer's last window per prefix (``window``); None (the default): whenever the model has
        sliding layers and no streaming layout is asked for; False: every layer stored whole.
        ``device``: where the runner computes and keeps its state; the model's (its weights') by default,
        and it must be the model's when given.
        ``state_limit_bytes``: what the per-prefix state kept between requests may take (``state``: the
        prefixes used least recently are dropped past it and fetched again when asked for); None: no limit."""
        self.model = model
        self.device = resolve_device(model.device, device)
        self.streaming_heads = streaming_heads
        # the calibrated layers "auto" and "calibrated" read: by default those shipped for this model, if any
        self.standin_profile = packaged_standins(model) if standin_layers == "shipped" else standin_layers
        self.selection_profile = packaged_selection(model) if selection_profile == "shipped" else selection_profile
        # stored at the width a request's "auto" reads, so that the default request reads the keys as stored
        probe_bits = calibrated_probe_bits(model, self.selection_profile) if probe_bits == AUTO else probe_bits
        self.client = client
        self.namespace = namespace
        if streaming_layout and streaming_heads is None:
            raise InvalidArgument("streaming_layout", "needs the model's streaming heads (streaming_heads=...)")
        if window_tail is None:
            window_tail = bool(model.config.sliding_layers) and not streaming_layout
        elif window_tail and streaming_layout:
            raise InvalidArgument("window_tail", "the window-tail layout and the streaming layout cannot be combined")
        self.layers = stored_layers(model.config, window_tail=window_tail, group_layers=group_layers)
        self.window = self.layers.tail  # the sliding layers' tail (window-tail layout), or None
        self.geometry = model_geometry(
            model,
            chunk_tokens=chunk_tokens,
            group_layers=group_layers,
            probe_bits=probe_bits,
            kv_quant=kv_quant,
            streaming_heads=streaming_heads if streaming_layout else None,
            layers=self.layers,
        )
        self.state = ResidentState(client, self.geometry, self.device, model.dtype, self._page_scope(), state_limit_bytes)
        # on CUDA, delivered rows are gathered into pinned buffers and copied on their own stream (staging.py);
        # None: gathered into host arrays and copied at the pageable rate
        self.staging = PinnedStaging(self.device) if self.device.type == "cuda" else None
        self.path_history = PathHistory()  # ``answer``: each path's measured time against its prediction
        self.stored_prefixes = choice.StoredPrefixes()  # ``answer``: prefixes known stored, not looked up again
        self.tail_pairs = {pair: i for i, pair in enumerate(self.tail_spec()[2] if self.tail_spec() else [])}
        self._said_no_standins = False

    # ------------------------------------------------------------ prefill
    def store_prefix(self, tokens, *, progress=None, kv: torch.Tensor | None = None) -> PrefixHandle:
        """Prefill ``tokens`` and store their KV, unless the daemon has them already.

        ``progress(iterable, desc, total=, unit=)`` wraps the prefill's
        block x layer steps (a bar, see kvstore.progress); None: no bar.
        ``kv [layers, 2, kv_heads, n, head_dim]``: the tokens' KV from this
        model's prefill when the caller has it (stored as given, no prefill).
        """
        toks = token_tensor(tokens)
        if kv is not None:
            c = self.model.config
            want = (self.model.num_layers, 2, c.num_key_value_heads, toks.numel(), c.head_dim)
            if tuple(kv.shape) != want or kv.dtype != self.model.dtype:
                raise InvalidArgument("kv", f"must be {self.model.dtype} {list(want)} for these tokens, got {kv.dtype} {list(kv.shape)}")
        m = self.geometry.num_chunks(toks.numel())
        hit = self.client.lookup(toks.numpy(), self.geometry, namespace=self.namespace, model_fingerprint=self.model.fingerprint)
        if hit.matched_chunks == m and (self.tail_spec() is None or self._has_tail(hit.prefix_id)):
            return PrefixHandle(hit.prefix_id, toks.numel(), m, cache_hit=True)
        t0 = time.perf_counter()
        if kv is None:
            _, kv = chunked_prefill(self.model, toks, progress=progress)  # [layers, 2, kv_heads, n, head_dim]
        arr = as_numpy_kv(kv)  # to the host: the put is an RPC
        stored = arr if self.window is None else arr[list(self.layers.layers)]  # the window tail: global layers as extents
        res = self.client.put_prefix(
            toks.numpy(), stored, self.geometry, namespace=self.namespace, model_fingerprint=self.model.fingerprint
        )
        written, batch = res.bytes_written, ""
        spec = self.tail_spec()
        if spec is not None:  # after the prefix: a put cut short between the two is healed by the next store
            sink, recent, pairs = spec
            tail = put_tail(self.client, res.prefix_id, arr, self.geometry, sink, recent, pairs=pairs, **self._page_scope())
            written, batch = written + tail.bytes_written, tail.batch_id
        return PrefixHandle(res.prefix_id, toks.numel(), m, False, written, time.perf_counter() - t0, batch)

    def _page_scope(self) -> dict:
        return {"namespace": self.namespace, "model_fingerprint": self.model.fingerprint}

    def tail_spec(self) -> tuple[int, int, list] | None:
        """(sink tokens, recent tokens, pairs) of the tail pages this runner's prefixes keep, or None."""
        if self.window is not None:
            return self.window.sink_tokens, self.window.recent_tokens, list(self.window.pairs)
        if self.geometry.streaming_heads:
            sh = self.streaming_heads
            return sh.sink_tokens, sh.recent_tokens, tail_pairs(self.geometry)
        return None

    def _has_tail(self, prefix_id: str) -> bool:
        sink, recent, pairs = self.tail_spec()
        return has_tail(self.client, prefix_id, self.geometry, sink, recent, pairs=pairs, **self._page_scope())

    def tail(self, prefix_id: str, num_tokens: int, out) -> tuple[torch.Tensor, torch.Tensor]:
        """The prefix's tail (streaming layout or window tail): positions on the host and rows
        ``[pairs, 2, t, d]`` on the device, fetched once and kept (``state``)."""
        return self.state.tail(prefix_id, num_tokens, self.tail_spec(), out)

    # ------------------------------------------------------------ re-prefill
    def check_request(self, prefix_id: str, suffix_tokens, cfg: ReprefillConfig):
        """Validate everything before any work; returns (description, suffix tensor, resolved layers)."""
        cfg = self.resolve(cfg)
        check_runner(cfg, self.geometry, self.streaming_heads)
        layers = self.calibrated_layers(cfg)
        suffix = token_tensor(suffix_tokens, field_name="suffix_tokens")
        desc = describe(self.client, prefix_id)
        self.plan(desc.num_chunks, cfg, cfg.budget, layers, num_tokens=desc.num_tokens)  # refuses a full_layers the budget cannot pay for
        check_prefix(desc, cfg, self.geometry, self.model, suffix)
        self.state.prefix(desc.prefix_id).stored_probe_bits = desc.geometry.probe_bits
        return desc, suffix, layers

    def calibrated_layers(self, cfg: ReprefillConfig) -> Layers:
        """The request's stand-in and whole layers for this runner (``checks.resolve_layers``); says once
        when "auto" stand-ins find no calibration file."""
        layers = resolve_layers(cfg, self.standin_profile, self.model.num_layers, self.geometry.group_layers)
        sliding = set(self.model.config.sliding_layers)
        if sliding and cfg.attention.standin_layers in (AUTO, CALIBRATED) and set(layers.standins) & sliding:
            layers = replace(layers, standins=tuple(x for x in layers.standins if x not in sliding))
        for name, chosen in (("standin_layers", layers.standins), ("whole_layers", layers.whole)):
            if set(chosen) & sliding:
                raise InvalidArgument(name, f"layers {sorted(set(chosen) & sliding)} slide: they load their window's chunks only")
        if layers.missing_calibration and not self._said_no_standins:
            self._said_no_standins = True
            log.warning(
                "no calibrated stand-in layers for this model (python -m kvstore_tools.models calibrate-standins NAME): "
                "Re-Prefill runs without stand-in rows"
            )
        return layers

    def resolve(self, cfg: ReprefillConfig) -> ReprefillConfig:
        """``cfg`` with its "auto" probe-key width and local chunks this runner's model's
        (``checks.resolve_selection``); every entry point resolves its request first."""
        return resolve_selection(cfg, self.selection_profile)

    def follow_top(self, cfg: ReprefillConfig) -> int:
        """The request's ``follow_top`` for this runner: "auto" is the model's selection profile's, 0 without one."""
        top = cfg.selection.follow_top
        if top != AUTO:
            return top
        return 0 if self.selection_profile is None else self.selection_profile.follow_top

    def plan(
        self, num_chunks: int, cfg: ReprefillConfig, budget: Budget, layers: Layers | None = None, *, num_tokens: int | None = None
    ) -> PeriodPlan:
        """The request's Periods and the chunks each loads (``selection.schedule.plan_periods``);
        ``num_tokens`` (the prefix's) places the sliding layers' windows, on a model that has them."""
        cfg = self.resolve(cfg)
        layers = self.calibrated_layers(cfg) if layers is None else layers
        sel = cfg.selection
        window = window_periods(self.model.config, cfg.schedule.period_layers)
        if window and num_tokens is None:
            raise ValueError("plan: a model with sliding-window layers needs num_tokens")
        window_chunks = window_chunk_count(num_tokens, self.model.config.sliding_window, self.geometry.chunk_tokens) if window else 0
        return plan_periods(
            self.model.num_layers,
            num_chunks,
            budget,
            period_layers=cfg.schedule.period_layers,
            full_layers=cfg.schedule.full_layers,
            whole_layers=layers.whole,
            sink_chunks=sel.sink_chunks,
            local_chunks=sel.local_chunks,
            window_layers=window,
            window_chunks=window_chunks,
        )

    def reprefill(
        self, prefix_id: str, suffix_tokens, cfg: ReprefillConfig = DEFAULT_CONFIG, *, choose=None, keep_kv: bool = False
    ) -> ReprefillResult:
        """First-token logits of ``suffix_tokens`` after the stored prefix, loading only selected chunks.

        ``choose(period, first_layer, queries, num_chunks) -> chunk ids`` replaces
        the configured selection (the baselines' token-level selections).
        ``keep_kv`` keeps each layer's loaded rows and suffix KV in ``layer_kv``
        (what ``generate`` decodes over).
        """
        t_start = time.perf_counter()  # TTFT counts the request's checks (a Describe) and its plan
        cfg = self.resolve(cfg)
        desc, suffix, layers = self.check_request(prefix_id, suffix_tokens, cfg)
        budget = Budget.fraction(1.0) if cfg.decode.first_token_full else cfg.budget  # the budget is then the decoding steps'
        plan = self.plan(desc.num_chunks, cfg, budget, layers, num_tokens=desc.num_tokens)
        request = pipeline.Request(self, desc, suffix, cfg, budget, plan, layers, choose=choose, keep_kv=keep_kv, t_start=t_start)
        return pipeline.run(request)

    def answer(self, prefix_tokens, suffix_tokens, cfg: ReprefillConfig = DEFAULT_CONFIG, *, profile, store: bool = True) -> choice.Answer:
        """The first token of a request on its cheapest path for this machine (``choice``): recompute, load the
        whole stored prefix, or sparse Re-Prefill with ``cfg``; a prefix not stored is recomputed and, with
        ``store``, its KV stored after the first token.  ``profile``: ``compute_model.parse_profile(...)`` (a
        named accelerator, or ``file:PATH`` from ``kvstore-bench calibrate``, which costs the loading paths)."""
        return choice.answer(self, prefix_tokens, suffix_tokens, self.resolve(cfg), profile, store=store)

    # ------------------------------------------------------------ generation
    def generate(
        self,
        prefix_id: str,
        suffix_tokens,
        cfg: ReprefillConfig = DEFAULT_CONFIG,
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
        return decode.generate(
            self,
            prefix_id,
            suffix_tokens,
            self.resolve(cfg),
            max_new_tokens,
            tokenizer=tokenizer,
            eos_token_ids=eos_token_ids,
            choose=choose,
            forced=forced,
        )

    # ------------------------------------------------------------ resident state
    def warm(self, prefix_id: str, cfg: ReprefillConfig = DEFAULT_CONFIG) -> int:
        """Fetch and keep the per-prefix state a Re-Prefill of ``prefix_id`` under ``cfg`` reads (each Period's
        probe keys or key summaries, the stand-in layers' value sums, a tail), so that its first request
        fetches none: for a worker about to serve a stored prefix it did not store.  The bytes fetched
        (0 when all of it was resident)."""
        cfg = self.resolve(cfg)
        check_runner(cfg, self.geometry, self.streaming_heads)
        layers = self.calibrated_layers(cfg)
        desc = describe(self.client, prefix_id)
        plan = self.plan(desc.num_chunks, cfg, cfg.budget, layers, num_tokens=desc.num_tokens)
        return pipeline.warm(self, desc, cfg, plan, layers)

    def summaries(self, prefix_id: str, period_layers: int, out: ReprefillResult | None = None) -> torch.Tensor:
        """Key summaries of each Period's first layer, ``[chunks, periods, kv_heads, 2, head_dim]``, kept resident."""
        return self.state.summaries(prefix_id, period_layers, out)

    def forget(self, prefix_id: str) -> None:
        """Drop the client state kept for ``prefix_id``; the stored prefix stays, and a later request fetches it again."""
        self.state.forget(prefix_id)

    def resident_bytes(self) -> int:
        """Bytes of client state kept between requests (key summaries, quantized probe keys, value sums, tails)."""
        return self.state.nbytes

    summary_bytes = staticmethod(summary_bytes)

    # ------------------------------------------------------------ baselines
    def full_recompute(self, prefix_tokens, suffix_tokens, *, progress=None) -> tuple[torch.Tensor, float]:
        """Logits of the first token by running prefix + suffix from scratch (no store); ``progress``: see store_prefix."""
        toks = torch.cat([token_tensor(prefix_tokens), token_tensor(suffix_tokens, field_name="suffix_tokens")])
        t0 = time.perf_counter()
        logits, _ = chunked_prefill(self.model, toks, progress=progress, keep_kv=False)
        return wait(logits), time.perf_counter() - t0
