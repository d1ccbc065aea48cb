"""Multi-query NIAH: four cities' numbers hidden, all four asked at once (RULER's MQ-NIAH)."""

from __future__ import annotations

from . import niah, ruler

NAME = "multiquery"
NUM_QUERIES = 4


def _make(rng, depth):
    cities = ruler.distinct_cities(rng, NUM_QUERIES)
    numbers = [ruler.random_digits(rng, niah.NUMBER_DIGITS) for _ in cities]
    depths = ruler.needle_depths(rng, NUM_QUERIES, depth)
    needles = [(d, niah.needle(c, n)) for d, c, n in zip(depths, cities, numbers)]
    names = ", ".join(cities[:-1]) + f" and {cities[-1]}"
    question = f"\n\nWhat are the special magic numbers for {names}? The special magic numbers for {names} are"
    meta = {"cities": cities, "max_new_tokens": 12 * NUM_QUERIES}
    return needles, question, numbers, True, list(range(NUM_QUERIES)), meta


def example(tokenizer, seed, num_tokens, depth=None, *, encoder=None):
    return ruler.build(NAME, tokenizer, seed, num_tokens, depth, encoder=encoder, make=_make)
