"""What every synthetic task produces: held-out examples and training sequences."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Example:
    """One question over a long shared prefix.

    The model reads ``prefix`` then ``suffix``; the logits at the last suffix
    token must put ``answer`` first.  ``answer_spans`` are the ``[start, end)``
    token ranges of the prefix that hold the answer record(s) (empty when the
    answer is only in the suffix); dropping the chunks that overlap them must
    leave the question unanswerable.
    """

    task: str
    prefix: np.ndarray  # [n] int64, starts with BOS
    suffix: np.ndarray  # [s] int64, ends where the answer token is predicted
    answer: int
    answer_spans: tuple[tuple[int, int], ...]
    meta: dict = field(default_factory=dict)  # task-specific facts (question position, record count, ...)

    def answer_chunks(self, chunk_tokens: int = 16) -> np.ndarray:
        """Ids of the prefix chunks of ``chunk_tokens`` that overlap an answer span (sorted, unique)."""
        ids = [np.arange(a // chunk_tokens, (b - 1) // chunk_tokens + 1) for a, b in self.answer_spans]
        return np.unique(np.concatenate(ids)) if ids else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class TrainingSequence:
    """A training sequence with supervised positions: ``logits[p]`` must predict ``tokens[p + 1]``."""

    tokens: np.ndarray  # [T] int64
    answer_positions: np.ndarray  # [a] int64, each < T - 1


def as_tokens(parts) -> np.ndarray:
    """Concatenate token lists / arrays into one int64 array."""
    return np.concatenate([np.asarray(p, dtype=np.int64).reshape(-1) for p in parts]) if parts else np.zeros(0, np.int64)
