"""Summary chunk scores: the LServe/Quest min/max bound on stored key summaries.

For query ``q`` and a chunk whose keys have channel-wise ``kmin``/``kmax``,
``sum_i max(q_i*kmax_i, q_i*kmin_i) >= max_{t in chunk} q . k_t``.  Since
``kmin <= kmax`` this is ``relu(q) . kmax + min(q, 0) . kmin``: two matmuls,
no ``[.., m, d]`` intermediate.

Aggregation (``summary_chunk_scores``): per (query head, query), softmax over
the ``m`` chunks of ``bound / sqrt(d)``, then summed over heads and queries.
It mirrors the exact score (softmax mass per (head, query), summed), with
each chunk's best logit standing in for the logsumexp of its tokens, so the
two rank alike; each (head, query) contributes one unit of mass, so a head
with large logits cannot outvote the others, and the scores sum to
``Hq * s`` like the exact ones.  Chunk lengths are not known from the
summaries, so a short last chunk is not penalised (it is the local chunk,
kept anyway).
"""

from __future__ import annotations

import math

import torch

from kvstore.contract import InvalidArgument

from ._common import DEFAULT_BLOCK_ELEMS, check_queries, group_queries, row_blocks
from .base import KEY_SUMMARIES, PeriodInputs, Selector
from .heads import aggregate_heads, check_aggregation, summary_head_chunk_scores


def _check_inputs(queries: torch.Tensor, key_min: torch.Tensor, key_max: torch.Tensor) -> None:
    if key_min.dim() != 3 or key_min.shape != key_max.shape or key_min.shape[0] < 1:
        shapes = f"key_min {tuple(key_min.shape)} and key_max {tuple(key_max.shape)}"
        raise InvalidArgument("key_min", f"{shapes} must both be [chunks >= 1, kv_heads, head_dim]")
    check_queries(queries, key_min.shape[1], key_min.shape[2])


def _bound_blocks(queries: torch.Tensor, key_min: torch.Tensor, key_max: torch.Tensor, max_block_elems: int):
    """Yield bound blocks ``[Hkv, rows in block, m]`` float32 (inputs already checked)."""
    m, num_kv_heads, _ = key_min.shape
    rows = group_queries(queries, num_kv_heads)  # [Hkv, g*s, d]
    kmin_t = key_min.to(rows.device, torch.float32).permute(1, 2, 0)  # [Hkv, d, m], on the queries' device
    kmax_t = key_max.to(rows.device, torch.float32).permute(1, 2, 0)  # [Hkv, d, m]
    for block in row_blocks(rows.shape[1], num_kv_heads * m, max_block_elems):
        q = rows[:, block]  # [Hkv, rows in block, d]
        bound = torch.matmul(q.clamp(min=0), kmax_t) + torch.matmul(q.clamp(max=0), kmin_t)
        yield bound


def chunk_upper_bounds(
    queries: torch.Tensor, key_min: torch.Tensor, key_max: torch.Tensor, *, max_block_elems: int = DEFAULT_BLOCK_ELEMS
) -> torch.Tensor:
    """Raw bound ``[Hq, s, m]`` float32 (unscaled) on ``max_{t in chunk} q . k_t``.

    ``queries``: ``[Hq, s, d]``; ``key_min``/``key_max``: ``[m, Hkv, d]``.
    """
    _check_inputs(queries, key_min, key_max)
    num_q_heads, num_queries, _ = queries.shape
    out = torch.cat(list(_bound_blocks(queries, key_min, key_max, max_block_elems)), dim=1)  # [Hkv, g*s, m]
    return out.reshape(num_q_heads, num_queries, key_min.shape[0])


def summary_chunk_scores(
    queries: torch.Tensor, key_min: torch.Tensor, key_max: torch.Tensor, *, max_block_elems: int = DEFAULT_BLOCK_ELEMS
) -> torch.Tensor:
    """Chunk scores ``[m]`` float32: softmax over chunks of the scaled bound, summed (module docstring)."""
    _check_inputs(queries, key_min, key_max)
    scale = 1.0 / math.sqrt(key_min.shape[-1])
    scores = torch.zeros(key_min.shape[0], dtype=torch.float32, device=queries.device)  # [m]
    for bound in _bound_blocks(queries, key_min, key_max, max_block_elems):
        scores += torch.softmax(bound.mul_(scale), dim=-1).sum(dim=(0, 1))
    return scores


class SummarySelector(Selector):
    """Scores chunks from the DRAM-resident key summaries (no probe keys needed); ``head_aggregation`` as in ``ExactSelector``."""

    name = "summary"
    needs = frozenset({KEY_SUMMARIES})
    per_head = True

    def __init__(self, head_aggregation: str = "sum"):
        self.head_aggregation = check_aggregation(head_aggregation)

    def score(self, inputs: PeriodInputs) -> torch.Tensor:
        if inputs.key_min is None or inputs.key_max is None:
            raise InvalidArgument("key_min", "the summary selector needs key_min and key_max")
        if self.head_aggregation == "sum":
            return summary_chunk_scores(inputs.queries, inputs.key_min, inputs.key_max)
        return aggregate_heads(self.head_scores(inputs), self.head_aggregation)

    def head_scores(self, inputs: PeriodInputs) -> torch.Tensor:
        """The bound's softmax per (query head, chunk), ``[Hq, m]`` (``heads.summary_head_chunk_scores``)."""
        if inputs.key_min is None or inputs.key_max is None:
            raise InvalidArgument("key_min", "the summary selector needs key_min and key_max")
        return summary_head_chunk_scores(inputs.queries, inputs.key_min, inputs.key_max)
