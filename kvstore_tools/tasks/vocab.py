"""The fixed token vocabulary of the synthetic recall tasks (no tokenizer).

Layout of the ``VOCAB_SIZE = 512`` ids::

    0..15     special tokens (BOS, record / question / turn / example markers)
    16..271   KEYS:   record keys, and the input symbols of few-shot examples
    272..335  VALUES: single-token record values, and few-shot labels
    336..511  FILLER: distractor text between records
"""

from __future__ import annotations

import numpy as np

VOCAB_SIZE = 512

PAD = 0
BOS = 1
REC = 2  # a record follows: REC key value
QUERY = 3  # a question follows: QUERY key
USER = 4  # a user turn starts
ASSISTANT = 5  # the assistant's answer follows
EOT = 6  # end of a turn
EXAMPLE = 7  # a few-shot example starts: EXAMPLE x1 x2 x3 LABEL y
LABEL = 8

KEYS = np.arange(16, 272)
VALUES = np.arange(272, 336)
FILLER = np.arange(336, 512)

NUM_KEYS = KEYS.size
NUM_VALUES = VALUES.size


def filler(rng: np.random.Generator, num_tokens: int) -> np.ndarray:
    """``num_tokens`` random filler tokens."""
    return rng.choice(FILLER, size=num_tokens)


def split_total(rng: np.random.Generator, total: int, parts: int) -> np.ndarray:
    """A uniformly random composition of ``total`` into ``parts`` non-negative integers."""
    if parts <= 0:
        return np.zeros(0, dtype=np.int64)
    cuts = np.sort(rng.integers(0, total + 1, size=parts - 1))
    return np.diff(np.concatenate([[0], cuts, [total]])).astype(np.int64)
