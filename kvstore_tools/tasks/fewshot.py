"""Few-shot rule induction: many labelled examples of a hidden rule, then a query.

An example is ``EXAMPLE x1 x2 x3 LABEL y``.  Per prefix a rule is drawn: a
set of ``NUM_SYMBOLS`` input symbols, ``NUM_LABELS`` labels, a hidden input
position ``j`` and a random map ``M`` from symbols to labels; ``y = M[x_j]``.
The other two inputs are distractors.  The query is an unlabelled example
whose ``x_j`` occurs at position ``j`` in the prefix; the answer is its
label.  The answer spans are every prefix example sharing the query's
``x_j`` (the evidence for ``M[x_j]``).
"""

from __future__ import annotations

import numpy as np

from . import vocab as V
from .base import Example, TrainingSequence, as_tokens

NAME = "fewshot"
NUM_SYMBOLS = 24
NUM_LABELS = 8
NUM_INPUTS = 3
EXAMPLE_TOKENS = NUM_INPUTS + 3  # EXAMPLE x1 x2 x3 LABEL y


class _Rule:
    def __init__(self, rng: np.random.Generator):
        self.symbols = rng.choice(V.KEYS, size=NUM_SYMBOLS, replace=False)
        self.labels = rng.choice(V.VALUES, size=NUM_LABELS, replace=False)
        self.mapping = rng.integers(NUM_LABELS, size=NUM_SYMBOLS)  # symbol index -> label index
        self.position = int(rng.integers(NUM_INPUTS))

    def draw(self, rng: np.random.Generator, num_examples: int):
        """``(tokens [num_examples, EXAMPLE_TOKENS], key symbol index [num_examples])``."""
        x = rng.integers(NUM_SYMBOLS, size=(num_examples, NUM_INPUTS))
        key = x[:, self.position]
        y = self.labels[self.mapping[key]]
        n = num_examples
        rows = np.column_stack([np.full(n, V.EXAMPLE), self.symbols[x], np.full(n, V.LABEL), y])
        return rows.astype(np.int64), key


def example(rng: np.random.Generator, num_tokens: int) -> Example:
    """BOS, a little filler, labelled examples, then the query: ``num_tokens`` tokens in all."""
    rule = _Rule(rng)
    prefix_tokens = num_tokens - (EXAMPLE_TOKENS - 1)
    num_examples = (prefix_tokens - 1) // EXAMPLE_TOKENS
    if num_examples < 1:
        raise ValueError(f"num_tokens={num_tokens} holds no example")
    lead = prefix_tokens - 1 - num_examples * EXAMPLE_TOKENS
    rows, keys = rule.draw(rng, num_examples)
    # the query's rule input must have been seen at the rule position
    query_key = int(rng.choice(np.unique(keys)))
    query, _ = rule.draw(rng, 1)
    query[0, 1 + rule.position] = rule.symbols[query_key]
    first = 1 + lead
    spans = tuple((first + EXAMPLE_TOKENS * int(i), first + EXAMPLE_TOKENS * (int(i) + 1)) for i in np.flatnonzero(keys == query_key))
    return Example(
        task=NAME,
        prefix=as_tokens([[V.BOS], V.filler(rng, lead), rows.reshape(-1)]),
        suffix=query[0, :-1].copy(),  # up to LABEL
        answer=int(rule.labels[rule.mapping[query_key]]),
        answer_spans=spans,
        meta={"rule_position": rule.position, "num_examples": num_examples, "evidence": len(spans)},
    )


def training_sequence(rng: np.random.Generator, num_tokens: int) -> TrainingSequence:
    """Labelled examples filling ``num_tokens``; each label whose rule input was seen before is supervised."""
    rule = _Rule(rng)
    num_examples = (num_tokens - 1) // EXAMPLE_TOKENS
    lead = num_tokens - 1 - num_examples * EXAMPLE_TOKENS
    rows, keys = rule.draw(rng, num_examples)
    seen_before = np.zeros(num_examples, dtype=bool)
    _, first_index = np.unique(keys, return_index=True)
    seen_before[:] = True
    seen_before[first_index] = False
    label_pos = 1 + lead + EXAMPLE_TOKENS * np.arange(num_examples) + EXAMPLE_TOKENS - 2  # LABEL predicts y
    return TrainingSequence(
        tokens=as_tokens([[V.BOS], V.filler(rng, lead), rows.reshape(-1)]),
        answer_positions=label_pos[seen_before],
    )
