"""Greedy generation after the first token, over whatever KV the first token saw.

``decode_greedy`` continues from the first token's logits: each step feeds the
last token through every layer, attending to that layer's KV (the prefix rows
the first token attended to, the suffix, the tokens generated so far), and
appends the new token's KV.  It stops at an end-of-sequence id or after
``max_new_tokens`` tokens.

The paths that produce the first token and the KV:

* ``ModelRunner.generate`` (Re-Prefill): each layer's loaded prefix rows plus
  the suffix (decoding attends to the rows the layer's Period loaded);
* ``dense_generate`` (the full-KV reference): dense prefill of the prefix, the
  suffix over all its rows, then decoding - the same arithmetic as Re-Prefill
  at a 100% budget, so the two agree token for token;
* ``dense_generate(..., keep_rows=...)``: the same with only some prefix rows
  (e.g. every chunk but the needle's), in process;
* ``dense_generate(..., streaming=profile)``: the full KV for retrieval heads,
  the sink and recent rows only for the profile's streaming heads
  (``model.streaming``), at the first token and at every decoding step;
* ``dense_generate(..., sparse_prefill=alpha)``: the suffix's prefill
  through LoopServe's vertical and slash lines covering ``alpha`` of its
  last queries' attention, per layer and head (``sparse_prefill``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .model.decoder import Decoder
from .model.streaming import row_masks
from .prefill import chunked_prefill
from .sparse_prefill import pattern


@dataclass
class GenerationResult:
    tokens: list[int]  # generated ids, the first token included, EOS included if reached
    ttft_s: float  # until the first token's logits (prefill or Re-Prefill)
    step_s: list[float]  # each later token's decode step
    stop: str  # "eos" | "length"
    first_logits: torch.Tensor  # [vocab] float32
    text: str | None = None  # decoded ``tokens`` without special tokens, when a tokenizer was given
    reprefill: object | None = None  # the ReprefillResult of the Re-Prefill path (selected chunks, bytes, ...)
    rows_attended: list[int] = field(default_factory=list)  # per layer: prefix rows the first token attended to
    reselect: object | None = None  # ReselectStats when decoding re-selected (ReprefillConfig.reselect_every)
    prefill_density: float | None = None  # sparse_prefill: share of the suffix's causal attention cells computed
    # per decoding step: the K/V rows its attention read, summed over layers and KV heads
    # (prefix rows a head may see, the suffix, the tokens generated so far)
    step_kv_rows: list[int] = field(default_factory=list)
    decode_attention_s: float | None = None  # the decoding steps' attention kernels, when timed (Decoder.attention_s)
    answer_margins: list[float] | None = None  # teacher-forced (``forced``): each forced token's logit minus the best other's

    @property
    def total_s(self) -> float:
        return self.ttft_s + sum(self.step_s)


class LayerKV:
    """Per-layer KV ``[2, Hkv, rows, d]`` with room for ``extra`` appended tokens (layers may differ in rows)."""

    def __init__(self, kv: Sequence[torch.Tensor], extra: int):
        self._buf, self._len = [], []
        for t in kv:  # [2, Hkv, r, d]
            buf = t.new_empty(t.shape[0], t.shape[1], t.shape[2] + extra, t.shape[3])
            buf[:, :, : t.shape[2]] = t
            self._buf.append(buf)
            self._len.append(t.shape[2])

    def __len__(self) -> int:
        return len(self._buf)

    def rows(self, layer: int) -> int:
        return self._len[layer]

    def view(self, layer: int) -> torch.Tensor:
        return self._buf[layer][:, :, : self._len[layer]]  # [2, Hkv, rows, d]

    def append(self, layer: int, kv: torch.Tensor) -> None:
        """Add ``kv [2, Hkv, t, d]`` after the layer's rows."""
        n, t = self._len[layer], kv.shape[2]
        if n + t > self._buf[layer].shape[2]:
            raise ValueError(f"layer {layer}: no room for {t} more rows (capacity {self._buf[layer].shape[2]})")
        self._buf[layer][:, :, n : n + t] = kv
        self._len[layer] = n + t

    def replace_head(self, layer: int, old_rows: int, head: torch.Tensor) -> None:
        """Put ``head [2, Hkv, r, d]`` in place of the layer's first ``old_rows`` rows, keeping the rest and the spare room."""
        buf, n = self._buf[layer], self._len[layer]
        if not 0 <= old_rows <= n:
            raise ValueError(f"layer {layer}: old_rows {old_rows} outside [0, {n}]")
        tail, spare = buf[:, :, old_rows:n], buf.shape[2] - n
        new = buf.new_empty(buf.shape[0], buf.shape[1], head.shape[2] + tail.shape[2] + spare, buf.shape[3])
        new[:, :, : head.shape[2]] = head
        new[:, :, head.shape[2] : head.shape[2] + tail.shape[2]] = tail
        self._buf[layer], self._len[layer] = new, head.shape[2] + tail.shape[2]


