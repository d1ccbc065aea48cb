"""Token-level selection of the baselines that store 64-token blocks.

* AS+H2O (AttentionStore with H2O's heavy hitters), query-agnostic: a
  token's importance is the attention it has accumulated by the end of
  prefill, taken here from the prefix's last ``window`` tokens (an
  observation window) at each Period's first layer.
* IMPRESS, query-aware: the suffix queries of the Period's first layer
  against that layer's prefix keys (the probe keys, read from the store).

Both keep the top ``ceil(budget * n)`` tokens and then load whole blocks:

* ``cover`` (AS+H2O): every block that holds a selected token;
* ``dense`` (IMPRESS): blocks ranked by how many selected tokens they hold
  (ties: larger summed score, then lower index), taken until the loaded
  tokens reach the token budget, at least one block.

Sink and local blocks (the first ``sink_blocks`` and last ``local_blocks``)
are always loaded.  As with the chunk budget (``budget.py``) they count
towards the budget: in ``dense`` mode the ranked blocks only fill what they
leave, so tokens loaded stay within a block of the budget and are comparable
with ContiguousKV's at the same fraction.  The selected tokens are returned
too, so a caller can report read amplification (tokens loaded / selected).
"""

from __future__ import annotations

import math
import numbers

import torch

from kvstore.errors import InvalidArgument

from ._common import DEFAULT_BLOCK_ELEMS, row_blocks
from .budget import _check_count
from .exact import token_attention_mass

BLOCK_MODES = ("cover", "dense")


# ---------------------------------------------------------------- token scores


