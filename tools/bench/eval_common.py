"""What the two accuracy benchmarks share (``accuracy`` and ``text_accuracy``).

The chunk size and plain selectors they run, the BUDGET of a
``SELECTOR@BUDGET`` path, the rows left when chunks are dropped, and the
Wilson interval every accuracy is printed with; and the pretrained-model
loading the Krul benches (``restore``, ``estimator``) share.
"""

from __future__ import annotations

import math

import numpy as np
import torch

SELECTORS = ("summary", "exact", "recent")
CHUNK_TOKENS = 16


def budget_fraction(budget: str, path: str) -> float:
    """The BUDGET of a SELECTOR@BUDGET path: a fraction in (0, 1]."""
    try:
        value = float(budget)
    except ValueError:
        raise ValueError(f"budget of {path!r} is not a number") from None
    if not 0 < value <= 1:
        raise ValueError(f"budget of {path!r} must be a fraction in (0, 1]")
    return value


def wilson_interval(correct: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95% for z = 1.96)."""
    if total == 0:
        return 0.0, 1.0
    p = correct / total
    denom = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denom
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def keep_rows_without(num_prefix: int, drop_chunks: np.ndarray, chunk_tokens: int = CHUNK_TOKENS) -> torch.Tensor:
    """Prefix row ids outside the chunks ``drop_chunks``."""
    keep = np.ones(num_prefix, dtype=bool)
    for c in drop_chunks:
        keep[c * chunk_tokens : (c + 1) * chunk_tokens] = False
    return torch.from_numpy(np.flatnonzero(keep))


def load_pretrained(name: str, threads: int):
    """``zoo.load(name)`` in float32 on ``threads`` torch threads; an unknown or missing model is a ``BenchError``."""
    from engine_client.model import zoo

    from .io_jobs import BenchError

    torch.set_num_threads(threads)
    try:
        return zoo.load(name, dtype=torch.float32)
    except (zoo.UnknownModel, zoo.ModelNotInstalled) as exc:
        raise BenchError(str(exc)) from None