def check_max_new_tokens(max_new_tokens) -> int:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    return int(max_new_tokens)


def eos_ids(tokenizer=None, eos_token_ids: Sequence[int] | None = None) -> frozenset[int]:
    """The ids that end generation: those given, else the tokenizer's EOS (none without either)."""
    if eos_token_ids is not None:
        return frozenset(int(i) for i in eos_token_ids)
    eos = getattr(tokenizer, "eos_token_id", None)
    return frozenset() if eos is None else frozenset([int(eos)])


@torch.inference_mode()
def decode_greedy(
    model: Decoder,
    first_logits: torch.Tensor,
    kv: LayerKV,
    next_position: int,
    max_new_tokens: int,
    stop_ids: frozenset[int] = frozenset(),
    row_masks: Sequence[torch.Tensor | None] | None = None,
    observe=None,
    kv_rows: list[int] | None = None,
    forced: Sequence[int] | None = None,
    margins: list[float] | None = None,
    row_positions: Sequence[torch.Tensor | None] | None = None,
) -> tuple[list[int], list[float], str]:
    """Greedy tokens from ``first_logits`` on; ``kv`` grows by one row per layer per step.

    ``next_position`` is the position of the first generated token (prefix +
    suffix length).  ``row_masks[layer] [Hkv, r]`` (or None) hides the first
    ``r`` rows of the layer per KV head; the rows after them stay visible.
    ``observe(layer, hidden, position, keys)``: called after each layer of
    each step (``prefill.prefill_with_attention`` says with what).
    ``kv_rows``: each step's K/V rows read (``attended_rows``) is appended.
    ``forced`` (teacher forcing): feed these tokens instead of the greedy ones,
    all of them and no more, and append to ``margins`` each one's logit minus
    the best other token's (``answer_margins`` over whatever KV ``kv`` holds).
    ``row_positions[layer] [rows]`` (or None): the positions of the layer's rows in ``kv`` as given
    (a sliding-window layer over a subset of the prefix); the rows each step appends follow from
    ``next_position``.  None: the rows are the positions right before each step's.
    Returns ``(tokens, step seconds, stop reason)``.
    """
    if len(kv) != model.num_layers:
        raise ValueError(f"kv has {len(kv)} layers, the model {model.num_layers}")
    if row_positions is not None:
        if len(row_positions) != model.num_layers:
            raise ValueError(f"row_positions has {len(row_positions)} layers, the model {model.num_layers}")
        for layer, at in enumerate(row_positions):
            if at is not None and tuple(at.shape) != (kv.rows(layer),):
                raise ValueError(f"row_positions[{layer}] must be [{kv.rows(layer)}], got {list(at.shape)}")
    if kv_rows is not None:
        hidden_rows = [hidden_count(None if row_masks is None else row_masks[layer]) for layer in range(model.num_layers)]
    if forced is not None:
        forced = [int(t) for t in forced]
        if not forced or margins is None:
            raise ValueError("forced needs at least one token and a margins list to fill")
        max_new_tokens, stop_ids = len(forced), frozenset()

    def pick(logits: torch.Tensor) -> int:
        if forced is None:
            return int(logits.argmax())
        token = forced[len(tokens)]
        margins.extend(_margins(logits[None], torch.tensor([token])))
        return token

    tokens: list[int] = []
    steps: list[float] = []
    tokens.append(pick(first_logits))
    while tokens[-1] not in stop_ids and len(tokens) < max_new_tokens:
        t0 = time.perf_counter()
        position = model.position_range(next_position + len(tokens) - 1, 1)  # checked on the host: no sync per layer
        hidden = model.embed(torch.tensor([tokens[-1]]))  # [1, hidden]
        if kv_rows is not None:
            kv_rows.append(attended_rows(kv, model.config.num_key_value_heads, hidden_rows))
        for layer in range(model.num_layers):
            layer_input = hidden
            at = None if row_positions is None else grown_positions(row_positions[layer], next_position, next_position + len(tokens) - 1)
            hidden, new_kv = model.layer_forward(
                layer, hidden, position, kv.view(layer), grown_mask(row_masks, layer, kv.rows(layer)), prefix_positions=at
            )
            kv.append(layer, new_kv)
            if observe is not None:
                observe(layer, layer_input, position.tensor, kv.view(layer)[0])
        tokens.append(pick(model.final_logits(hidden)))
        steps.append(time.perf_counter() - t0)
    return tokens, steps, "eos" if tokens[-1] in stop_ids else "length"


