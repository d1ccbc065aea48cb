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

from dataclasses import dataclass

import numpy as np

from kvstore.errors import InvalidArgument


@dataclass(frozen=True)
class Request:
    index: int
    prefix: int  # which shared prefix
    suffix: np.ndarray  # int64 tokens


@dataclass(frozen=True)
class TurnEvent:
    time_s: float
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
    lo, hi = (value, value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else tuple(value)
    _positive_int(name, lo)
    _positive_int(name, hi)
    if lo > hi:
        raise InvalidArgument(name, f"empty range ({lo}, {hi})")
    return int(lo), int(hi)


def zipf_probabilities(n: int, alpha: float) -> np.ndarray:
    """``P(rank k) ∝ 1 / k**alpha`` for ranks 1..n."""
    _positive_int("num_prefixes", n)
    if not np.isfinite(alpha) or alpha < 0:
        raise InvalidArgument("alpha", f"must be a finite number >= 0, got {alpha!r}")
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
    """Requests whose prefix follows Zipf popularity (which prefix holds which rank is seeded)."""
    n = _positive_int("num_prefixes", num_prefixes)
    _positive_int("num_requests", num_requests)
    _positive_int("vocab_size", vocab_size)
    lo, hi = _range("suffix_tokens", suffix_tokens)
    rng = np.random.default_rng(seed)
    rank_to_prefix = rng.permutation(n)
    ranks = rng.choice(n, size=num_requests, p=zipf_probabilities(n, alpha))
    out = []
    for i, r in enumerate(ranks.tolist()):
        length = int(rng.integers(lo, hi + 1))
        out.append(Request(i, int(rank_to_prefix[r]), rng.integers(0, vocab_size, length, dtype=np.int64)))
    return out


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
    max_output_tokens: int = 4096,
    seed: int,
) -> list[TurnEvent]:
    """Turn events of ``num_conversations`` conversations, in time order.

    Each turn's output is ``input x ratio`` with a lognormal ratio whose mean
    is ``output_ratio``; at most ``concurrency`` conversations are open at
    once (a new one starts when one ends); between a conversation's turns
    the user is inactive for an exponential time of mean ``mean_gap_s``.
    """
    n = _positive_int("num_conversations", num_conversations)
    t_lo, t_hi = _range("turns", turns)
    conc = _positive_int("concurrency", concurrency)
    f_lo, f_hi = _range("first_input_tokens", first_input_tokens)
    l_lo, l_hi = _range("later_input_tokens", later_input_tokens)
    if not mean_gap_s > 0:
        raise InvalidArgument("mean_gap_s", f"must be > 0, got {mean_gap_s!r}")
    if not output_ratio > 0:
        raise InvalidArgument("output_ratio", f"must be > 0, got {output_ratio!r}")
    if not ratio_sigma >= 0:
        raise InvalidArgument("ratio_sigma", f"must be >= 0, got {ratio_sigma!r}")
    _positive_int("max_output_tokens", max_output_tokens)
    rng = np.random.default_rng(seed)
    mu = np.log(output_ratio) - ratio_sigma**2 / 2  # lognormal with mean output_ratio
    slots = [0.0] * conc  # when each concurrency slot is free again
    events = []
    for c in range(n):
        k = min(range(conc), key=lambda i: slots[i])
        t = slots[k]
        history = 0
        for turn in range(int(rng.integers(t_lo, t_hi + 1))):
            lo, hi = (f_lo, f_hi) if turn == 0 else (l_lo, l_hi)
            inp = int(rng.integers(lo, hi + 1))
            out = int(min(max_output_tokens, max(1, round(inp * rng.lognormal(mu, ratio_sigma)))))
            events.append(TurnEvent(float(t), c, turn, history, inp, out))
            history += inp + out
            t += float(rng.exponential(mean_gap_s))
        slots[k] = t
    events.sort(key=lambda e: (e.time_s, e.conversation, e.turn))
    return events
