"""Needle in a haystack of real prose.

The haystack is the Python Language Reference's prose (``haystack``: CPython's
``pydoc_data/topics.py``, PSF License), read from a seeded starting sentence.
The needle "The special magic number for CITY is NNNNNNN." sits at ``depth``;
the suffix asks "What is the special magic number for CITY? The special magic
number for CITY is".  The answer is the seven digits.
"""

from __future__ import annotations

from .base import Encoder, TextExample, check_depth, cycle, layout, random_digits, task_rng
from .haystack import haystack_source, sentences

NAME = "niah"
HEADER = (
    "Some special magic numbers are hidden within the following text. "
    "Make sure to memorize them. I will quiz you about the numbers afterwards.\n"
)
CITIES = (
    "Chicago",
    "Yangon",
    "Antananarivo",
    "Colombo",
    "Almaty",
    "Sydney",
    "Mexico City",
    "Seattle",
    "Lagos",
    "Amsterdam",
    "Belgrade",
    "Cairo",
    "Baghdad",
    "Damascus",
    "Kigali",
    "Dakar",
    "Sofia",
    "Victoria",
    "Tashkent",
    "Mumbai",
    "Barcelona",
    "Riyadh",
    "Boston",
    "Lima",
    "Lisbon",
    "Vienna",
    "Helsinki",
    "Oslo",
    "Nairobi",
    "Hanoi",
)
NUMBER_DIGITS = 7
MAX_NEW_TOKENS = 10


def needle(city: str, number: str) -> str:
    return f" The special magic number for {city} is {number}."


def question(city: str) -> str:
    return f"\n\nWhat is the special magic number for {city}? The special magic number for {city} is"


def haystack(rng):
    """The prose sentence stream from a seeded start."""
    text = sentences()
    return cycle(text, int(rng.integers(len(text))))


def example(tokenizer, seed: int, num_tokens: int, depth: float | None = None, *, encoder: Encoder | None = None) -> TextExample:
    """The NIAH prompt of ``seed``: the prefix is ``num_tokens`` tokens (or up to one sentence fewer)."""
    depth = check_depth(depth)
    rng = task_rng(NAME, seed)
    city = str(rng.choice(CITIES))
    number = random_digits(rng, NUMBER_DIGITS)
    drawn = float(rng.random())
    depth = drawn if depth is None else depth
    encode = encoder or Encoder(tokenizer)
    prefix, spans = layout(encode, HEADER, haystack(rng), [(depth, needle(city, number))], num_tokens)
    return TextExample(
        task=NAME,
        seed=int(seed),
        prefix_tokens=prefix,
        suffix_tokens=encode(question(city)).copy(),
        answers=(number,),
        needle_spans=tuple(spans),
        depth=depth,
        meta={"city": city, "haystack": haystack_source(), "max_new_tokens": MAX_NEW_TOKENS},
    )
