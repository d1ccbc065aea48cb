"""Budget: how many chunks a Period loads, and which.

A ``Budget`` is a fraction of the prefix's chunks in ``(0, 1]`` (count =
``floor(fraction * m)``, at least 1: ``rounding.fraction_count``, the one
rule every budget is counted by) or a count of chunks in ``[1, m]``, and
says which (``Budget.fraction(0.05)``, ``Budget.chunks(6)``): 1.0 is every
chunk, one chunk is ``Budget.chunks(1)``.  The functions below also take
the plain amount (a ``float`` fraction or an ``int`` count), which is what
a ``Budget`` hands them (``amount``).  The sink chunks
(the first ``sink_chunks``, attention sinks) and the local chunks (the last
``local_chunks``, nearest the suffix) are always loaded and count towards the
budget, which is raised to ``sink + local`` (capped at ``m``) when smaller.
Out-of-range budgets are errors, never silently clamped.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch

from kvstore.contract import InvalidArgument

from ..rounding import fraction_count


def _check_count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise InvalidArgument(name, f"must be an int >= {minimum}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Budget:
    """How much of a prefix a Re-Prefill loads: ``value`` is a fraction of its chunks or a chunk count (``unit``)."""

    value: float | int
    unit: str = "fraction"  # "fraction" | "chunks"

    def __post_init__(self):
        v = self.value
        if self.unit == "fraction":
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or math.isnan(v) or not 0 < v <= 1:
                raise InvalidArgument("budget", f"a fraction must be in (0, 1], got {v!r}")
            object.__setattr__(self, "value", float(v))
        elif self.unit == "chunks":
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise InvalidArgument("budget", f"a chunk count must be an int >= 1, got {v!r}")
            object.__setattr__(self, "value", int(v))
        else:
            raise InvalidArgument("budget", f"unit must be 'fraction' or 'chunks', got {self.unit!r}")

    @classmethod
    def fraction(cls, value: float) -> Budget:
        return cls(value, "fraction")

    @classmethod
    def chunks(cls, count: int) -> Budget:
        return cls(count, "chunks")

    @classmethod
    def parse(cls, text: str) -> Budget:
        """``0.05`` or ``5%``: a fraction; ``12c``: 12 chunks."""
        t = text.strip()
        try:
            if t.endswith("%"):
                return cls.fraction(float(t[:-1]) / 100)
            if t.endswith("c"):
                return cls.chunks(int(t[:-1]))
            return cls.fraction(float(t))
        except ValueError:
            raise InvalidArgument("budget", f"must be a fraction (0.05 or 5%) or a chunk count (12c), got {text!r}") from None

    @property
    def amount(self) -> float | int:
        """What ``budget_count`` takes: the ``float`` fraction or the ``int`` count."""
        return self.value

    @property
    def is_all(self) -> bool:
        """A fraction of 1: every chunk, whatever the prefix."""
        return self.unit == "fraction" and self.value >= 1

    def scaled(self, factor: float) -> Budget:
        """A fraction ``factor`` times this one, at most 1 (look-ahead guesses); a count scales and rounds down, at least 1."""
        if self.unit == "fraction":
            return Budget.fraction(min(1.0, self.value * factor))
        return Budget.chunks(max(1, int(self.value * factor)))

    def __str__(self) -> str:
        return f"{self.value:g}" if self.unit == "fraction" else f"{self.value}c"


def budget_amount(budget) -> object:
    return budget.amount if isinstance(budget, Budget) else budget


def budget_count(num_chunks: int, budget: Budget | float | int, sink_chunks: int = 1, local_chunks: int = 1) -> int:
    """Number of chunks to load out of ``num_chunks``; see the module docstring.

    A fraction counts by ``rounding.fraction_count`` (floor, at least 1).
    """
    m = _check_count("num_chunks", num_chunks, 1)
    sink = _check_count("sink_chunks", sink_chunks, 0)
    local = _check_count("local_chunks", local_chunks, 0)
    budget = budget_amount(budget)
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
    scores: torch.Tensor,
    budget: Budget | float | int,
    *,
    sink_chunks: int = 1,
    local_chunks: int = 1,
    follow: int = 0,
    follow_top: int = 0,
    page_chunks: int = 1,
) -> torch.Tensor:
    """Chunk ids to load, ascending ``LongTensor`` of exactly ``budget_count`` ids, on the host.

    ``scores``: ``[m]``, higher is more important.  Sink and local chunks are
    kept whatever their score; the rest of the budget goes to the
    top-scoring remaining chunks, ties to the lower index.

    ``follow = f > 0``: each chunk taken brings the ``f`` chunks after it, in
    score order, until the budget is spent.  A question's queries find the
    text that names what it asks for ("the number for Lagos is"); the answer
    is the tokens after it, often across a chunk boundary, and scores less.
    ``follow_top = n > 0``: only the ``n`` best-ranked chunks bring theirs,
    the rest of the budget goes to chunks by score alone (a question that
    restates a sentence in other words needs the sentence and what scores
    near it, not the text after each of them; docs/serving.md, Gemma 3).

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
    follow = _check_count("follow", follow, 0)
    follow_top = _check_count("follow_top", follow_top, 0)
    page_chunks = _check_count("page_chunks", page_chunks, 1)
    if follow and page_chunks > 1:
        raise InvalidArgument("page_chunks", f"selects whole pages; it does not combine with follow={follow}")
    m = scores.shape[0]
    count = budget_count(m, budget, sink_chunks, local_chunks)
    # The scores cross to the host once and are ranked there (the ids go to the daemon from the host):
    # ranking on the device cost a dozen small launches and copies a Period, 1.5 ms of host time per
    # layer on the H200 machine (docs/gpu.md).  Which chunks are forced is known without the scores.
    host = _scores_on_host(scores)  # [m]
    if np.isnan(host).any():
        raise InvalidArgument("scores", "contains NaN")
    forced = np.zeros(m, dtype=bool)
    forced[:sink_chunks] = True
    forced[m - min(local_chunks, m) :] = True
    num_rest = count - int(forced.sum())
    if page_chunks > 1:
        pages = np.argsort(-_page_scores_np(host, page_chunks), kind="stable")  # ties: the lower page
        order = (pages[:, None] * page_chunks + np.arange(page_chunks)).reshape(-1)
        order = order[order < m]
        taken = order[~forced[order]][:num_rest]
    else:
        candidates = np.flatnonzero(~forced)
        ranked = candidates[np.argsort(-host[candidates], kind="stable")]  # a stable sort: ties -> lower index
        if follow == 0:
            taken = ranked[:num_rest]
        else:
            taken = _with_followers(ranked.tolist(), forced.tolist(), num_rest, follow, follow_top)
    chosen = np.sort(np.concatenate([np.flatnonzero(forced), np.asarray(taken, dtype=np.int64)]))
    return torch.from_numpy(chosen.astype(np.int64))  # on the host: the ids go to the daemon


