"""Variable tracking: a chain "VAR A = 12345." "VAR B = VAR A." ... hidden in prose; name every variable
holding the value (RULER's VT, one chain of four hops)."""

from __future__ import annotations

from . import ruler

NAME = "vt"
NUM_HOPS = 4
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _make(rng, depth):
    names = ["".join(rng.choice(list(LETTERS), size=5)) for _ in range(NUM_HOPS + 1)]
    value = ruler.random_digits(rng, 5)
    statements = [f" VAR {names[0]} = {value}."] + [f" VAR {names[i]} = VAR {names[i - 1]}." for i in range(1, NUM_HOPS + 1)]
    start = ruler.needle_depths(rng, 1, depth)[0]
    depths = sorted([start] + [float(x) for x in rng.uniform(start, 1, NUM_HOPS)])  # the chain in order
    needles = list(zip(depths, statements))
    question = (
        f"\n\nQuestion: Find all variables that are assigned the value {value} in the text above. "
        f"Answer: According to the chain of variables assigned in the text above, {NUM_HOPS + 1} variables "
        f"are assigned the value {value}, they are:"
    )
    meta = {"value": value, "max_new_tokens": 8 * (NUM_HOPS + 1)}
    return needles, question, names, True, list(range(NUM_HOPS + 1)), meta


def example(tokenizer, seed, num_tokens, depth=None, *, encoder=None):
    return ruler.build(NAME, tokenizer, seed, num_tokens, depth, encoder=encoder, make=_make)
