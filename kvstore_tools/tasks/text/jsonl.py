"""Custom tasks from a JSONL file: ``{"prefix": str, "question": str, "answers": [str, ...]}`` per line.

``prefix`` is stored (Re-Prefill loads from it), ``question`` is the suffix,
the text ends where the answer starts; an example is correct when the decoded
text holds one of ``answers``.  Optional fields: ``needle`` (a substring of
``prefix`` that holds the evidence: its chunks are the ones reported and
dropped by drop-needle), ``max_new_tokens`` (int, default 16).  Every line is
checked before any is used; an error names the line and the field.
"""

from __future__ import annotations

import json

import numpy as np

from .base import TextExample, bos_ids

NAME = "file"
FIELDS = {"prefix": str, "question": str, "answers": list, "needle": str, "max_new_tokens": int}
REQUIRED = ("prefix", "question", "answers")


class TaskFileError(ValueError):
    """A JSONL task file that cannot be used; the message names the line and field."""


def read(path: str) -> list[dict]:
    """The checked records of ``path`` (blank lines skipped)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as exc:
        raise TaskFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    records = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            records.append(check_record(line, f"{path}:{number}"))
    if not records:
        raise TaskFileError(f"{path}: no examples")
    return records


def check_record(line: str, where: str) -> dict:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TaskFileError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(rec, dict):
        raise TaskFileError(f"{where}: must be a JSON object, got {type(rec).__name__}")
    for key in REQUIRED:
        if key not in rec:
            raise TaskFileError(f"{where}: field {key!r} is missing")
    for key, value in rec.items():
        if key not in FIELDS:
            raise TaskFileError(f"{where}: field {key!r} is unknown (known: {', '.join(FIELDS)})")
        if not isinstance(value, FIELDS[key]) or isinstance(value, bool):
            raise TaskFileError(f"{where}: field {key!r} must be {FIELDS[key].__name__}, got {type(value).__name__}")
    if not rec["prefix"].strip() or not rec["question"].strip():
        raise TaskFileError(f"{where}: field {'prefix' if not rec['prefix'].strip() else 'question'!r} must not be empty")
    if not rec["answers"] or not all(isinstance(a, str) and a.strip() for a in rec["answers"]):
        raise TaskFileError(f"{where}: field 'answers' must be a non-empty list of non-empty strings")
    if "needle" in rec and rec["needle"] not in rec["prefix"]:
        raise TaskFileError(f"{where}: field 'needle' does not occur in 'prefix'")
    if rec.get("max_new_tokens", 1) < 1:
        raise TaskFileError(f"{where}: field 'max_new_tokens' must be >= 1")
    return rec


def to_example(rec: dict, tokenizer, index: int, path: str) -> TextExample:
    enc = tokenizer.backend.encode(rec["prefix"], add_special_tokens=False)
    bos = bos_ids(tokenizer)  # the model's <bos> first where it expects one
    spans, depth = (), None
    if "needle" in rec:
        start = rec["prefix"].index(rec["needle"])
        end = start + len(rec["needle"])
        ids = [i for i, (a, b) in enumerate(enc.offsets) if a < end and b > start]
        spans = ((bos.size + ids[0], bos.size + ids[-1] + 1),)
        depth = start / max(1, len(rec["prefix"]))
    return TextExample(
        task=f"file:{path}",
        seed=index,
        prefix_tokens=np.concatenate([bos, np.asarray(enc.ids, dtype=np.int64)]),
        suffix_tokens=np.asarray(tokenizer.encode(rec["question"]), dtype=np.int64),
        answers=tuple(rec["answers"]),
        needle_spans=spans,
        depth=depth,
        meta={"max_new_tokens": rec.get("max_new_tokens", 16), "line_index": index},
    )


def examples(path: str, tokenizer, num_examples: int, *, start: int = 0) -> list[TextExample]:
    """Up to ``num_examples`` examples from record ``start`` on (every record is checked first)."""
    records = read(path)
    return [to_example(rec, tokenizer, i, path) for i, rec in enumerate(records) if start <= i < start + num_examples]