def _scores_on_host(scores: torch.Tensor) -> np.ndarray:
    """``scores`` as a host array, in one transfer; half-precision scores widened exactly to float32."""
    if scores.dtype in (torch.bfloat16, torch.float16):
        scores = scores.float()
    return scores.detach().cpu().numpy()


def _page_scores_np(scores: np.ndarray, page_chunks: int) -> np.ndarray:
    """``page_scores`` on the host."""
    pad = -scores.shape[0] % page_chunks
    padded = np.concatenate([scores, np.full(pad, -np.inf, dtype=scores.dtype)]) if pad else scores
    return padded.reshape(-1, page_chunks).max(axis=1)


def page_scores(scores: torch.Tensor, page_chunks: int) -> torch.Tensor:
    """``[ceil(m / page_chunks)]``: each physical page's score, the max over its chunks (the last page may be short)."""
    m = scores.shape[0]
    pad = -m % page_chunks
    padded = torch.cat([scores, scores.new_full((pad,), float("-inf"))]) if pad else scores
    return padded.reshape(-1, page_chunks).amax(dim=1)


def _with_followers(order: list[int], forced: list[bool], num_rest: int, follow: int, top: int = 0) -> list[int]:
    """The first ``num_rest`` chunks of ``order``, each of its first ``top`` (every one: 0) followed by up to
    ``follow`` non-forced successors."""
    m = len(forced)
    taken: list[int] = []
    seen = set()
    for i, c in enumerate(order):
        last = c + follow + 1 if top == 0 or i < top else c + 1
        for j in range(c, min(m, last)):
            if len(taken) == num_rest:
                return taken
            if not forced[j] and j not in seen:
                seen.add(j)
                taken.append(j)
    return taken
