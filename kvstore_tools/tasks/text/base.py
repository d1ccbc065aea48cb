"""What every real-text task produces, and the pieces they share.

A task is pure: ``example(tokenizer, seed, num_tokens, depth=None)`` builds
one prompt from the seed alone (no files written, no network).  The prompt is
split where Re-Prefill splits it: ``prefix_tokens`` (stored in kvstore,
``num_tokens`` long or at most one filler sentence shorter) and
``suffix_tokens`` (the question, computed on every request).  ``needle_spans``
are the prefix token ranges that hold the evidence; the chunks that overlap
them are the ones a selection must load for the answer to survive.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

# Seeds below TUNING_SEED_LIMIT are for designing and tuning selections;
# reported figures use seeds from EVAL_SEED_START on.  The two never overlap.
TUNING_SEED_LIMIT = 1000
EVAL_SEED_START = 1_000_000


@dataclass(frozen=True)
class TextExample:
    """One raw-text (or chat) prompt over a long prefix, with accepted answers."""

    task: str
    seed: int
    prefix_tokens: np.ndarray  # [n] int64
    suffix_tokens: np.ndarray  # [s] int64, ends where the answer starts
    answers: tuple[str, ...]  # accepted answers (any one suffices unless require_all)
    needle_spans: tuple[tuple[int, int], ...]  # [start, end) prefix token ranges holding the evidence
    depth: float | None = None  # where the (first) needle sits in the filler, 0..1
    require_all: bool = False  # every answer must appear (multi-value)
    meta: dict = field(default_factory=dict)

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.prefix_tokens.size)

    def needle_chunks(self, chunk_tokens: int = 16) -> np.ndarray:
        """Ids of the prefix chunks of ``chunk_tokens`` that overlap a needle span (sorted, unique)."""
        ids = [np.arange(a // chunk_tokens, (b - 1) // chunk_tokens + 1) for a, b in self.needle_spans if b > a]
        return np.unique(np.concatenate(ids)) if ids else np.zeros(0, dtype=np.int64)

    def is_correct(self, text: str) -> bool:
        """Whether generated ``text`` holds an accepted answer (all of them if ``require_all``)."""
        found = [answer_in(a, text) for a in self.answers]
        return all(found) if self.require_all else any(found)


def answer_in(answer: str, text: str) -> bool:
    """``answer`` occurs in ``text``: numbers as whole numbers (12345 is not in 123456; a version
    3.11 is not in 3.11.4), words case-insensitively."""
    answer = answer.strip()
    if not answer:
        return False
    if answer.isdigit():
        return re.search(rf"(?<!\d){answer}(?!\d)", text) is not None
    if re.fullmatch(r"\d+(\.\d+)+", answer):
        return re.search(rf"(?<![\d.]){re.escape(answer)}(?!\.?\d)", text) is not None
    return re.search(rf"(?<!\w){re.escape(answer)}(?!\w)", text, flags=re.IGNORECASE) is not None


def task_rng(task: str, seed: int) -> np.random.Generator:
    """The generator of one example: keyed on the task name and the seed."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return np.random.default_rng([zlib.crc32(task.encode()), int(seed)])


def check_depth(depth) -> float | None:
    if depth is None:
        return None
    if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0 <= depth <= 1:
        raise ValueError(f"depth must be a fraction in [0, 1], got {depth!r}")
    return float(depth)


def random_digits(rng: np.random.Generator, num_digits: int) -> str:
    """A number of exactly ``num_digits`` digits (no leading zero)."""
    return str(int(rng.integers(10 ** (num_digits - 1), 10**num_digits)))


def bos_ids(tokenizer) -> np.ndarray:
    """``[bos]`` where the model expects it before a prompt (Gemma: ``Tokenizer.add_bos_token``), else none."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return np.asarray([bos] if getattr(tokenizer, "add_bos_token", False) and bos is not None else [], dtype=np.int64)


class Encoder:
    """Token ids of text pieces, cached (filler sentences repeat)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[str, np.ndarray] = {}

    def __call__(self, text: str) -> np.ndarray:
        ids = self._cache.get(text)
        if ids is None:
            ids = np.asarray(self.tokenizer.encode(text), dtype=np.int64)
            if len(self._cache) < 100_000:
                self._cache[text] = ids
        return ids


def layout(
    encode: Encoder,
    header: str,
    sentences: Iterator[str],
    needles: Sequence[tuple[float, str]],
    num_tokens: int,
) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """``header``, filler sentences from ``sentences``, and each needle at its depth.

    ``needles`` are ``(depth, text)``: the needle goes at the sentence boundary
    closest to ``depth`` x the filler's length (needles at the same boundary keep
    their order).  The result has at most ``num_tokens`` tokens, filled up to the
    last whole sentence that fits, the model's ``<bos>`` first where it expects
    one (``bos_ids``).  Returns ``(tokens [n], needle spans)`` with the spans in
    the order of ``needles``.
    """
    head = np.concatenate([bos_ids(encode.tokenizer), encode(header)])
    needle_ids = [encode(text) for _, text in needles]
    room = num_tokens - head.size - sum(ids.size for ids in needle_ids)
    if room < 0:
        raise ValueError(f"{num_tokens} tokens cannot hold the header and {len(needles)} needle(s)")
    filler, used = [], 0
    for sentence in sentences:
        ids = encode(sentence)
        if used + ids.size > room:
            break
        filler.append(ids)
        used += ids.size
    bounds = np.concatenate([[0], np.cumsum([f.size for f in filler])])  # token offset of each boundary
    slots = [int(np.abs(bounds - depth * used).argmin()) for depth, _ in needles]
    parts, spans, pos = [head], [None] * len(needles), head.size
    order = sorted(range(len(needles)), key=lambda i: (slots[i], i))
    k = 0
    for b in range(len(filler) + 1):
        while k < len(order) and slots[order[k]] == b:
            i = order[k]
            parts.append(needle_ids[i])
            spans[i] = (pos, pos + needle_ids[i].size)
            pos += needle_ids[i].size
            k += 1
        if b < len(filler):
            parts.append(filler[b])
            pos += filler[b].size
    return np.concatenate(parts).astype(np.int64), spans


def cycle(items: Sequence[str], start: int = 0) -> Iterator[str]:
    i = start
    while True:
        yield items[i % len(items)]
        i += 1


ExampleFn = Callable[..., TextExample]
