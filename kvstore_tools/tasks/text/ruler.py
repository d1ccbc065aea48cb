"""What the RULER-style variants share: several magic-number needles in the NIAH haystack."""

from __future__ import annotations

import numpy as np

from . import niah
from .base import Encoder, TextExample, check_depth, layout, random_digits, task_rng


def distinct_cities(rng: np.random.Generator, k: int) -> list[str]:
    return [str(c) for c in rng.choice(niah.CITIES, size=k, replace=False)]


def needle_depths(rng: np.random.Generator, k: int, depth: float | None) -> list[float]:
    """``k`` depths: the first at ``depth`` (seeded if None), the others seeded."""
    first = check_depth(depth)
    drawn = rng.random(k)
    return [float(drawn[0]) if first is None else first] + [float(x) for x in drawn[1:]]


def build(name: str, tokenizer, seed: int, num_tokens: int, depth, *, encoder, make) -> TextExample:
    """``make(rng, depths?) -> (needles [(depth, text)], question, answers, require_all, evidence ids, meta)``.

    ``evidence ids`` index ``needles``: the spans the answer needs (distractors are not evidence).
    """
    rng = task_rng(name, seed)
    needles, question, answers, require_all, evidence, meta = make(rng, depth)
    encode = encoder or Encoder(tokenizer)
    prefix, spans = layout(encode, niah.HEADER, niah.haystack(rng), needles, num_tokens)
    return TextExample(
        task=name,
        seed=int(seed),
        prefix_tokens=prefix,
        suffix_tokens=encode(question).copy(),
        answers=tuple(answers),
        needle_spans=tuple(spans[i] for i in evidence),
        depth=needles[evidence[0]][0],
        require_all=require_all,
        meta={**meta, "haystack": niah.haystack_source()},
    )


__all__ = ["build", "distinct_cities", "needle_depths", "random_digits"]
