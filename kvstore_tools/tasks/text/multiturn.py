"""Multi-turn recall in the chat template: the needle in an earlier user turn, the question in the last.

Each earlier turn shares a passage of the NIAH haystack and gets a short
assistant reply; the needle "The special magic number for CITY is NNNNNNN."
ends the turn nearest ``depth``.  The prefix is the rendered conversation so
far; the suffix is the last user turn, the assistant header and the answer's
opening words.  (With the full KV this small model answers chat-formatted
recall less reliably than raw text: it is for conversation work, not the
headline.)

``multiturn-qbegin``, ``multiturn-qmiddle`` and ``multiturn-qend`` are
LoopServe's question-position variant: the last user turn brings a new
passage of ``SENTENCES_PER_TURN`` sentences with the question before it, in
its middle or after it; the assistant's answer opens as in ``multiturn``
(without the opening this model replies with the history's own assistant
turn, full KV or not).
"""

from __future__ import annotations

import numpy as np

from . import niah
from .base import Encoder, TextExample, check_depth, random_digits, task_rng

NAME = "multiturn"
SENTENCES_PER_TURN = 6
REPLY = "Thank you, I have read this passage."
QUESTION_AT = ("begin", "middle", "end")


def _render(tokenizer, messages, add_generation_prompt):
    return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)


def example(
    tokenizer, seed: int, num_tokens: int, depth: float | None = None, *, encoder: Encoder | None = None, question_at: str | None = None
) -> TextExample:
    """``question_at`` (one of ``QUESTION_AT``): the question-position variant; None: the question alone, answer opened."""
    if question_at is not None and question_at not in QUESTION_AT:
        raise ValueError(f"question_at must be one of {', '.join(QUESTION_AT)}, got {question_at!r}")
    depth = check_depth(depth)
    rng = task_rng(NAME, seed)
    city = str(rng.choice(niah.CITIES))
    number = random_digits(rng, niah.NUMBER_DIGITS)
    drawn = float(rng.random())
    depth = drawn if depth is None else depth
    stream = niah.haystack(rng)
    encode = encoder or Encoder(tokenizer)
    room = num_tokens - encode(niah.needle(city, number)).size
    turns = []  # user passages, added while the rendered conversation fits
    while True:
        candidate = turns + ["".join(next(stream) for _ in range(SENTENCES_PER_TURN)).strip()]
        if len(tokenizer.encode(_render(tokenizer, _messages(candidate, None, 0), False))) > room:
            break
        turns = candidate
    if not turns:
        raise ValueError(f"{num_tokens} tokens cannot hold one turn")
    while True:
        at = min(len(turns) - 1, int(round(depth * (len(turns) - 1))))
        prefix_text = _render(tokenizer, _messages(turns, (at, niah.needle(city, number)), 0), False)
        enc = tokenizer.backend.encode(prefix_text, add_special_tokens=False)
        if len(enc.ids) <= num_tokens or len(turns) == 1:
            break
        turns = turns[:-1]
    if len(enc.ids) > num_tokens:
        raise ValueError(f"{num_tokens} tokens cannot hold one turn")
    ask = f"What is the special magic number for {city}?"
    if question_at is None:
        last = [{"role": "user", "content": ask}]
    else:  # a new passage from the same stream, the question placed in it
        passage = [next(stream).strip() for _ in range(SENTENCES_PER_TURN)]
        cut = {"begin": 0, "middle": SENTENCES_PER_TURN // 2, "end": SENTENCES_PER_TURN}[question_at]
        last = [{"role": "user", "content": " ".join([*passage[:cut], ask, *passage[cut:]])}]
    full = _render(tokenizer, _messages(turns, (at, niah.needle(city, number)), 0) + last, True)
    if not full.startswith(prefix_text):
        raise ValueError("the chat template does not render the conversation as a prefix of its continuation")
    suffix_text = full[len(prefix_text) :] + f"The special magic number for {city} is"
    start = prefix_text.index(niah.needle(city, number).strip())
    end = start + len(niah.needle(city, number).strip())
    span = [i for i, (a, b) in enumerate(enc.offsets) if a < end and b > start]
    return TextExample(
        task=NAME if question_at is None else f"{NAME}-q{question_at}",
        seed=int(seed),
        prefix_tokens=np.asarray(enc.ids, dtype=np.int64),
        suffix_tokens=encode(suffix_text).copy(),
        answers=(number,),
        needle_spans=((span[0], span[-1] + 1),),
        depth=depth,
        meta={
            "city": city,
            "turns": len(turns),
            "needle_turn": at,
            "max_new_tokens": niah.MAX_NEW_TOKENS,
            **({"question_at": question_at} if question_at else {}),
        },
    )


class QuestionAt:
    """The task ``multiturn-q{where}``: ``example`` with the question at ``where`` in the last turn."""

    def __init__(self, where: str):
        self.NAME = f"{NAME}-q{where}"
        self.where = where

    def example(self, tokenizer, seed, num_tokens, depth=None, *, encoder=None) -> TextExample:
        # the same conversation and needle as ``multiturn`` at this seed: only the last turn differs
        return example(tokenizer, seed, num_tokens, depth, encoder=encoder, question_at=self.where)


VARIANTS = tuple(QuestionAt(w) for w in QUESTION_AT)


def _messages(turns, needle, _unused):
    out = []
    for i, passage in enumerate(turns):
        content = passage + (needle[1] if needle is not None and needle[0] == i else "")
        out += [{"role": "user", "content": content}, {"role": "assistant", "content": REPLY}]
    return out