def _margins(logits: torch.Tensor, tokens: torch.Tensor) -> list[float]:
    """Per row of ``logits [k, vocab]``: the logit of ``tokens[i]`` minus the row's largest other logit."""
    picked = logits.gather(1, tokens[:, None])[:, 0]
    others = logits.scatter(1, tokens[:, None], float("-inf")).max(dim=1).values
    return (picked - others).tolist()


def hidden_count(mask: torch.Tensor | None) -> int:
    """(row, KV head) pairs a row mask hides."""
    return 0 if mask is None else int((~mask).sum())


def attended_rows(kv: LayerKV, kv_heads: int, hidden: Sequence[int], layers: Sequence[int] | None = None) -> int:
    """K/V rows the next token's attention reads, summed over ``layers`` (all) and KV heads.

    Each head reads the rows it may see and the row the token adds;
    ``hidden[i]`` counts the (row, head) pairs ``layers[i]``'s row mask hides.
    """
    layers = range(len(kv)) if layers is None else layers
    return sum(kv_heads * (kv.rows(layer) + 1) - h for layer, h in zip(layers, hidden, strict=True))


def grown_mask(row_masks, layer: int, rows: int) -> torch.Tensor | None:
    """``row_masks[layer]`` widened with visible columns to ``rows``."""
    mask = None if row_masks is None else row_masks[layer]
    if mask is None or mask.shape[1] == rows:
        return mask
    return torch.cat([mask, mask.new_ones(mask.shape[0], rows - mask.shape[1])], dim=1)


def grown_positions(positions: torch.Tensor | None, first: int, end: int) -> torch.Tensor | None:
    """``positions`` followed by the generated tokens' ``first .. end - 1`` (None stays None)."""
    if positions is None or end == first:
        return positions
    return torch.cat([positions, torch.arange(first, end, device=positions.device)])


def sliding_positions(model: Decoder, keep_rows: torch.Tensor | None, num_prefix: int, num_suffix: int) -> list | None:
    """Per layer, the positions of ``keep_rows`` then the suffix at a sliding-window layer (None elsewhere);
    None when every prefix row is kept or no layer slides (the rows then end right before the suffix)."""
    c = model.config
    if keep_rows is None or not c.sliding_layers:
        return None
    at = torch.cat([keep_rows.long(), torch.arange(num_prefix, num_prefix + num_suffix)])
    return [at if c.window_of(layer) is not None else None for layer in range(model.num_layers)]


@torch.inference_mode()
def suffix_over_prefix(
    model: Decoder,
    prefix_kv: torch.Tensor,
    num_prefix: int,
    suffix: torch.Tensor,
    keep_rows: torch.Tensor | None = None,
    row_masks: Sequence[torch.Tensor | None] | None = None,
    sparse_alpha: float | None = None,
    densities: list[float] | None = None,
    observe=None,
):
    """The suffix over prefix rows ``keep_rows`` (all if None) of ``prefix_kv [L, 2, Hkv, n, d]``.

    ``row_masks[layer] [Hkv, rows]``: per-KV-head visibility of those rows.
    ``sparse_alpha``: each layer's suffix attends through the lines covering
    that share of its last queries' attention (``sparse_prefill.pattern``);
    each layer's density is appended to ``densities``.
    ``observe``: as in ``decode_greedy`` (with the full prefix only).
    Returns ``(first logits [vocab], per-layer KV [2, Hkv, rows + s, d])``.
    """
    positions = torch.arange(num_prefix, num_prefix + suffix.numel())
    hidden = model.embed(suffix)
    layers = []
    for layer in range(model.num_layers):
        rows = prefix_kv[layer] if keep_rows is None else prefix_kv[layer].index_select(2, keep_rows)
        pattern_mask = None
        if sparse_alpha is not None:
            q = model.layer_queries(layer, hidden, positions)
            row_pos = torch.arange(num_prefix) if keep_rows is None else keep_rows
            keys = torch.cat([rows[0], model.layer_keys(layer, hidden, positions)], dim=1)
            pattern_mask, density = pattern(q, keys, positions, torch.cat([row_pos, positions]), sparse_alpha)
            if densities is not None:
                densities.append(density)
        mask = None if row_masks is None else row_masks[layer]
        layer_input = hidden
        at = keep_rows if keep_rows is not None and model.config.window_of(layer) is not None else None
        hidden, suffix_kv = model.layer_forward(layer, hidden, positions, rows, mask, pattern_mask, at)
        layers.append(torch.cat([rows, suffix_kv], dim=2))
        if observe is not None:
            observe(layer, layer_input, positions, layers[-1][0])
    return model.final_logits(hidden), layers


