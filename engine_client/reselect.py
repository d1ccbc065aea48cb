"""Decoding with progressive re-selection: each Period chooses its chunks again from the generated tokens.

Re-Prefill chooses each Period's chunks from the question's queries, and plain
decoding (``generation.decode_greedy``) attends to those rows for every
generated token.  On real text the question finds the sentence that names what
is asked, and the first answer tokens; the tokens after them can lie in chunks
the question's queries ranked lower, and a Period that did not load them loses
the end of the answer.  Measured on SmolLM2-135M (README, NIAH at 2048 tokens):
every miss at 5% is a seven-digit value cut to its first six digits, with the
needle's chunks loaded by the retrieval layers but absent from layers 25-29.

``decode_reselecting`` re-selects as LoopServe does: every ``every`` generated
tokens, each Period scores the prefix's chunks with the queries of the last
``every`` generated tokens at its first layer (the same selector and chunk
count as the first token: scores from state the client keeps resident, the
4-bit probe keys or the key summaries), asks the daemon only for the chunks
its working set lacks (``ReadChunks`` for the Period's layers), and decodes
over the new set.  The token budget per step is the first token's: a set is
replaced, not grown.  Chunks fetched once stay in the request's working set,
so a chunk that leaves a set and comes back costs no second read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kvstore.contract import InvalidArgument

from .generation import LayerKV, attended_rows, grown_mask, hidden_count
from .model.decoder import Decoder

# select(period, first_layer, queries [Hq, t, d], chunk_count) -> chunk ids
SelectFn = Callable[[int, int, torch.Tensor, int], torch.Tensor]
# fetch(first_layer, num_layers, chunk ids) -> {layer: {chunk: rows [2, Hkv, tokens, d]}}, bytes read, bytes delivered
FetchFn = Callable[[int, int, list[int]], tuple[dict[int, dict[int, torch.Tensor]], int, int]]
# row_mask(layer, chunk ids ascending) -> [Hkv, rows of those chunks] per-KV-head visibility, or None (all visible)
MaskFn = Callable[[int, list[int]], torch.Tensor | None]


@dataclass
class ReselectStats:
    every: int = 0  # generated tokens between re-selections
    reselections: int = 0  # Period selections made while decoding
    sets_changed: int = 0  # of those, the ones that changed the Period's set
    chunks_swapped_in: int = 0  # chunks a new set holds that the Period's previous set did not
    chunks_fetched: int = 0  # (chunk, Period) pairs asked of the daemon: not in the working set yet
    bytes_read: int = 0  # from the daemon's disk for those, padding included
    bytes_fetched: int = 0  # extent bytes delivered for those
    working_set_bytes: int = 0  # prefix rows held at the end of decoding, all layers
    select_s: float = 0.0
    fetch_s: float = 0.0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class WorkingSet:
    """The prefix rows a request holds, per (layer, chunk): what a Period can attend to without a read."""

    def __init__(self):
        self._rows: dict[tuple[int, int], torch.Tensor] = {}

    def add(self, layer: int, chunk: int, rows: torch.Tensor) -> None:
        self._rows[(layer, chunk)] = rows

    def has(self, layer: int, chunk: int) -> bool:
        return (layer, chunk) in self._rows

    def rows(self, layer: int, chunks: Sequence[int]) -> torch.Tensor:
        """``[2, Hkv, tokens, d]``: the chunks' rows of ``layer`` in the order given."""
        return torch.cat([self._rows[(layer, int(c))] for c in chunks], dim=2)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._rows.values())

    @classmethod
    def from_loaded(cls, layer_kv: Sequence[torch.Tensor], periods, sets, chunk_tokens) -> WorkingSet:
        """Split each layer's loaded prefix rows (``layer_kv[l] [2, Hkv, rows + s, d]``) by chunk.

        ``periods``: ``(first layer, layers)`` per Period; ``sets[p]`` its
        chunks ascending, ``chunk_tokens[p]`` their token counts.
        """
        ws = cls()
        for (l0, layers), chunks, tokens in zip(periods, sets, chunk_tokens):
            for layer in range(l0, l0 + layers):
                parts = torch.split(layer_kv[layer][:, :, : sum(tokens)], list(tokens), dim=2)
                for c, part in zip(chunks, parts):
                    ws.add(layer, int(c), part)
        return ws


def check_every(every) -> int:
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise InvalidArgument("reselect_every", f"must be an int >= 0, got {every!r}")
    return every