@torch.inference_mode()
def h2o_token_scores(
    model,
    kv: torch.Tensor,
    tokens: torch.Tensor,
    *,
    period_layers: int,
    window: int = 64,
    max_block_elems: int = DEFAULT_BLOCK_ELEMS,
) -> torch.Tensor:
    """H2O accumulated attention per prefix token at each Period's first layer: ``[periods, n]`` float32.

    ``kv``: the prefix's ``[layers, 2, Hkv, n, d]`` (post-RoPE, as stored);
    ``tokens``: its ``[n]`` token ids.  Row ``p`` is the softmax mass that the
    last ``w = min(window, n)`` prefix tokens pay to each token at layer
    ``l0 = p * period_layers``, summed over query heads and window queries
    (each window query sees the keys up to its own position), so every row
    sums to ``Hq * w``.

    Post hoc, without a second prefill: the window's hidden states are
    recomputed by running only the window through layers ``0 .. l0-1``,
    attending to the stored KV of the tokens before it.  Scores are built
    ``max_block_elems`` float32 logits at a time.
    """
    c = model.config
    expected = (c.num_hidden_layers, 2, c.num_key_value_heads, c.head_dim)
    if kv.dim() != 5 or (*kv.shape[:3], kv.shape[4]) != expected or kv.shape[3] < 1:
        raise InvalidArgument("kv", f"expected [{', '.join(map(str, expected[:3]))}, n >= 1, {expected[3]}], got {list(kv.shape)}")
    n = kv.shape[3]
    tokens = torch.as_tensor(tokens).reshape(-1)
    if tokens.numel() != n:
        raise InvalidArgument("tokens", f"has {tokens.numel()} tokens, the KV has {n}")
    period_layers = _check_count("period_layers", period_layers, 1)
    window = _check_count("window", window, 1)
    start = n - min(window, n)  # first window position
    positions = torch.arange(start, n, device=model.device)  # [w]
    first_layers = range(0, c.num_hidden_layers, period_layers)
    hidden = model.embed(tokens[start:])  # [w, hidden]
    out = torch.empty(len(first_layers), n, dtype=torch.float32, device=model.device)  # [periods, n]
    for layer in range(first_layers[-1] + 1):
        if layer % period_layers == 0:
            q = model.layer_queries(layer, hidden, positions)  # [Hq, w, d]
            out[layer // period_layers] = window_attention_mass(q, kv[layer, 0], start, max_block_elems=max_block_elems)
        if layer < first_layers[-1]:
            hidden, _ = model.layer_forward(layer, hidden, positions, kv[layer, :, :, :start] if start else None)
    return out


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


def impress_token_scores(
    queries: torch.Tensor, probe_keys: torch.Tensor, *, max_block_elems: int = DEFAULT_BLOCK_ELEMS
) -> torch.Tensor:
    """IMPRESS token importance: ``[n]`` float32 softmax mass of the suffix queries on the probe keys.

    ``queries``: ``[Hq, s, d]`` (the Period's first layer, post-RoPE);
    ``probe_keys``: ``[Hkv, n, d]``, that layer's prefix keys.  Summed over
    query heads and suffix queries (GQA: query head ``h`` reads KV head
    ``h // (Hq // Hkv)``).
    """
    return token_attention_mass(queries, probe_keys, max_block_elems=max_block_elems)


# ---------------------------------------------------------------- block mapping


def token_budget(num_tokens: int, budget: float | int) -> int:
    """Tokens to select out of ``num_tokens``: ``ceil(fraction * n)`` for a fraction in (0, 1], or an int count in [1, n]."""
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
        return max(1, math.ceil(round(float(budget) * n, 9)))  # 9 decimals: 0.05 of 100 is 5, as in budget.py
    raise InvalidArgument("budget", f"must be a fraction in (0, 1] or an int token count, got {type(budget).__name__}")


def select_blocks_for_tokens(
    token_scores: torch.Tensor,
    budget: float | int,
    *,
    block_tokens: int = 64,
    sink_blocks: int = 1,
    local_blocks: int = 1,
    mode: str = "cover",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(blocks, selected_tokens)``: both ascending, unique ``LongTensor`` on ``token_scores``' device.

    ``token_scores``: ``[n]``, higher is more important.  The top
    ``token_budget(n, budget)`` tokens are selected (ties: lower index);
    ``mode`` maps them onto blocks of ``block_tokens`` (the last may be
    short), see the module docstring.
    """
    if token_scores.dim() != 1 or token_scores.numel() == 0:
        raise InvalidArgument("token_scores", f"expected [tokens >= 1], got shape {tuple(token_scores.shape)}")
    if torch.isnan(token_scores).any():
        raise InvalidArgument("token_scores", "contains NaN")
    block_tokens = _check_count("block_tokens", block_tokens, 1)
    sink_blocks = _check_count("sink_blocks", sink_blocks, 0)
    local_blocks = _check_count("local_blocks", local_blocks, 0)
    if mode not in BLOCK_MODES:
        raise InvalidArgument("mode", f"must be one of {', '.join(BLOCK_MODES)}, got {mode!r}")
    n = token_scores.numel()
    k = token_budget(n, budget)
    scores = token_scores.float()  # [n]
    device = scores.device
    m = -(-n // block_tokens)
    # A stable descending sort keeps equal scores in index order: ties -> lower index.
    selected = torch.sort(torch.sort(scores, descending=True, stable=True).indices[:k]).values  # [k]
    block_of = selected // block_tokens  # [k]
    chosen = torch.zeros(m, dtype=torch.bool, device=device)  # [m]
    chosen[:sink_blocks] = True
    chosen[m - min(local_blocks, m) :] = True
    if mode == "cover":
        chosen[block_of] = True
    else:
        chosen |= _densest_blocks(scores, selected, block_of, chosen, k, block_tokens)
    return torch.nonzero(chosen).squeeze(1), selected


def _densest_blocks(
    scores: torch.Tensor, selected: torch.Tensor, block_of: torch.Tensor, forced: torch.Tensor, k: int, block_tokens: int
) -> torch.Tensor:
    """``[m]`` bool: the non-forced blocks IMPRESS loads, best first until forced + taken tokens reach ``k``.

    Ranked by selected tokens held, then summed score of those tokens, then
    lower index; only blocks holding a selected token are candidates, and at
    least one is taken when there is any.
    """
    m = forced.shape[0]
    n = scores.shape[0]
    counts = torch.bincount(block_of, minlength=m)  # [m] selected tokens per block
    mass = torch.zeros(m, dtype=torch.float32, device=scores.device).index_add_(0, block_of, scores[selected])  # [m]
    sizes = torch.full((m,), block_tokens, dtype=torch.long, device=scores.device)  # [m] tokens per block
    sizes[-1] = n - (m - 1) * block_tokens
    # Lexicographic rank by stable sorts, least significant key first.
    order = torch.arange(m, device=scores.device)
    order = order[torch.sort(mass[order], descending=True, stable=True).indices]
    order = order[torch.sort(counts[order], descending=True, stable=True).indices]
    order = order[(counts[order] > 0) & ~forced[order]]  # candidates, best first
    # Take a block while the tokens loaded before it are short of the budget.
    loaded_before = int(sizes[forced].sum()) + torch.cumsum(sizes[order], 0) - sizes[order]  # [candidates]
    take = loaded_before < k
    take[:1] = True  # at least one block chosen by importance
    out = torch.zeros(m, dtype=torch.bool, device=scores.device)
    out[order[take]] = True
    return out
