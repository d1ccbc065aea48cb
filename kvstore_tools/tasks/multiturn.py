"""Multi-turn recall: a conversation whose user turns each ask about a record.

A turn is ``USER <content> ASSISTANT value EOT``.  The content holds a few
records ``REC key value`` and one question ``QUERY key`` with filler runs
between the items; the question stands before the turn's records, between
them, or after them (``question_position``).  It asks about a record given in
an earlier turn or earlier in the same turn; each key is asked at most once
and keys are distinct across the conversation, so the answer is stated in
exactly one record.  The assistant's answer token is part of the history the
later turns read (histories carry the correct answers, i.e. a model that
answered every earlier turn right).

A held-out example's prefix is ``BOS`` and the earlier turns (plus filler to
the requested length); its suffix is the last turn up to ``ASSISTANT``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import vocab as V
from .base import Example, TrainingSequence, as_tokens

NAME = "multiturn"
POSITIONS = ("before", "middle", "after")
RECORDS_PER_TURN = (2, 10)
MAX_GAP_CHOICES = (2, 8, 24)  # per conversation: filler run lengths are uniform in [0, max_gap]
SAME_TURN_PROB = 0.25


@dataclass
class _Turn:
    tokens: np.ndarray  # USER ... ASSISTANT value EOT
    answer: int
    target_key: int
    record_offsets: dict  # key -> offset of its REC within tokens
    question_position: str
    same_turn: bool


class _Conversation:
    """Draws turns one after another; keeps which keys exist and which were asked."""

    def __init__(self, rng: np.random.Generator, max_gap: int | None = None):
        self.rng = rng
        self.max_gap = int(rng.choice(MAX_GAP_CHOICES)) if max_gap is None else max_gap
        self.unused_keys = list(rng.permutation(V.KEYS))
        self.askable: list[tuple[int, int]] = []  # (key, value) of earlier turns, not yet asked

    def draw_turn(self) -> _Turn | None:
        rng = self.rng
        n = int(rng.integers(RECORDS_PER_TURN[0], RECORDS_PER_TURN[1] + 1))
        if n > len(self.unused_keys):
            return None
        keys = [int(self.unused_keys.pop()) for _ in range(n)]
        values = [int(v) for v in rng.choice(V.VALUES, size=n)]
        choices = POSITIONS if self.askable else POSITIONS[1:]
        position = str(rng.choice(choices))
        q_index = {"before": 0, "after": n, "middle": int(rng.integers(1, n))}[position]
        same = q_index > 0 and (not self.askable or rng.random() < SAME_TURN_PROB)
        if same:
            i = int(rng.integers(q_index))
            key, answer = keys[i], values[i]
        else:
            key, answer = self.askable.pop(int(rng.integers(len(self.askable))))
        items = [[V.REC, k, v] for k, v in zip(keys, values)]
        items.insert(q_index, [V.QUERY, key])
        parts, offsets, pos = [[V.USER]], {}, 1
        for j, item in enumerate(items):
            gap = V.filler(rng, int(rng.integers(0, self.max_gap + 1)))
            parts.append(gap)
            pos += gap.size
            if item[0] == V.REC:
                offsets[item[1]] = pos
            parts.append(item)
            pos += len(item)
        parts.append(V.filler(rng, int(rng.integers(0, self.max_gap + 1))))
        parts.append([V.ASSISTANT, answer, V.EOT])
        self.askable.extend((k, v) for k, v in zip(keys, values) if not (same and k == key))
        return _Turn(as_tokens(parts), answer, key, offsets, position, same)


def example(rng: np.random.Generator, num_tokens: int) -> Example:
    """A conversation of exactly ``num_tokens`` tokens; its last turn's question is the example's.

    Turns are drawn until the next would not fit; the last one kept becomes
    the suffix and the history is padded with filler (between the last
    history turn and the final turn) to the requested length.
    """
    # filler runs stay short enough for several turns in short conversations
    conv = _Conversation(rng, max_gap=min(int(rng.choice(MAX_GAP_CHOICES)), max(2, num_tokens // 64)))
    turns, total = [], 1
    while True:
        turn = conv.draw_turn()
        if turn is None or total + turn.tokens.size > num_tokens:
            break
        turns.append(turn)
        total += turn.tokens.size
    if len(turns) < 2:
        raise ValueError(f"num_tokens={num_tokens} is too short for a conversation of two turns")
    history, final = turns[:-1], turns[-1]
    suffix = final.tokens[:-2]  # up to ASSISTANT, where the answer is predicted
    starts = 1 + np.cumsum([0] + [t.tokens.size for t in history])
    record_pos = {k: int(s) + off for t, s in zip(history, starts) for k, off in t.record_offsets.items()}
    pad = num_tokens - int(starts[-1]) - suffix.size
    prefix = as_tokens([[V.BOS]] + [t.tokens for t in history] + [V.filler(rng, pad)])
    spans = () if final.same_turn else ((record_pos[final.target_key], record_pos[final.target_key] + 3),)
    return Example(
        task=NAME,
        prefix=prefix,
        suffix=suffix,
        answer=final.answer,
        answer_spans=spans,
        meta={"question_position": final.question_position, "same_turn": final.same_turn, "num_turns": len(turns)},
    )


def training_sequence(rng: np.random.Generator, num_tokens: int) -> TrainingSequence:
    """A conversation of ``num_tokens`` tokens (filler-padded); every assistant answer is supervised."""
    conv = _Conversation(rng)
    parts, positions, pos = [[V.BOS]], [], 1
    while True:
        turn = conv.draw_turn()
        if turn is None or pos + turn.tokens.size > num_tokens:
            break
        parts.append(turn.tokens)
        positions.append(pos + turn.tokens.size - 3)  # ASSISTANT predicts the answer
        pos += turn.tokens.size
    parts.append(V.filler(rng, num_tokens - pos))
    return TrainingSequence(tokens=as_tokens(parts), answer_positions=np.asarray(positions, dtype=np.int64))
