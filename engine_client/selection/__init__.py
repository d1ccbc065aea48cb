"""Chunk selection for Re-Prefill: which ContiguousChunks a Period loads.

Pure policies over torch tensors (no I/O).  A ``Selector`` scores the ``m``
chunks of a prefix from a ``PeriodInputs`` (queries of the period's first
layer plus probe keys or key summaries); ``select_chunks`` turns scores and
a budget into chunk ids, sink and local chunks always included.

    sel = get_selector("summary")
    ids = sel.select(PeriodInputs(q, key_min=kmin, key_max=kmax), budget=0.05)
"""

from __future__ import annotations

from kvstore.contract import InvalidArgument

from ._common import summaries_for_layer
from .base import KEY_SUMMARIES, PROBE_KEYS, PeriodInputs, Selector
from .baselines import FullSelector, RecencySelector
from .budget import Budget, budget_count, select_chunks
from .exact import ExactSelector, exact_chunk_scores, sum_per_chunk, token_attention_mass
from .heads import HEAD_AGGREGATIONS, aggregate_heads, check_aggregation, exact_head_chunk_scores, summary_head_chunk_scores
from .schedule import PeriodPlan, plan_periods, window_chunk_count
from .summary import SummarySelector, chunk_upper_bounds, summary_chunk_scores
from .tokens import (
    h2o_chunks,
    impress_blocks,
    impress_token_scores,
    partial_probe_scores,
    probe_subset,
    storage_order,
    token_budget,
    token_cap,
)

SELECTORS: dict[str, type[Selector]] = {cls.name: cls for cls in (ExactSelector, SummarySelector, FullSelector, RecencySelector)}


def get_selector(name: str, head_aggregation: str = "sum") -> Selector:
    """A new selector by its config name: one of ``SELECTORS`` ("exact", "summary", "full", "recent").

    ``head_aggregation`` ("sum" | "max", see ``heads``) applies to the scoring
    selectors (exact, summary); the others rank without heads.
    """
    check_aggregation(head_aggregation)
    try:
        cls = SELECTORS[name]
    except (KeyError, TypeError):
        raise InvalidArgument("selector", f"unknown selector {name!r}; known: {', '.join(sorted(SELECTORS))}") from None
    return cls(head_aggregation) if cls in (ExactSelector, SummarySelector) else cls()


__all__ = [
    "HEAD_AGGREGATIONS",
    "KEY_SUMMARIES",
    "PROBE_KEYS",
    "PeriodPlan",
    "aggregate_heads",
    "exact_head_chunk_scores",
    "plan_periods",
    "window_chunk_count",
    "summary_head_chunk_scores",
    "SELECTORS",
    "ExactSelector",
    "FullSelector",
    "PeriodInputs",
    "RecencySelector",
    "Selector",
    "SummarySelector",
    "Budget",
    "budget_count",
    "chunk_upper_bounds",
    "exact_chunk_scores",
    "get_selector",
    "h2o_chunks",
    "impress_blocks",
    "impress_token_scores",
    "partial_probe_scores",
    "probe_subset",
    "select_chunks",
    "sum_per_chunk",
    "summaries_for_layer",
    "summary_chunk_scores",
    "token_attention_mass",
    "storage_order",
    "token_budget",
    "token_cap",
]