@torch.inference_mode()
def decode_reselecting(
    model: Decoder,
    first_logits: torch.Tensor,
    kv: LayerKV,
    *,
    periods: Sequence[tuple[int, int, int]],
    sets: list[list[int]],
    working: WorkingSet,
    select: SelectFn,
    fetch: FetchFn,
    num_chunks: int,
    next_position: int,
    max_new_tokens: int,
    every: int,
    select_first: bool = False,
    stop_ids: frozenset[int] = frozenset(),
    row_mask: MaskFn | None = None,
    kv_rows: list[int] | None = None,
) -> tuple[list[int], list[float], str, ReselectStats]:
    """Greedy decoding like ``decode_greedy``, each Period re-selecting every ``every`` tokens.

    ``kv``: per layer, the Period's prefix rows (``sets[p]``'s chunks in that
    order) then the suffix; ``periods``: ``(first layer, layers, chunk count)``
    (a count equal to the prefix's chunks: loaded in full, never re-selected);
    ``sets`` is updated in place; ``num_chunks``: the prefix's.
    ``select_first``: also select at the first decoding step (the first
    token loaded more than the count, ``ReprefillConfig.first_token_full``).  ``row_mask``
    gives each layer's per-KV-head view of its set's rows (streaming heads,
    per-head sets), asked again at every re-selection; ``kv_rows`` receives each step's
    K/V rows read (``generation.attended_rows``).  Returns ``(tokens, step
    seconds, stop reason, stats)``.
    """
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    stats = ReselectStats(every=every)
    prefix_rows = [kv.rows(layer) for layer in range(model.num_layers)]
    for (l0, layers, _), chunks in zip(periods, sets):  # the suffix starts after the prefix rows
        rows = working.rows(l0, chunks).shape[2]
        for layer in range(l0, l0 + layers):
            prefix_rows[layer] = rows
    masks: list[torch.Tensor | None] = [None] * model.num_layers
    hidden_n = [0] * model.num_layers  # (row, head) pairs each mask hides

    def set_masks(l0: int, layers: int, chunks: list[int]) -> None:
        for layer in range(l0, l0 + layers):
            masks[layer] = row_mask(layer, chunks)
            hidden_n[layer] = hidden_count(masks[layer])

    if row_mask is not None:
        for (l0, layers, _), chunks in zip(periods, sets):
            set_masks(l0, layers, chunks)
    inputs: dict[int, list[torch.Tensor]] = {l0: [] for l0, _, _ in periods}  # each Period's first-layer inputs
    tokens, steps = [int(first_logits.argmax())], []
    while tokens[-1] not in stop_ids and len(tokens) < max_new_tokens:
        t0 = time.perf_counter()
        pos = next_position + len(tokens) - 1
        hidden = model.embed(torch.tensor([tokens[-1]]))  # [1, hidden]
        reselect = len(tokens) % every == 0 or (select_first and len(tokens) == 1)
        rows_read = 0
        for p, (l0, layers, count) in enumerate(periods):
            recent = inputs[l0]
            recent.append(hidden)
            del recent[:-every]
            if reselect and count < num_chunks:  # a Period loaded in full has nothing to choose
                _reselect(model, p, l0, layers, count, recent, pos, sets, kv, prefix_rows, working, select, fetch, stats)
                if row_mask is not None:  # asked at every re-selection: a head's own set can change under the same union
                    set_masks(l0, layers, sets[p])
            span = range(l0, l0 + layers)
            if kv_rows is not None:
                rows_read += attended_rows(kv, model.config.num_key_value_heads, hidden_n[l0 : l0 + layers], span)
            for layer in span:
                mask = grown_mask(masks, layer, kv.rows(layer))
                hidden, new_kv = model.layer_forward(layer, hidden, torch.tensor([pos]), kv.view(layer), mask)
                kv.append(layer, new_kv)
        tokens.append(int(model.final_logits(hidden).argmax()))
        steps.append(time.perf_counter() - t0)
        if kv_rows is not None:
            kv_rows.append(rows_read)
    stats.working_set_bytes = working.nbytes
    return tokens, steps, "eos" if tokens[-1] in stop_ids else "length", stats


def _reselect(model, p, l0, layers, count, recent, pos, sets, kv, prefix_rows, working, select, fetch, stats) -> None:
    """Choose Period ``p``'s set again; when it changed, ``kv`` holds the new set's rows."""
    t0 = time.perf_counter()
    t = len(recent)
    q = model.layer_queries(l0, torch.cat(recent), torch.arange(pos - t + 1, pos + 1))  # [Hq, t, d]
    new = sorted(int(c) for c in select(p, l0, q, count).tolist())
    stats.select_s += time.perf_counter() - t0
    stats.reselections += 1
    old = sets[p]
    if new == old:
        return
    stats.sets_changed += 1
    stats.chunks_swapped_in += len(set(new) - set(old))
    missing = [c for c in new if not working.has(l0, c)]
    if missing:
        t0 = time.perf_counter()
        rows, read, useful = fetch(l0, layers, missing)
        for layer in range(l0, l0 + layers):
            for c in missing:
                working.add(layer, c, rows[layer][c])
        stats.chunks_fetched += len(missing)
        stats.bytes_read += read
        stats.bytes_fetched += useful
        stats.fetch_s += time.perf_counter() - t0
    for layer in range(l0, l0 + layers):
        head = working.rows(layer, new)
        kv.replace_head(layer, prefix_rows[layer], head)
        prefix_rows[layer] = head.shape[2]
    sets[p] = new
