"""Online prefill sparsification (LoopServe): vertical and slash lines that cover ``alpha`` of the attention.

A new turn's prefill over a stored history attends, per head, mostly along
two kinds of lines of the attention matrix: *vertical* lines (a key every
query reads: the sink, a delimiter, the evidence) and *slash* lines (keys at
a fixed distance behind each query: the local window, repeated structure).
From the attention of the turn's last queries, ``vertical_slash`` picks, per
head, the lines to keep greedily - the heaviest line first, each counted by
the mass it adds beyond the lines already kept - until they cover at least
``alpha`` of that attention; ``line_mask`` turns them into the boolean mask
the whole turn's prefill attends through.

Notation: ``H`` heads, ``q`` observed queries at absolute positions
``q_pos``, ``t`` keys at positions ``key_pos`` (ascending; ``0..t-1`` when
not given; causal: query ``i`` sees keys at positions ``<= q_pos[i]``).
A vertical line is a key (its index); a slash line of offset ``o`` holds
the cells ``(i, j)`` with ``q_pos[i] - key_pos[j] == o``.  ``pattern``
does it for one layer of a prefill: the attention of the last ``observe``
queries, their lines, and the mask of every query.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Lines:
    """Per head, the kept vertical key positions and slash offsets, and the share of the observed mass they cover."""

    verticals: list[torch.Tensor]  # [H] of LongTensor key positions
    slashes: list[torch.Tensor]  # [H] of LongTensor offsets (query position - key position, >= 0)
    covered: torch.Tensor  # [H] float: covered mass / total mass of the observed queries


def _check(probs: torch.Tensor, q_pos: torch.Tensor, alpha: float, key_pos: torch.Tensor) -> None:
    if probs.dim() != 3:
        raise ValueError(f"probs must be [heads, queries, keys], got {list(probs.shape)}")
    if q_pos.shape != (probs.shape[1],):
        raise ValueError(f"q_pos must be [{probs.shape[1]}], got {list(q_pos.shape)}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or math.isnan(alpha) or not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
    if key_pos.shape != (probs.shape[2],):
        raise ValueError(f"key_pos must be [{probs.shape[2]}], got {list(key_pos.shape)}")
    if q_pos.numel() and (int(q_pos.min()) < 0 or int(q_pos.max()) > int(key_pos.max())):
        raise ValueError("q_pos must lie among the keys' positions")


def vertical_slash(probs: torch.Tensor, q_pos: torch.Tensor, alpha: float, key_pos: torch.Tensor | None = None) -> Lines:
    """Lines covering at least ``alpha`` of ``probs [H, q, t]`` per head (module docstring).

    ``probs`` are attention probabilities (rows summing to 1 over the causal
    keys; what lies past ``q_pos[i]`` is ignored).  The greedy order is the
    lines' own mass; a line adds only what the kept lines do not hold yet, and
    lines are taken until the covered mass reaches ``alpha`` of the total.
    """
    q_pos = torch.as_tensor(q_pos, dtype=torch.long)
    h, q, t = probs.shape
    keys = torch.arange(t)
    key_pos = keys if key_pos is None else torch.as_tensor(key_pos, dtype=torch.long)
    _check(probs, q_pos, alpha, key_pos)
    offset = q_pos[:, None] - key_pos[None, :]  # [q, t]: the slash each cell lies on
    causal = offset >= 0  # [q, t]
    p = probs.float() * causal
    span = int(offset.max()) + 1 if offset.numel() else 1
    where = offset.clamp_min(0)  # [q, t]: a cell's slash (its offset), clamped for indexing
    verticals, slashes, covered = [], [], torch.zeros(h)
    for head in range(h):
        ph = p[head].double()
        total = float(ph.sum())
        col_mass = ph.sum(0)  # [t]
        slash_mass = torch.zeros(span, dtype=torch.float64).index_add_(0, where.flatten(), ph.flatten())
        # candidates: verticals 0..t-1 then slashes t..t+span-1, heaviest first (stable: verticals win ties)
        masses = torch.cat([col_mass, slash_mass])
        order = torch.sort(masses, descending=True, stable=True).indices
        order = order[masses[order] > 0]  # a line with no mass is never taken
        if total == 0 or not order.numel():
            verticals.append(torch.zeros(0, dtype=torch.long))
            slashes.append(torch.zeros(0, dtype=torch.long))
            covered[head] = 1.0
            continue
        # rank of each line in that order (past the end: not in it)
        rank = torch.full((t + span,), order.numel(), dtype=torch.long)
        rank[order] = torch.arange(order.numel())
        v_rank, s_rank = rank[:t], rank[t:]
        cell_v, cell_s = v_rank[None, :].expand(q, t), s_rank[where]  # [q, t]: rank of each cell's two lines
        first = torch.minimum(cell_v, cell_s).masked_fill(~causal, order.numel())  # [q, t]: the line that covers it first

        # the walk takes lines in order until alpha is covered, each adding the cells no earlier line
        # holds: the mass line r adds is that of the cells it covers first, so the mass the first k
        # lines cover is a prefix sum, and the walk's stopping point one search in it
        n = order.numel()
        cells = first[causal]
        gains = torch.zeros(n + 1, dtype=torch.float64).index_add_(0, cells, ph[causal])[:n]
        reach = torch.cumsum(gains, 0)
        k = min(int(torch.searchsorted(reach, torch.tensor([alpha * total - 1e-9 * total], dtype=torch.float64))) + 1, n)
        # the walk skips a line whose cells all came in with earlier lines: keep those that cover a cell first
        firsts = torch.bincount(cells, minlength=n + 1)[:k].nonzero().flatten()
        kept = order[firsts]
        verticals.append(torch.sort(kept[kept < t]).values)
        slashes.append(torch.sort(kept[kept >= t] - t).values)
        covered[head] = float(reach[k - 1]) / total
    return Lines(verticals, slashes, covered)


def line_mask(lines: Lines, q_pos: torch.Tensor, num_keys: int, key_pos: torch.Tensor | None = None) -> torch.Tensor:
    """``[H, s, num_keys]`` bool: query ``i`` (at ``q_pos[i]``) may read key ``j`` on a kept line, causally.

    Each query also keeps its own position (offset 0), so no row is empty.
    """
    q_pos = torch.as_tensor(q_pos, dtype=torch.long)
    keys = torch.arange(num_keys)
    key_pos = keys if key_pos is None else torch.as_tensor(key_pos, dtype=torch.long)
    offset = q_pos[:, None] - key_pos[None, :]  # [s, t]
    causal = offset >= 0
    out = []
    for vs, ss in zip(lines.verticals, lines.slashes):
        m = torch.isin(keys, vs)[None, :].expand_as(causal) | torch.isin(offset, ss) | (offset == 0)
        out.append(m & causal)
    return torch.stack(out) if out else torch.zeros(0, q_pos.numel(), num_keys, dtype=torch.bool)


def pattern(
    q: torch.Tensor, keys: torch.Tensor, q_pos: torch.Tensor, key_pos: torch.Tensor, alpha: float, observe: int = 16
) -> tuple[torch.Tensor, float]:
    """The sparse pattern of one layer's prefill: ``(mask [Hq, s, t], density)``.

    ``q [Hq, s, d]`` are the turn's post-RoPE queries at ``q_pos``, ``keys
    [Hkv, t, d]`` every key they may read (stored rows then the turn's own) at
    ``key_pos``.  The last ``observe`` queries are attended densely; their
    lines (``vertical_slash``) give the mask of all ``s`` queries.
    ``density`` is the share of the causal cells the mask keeps.
    """
    hq, s, d = q.shape
    hkv = keys.shape[0]
    g = hq // hkv
    o = min(observe, s)
    last = q[:, s - o :].float().reshape(hkv, g, o, d)
    scores = torch.einsum("hgod,htd->hgot", last, keys.float()) / math.sqrt(d)
    offset = q_pos[s - o :, None] - key_pos[None, :]
    probs = scores.masked_fill(offset < 0, float("-inf")).softmax(-1).reshape(hq, o, -1)
    lines = vertical_slash(probs, q_pos[s - o :], alpha, key_pos)
    mask = line_mask(lines, q_pos, keys.shape[1], key_pos)
    causal = (q_pos[:, None] - key_pos[None, :]) >= 0
    return mask, float(mask.sum()) / float(causal.sum() * hq)