def dense_generate(
    model: Decoder,
    prefix_tokens,
    suffix_tokens,
    max_new_tokens: int = 16,
    *,
    tokenizer=None,
    eos_token_ids: Sequence[int] | None = None,
    keep_rows: torch.Tensor | None = None,
    prefix_kv: torch.Tensor | None = None,
    streaming=None,
    sparse_prefill: float | None = None,
    observe=None,
) -> GenerationResult:
    """Full-KV reference: prefill the prefix, run the suffix over its rows (``keep_rows``: only those), decode.

    ``prefix_kv [L, 2, Hkv, n, d]`` skips the prefill when the caller has it.
    ``streaming`` (a ``model.streaming.StreamingHeads``): its streaming heads
    see only the sink and recent prefix rows.  ``sparse_prefill`` (alpha in
    (0, 1]): the suffix's prefill through LoopServe's lines (``sparse_prefill``).
    ``observe`` (e.g. ``krul.AttentionEstimator.observe``) sees every layer of
    the prefill, the suffix and each decoding step; with the full KV only.
    """
    max_new_tokens = check_max_new_tokens(max_new_tokens)
    if observe is not None and (keep_rows is not None or streaming is not None or sparse_prefill is not None):
        raise ValueError("observe sees dense attention over the full KV: not with keep_rows, streaming or sparse_prefill")
    prefix = torch.as_tensor(np.asarray(prefix_tokens), dtype=torch.long).reshape(-1)
    suffix = torch.as_tensor(np.asarray(suffix_tokens), dtype=torch.long).reshape(-1)
    if prefix.numel() == 0 or suffix.numel() == 0:
        raise ValueError("prefix_tokens and suffix_tokens must not be empty")
    t0 = time.perf_counter()
    if prefix_kv is None:
        _, prefix_kv = chunked_prefill(model, prefix, observe=observe)
    positions = torch.arange(prefix.numel()) if keep_rows is None else keep_rows
    masks = row_masks(streaming, [positions] * model.num_layers, prefix.numel())
    densities: list[float] = []
    logits, layers = suffix_over_prefix(model, prefix_kv, prefix.numel(), suffix, keep_rows, masks, sparse_prefill, densities, observe)
    ttft = time.perf_counter() - t0
    kv = LayerKV(layers, max_new_tokens)
    rows = [kv.rows(i) - suffix.numel() for i in range(len(kv))]
    kv_rows: list[int] = []
    tokens, steps, stop = decode_greedy(
        model,
        logits,
        kv,
        prefix.numel() + suffix.numel(),
        max_new_tokens,
        eos_ids(tokenizer, eos_token_ids),
        masks,
        observe,
        kv_rows,
        row_positions=sliding_positions(model, keep_rows, prefix.numel(), suffix.numel()),
    )
    density = sum(densities) / len(densities) if densities else None
    return GenerationResult(
        tokens, ttft, steps, stop, logits, _text(tokenizer, tokens), rows_attended=rows, prefill_density=density, step_kv_rows=kv_rows
    )


def _text(tokenizer, tokens: list[int]) -> str | None:
    return None if tokenizer is None else tokenizer.decode(tokens, skip_special_tokens=True)


@torch.inference_mode()
def answer_margins(model: Decoder, prefix_kv: torch.Tensor, suffix_tokens, answer_tokens) -> list[float]:
    """How firmly the full KV gives an answer: per answer token, teacher-forced, its logit minus the
    best other token's.

    ``prefix_kv [L, 2, Hkv, n, d]``; the suffix then the answer's tokens run over it, and position
    ``len(suffix) - 1 + i`` predicts ``answer_tokens[i]``.  A margin below 0 means greedy decoding
    would not produce that token; a small positive one is a close call that any change to the KV
    (fewer rows, fewer bits) can tip.
    """
    suffix = torch.as_tensor(np.asarray(suffix_tokens), dtype=torch.long).reshape(-1)
    answer = torch.as_tensor(np.asarray(answer_tokens), dtype=torch.long).reshape(-1)
    if suffix.numel() == 0 or answer.numel() == 0:
        raise ValueError("suffix_tokens and answer_tokens must not be empty")
    tokens = torch.cat([suffix, answer[:-1]])
    n = prefix_kv.shape[3]
    positions = torch.arange(n, n + tokens.numel())
    hidden = model.embed(tokens)
    for layer in range(model.num_layers):
        hidden, _ = model.layer_forward(layer, hidden, positions, prefix_kv[layer])
    return _margins(model.position_logits(hidden)[suffix.numel() - 1 :], answer)  # [answer, vocab] rows
