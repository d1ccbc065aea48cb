"""Multi-value NIAH: one city given four magic numbers; all four must be named (RULER's MV-NIAH)."""

from __future__ import annotations

from . import niah, ruler

NAME = "multivalue"
NUM_VALUES = 4


def _make(rng, depth):
    (city,) = ruler.distinct_cities(rng, 1)
    numbers = [ruler.random_digits(rng, niah.NUMBER_DIGITS) for _ in range(NUM_VALUES)]
    depths = ruler.needle_depths(rng, NUM_VALUES, depth)
    needles = [(d, niah.needle(city, n)) for d, n in zip(depths, numbers)]
    question = f"\n\nWhat are all the special magic numbers for {city}? The special magic numbers for {city} are"
    meta = {"city": city, "max_new_tokens": 12 * NUM_VALUES}
    return needles, question, numbers, True, list(range(NUM_VALUES)), meta


def example(tokenizer, seed, num_tokens, depth=None, *, encoder=None):
    return ruler.build(NAME, tokenizer, seed, num_tokens, depth, encoder=encoder, make=_make)
