"""A Period's chunk set: gather what the selector scores from, score, keep the budget's best.

The selector declares its inputs (``Selector.needs``); ``PeriodSelection``
fetches exactly those from the resident state (probe keys, 4-bit and kept, or
full precision for this Period; key summaries) and never asks which selector
it runs.  Scores and the top-k stay on the model's device; the set goes to the
host only to be sent (``pipeline``).
"""

from __future__ import annotations

import torch

from ..selection import KEY_SUMMARIES, PROBE_KEYS, Budget, PeriodInputs, get_selector, select_chunks
from ..selection.heads import kv_head_scores
from .config import AUTO, ReprefillConfig
from .state import ResidentState


class PeriodSelection:
    """One request's selection, Period by Period (``cfg``'s selector over ``prefix_id``'s ``num_chunks`` chunks)."""

    def __init__(
        self,
        cfg: ReprefillConfig,
        state: ResidentState,
        prefix_id: str,
        num_chunks: int,
        streaming_heads,
        out,
        *,
        layers=None,
        follow_top=0,
    ):
        """``layers`` (``window.StoredLayers``): the model layers the stored groups hold (every one: None).
        ``follow_top``: what ``follow_top="auto"`` is for the runner's model (``ModelRunner.follow_top``)."""
        sel = cfg.selection
        self.stored = (lambda layer: layer) if layers is None else layers.stored
        self.cfg, self.state, self.prefix_id, self.m, self.out = cfg, state, prefix_id, num_chunks, out
        self.selector = get_selector(sel.selector, sel.head_aggregation)
        self.streaming_heads = streaming_heads if cfg.attention.streaming else None
        self.pick = dict(
            sink_chunks=sel.sink_chunks,
            local_chunks=sel.local_chunks,
            follow=sel.follow,
            follow_top=follow_top if sel.follow_top == AUTO else sel.follow_top,
            page_chunks=sel.page_chunks,
        )

    def loads_all(self, budget: Budget) -> bool:
        return self.selector.loads_all or budget.is_all or (budget.unit == "chunks" and budget.value == self.m)

    def inputs(self, q: torch.Tensor, l0: int) -> PeriodInputs:
        """What the selector scores from at the Period starting at layer ``l0`` (``q``: its queries ``[Hq, s, d]``)."""
        geo, cfg, needs = self.state.geometry, self.cfg, self.selector.needs
        inputs = PeriodInputs(q, chunk_tokens=geo.chunk_tokens, chunk_count=self.m)
        stored = self.stored(l0)  # the layer's index in the store geometry
        if PROBE_KEYS in needs:
            group, bits = stored // geo.group_layers, cfg.selection.probe_bits
            if bits:
                keys = self.state.probe(self.prefix_id, group, bits, self.out).dequantize(self.state.dtype)
            else:
                keys = self.state.full_probe(self.prefix_id, group, self.out)
            inputs = PeriodInputs(q, chunk_tokens=geo.chunk_tokens, probe_keys=keys, chunk_count=self.m)
        if KEY_SUMMARIES in needs:
            period = cfg.schedule.period_layers
            summ = self.state.summaries(self.prefix_id, period, self.out)
            inputs = PeriodInputs.from_store_summaries(q, summ, stored // period, chunk_tokens=geo.chunk_tokens, chunk_count=self.m)
        return inputs

    def warm(self, l0: int, budget: Budget) -> None:
        """Fetch what the Period at ``l0`` scores from where it is kept between requests (quantized probe
        keys, key summaries; full-precision probe keys are fetched per Period and not kept)."""
        if self.loads_all(budget):
            return
        geo, cfg, needs = self.state.geometry, self.cfg, self.selector.needs
        if PROBE_KEYS in needs and cfg.selection.probe_bits:
            self.state.probe(self.prefix_id, self.stored(l0) // geo.group_layers, cfg.selection.probe_bits, self.out)
        if KEY_SUMMARIES in needs:
            self.state.summaries(self.prefix_id, cfg.schedule.period_layers, self.out)

    def choose(self, q: torch.Tensor, l0: int, budget: Budget, head_sets: list | None = None) -> torch.Tensor:
        """Ascending chunk ids on the queries' device; with ``per_head`` the union of each KV head's set,
        the sets put in ``head_sets``."""
        if self.loads_all(budget):
            return torch.arange(self.m, device=q.device)
        inputs = self.inputs(q, l0)
        hkv = self.state.geometry.model.num_kv_heads
        if not self.cfg.selection.per_head:
            retrieval = [h for h in range(hkv) if not self._streams_whole_period(l0, h)]
            if self.selector.needs and 0 < len(retrieval) < hkv:  # streaming heads see sink + recent only: not scored
                inputs = inputs.of_kv_heads(retrieval, hkv)
            return select_chunks(self.selector.score(inputs), budget, **self.pick)
        scores = kv_head_scores(self.selector.head_scores(inputs), hkv)  # [Hkv, m]
        sink, local = self.pick["sink_chunks"], self.pick["local_chunks"]
        sets = []
        for h in range(scores.shape[0]):
            if self._streams_whole_period(l0, h):  # sees sink + recent only: the forced chunks
                sets.append(select_chunks(scores[h], sink + local, sink_chunks=sink, local_chunks=local))
            else:
                sets.append(select_chunks(scores[h], budget, **self.pick))
        if head_sets is not None:
            head_sets[:] = sets
        return torch.unique(torch.cat(sets))

    def _streams_whole_period(self, l0: int, head: int) -> bool:
        """KV head ``head`` is a streaming head in every layer of the Period at ``l0`` (with ``streaming``)."""
        if self.streaming_heads is None:
            return False
        num_layers = self.state.geometry.model.num_layers
        layers = range(l0, min(l0 + self.cfg.schedule.period_layers, num_layers))
        return all(self.streaming_heads.streaming[layer][head] for layer in layers)
