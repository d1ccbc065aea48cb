"""Token-level policies of the baselines (pure torch, no I/O).

* **H2O** (heavy hitters): a token's importance is the attention it has
  accumulated over the prefix's own prefill - every later prefix query's
  causal softmax mass on it, summed over query heads - at each Period's
  first layer (``window_attention_mass`` applied block by block during the
  prefill, ``engine_client.prefill.prefill_with_attention``).  It is
  query-agnostic, known when the prefix is stored.
* **IMPRESS**: a query's important tokens found from *partial* probe keys -
  a subset of KV heads and channels of each Period's first layer, kept
  resident by the client (``probe_subset`` picks it, ``partial_probe_scores``
  scores with it).

Both store each Period's rows reordered (``storage_order``): the sink
tokens, the local tokens, then the rest by descending accumulated
attention.  Attention over a set of prefix rows does not depend on their
order (the keys carry their RoPE), so a reordered extent computes the same
thing.  H2O then loads exactly its retained tokens, the first
``token_cap`` rows (compacted: no other token is read or attended to);
IMPRESS loads the first block (sink, local and the most accumulated
tokens) and then the blocks holding most of the query's important tokens
(``impress_blocks``).

One budget for every system: ``token_cap(n, budget)`` prefix tokens per
Period, sink and local included, the rounding the Re-Prefill runner plans
with (``schedule.plan_periods``: ``floor(budget x m)`` 16-token chunks per
layer, never above the budget, raised to sink + local); no system loads more.
"""

from __future__ import annotations

import math
import numbers

import torch

from kvstore.contract import InvalidArgument

from ..rounding import fraction_count
from ._common import DEFAULT_BLOCK_ELEMS, num_chunks, row_blocks
from .budget import _check_count
from .exact import token_attention_mass

# ---------------------------------------------------------------- budget


def token_cap(num_tokens: int, budget: float | int, *, chunk_tokens: int = 16, sink_chunks: int = 1, local_chunks: int = 1) -> int:
    """Prefix tokens a Period may load under ``budget``, sink and local included: the chunks per layer
    ``plan_periods`` gives the runner, in tokens, at most ``n``."""
    from .schedule import plan_periods

    n = _check_count("num_tokens", num_tokens, 1)
    m = num_chunks(n, _check_count("chunk_tokens", chunk_tokens, 1))
    per_layer = plan_periods(1, m, budget, period_layers=1, sink_chunks=sink_chunks, local_chunks=local_chunks).periods[0][2]
    return min(n, per_layer * chunk_tokens)


def token_budget(num_tokens: int, budget: float | int) -> int:
    """Tokens to select out of ``num_tokens``: ``fraction_count`` (floor, at least 1) of a fraction in (0, 1], or an int count in [1, n]."""
    n = _check_count("num_tokens", num_tokens, 1)
    if isinstance(budget, bool):
        raise InvalidArgument("budget", f"must be a fraction in (0, 1] or an int token count, got {budget!r}")
    if isinstance(budget, numbers.Integral):
        if not 1 <= budget <= n:
            raise InvalidArgument("budget", f"token count {budget} out of range [1, {n}] (the prefix has {n} tokens)")
        return int(budget)
    if isinstance(budget, numbers.Real):
        if not 0.0 < budget <= 1.0:  # also rejects NaN
            raise InvalidArgument("budget", f"fraction {budget!r} out of range (0, 1]")
        return fraction_count(n, float(budget))
    raise InvalidArgument("budget", f"must be a fraction in (0, 1] or an int token count, got {type(budget).__name__}")


# ---------------------------------------------------------------- H2O


