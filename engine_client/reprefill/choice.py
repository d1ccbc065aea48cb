"""One request, the cheapest path: recompute, load the whole prefix, or sparse Re-Prefill (``ModelRunner.answer``).

A serving engine hands the runner a request's prefix and suffix tokens and
a profile of its machine (``compute_model``: a named accelerator, or the
``file:`` profile ``kvstore-bench calibrate`` measured, which knows the disk
rate and the storage path's fixed cost per Period).  The runner looks the
prefix up (once: ``StoredPrefixes``); a prefix not wholly stored is recomputed (prefix and suffix in
one prefill) and its KV stored after the first token, and so is one whose chunks are stored but whose
tail pages (window tail, streaming layout) are not.  A stored prefix is
costed three ways by ``path_choice.choose`` (the request's shape: its
tokens, the stored bytes, the Periods of the configuration, the fraction
of chunks the budget loads, the per-request state the sparse path would
fetch when it is not resident) and run on the cheapest: ``full_recompute``,
``reprefill`` with every chunk (the ``full`` system), or ``reprefill`` with the
configuration.  ``Answer`` says which and why, with the prediction of every
path, beside the first token's logits and the measured time to them.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import torch
import xxhash

from kvstore.contract import InvalidArgument, NotFound
from kvstore.contract.geometry import quantized_row_bytes

from ..compute_model import AcceleratorProfile
from ..path_choice import Choice, RequestShape, choose
from ..prefill import chunked_prefill
from ..selection.budget import budget_count
from ..stream_tail import TailMissing, tail_bytes
from .checks import token_tensor
from .config import ReprefillConfig
from .device import wait
from .result import PrefixHandle, ReprefillResult
from .systems import parse_system


@dataclass
class Answer:
    path: str  # "recompute", "full-load" or "sparse"
    reason: str  # why this path ("the prefix is not stored", or the choice's comparison)
    logits: torch.Tensor  # [vocab] float32, the first token's
    ttft_s: float  # measured, from the call to the logits (a recompute's put of the prefix comes after)
    choice: Choice | None  # every path's prediction; None when the prefix was not stored
    reprefill: ReprefillResult | None  # the loading paths' result
    prefix: PrefixHandle | None  # a recomputed prefix, as stored after the first token


def request_shape(runner, num_tokens: int, suffix_tokens: int, prefix_id: str, cfg: ReprefillConfig) -> RequestShape:
    """What ``path_choice`` needs of this request on ``runner``'s layout."""
    cfg = runner.resolve(cfg)
    geo = runner.geometry
    num_chunks = geo.num_chunks(num_tokens)
    sel = cfg.selection
    loaded = budget_count(num_chunks, cfg.budget, sel.sink_chunks, sel.local_chunks)
    state = runner.state.prefix(prefix_id)
    resident = bool(state.probes or state.summaries)
    if resident:
        state_bytes = 0
    elif geo.probe_bits:  # each stored group's probe keys, as the daemon keeps them
        state_bytes = geo.num_groups * geo.model.num_kv_heads * num_tokens * quantized_row_bytes(geo.model.head_dim, geo.probe_bits)
    else:
        state_bytes = geo.num_groups * geo.model.num_kv_heads * num_tokens * geo.model.head_dim * geo.model.itemsize
    spec = runner.tail_spec()  # a window tail or the streaming heads' tail: fetched by either loading path
    tail = 0 if spec is None or state.tail is not None else tail_bytes(geo, spec[0], spec[1], spec[2])
    return RequestShape(
        prefix_tokens=num_tokens,
        suffix_tokens=suffix_tokens,
        kv_bytes=int(geo.kv_bytes(num_tokens)),
        num_periods=-(-len(runner.layers.layers) // cfg.schedule.period_layers),  # the stored layers' Periods
        budget=loaded / num_chunks,
        state_bytes=int(state_bytes),
        scored_rows=num_tokens,
        tail_bytes=int(tail),
    )


class StoredPrefixes:
    """The prefixes a runner found or made wholly stored, by their tokens: ``answer`` looks each up once.

    A look-up is a round trip carrying every token id (1-3 ms for 2k-16k tokens); where recompute takes
    12 ms it is most of what the choice adds.  A prefix known here is taken as stored; if a loading path
    then finds it gone (evicted, deleted), it is forgotten and the request looked up again.  Keyed by the
    tokens' digest with the runner's namespace and model fingerprint; at most ``limit`` kept, the oldest
    forgotten first.
    """

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._ids: dict[bytes, str] = {}

    @staticmethod
    def key(runner, tokens: torch.Tensor) -> bytes:
        h = xxhash.xxh3_128(tokens.numpy().astype(np.int64, copy=False).tobytes())
        h.update(f"\0{runner.namespace}\0{runner.model.fingerprint}".encode())
        return h.digest()

    def get(self, key: bytes) -> str | None:
        return self._ids.get(key)

    def add(self, key: bytes, prefix_id: str) -> None:
        self._ids.pop(key, None)
        self._ids[key] = prefix_id
        while len(self._ids) > self.limit:
            del self._ids[next(iter(self._ids))]

    def forget(self, key: bytes) -> None:
        self._ids.pop(key, None)


def answer(runner, prefix_tokens, suffix_tokens, cfg: ReprefillConfig, profile: AcceleratorProfile, *, store: bool = True) -> Answer:
    if not isinstance(profile, AcceleratorProfile):
        raise InvalidArgument(
            "profile", f"must be a compute_model.AcceleratorProfile (compute_model.parse_profile), got {type(profile).__name__}"
        )
    if not isinstance(cfg, ReprefillConfig):
        raise InvalidArgument("cfg", f"must be a ReprefillConfig, got {type(cfg).__name__}")
    t0 = time.perf_counter()
    prefix = token_tensor(prefix_tokens)
    suffix = token_tensor(suffix_tokens, field_name="suffix_tokens")
    known = runner.stored_prefixes
    key = known.key(runner, prefix)
    prefix_id = known.get(key)
    if prefix_id is not None:
        try:
            return _answer_stored(runner, prefix, suffix, prefix_id, cfg, profile, t0)
        except NotFound:  # gone since it was seen: look it up again
            known.forget(key)
    m = runner.geometry.num_chunks(prefix.numel())
    hit = runner.client.lookup(prefix.numpy(), runner.geometry, namespace=runner.namespace, model_fingerprint=runner.model.fingerprint)
    if hit.matched_chunks < m:
        return _recompute(runner, prefix, suffix, store, key, t0, f"the prefix is not stored ({hit.matched_chunks} of its {m} chunks are)")
    known.add(key, hit.prefix_id)
    try:
        return _answer_stored(runner, prefix, suffix, hit.prefix_id, cfg, profile, t0)
    except TailMissing:  # the window tail's or streaming heads' pages were evicted, or their put was cut short
        known.forget(key)
        return _recompute(runner, prefix, suffix, store, key, t0, "the prefix's tail pages are not stored (its chunks are)")


def _recompute(runner, prefix, suffix, store: bool, key: bytes, t0: float, why: str) -> Answer:
    """Prefix and suffix in one prefill; with ``store``, the prefix's KV stored after the first token
    (``store_prefix`` puts whatever of it is missing, a tail included)."""
    n = prefix.numel()
    logits, kv = chunked_prefill(runner.model, torch.cat([prefix, suffix]))
    ttft = time.perf_counter() - t0  # the KV's copy to the host has waited for the device
    handle = runner.store_prefix(prefix, kv=kv[:, :, :, :n].contiguous()) if store else None
    if handle is not None:
        runner.stored_prefixes.add(key, handle.prefix_id)
    return Answer("recompute", why, logits, ttft, None, None, handle)


def _answer_stored(runner, prefix, suffix, prefix_id: str, cfg, profile, t0: float) -> Answer:
    """A wholly stored prefix: the cheapest path, run and timed from ``t0``."""
    n = prefix.numel()
    shape = request_shape(runner, n, suffix.numel(), prefix_id, cfg)
    history = runner.path_history
    choice = choose(runner.model.config, profile, shape, history.ratios_for(profile, shape))
    if choice.path == "recompute":
        logits, _ = chunked_prefill(runner.model, torch.cat([prefix, suffix]), keep_kv=False)
        logits = wait(logits)  # the device's queue is in the TTFT
        ttft = time.perf_counter() - t0
        history.record(profile, "recompute", shape, choice.modelled["recompute"], ttft)
        return Answer("recompute", choice.reason, logits, ttft, choice, None, None)
    run_cfg = parse_system("full", warn=False) if choice.path == "full-load" else cfg
    if choice.path == "sparse" and choice.speculate is False and cfg.fetch.speculate:  # a Period's compute cannot hide a read here
        run_cfg = dataclasses.replace(cfg, fetch=dataclasses.replace(cfg.fetch, speculate=False))
    before = time.perf_counter() - t0  # the look-up and the choice
    res = runner.reprefill(prefix_id, suffix, run_cfg)
    # the first token is out at the reprefill's own TTFT: what it does after (attention mass to the daemon) is not in it
    history.record(profile, choice.path, shape, choice.modelled[choice.path], before + res.ttft_s)
    return Answer(choice.path, choice.reason, res.logits, before + res.ttft_s, choice, res, None)
