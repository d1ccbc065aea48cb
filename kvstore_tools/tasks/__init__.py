"""Synthetic long-context recall tasks over a fixed vocabulary (``vocab``), seeded, no downloads.

Each task module offers ``example(rng, num_tokens) -> Example`` (a held-out
question; prefix and suffix together are ``num_tokens`` tokens) and
``training_sequence(rng, num_tokens) -> TrainingSequence`` (a sequence of
``num_tokens`` with many supervised answer positions).

Training and evaluation draw from disjoint seed streams: ``rng_for(purpose,
seed)`` keys numpy's SeedSequence on both the purpose ("train" / "eval") and
the seed.
"""

from __future__ import annotations

import zlib
from types import ModuleType

import numpy as np

from . import fewshot, kv_retrieval, multiturn, vocab
from .base import Example, TrainingSequence

TASKS: dict[str, ModuleType] = {kv_retrieval.NAME: kv_retrieval, multiturn.NAME: multiturn, fewshot.NAME: fewshot}
PURPOSES = ("train", "eval")


def get_task(name: str) -> ModuleType:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r} (known: {', '.join(TASKS)})")
    return TASKS[name]


def rng_for(purpose: str, seed: int, task: str = "") -> np.random.Generator:
    """The generator of ``purpose`` ("train" or "eval"); the two never share a stream."""
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {PURPOSES}, got {purpose!r}")
    return np.random.default_rng([zlib.crc32(purpose.encode()), zlib.crc32(task.encode()), int(seed)])


def examples(task: str, num_examples: int, num_tokens: int, seed: int = 0) -> list[Example]:
    """``num_examples`` held-out examples of ``task``, each ``num_tokens`` tokens of prefix and suffix."""
    module = get_task(task)
    rng = rng_for("eval", seed, task)
    return [module.example(rng, num_tokens) for _ in range(num_examples)]


__all__ = ["TASKS", "Example", "TrainingSequence", "examples", "get_task", "rng_for", "vocab"]