def window_attention_mass(
    queries: torch.Tensor, keys: torch.Tensor, start: int, *, max_block_elems: int = DEFAULT_BLOCK_ELEMS
) -> torch.Tensor:
    """Causal softmax mass per key of window queries at positions ``start ..``: ``[n]`` float32.

    ``queries``: ``[Hq, w, d]`` post-RoPE, query ``i`` at position
    ``start + i``; ``keys``: ``[Hkv, n, d]`` post-RoPE, ``start + w <= n``.
    Query head ``h`` reads KV head ``h // (Hq // Hkv)``; no key is copied
    per query head.
    """
    hq, w, d = queries.shape
    hkv, n, _ = keys.shape
    if hq % hkv or start < 0 or start + w > n:
        raise InvalidArgument("queries", f"{list(queries.shape)} window at {start} does not fit keys {list(keys.shape)}")
    keys_t = keys.to(queries.device, torch.float32).transpose(1, 2)  # [Hkv, d, n]
    rows = queries.float().reshape(hkv, (hq // hkv) * w, d)  # [Hkv, g*w, d]: row j*w + i = head h*g + j, query i
    row_pos = start + torch.arange(rows.shape[1], device=queries.device) % w  # [g*w] position of each row's query
    key_pos = torch.arange(n, device=queries.device)  # [n]
    scale = 1.0 / math.sqrt(d)
    mass = torch.zeros(n, dtype=torch.float32, device=queries.device)  # [n]
    for block in row_blocks(rows.shape[1], hkv * n, max_block_elems):
        logits = torch.matmul(rows[:, block], keys_t).mul_(scale)  # [Hkv, rows in block, n]
        logits.masked_fill_(key_pos[None, :] > row_pos[block, None], float("-inf"))
        mass += torch.softmax(logits, dim=-1).sum(dim=(0, 1))
    return mass


def impress_token_scores(queries: torch.Tensor, probe_keys: torch.Tensor, *, max_block_elems: int = DEFAULT_BLOCK_ELEMS) -> torch.Tensor:
    """IMPRESS token importance: ``[n]`` float32 softmax mass of the suffix queries on the probe keys.

    ``queries``: ``[Hq, s, d]`` (the Period's first layer, post-RoPE);
    ``probe_keys``: ``[Hkv, n, d]``, that layer's prefix keys.  Summed over
    query heads and suffix queries (GQA: query head ``h`` reads KV head
    ``h // (Hq // Hkv)``).
    """
    return token_attention_mass(queries, probe_keys, max_block_elems=max_block_elems)


def storage_order(scores: torch.Tensor, *, sink_tokens: int = 16, local_tokens: int = 16) -> torch.Tensor:
    """Stored row order of one Period: ``[n]`` token positions, a permutation.

    The first ``sink_tokens`` positions, then the last ``local_tokens``, then
    every other token by descending ``scores`` (ties: lower position).
    """
    if scores.dim() != 1 or scores.numel() == 0:
        raise InvalidArgument("scores", f"expected [tokens >= 1], got shape {tuple(scores.shape)}")
    if torch.isnan(scores).any():
        raise InvalidArgument("scores", "contains NaN")
    n = scores.numel()
    sink = min(_check_count("sink_tokens", sink_tokens, 0), n)
    local = min(_check_count("local_tokens", local_tokens, 0), n - sink)
    middle = torch.arange(sink, n - local, device=scores.device)  # [n - sink - local]
    # A stable descending sort keeps equal scores in position order.
    ranked = middle[torch.sort(scores[middle].float(), descending=True, stable=True).indices]
    return torch.cat([torch.arange(sink, device=scores.device), torch.arange(n - local, n, device=scores.device), ranked])


def h2o_chunks(num_tokens: int, budget: float | int, *, chunk_tokens: int = 16) -> torch.Tensor:
    """H2O's chunks in ``storage_order``: exactly the first ``token_cap`` rows (the retained tokens), ascending ids.

    ``token_cap`` is a whole number of ``chunk_tokens`` chunks unless it is
    the whole prefix, so no token beyond the retained ones is loaded.
    """
    cap = token_cap(num_tokens, budget, chunk_tokens=chunk_tokens)
    return torch.arange(num_chunks(cap, chunk_tokens))


# ---------------------------------------------------------------- IMPRESS


def probe_subset(keys: torch.Tensor, num_heads: int, num_channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(heads, channels)`` ascending ids of IMPRESS's partial probe keys.

    ``keys``: ``[Hkv, n, d]``, a Period's first-layer prefix keys.  The
    ``num_heads`` KV heads and then, within them, the ``num_channels``
    channels of largest mean absolute key (ties: lower id).
    """
    if keys.dim() != 3:
        raise InvalidArgument("keys", f"expected [kv_heads, tokens, head_dim], got shape {tuple(keys.shape)}")
    hkv, _, d = keys.shape
    num_heads = _check_count("num_heads", num_heads, 1)
    num_channels = _check_count("num_channels", num_channels, 1)
    if num_heads > hkv or num_channels > d:
        raise InvalidArgument("num_heads", f"{num_heads} heads x {num_channels} channels exceed the keys' {hkv} x {d}")
    mag = keys.float().abs().mean(dim=1)  # [Hkv, d]
    heads = torch.sort(torch.sort(mag.sum(1), descending=True, stable=True).indices[:num_heads]).values
    channels = torch.sort(torch.sort(mag[heads].sum(0), descending=True, stable=True).indices[:num_channels]).values
    return heads, channels


def partial_probe_scores(
    queries: torch.Tensor,
    probe: torch.Tensor,
    heads: torch.Tensor,
    channels: torch.Tensor,
    *,
    num_kv_heads: int,
    max_block_elems: int = DEFAULT_BLOCK_ELEMS,
) -> torch.Tensor:
    """IMPRESS token importance from partial probe keys: ``[n]`` float32.

    ``queries``: ``[Hq, s, d]``, the Period's first layer, post-RoPE, over
    ``num_kv_heads`` KV heads; ``probe``: ``[len(heads), n, len(channels)]``,
    the kept heads' keys on the kept channels.  Only the query heads that
    read the kept KV heads take part (GQA: query head ``h`` reads KV head
    ``h // (Hq // Hkv)``), on the kept channels, with the full ``1/sqrt(d)``
    logit scale; the mass is summed over them and the suffix queries.
    """
    hq, _, d = queries.shape
    num_kv_heads = _check_count("num_kv_heads", num_kv_heads, 1)
    if hq % num_kv_heads or probe.dim() != 3 or probe.shape[0] != heads.numel() or probe.shape[2] != channels.numel():
        raise InvalidArgument(
            "probe", f"{tuple(probe.shape)} does not match {heads.numel()} heads x {channels.numel()} channels of {hq} query heads"
        )
    g = hq // num_kv_heads
    qheads = (heads[:, None] * g + torch.arange(g)).reshape(-1)  # [len(heads) * g], grouped by KV head
    sub = queries.float()[qheads][:, :, channels] * math.sqrt(channels.numel() / d)  # keep the 1/sqrt(d) scale
    return token_attention_mass(sub, probe.float(), max_block_elems=max_block_elems)


def impress_blocks(scores: torch.Tensor, budget_tokens: int, *, block_tokens: int = 64, forced_tokens: int = 32) -> torch.Tensor:
    """IMPRESS's blocks in ``storage_order``: ascending ids, at most ``budget_tokens`` rows in all.

    ``scores``: ``[n]`` token importance in stored row order.  The blocks
    holding the first ``forced_tokens`` rows (sink and local) are always
    loaded; the ``budget_tokens`` highest-scoring rows are the important
    ones, and the other blocks are taken by how many of them they hold
    (then their summed score, then lower id) while the total stays within
    ``budget_tokens``.
    """
    if scores.dim() != 1 or scores.numel() == 0:
        raise InvalidArgument("scores", f"expected [tokens >= 1], got shape {tuple(scores.shape)}")
    n = scores.numel()
    block_tokens = _check_count("block_tokens", block_tokens, 1)
    k = _check_count("budget_tokens", budget_tokens, 1)
    m = num_chunks(n, block_tokens)
    sizes = torch.full((m,), block_tokens, dtype=torch.long)  # [m] rows per block
    sizes[-1] = n - (m - 1) * block_tokens
    num_forced = num_chunks(min(_check_count("forced_tokens", forced_tokens, 0), n), block_tokens)
    if int(sizes[:num_forced].sum()) > k:
        raise InvalidArgument("budget_tokens", f"{k} tokens hold less than the {num_forced} forced {block_tokens}-token blocks")
    s = scores.float().cpu()
    important = torch.sort(s, descending=True, stable=True).indices[: min(k, n)]  # [k]
    block_of = important // block_tokens
    counts = torch.bincount(block_of, minlength=m)  # [m] important rows per block
    mass = torch.zeros(m).index_add_(0, block_of, s[important])  # [m]
    order = torch.arange(m)
    order = order[torch.sort(mass[order], descending=True, stable=True).indices]
    order = order[torch.sort(counts[order], descending=True, stable=True).indices]
    order = order[(order >= num_forced) & (counts[order] > 0)]
    loaded = int(sizes[:num_forced].sum())
    take = [*range(num_forced)]
    for b in order.tolist():
        if loaded + int(sizes[b]) <= k:
            take.append(b)
            loaded += int(sizes[b])
    return torch.tensor(sorted(take), dtype=torch.long)
