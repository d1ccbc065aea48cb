"""Seeded workload generators for the benchmarks.

* ``zipf_requests``: many requests over a set of shared prefixes (RAG
  documents, system prompts) with Zipf popularity, each with its own suffix
  - ContiguousKV's evaluation workload.
* ``conversation_trace``: multi-turn conversations whose output/input token
  ratio follows the ShareGPT statistics quoted by Krul (outputs about 6.5x
  longer than inputs), histories growing turn by turn, a bounded number of
  conversations active at once and exponential inactivity gaps.

Everything is a pure function of its arguments and the seed.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from kvstore.contract import InvalidArgument


@dataclass(frozen=True)
class Request:
    index: int
    prefix: int  # which shared prefix
    suffix: np.ndarray  # [suffix_tokens] int64 token ids
    rank: int  # the prefix's popularity rank, 1 = most requested


@dataclass(frozen=True)
class TurnEvent:
    time_s: float  # when the turn's input arrives, from the start of the trace
    conversation: int
    turn: int
    history_tokens: int  # tokens of the conversation before this turn
    input_tokens: int
    output_tokens: int


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidArgument(name, f"must be a positive integer, got {value!r}")
    return int(value)


def _range(name: str, value) -> tuple[int, int]:
    """``(lo, hi)`` inclusive, or one integer for both."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value, value)
    try:
        lo, hi = value
    except (TypeError, ValueError):
        raise InvalidArgument(name, f"must be an integer or a (lo, hi) pair, got {value!r}") from None
    _positive_int(name, lo)
    _positive_int(name, hi)
    if lo > hi:
        raise InvalidArgument(name, f"empty range ({lo}, {hi})")
    return int(lo), int(hi)


def _number(name: str, value, *, minimum: float, inclusive: bool) -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    ok = ok and bool(np.isfinite(value)) and (value >= minimum if inclusive else value > minimum)
    if not ok:
        raise InvalidArgument(name, f"must be a finite number {'>=' if inclusive else '>'} {minimum}, got {value!r}")
    return float(value)


def _rng(seed) -> np.random.Generator:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InvalidArgument("seed", f"must be an integer >= 0, got {seed!r}")
    return np.random.default_rng(int(seed))


def zipf_probabilities(n: int, alpha: float) -> np.ndarray:
    """``P(rank k) ∝ 1 / k**alpha`` for ranks 1..n (index ``k - 1``); ``alpha = 0`` is uniform."""
    n = _positive_int("n", n)
    alpha = _number("alpha", alpha, minimum=0.0, inclusive=True)
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** alpha
    return w / w.sum()


def zipf_requests(
    num_prefixes: int,
    num_requests: int,
    *,
    alpha: float = 1.0,
    seed: int,
    suffix_tokens=(32, 64),
    vocab_size: int,
) -> list[Request]:
    """``num_requests`` requests over prefixes ``0..num_prefixes-1`` with Zipf popularity.

    Which prefix holds which rank is a seeded permutation; each request
    draws its own suffix of ``suffix_tokens`` tokens (an int or an inclusive
    ``(lo, hi)`` range) uniformly from ``[0, vocab_size)``.
    """
    n = _positive_int("num_prefixes", num_prefixes)
    num_requests = _positive_int("num_requests", num_requests)
    vocab_size = _positive_int("vocab_size", vocab_size)
    lo, hi = _range("suffix_tokens", suffix_tokens)
    p = zipf_probabilities(n, alpha)
    rng = _rng(seed)
    rank_to_prefix = rng.permutation(n)
    ranks = rng.choice(n, size=num_requests, p=p)  # 0-based
    lengths = rng.integers(lo, hi + 1, size=num_requests)
    tokens = rng.integers(0, vocab_size, size=int(lengths.sum()), dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths)))
    return [Request(i, int(rank_to_prefix[r]), tokens[starts[i] : starts[i + 1]].copy(), int(r) + 1) for i, r in enumerate(ranks.tolist())]


def conversation_trace(
    num_conversations: int,
    *,
    turns=(2, 8),
    concurrency: int = 8,
    mean_gap_s: float = 30.0,
    first_input_tokens=(64, 512),
    later_input_tokens=(16, 128),
    output_ratio: float = 6.5,
    ratio_sigma: float = 0.6,
    max_output_tokens: int | None = None,
    seed: int,
) -> list[TurnEvent]:
    """Turn events of ``num_conversations`` conversations, in time order.

    * Each turn's output is ``input x ratio`` (at least 1 token, at most
      ``max_output_tokens`` if given) with a lognormal ratio of mean
      ``output_ratio`` and log-spread ``ratio_sigma``, drawn independently of
      the input, so mean output / mean input is ``output_ratio`` too (an
      output cap lowers both).
    * The first turn's input is drawn from ``first_input_tokens`` (the
      document or opening question), later ones from ``later_input_tokens``;
      ``history_tokens`` is the sum of all earlier inputs and outputs.
    * ``concurrency`` slots: a conversation is active from its first turn to
      its last; a slot's next conversation starts an inactivity gap after
      its previous one's last turn.  Gaps (between turns too) are
      exponential with mean ``mean_gap_s``.
    """
    n = _positive_int("num_conversations", num_conversations)
    t_lo, t_hi = _range("turns", turns)
    conc = _positive_int("concurrency", concurrency)
    f_lo, f_hi = _range("first_input_tokens", first_input_tokens)
    l_lo, l_hi = _range("later_input_tokens", later_input_tokens)
    mean_gap_s = _number("mean_gap_s", mean_gap_s, minimum=0.0, inclusive=False)
    output_ratio = _number("output_ratio", output_ratio, minimum=0.0, inclusive=False)
    ratio_sigma = _number("ratio_sigma", ratio_sigma, minimum=0.0, inclusive=True)
    cap = _positive_int("max_output_tokens", max_output_tokens) if max_output_tokens is not None else None
    rng = _rng(seed)
    mu = np.log(output_ratio) - ratio_sigma**2 / 2  # E[lognormal(mu, sigma)] = output_ratio
    slots = [(0.0, k) for k in range(conc)]  # (when the slot is free, slot): a min-heap
    events = []
    for c in range(n):
        free_at, k = heapq.heappop(slots)
        t = free_at + float(rng.exponential(mean_gap_s))
        history = 0
        num_turns = int(rng.integers(t_lo, t_hi + 1))
        for turn in range(num_turns):
            if turn:
                t += float(rng.exponential(mean_gap_s))
            lo, hi = (f_lo, f_hi) if turn == 0 else (l_lo, l_hi)
            inp = int(rng.integers(lo, hi + 1))
            out = max(1, round(inp * float(rng.lognormal(mu, ratio_sigma))))
            if cap is not None:
                out = min(cap, out)
            events.append(TurnEvent(t, c, turn, history, inp, out))
            history += inp + out
        heapq.heappush(slots, (t, k))
    events.sort(key=lambda e: (e.time_s, e.conversation, e.turn))
    return events
