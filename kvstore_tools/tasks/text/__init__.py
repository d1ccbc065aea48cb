"""Real-text recall tasks for a pretrained model, looked up by name.

Every task is ``module.example(tokenizer, seed, num_tokens, depth=None) ->
TextExample``: pure and deterministic per ``(task, seed)``.  ``examples``
draws a list from a seed stream; evaluation uses seeds from
``EVAL_SEED_START`` (1_000_000) on, tuning uses seeds below
``TUNING_SEED_LIMIT`` (1000), so figures are never measured on the examples a
selection was tuned on.

``file:PATH`` names a custom task read from a JSONL file (see ``jsonl``).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

from . import multikey, multiquery, multiturn, multivalue, niah, passkey, vt
from .base import EVAL_SEED_START, TUNING_SEED_LIMIT, Encoder, TextExample, answer_in

# a task is a module, or an object with the same NAME and example (multiturn's question-position variants)
TASKS: dict[str, ModuleType] = {m.NAME: m for m in (passkey, niah, multikey, multivalue, multiquery, vt, multiturn, *multiturn.VARIANTS)}
STREAMS = {"eval": EVAL_SEED_START, "tune": 0}


def get_task(name: str) -> ModuleType:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r} (known: {', '.join(TASKS)}, file:PATH)")
    return TASKS[name]


def seeds(num_examples: int, stream: str = "eval", start: int = 0) -> list[int]:
    """``num_examples`` seeds of ``stream`` ("eval": from 1_000_000 on; "tune": below 1000)."""
    if stream not in STREAMS:
        raise ValueError(f"stream must be one of {', '.join(STREAMS)}, got {stream!r}")
    first = STREAMS[stream] + start
    if stream == "tune" and first + num_examples > TUNING_SEED_LIMIT:
        raise ValueError(f"the tuning stream has seeds below {TUNING_SEED_LIMIT} only")
    return list(range(first, first + num_examples))


def examples(
    task: str,
    tokenizer,
    num_examples: int,
    num_tokens: int,
    *,
    stream: str = "eval",
    start: int = 0,
    depths: Sequence[float] | None = None,
) -> list[TextExample]:
    """``num_examples`` examples of ``task`` from ``stream``; ``depths`` (cycled) sweeps the needle's depth."""
    if task.startswith("file:"):
        from . import jsonl

        return jsonl.examples(task[len("file:") :], tokenizer, num_examples, start=start)
    module = get_task(task)
    encode = Encoder(tokenizer)
    out = []
    for i, seed in enumerate(seeds(num_examples, stream, start)):
        depth = None if not depths else depths[i % len(depths)]
        out.append(module.example(tokenizer, seed, num_tokens, depth, encoder=encode))
    return out


def key_variants(task: str, tokenizer, num_examples: int, num_tokens: int, *, start: int = 0) -> list[list]:
    """Per evaluation example of ``task``, the same prefix asked about each of its keys (a task with ``KEYS``:
    multikey's four needles); ValueError naming the task for one whose prefix answers one question."""
    module = get_task(task) if not task.startswith("file:") else None
    if module is None or not hasattr(module, "KEYS"):
        raise ValueError(
            f"{task} asks one question per prefix (tasks with several keys: {', '.join(n for n, m in TASKS.items() if hasattr(m, 'KEYS'))})"
        )
    encode = Encoder(tokenizer)
    return [
        [module.example(tokenizer, seed, num_tokens, None, encoder=encode, ask=k) for k in range(module.KEYS)]
        for seed in seeds(num_examples, "eval", start)
    ]


__all__ = ["EVAL_SEED_START", "TASKS", "TUNING_SEED_LIMIT", "TextExample", "answer_in", "examples", "get_task", "key_variants", "seeds"]
