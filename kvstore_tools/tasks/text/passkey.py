"""Pass-key retrieval in raw text.

A fixed instruction, repeated filler sentences ("The grass is green. The sky
is blue. ..."), the needle "The pass key is NNNNN. Remember it." at ``depth`` of the
filler, and the question as the suffix: "What is the pass key? The pass key
is".  The answer is the five digits.  (Repeating the key after the needle,
"NNNNN is the pass key.", makes this model answer "the pass key." instead:
9/20 at 1k tokens with the full KV; and a blank line before the question
makes it answer "a magical key..." when the needle is late: 12/20.  The
question follows the filler after a space, checked on tuning seeds.)
"""

from __future__ import annotations

from .base import Encoder, TextExample, check_depth, cycle, layout, random_digits, task_rng

NAME = "passkey"
HEADER = (
    "There is an important info hidden inside a lot of irrelevant text. "
    "Find it and memorize it. I will quiz you about the important information there."
)
FILLER = (
    " The grass is green.",
    " The sky is blue.",
    " The sun is yellow.",
    " Here we go.",
    " There and back again.",
)
QUESTION = " What is the pass key? The pass key is"
KEY_DIGITS = 5
MAX_NEW_TOKENS = 8


def needle(key: str) -> str:
    return f" The pass key is {key}. Remember it."


def example(tokenizer, seed: int, num_tokens: int, depth: float | None = None, *, encoder: Encoder | None = None) -> TextExample:
    """The pass-key prompt of ``seed``: the prefix is ``num_tokens`` tokens (or one filler sentence fewer)."""
    depth = check_depth(depth)
    rng = task_rng(NAME, seed)
    key = random_digits(rng, KEY_DIGITS)
    drawn = float(rng.random())
    depth = drawn if depth is None else depth
    encode = encoder or Encoder(tokenizer)
    prefix, spans = layout(encode, HEADER, cycle(FILLER), [(depth, needle(key))], num_tokens)
    return TextExample(
        task=NAME,
        seed=int(seed),
        prefix_tokens=prefix,
        suffix_tokens=encode(QUESTION).copy(),
        answers=(key,),
        needle_spans=tuple(spans),
        depth=depth,
        meta={"key": key, "max_new_tokens": MAX_NEW_TOKENS},
    )
