"""Budget: how many chunks a Period loads, and which.

A budget is a fraction of the prefix's chunks in ``(0, 1]`` (count =
``floor(fraction * m)``, at least 1: ``rounding.fraction_count``, the one
rule every budget is counted by) or an ``int`` count in ``[1, m]``.  The sink chunks
(the first ``sink_chunks``, attention sinks) and the local chunks (the last
``local_chunks``, nearest the suffix) are always loaded and count towards the
budget, which is raised to ``sink + local`` (capped at ``m``) when smaller.
Out-of-range budgets are errors, never silently clamped.
"""

from __future__ import annotations

import numbers

import torch

from kvstore.wire import InvalidArgument

from ..rounding import fraction_count


def _check_count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise InvalidArgument(name, f"must be an int >= {minimum}, got {value!r}")
    return int(value)


def budget_count(num_chunks: int, budget: float | int, sink_chunks: int = 1, local_chunks: int = 1) -> int:
    """Number of chunks to load out of ``num_chunks``; see the module docstring.

    A fraction counts by ``rounding.fraction_count`` (floor, at least 1).
    """
    m = _check_count("num_chunks", num_chunks, 1)
    sink = _check_count("sink_chunks", sink_chunks, 0)
    local = _check_count("local_chunks", local_chunks, 0)
    if isinstance(budget, bool):
        raise InvalidArgument("budget", f"must be a fraction in (0, 1] or an int count, got {budget!r}")
    if isinstance(budget, numbers.Integral):
        if not 1 <= budget <= m:
            raise InvalidArgument("budget", f"count {budget} out of range [1, {m}] (the prefix has {m} chunks)")
        count = int(budget)
    elif isinstance(budget, numbers.Real):
        if not 0.0 < budget <= 1.0:  # also rejects NaN
            raise InvalidArgument("budget", f"fraction {budget!r} out of range (0, 1]")
        count = fraction_count(m, float(budget))
    else:
        raise InvalidArgument("budget", f"must be a fraction in (0, 1] or an int count, got {type(budget).__name__}")
    return min(m, max(count, sink + local))


def select_chunks(
    scores: torch.Tensor, budget: float | int, *, sink_chunks: int = 1, local_chunks: int = 1, follow: int = 0, page_chunks: int = 1
) -> torch.Tensor:
    """Chunk ids to load, ascending ``LongTensor`` of exactly ``budget_count`` ids.

    ``scores``: ``[m]``, higher is more important.  Sink and local chunks are
    kept whatever their score; the rest of the budget goes to the
    top-scoring remaining chunks, ties to the lower index.

    ``follow = f > 0``: each chunk taken brings the ``f`` chunks after it, in
    score order, until the budget is spent.  A question's queries find the
    text that names what it asks for ("the number for Lagos is"); the answer
    is the tokens after it, often across a chunk boundary, and scores less.

    ``page_chunks = P > 1`` (LServe's hierarchical pages): the chunks are
    logical pages, grouped into physical pages of ``P`` consecutive chunks
    (the unit a read fetches); a physical page scores the max of its
    chunks' scores (``page_scores``) and the budget goes to whole physical
    pages in that order (the last one taken in part when the count ends
    inside it), so coarse reads keep the fine ranking of each page's best
    chunk.  ``follow`` and ``page_chunks`` do not combine.
    """
    if scores.dim() != 1:
        raise InvalidArgument("scores", f"expected [chunks], got shape {tuple(scores.shape)}")
    if torch.isnan(scores).any():
        raise InvalidArgument("scores", "contains NaN")
    follow = _check_count("follow", follow, 0)
    page_chunks = _check_count("page_chunks", page_chunks, 1)
    if follow and page_chunks > 1:
        raise InvalidArgument("page_chunks", f"selects whole pages; it does not combine with follow={follow}")
    m = scores.shape[0]
    count = budget_count(m, budget, sink_chunks, local_chunks)
    forced = torch.zeros(m, dtype=torch.bool, device=scores.device)  # [m]
    forced[:sink_chunks] = True
    forced[m - min(local_chunks, m) :] = True
    candidates = torch.nonzero(~forced).squeeze(1)  # [m - num forced]
    num_rest = count - int(forced.sum())
    # A stable descending sort keeps equal scores in index order: ties -> lower index.
    order = candidates[torch.sort(scores[candidates], descending=True, stable=True).indices]
    if page_chunks > 1:
        pages = torch.sort(page_scores(scores, page_chunks), descending=True, stable=True).indices  # ties: lower page
        fixed = forced.tolist()
        chunks = [c for p in pages.tolist() for c in range(p * page_chunks, min(m, (p + 1) * page_chunks)) if not fixed[c]]
        order = torch.tensor(chunks, dtype=torch.long)
        taken = order[:num_rest]
    elif follow == 0:
        taken = order[:num_rest]
    else:
        taken = _with_followers(order.tolist(), forced.tolist(), num_rest, follow)
    chosen = torch.cat([torch.nonzero(forced).squeeze(1), taken.to(forced.device)])
    return torch.sort(chosen).values


def page_scores(scores: torch.Tensor, page_chunks: int) -> torch.Tensor:
    """``[ceil(m / page_chunks)]``: each physical page's score, the max over its chunks (the last page may be short)."""
    m = scores.shape[0]
    pad = -m % page_chunks
    padded = torch.cat([scores, scores.new_full((pad,), float("-inf"))]) if pad else scores
    return padded.reshape(-1, page_chunks).amax(dim=1)


def _with_followers(order: list[int], forced: list[bool], num_rest: int, follow: int) -> torch.Tensor:
    """The first ``num_rest`` chunks of ``order``, each followed by up to ``follow`` non-forced successors."""
    m = len(forced)
    taken: list[int] = []
    seen = set()
    for c in order:
        for j in range(c, min(m, c + follow + 1)):
            if len(taken) == num_rest:
                return torch.tensor(taken, dtype=torch.long)
            if not forced[j] and j not in seen:
                seen.add(j)
                taken.append(j)
    return torch.tensor(taken, dtype=torch.long)
