"""Multi-key NIAH: the needle among three distractor needles for other cities (RULER's MK-NIAH)."""

from __future__ import annotations

from . import niah, ruler

NAME = "multikey"
NUM_DISTRACTORS = 3


KEYS = 1 + NUM_DISTRACTORS  # needles a question can ask about (``example(..., ask=k)``)


def _make(rng, depth, ask=0):
    cities = ruler.distinct_cities(rng, KEYS)
    numbers = [ruler.random_digits(rng, niah.NUMBER_DIGITS) for _ in cities]
    depths = ruler.needle_depths(rng, len(cities), depth)
    needles = [(d, niah.needle(c, n)) for d, c, n in zip(depths, cities, numbers)]
    others = [n for i, n in enumerate(numbers) if i != ask]
    meta = {"city": cities[ask], "distractors": others, "max_new_tokens": niah.MAX_NEW_TOKENS}
    return needles, niah.question(cities[ask]), [numbers[ask]], False, [ask], meta


def example(tokenizer, seed, num_tokens, depth=None, *, encoder=None, ask: int = 0):
    """Seed ``seed``'s prefix; the question asks about needle ``ask`` (0: the example's own; the prefix is the
    same for every ``ask``, the others are its distractors)."""
    if isinstance(ask, bool) or not isinstance(ask, int) or not 0 <= ask < KEYS:
        raise ValueError(f"ask must be an int in [0, {KEYS}), got {ask!r}")
    return ruler.build(NAME, tokenizer, seed, num_tokens, depth, encoder=encoder, make=lambda rng, d: _make(rng, d, ask))
