"""Shape checks and GQA/blocking helpers shared by the scoring policies."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from kvstore.contract import InvalidArgument

# Largest float32 score block materialised at once (64 MiB); callers may
# lower it (tests do, to exercise the blocking).
DEFAULT_BLOCK_ELEMS = 1 << 24


def num_chunks(num_tokens: int, chunk_tokens: int) -> int:
    """``m = ceil(n / c)``: the last chunk may be short."""
    if chunk_tokens < 1:
        raise InvalidArgument("chunk_tokens", f"must be >= 1, got {chunk_tokens}")
    return -(-num_tokens // chunk_tokens)


def check_queries(queries: torch.Tensor, num_kv_heads: int, head_dim: int) -> int:
    """Validate ``queries`` ``[Hq, s, d]`` against the keys; returns the GQA ratio ``Hq // Hkv``."""
    if queries.dim() != 3:
        raise InvalidArgument("queries", f"expected [query_heads, queries, head_dim], got shape {tuple(queries.shape)}")
    num_q_heads, num_queries, dim = queries.shape
    if dim != head_dim:
        raise InvalidArgument("queries", f"head_dim {dim} != keys' head_dim {head_dim}")
    if num_kv_heads < 1 or num_q_heads % num_kv_heads:
        raise InvalidArgument("queries", f"{num_q_heads} query heads is not a multiple of {num_kv_heads} KV heads")
    if num_queries < 1:
        raise InvalidArgument("queries", "needs at least one query")
    return num_q_heads // num_kv_heads


def group_queries(queries: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """``[Hq, s, d]`` -> ``[Hkv, g*s, d]`` float32, rows of KV head ``h`` = query heads ``h*g .. h*g+g-1``.

    This is the GQA mapping "query head ``h`` uses KV head ``h // g``" with
    ``g = Hq // Hkv``; rows are ordered (query head in group, query).
    """
    num_q_heads, num_queries, dim = queries.shape
    group = num_q_heads // num_kv_heads
    return queries.float().reshape(num_kv_heads, group * num_queries, dim)


def row_blocks(num_rows: int, elems_per_row: int, max_elems: int) -> Iterator[slice]:
    """Slices over ``num_rows`` so that one block holds at most ``max_elems`` (>= 1 row)."""
    step = max(1, max_elems // max(1, elems_per_row))
    for start in range(0, num_rows, step):
        yield slice(start, min(start + step, num_rows))


def summaries_for_layer(summaries: torch.Tensor | np.ndarray, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split the store's summaries of one layer into ``(key_min, key_max)``, each ``[m, Hkv, d]`` float32.

    ``summaries``: ``[chunks, layers, kv_heads, 2 (min|max), head_dim]`` float32,
    as ``ChunkStore.read_summaries`` returns it (numpy or torch).
    """
    summ = torch.as_tensor(summaries)
    if summ.dim() != 5 or summ.shape[3] != 2:
        raise InvalidArgument("summaries", f"expected [chunks, layers, kv_heads, 2, head_dim], got {tuple(summ.shape)}")
    if not 0 <= layer < summ.shape[1]:
        raise InvalidArgument("layer", f"{layer} out of range for {summ.shape[1]} layers")
    per_layer = summ[:, layer].float()  # [m, Hkv, 2, d]
    return per_layer[:, :, 0], per_layer[:, :, 1]
