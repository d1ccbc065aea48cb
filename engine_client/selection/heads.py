"""Per-head chunk scores and how they are combined across heads.

The exact and summary scores (``exact.py``, ``summary.py``) sum softmax mass
over all query heads: a chunk that one head attends to sharply (a retrieval
head reading the needle) competes with chunks that every head attends to a
little (sinks, recent text, punctuation).  Quest and LServe select per head
instead.  A ContiguousChunk holds every head's KV, so selection stays per
chunk; what changes is the aggregation:

* ``sum``: ``sum_h mass[h, chunk]`` -- the existing scores;
* ``max``: ``max_h mass[h, chunk] / s`` -- a chunk ranks by the head that
  wants it most, each head's mass normalised to one unit per query so no
  head can outvote another.

``head_chunk_scores`` returns the ``[Hq, m]`` mass per query head (each row
sums to the number of queries ``s``); ``aggregate_heads`` reduces it to
``[m]``.  ``kv_head_scores`` reduces it to ``[Hkv, m]`` instead (``max``
over each KV head's query group): a set per KV head, as LServe selects
(``ReprefillConfig.per_head``).  ``sum`` over heads reproduces ``exact_chunk_scores`` /
``summary_chunk_scores`` exactly.
"""

from __future__ import annotations

import math

import torch

from kvstore.contract import InvalidArgument

from ._common import check_queries, num_chunks

HEAD_AGGREGATIONS = ("sum", "max")


def check_aggregation(mode: str) -> str:
    if mode not in HEAD_AGGREGATIONS:
        raise InvalidArgument("head_aggregation", f"must be one of {', '.join(HEAD_AGGREGATIONS)}, got {mode!r}")
    return mode


def exact_head_chunk_scores(queries: torch.Tensor, probe_keys: torch.Tensor, chunk_tokens: int = 16) -> torch.Tensor:
    """Softmax mass per (query head, chunk), summed over queries: ``[Hq, m]`` float32.

    ``queries`` ``[Hq, s, d]``, ``probe_keys`` ``[Hkv, n, d]`` (post-RoPE);
    query head ``h`` attends with KV head ``h // (Hq // Hkv)``.
    """
    if probe_keys.dim() != 3 or probe_keys.shape[1] < 1:
        raise InvalidArgument("probe_keys", f"expected [kv_heads, tokens >= 1, head_dim], got {tuple(probe_keys.shape)}")
    if chunk_tokens < 1:
        raise InvalidArgument("chunk_tokens", f"must be >= 1, got {chunk_tokens}")
    num_kv_heads, n, d = probe_keys.shape
    group = check_queries(queries, num_kv_heads, d)
    hq, s, _ = queries.shape
    q = queries.float().reshape(num_kv_heads, group * s, d)  # [Hkv, g*s, d]
    logits = torch.matmul(q, probe_keys.to(q.device, torch.float32).transpose(1, 2)) / math.sqrt(d)  # [Hkv, g*s, n]
    mass = torch.softmax(logits, dim=-1).reshape(hq, s, n).sum(dim=1)  # [Hq, n]
    m = num_chunks(n, chunk_tokens)
    padded = mass.new_zeros(hq, m * chunk_tokens)  # [Hq, m*c]
    padded[:, :n] = mass
    return padded.view(hq, m, chunk_tokens).sum(dim=2)


def summary_head_chunk_scores(queries: torch.Tensor, key_min: torch.Tensor, key_max: torch.Tensor) -> torch.Tensor:
    """Softmax over chunks of the min/max bound, per (query head, chunk), summed over queries: ``[Hq, m]``.

    ``key_min``/``key_max``: ``[m, Hkv, d]``; see ``summary.py`` for the bound.
    """
    if key_min.dim() != 3 or key_min.shape != key_max.shape or key_min.shape[0] < 1:
        raise InvalidArgument("key_min", f"key_min {tuple(key_min.shape)} and key_max {tuple(key_max.shape)} must be [m, Hkv, d]")
    m, num_kv_heads, d = key_min.shape
    group = check_queries(queries, num_kv_heads, d)
    hq, s, _ = queries.shape
    q = queries.float().reshape(num_kv_heads, group * s, d)  # [Hkv, g*s, d]
    kmax_t = key_max.to(q.device, torch.float32).permute(1, 2, 0)  # [Hkv, d, m], on the queries' device
    kmin_t = key_min.to(q.device, torch.float32).permute(1, 2, 0)
    bound = torch.matmul(q.clamp(min=0), kmax_t) + torch.matmul(q.clamp(max=0), kmin_t)  # [Hkv, g*s, m]
    return torch.softmax(bound / math.sqrt(d), dim=-1).reshape(hq, s, m).sum(dim=1)


def aggregate_heads(head_scores: torch.Tensor, mode: str = "sum") -> torch.Tensor:
    """``[H, m]`` per-head chunk scores -> ``[m]`` (module docstring)."""
    check_aggregation(mode)
    if head_scores.dim() != 2:
        raise InvalidArgument("head_scores", f"expected [heads, chunks], got {tuple(head_scores.shape)}")
    if mode == "sum":
        return head_scores.sum(dim=0)
    totals = head_scores.sum(dim=1, keepdim=True).clamp(min=torch.finfo(head_scores.dtype).tiny)  # [H, 1]
    return (head_scores / totals).amax(dim=0)


def kv_head_scores(head_scores: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """``[Hq, m]`` per-query-head scores -> ``[Hkv, m]``: each KV head's query group by ``max`` (normalised as above)."""
    if head_scores.dim() != 2 or num_kv_heads < 1 or head_scores.shape[0] % num_kv_heads:
        raise InvalidArgument(
            "head_scores", f"expected [query heads, chunks] in groups of {num_kv_heads} KV heads, got {tuple(head_scores.shape)}"
        )
    totals = head_scores.sum(dim=1, keepdim=True).clamp(min=torch.finfo(head_scores.dtype).tiny)
    normed = head_scores / totals
    return normed.view(num_kv_heads, -1, normed.shape[1]).amax(dim=1)
