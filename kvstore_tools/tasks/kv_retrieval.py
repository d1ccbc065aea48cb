"""Key-value retrieval over a long document.

The document is ``BOS`` then records ``REC key value`` with runs of filler
between them; keys are distinct within a document, values are single tokens
(and may repeat).  The question is ``QUERY key``; the answer is its value.
The number of records varies per document, between ``n/64`` and ``n/8`` for a
document of ``n`` tokens (at most the 256 keys of the vocabulary).
"""

from __future__ import annotations

import numpy as np

from . import vocab as V
from .base import Example, TrainingSequence, as_tokens

NAME = "kv"
RECORD_TOKENS = 3  # REC key value
QUESTION_TOKENS = 2  # QUERY key


def _num_records(rng: np.random.Generator, doc_tokens: int) -> int:
    hi = max(1, min(V.NUM_KEYS, doc_tokens // 8, doc_tokens // RECORD_TOKENS))
    lo = min(hi, max(1, doc_tokens // 64))
    return int(rng.integers(lo, hi + 1))


def document(rng: np.random.Generator, doc_tokens: int, num_records: int | None = None):
    """``(tokens [doc_tokens], keys [r], values [r], record_starts [r])`` of one document (no BOS)."""
    if num_records is None:
        num_records = _num_records(rng, doc_tokens)
    if num_records * RECORD_TOKENS > doc_tokens or num_records > V.NUM_KEYS:
        raise ValueError(f"{num_records} records do not fit in {doc_tokens} tokens")
    keys = rng.choice(V.KEYS, size=num_records, replace=False)
    values = rng.choice(V.VALUES, size=num_records)
    gaps = V.split_total(rng, doc_tokens - RECORD_TOKENS * num_records, num_records + 1)
    parts, starts, pos = [], [], 0
    for i in range(num_records):
        parts.append(V.filler(rng, gaps[i]))
        pos += gaps[i]
        starts.append(pos)
        parts.append([V.REC, keys[i], values[i]])
        pos += RECORD_TOKENS
    parts.append(V.filler(rng, gaps[-1]))
    return as_tokens(parts), keys, values, np.asarray(starts, dtype=np.int64)


def example(rng: np.random.Generator, num_tokens: int, num_records: int | None = None) -> Example:
    """A prefix and a question about one of its records, ``num_tokens`` tokens in all."""
    doc, keys, values, starts = document(rng, num_tokens - 1 - QUESTION_TOKENS, num_records)
    target = int(rng.integers(keys.size))
    start = 1 + int(starts[target])  # after BOS
    return Example(
        task=NAME,
        prefix=as_tokens([[V.BOS], doc]),
        suffix=np.array([V.QUERY, keys[target]], dtype=np.int64),
        answer=int(values[target]),
        answer_spans=((start, start + RECORD_TOKENS),),
        meta={"num_records": int(keys.size), "record_start": start},
    )


def training_sequence(rng: np.random.Generator, num_tokens: int) -> TrainingSequence:
    """A document then many ``QUERY key value`` pairs, every value supervised (multi-query recall)."""
    num_queries = max(2, num_tokens // 32)
    doc_tokens = num_tokens - 3 * num_queries  # BOS + doc + queries without the last value
    doc, keys, values, _ = document(rng, doc_tokens)
    asked = rng.choice(keys.size, size=num_queries, replace=num_queries > keys.size)
    qa = np.stack([np.full(num_queries, V.QUERY), keys[asked], values[asked]], axis=1)  # [q, 3]: QUERY key value
    tokens = as_tokens([[V.BOS], doc, qa.reshape(-1)[:-1]])
    positions = 1 + doc_tokens + 1 + 3 * np.arange(num_queries)  # each key predicts its value
    return TrainingSequence(tokens=tokens, answer_positions=positions[positions < num_tokens - 1])
