"""Exact chunk scores: attention mass of the suffix queries on each chunk.

ChunkKV / ContiguousKV, equation 1: for every query head ``h`` and suffix
query ``t``, softmax over all ``n`` prefix keys of the period's first layer
(scale ``1/sqrt(d)``, float32), then summed over heads and queries, then
summed over the tokens of each ContiguousChunk.  The scores of one call sum
to ``Hq * s`` (one unit of softmax mass per (head, query)).
"""

from __future__ import annotations

import math

import torch

from kvstore.contract import InvalidArgument

from ._common import DEFAULT_BLOCK_ELEMS, check_queries, group_queries, num_chunks, row_blocks
from .base import PROBE_KEYS, PeriodInputs, Selector
from .heads import aggregate_heads, check_aggregation, exact_head_chunk_scores


def token_attention_mass(queries: torch.Tensor, probe_keys: torch.Tensor, *, max_block_elems: int = DEFAULT_BLOCK_ELEMS) -> torch.Tensor:
    """Softmax mass per prefix token, summed over query heads and queries: ``[n]`` float32.

    ``queries``: ``[Hq, s, d]``; ``probe_keys``: ``[Hkv, n, d]`` (both post-RoPE).
    The ``[Hkv, rows, n]`` logits are built ``max_block_elems`` at a time
    (rows = (query head in group, query)), so n = 32k, s = 512 stays bounded.
    """
    if probe_keys.dim() != 3 or probe_keys.shape[1] < 1:
        shape = tuple(probe_keys.shape)
        raise InvalidArgument("probe_keys", f"expected [kv_heads, tokens >= 1, head_dim], got shape {shape}")
    num_kv_heads, num_tokens, head_dim = probe_keys.shape
    check_queries(queries, num_kv_heads, head_dim)
    rows = group_queries(queries, num_kv_heads)  # [Hkv, g*s, d]
    keys_t = probe_keys.to(rows.device, torch.float32).transpose(1, 2)  # [Hkv, d, n], on the queries' device
    scale = 1.0 / math.sqrt(head_dim)
    mass = torch.zeros(num_tokens, dtype=torch.float32, device=rows.device)  # [n]
    for block in row_blocks(rows.shape[1], num_kv_heads * num_tokens, max_block_elems):
        logits = torch.matmul(rows[:, block], keys_t).mul_(scale)  # [Hkv, rows in block, n]
        mass += torch.softmax(logits, dim=-1).sum(dim=(0, 1))
    return mass


def sum_per_chunk(token_scores: torch.Tensor, chunk_tokens: int) -> torch.Tensor:
    """``[n]`` per-token scores -> ``[m]`` per-chunk sums, ``m = ceil(n / c)`` (last chunk short)."""
    m = num_chunks(token_scores.shape[0], chunk_tokens)
    padded = token_scores.new_zeros(m * chunk_tokens)  # [m*c]
    padded[: token_scores.shape[0]] = token_scores
    return padded.view(m, chunk_tokens).sum(dim=1)


def exact_chunk_scores(
    queries: torch.Tensor,
    probe_keys: torch.Tensor,
    chunk_tokens: int = 16,
    *,
    max_block_elems: int = DEFAULT_BLOCK_ELEMS,
) -> torch.Tensor:
    """Attention mass per chunk, ``[m]`` float32; see the module docstring.

    ``queries``: ``[Hq, s, d]``, the period's first layer's post-RoPE suffix
    queries (all query heads); ``probe_keys``: ``[Hkv, n, d]``, that layer's
    full prefix keys.  Query head ``h`` attends with KV head ``h // (Hq // Hkv)``.
    """
    if chunk_tokens < 1:
        raise InvalidArgument("chunk_tokens", f"must be >= 1, got {chunk_tokens}")
    mass = token_attention_mass(queries, probe_keys, max_block_elems=max_block_elems)  # [n]
    return sum_per_chunk(mass, chunk_tokens)


class ExactSelector(Selector):
    """Scores chunks by exact softmax mass over the stored probe keys.

    ``head_aggregation``: "sum" over query heads (``exact_chunk_scores``) or
    "max" of each head's normalised mass (``heads.aggregate_heads``).
    """

    name = "exact"
    needs = frozenset({PROBE_KEYS})
    per_head = True

    def __init__(self, head_aggregation: str = "sum"):
        self.head_aggregation = check_aggregation(head_aggregation)

    def score(self, inputs: PeriodInputs) -> torch.Tensor:
        if inputs.probe_keys is None:
            raise InvalidArgument("probe_keys", "the exact selector needs the period's probe keys")
        if self.head_aggregation == "sum":
            return exact_chunk_scores(inputs.queries, inputs.probe_keys, inputs.chunk_tokens)
        return aggregate_heads(self.head_scores(inputs), self.head_aggregation)

    def head_scores(self, inputs: PeriodInputs) -> torch.Tensor:
        """Mass per (query head, chunk), ``[Hq, m]`` (``heads.exact_head_chunk_scores``)."""
        if inputs.probe_keys is None:
            raise InvalidArgument("probe_keys", "the exact selector needs the period's probe keys")
        return exact_head_chunk_scores(inputs.queries, inputs.probe_keys, inputs.chunk_tokens)
