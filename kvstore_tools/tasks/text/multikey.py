"""Multi-key NIAH: the needle among three distractor needles for other cities (RULER's MK-NIAH)."""

from __future__ import annotations

from . import niah, ruler

NAME = "multikey"
NUM_DISTRACTORS = 3


def _make(rng, depth):
    cities = ruler.distinct_cities(rng, 1 + NUM_DISTRACTORS)
    numbers = [ruler.random_digits(rng, niah.NUMBER_DIGITS) for _ in cities]
    depths = ruler.needle_depths(rng, len(cities), depth)
    needles = [(d, niah.needle(c, n)) for d, c, n in zip(depths, cities, numbers)]
    meta = {"city": cities[0], "distractors": numbers[1:], "max_new_tokens": niah.MAX_NEW_TOKENS}
    return needles, niah.question(cities[0]), [numbers[0]], False, [0], meta


def example(tokenizer, seed, num_tokens, depth=None, *, encoder=None):
    return ruler.build(NAME, tokenizer, seed, num_tokens, depth, encoder=encoder, make=_make)
