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

from .io_jobs import BenchError

SELECTORS = ("summary", "exact", "recent")
CHUNK_TOKENS = 16
DEFAULT_BUDGET = 0.05  # a path named without one: the budget the accuracy target is set at


def is_path_system(name: str) -> bool:
    """Whether ``name`` is what a SYSTEM@BUDGET path may name: a plain selector or a named system (old names included)."""
    from engine_client.reprefill.systems import is_system

    return name in SELECTORS or is_system(name)


def path_config(name: str, budget: float, period_layers: int):
    """The ``ReprefillConfig`` of a SYSTEM@BUDGET path: a plain selector at ``period_layers``, or a named
    system as it is named (``engine_client.reprefill.systems``; an old name says its new one on stderr)."""
    import sys
    import warnings

    from engine_client.reprefill import parse_system
    from engine_client.reprefill.systems import ALIASES

    if name in SELECTORS:
        return parse_system(name).replace(budget=budget, period_layers=period_layers)
    if name in ALIASES and name not in _NOTED:
        _NOTED.add(name)
        print(f"note: system {name!r} is now {ALIASES[name]!r}; the old name goes in the next release", file=sys.stderr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return parse_system(name).replace(budget=budget)


_NOTED: set[str] = set()  # old names already noted in this run


def check_strategy_flags(args) -> None:
    """``--gamma`` / ``--ratio`` of a recorded Krul strategy: an edge mass in [0, 2], a share in [0, 1]."""
    if not 0.0 <= args.gamma <= 2.0 or not 0.0 <= args.ratio <= 1.0:
        raise BenchError("--gamma must be in [0, 2] (an edge mass) and --ratio in [0, 1]")


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


def paired_difference(system: list[bool], reference: list[bool], z: float = 1.96) -> dict:
    """How often ``system`` is right against ``reference`` on the same examples, with a 95% interval.

    ``difference`` = system's accuracy minus the reference's; ``interval`` is
    Newcombe's (1998) method 10 for paired proportions: the two Wilson
    intervals joined through the pairs' correlation (phi, continuity-corrected
    as in the paper), so a shared example counts once, not as two samples.
    """
    if len(system) != len(reference) or not system:
        raise ValueError(f"need the same examples for both, got {len(system)} and {len(reference)}")
    both = sum(1 for x, y in zip(system, reference) if x and y)
    only_system = sum(1 for x, y in zip(system, reference) if x and not y)
    only_reference = sum(1 for x, y in zip(system, reference) if y and not x)
    n = len(system)
    neither = n - both - only_system - only_reference
    p1, p2 = (both + only_system) / n, (both + only_reference) / n
    l1, u1 = wilson_interval(both + only_system, n, z)
    l2, u2 = wilson_interval(both + only_reference, n, z)
    margins = (both + only_system) * (only_reference + neither) * (both + only_reference) * (only_system + neither)
    cross = both * neither - only_system * only_reference
    corrected = cross - n / 2 if cross > n / 2 else (cross if cross < 0 else 0.0)
    phi = corrected / math.sqrt(margins) if margins else 0.0
    diff = p1 - p2
    lo = diff - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    hi = diff + math.sqrt(max(0.0, (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))
    return {
        "both": both,
        "only_system": only_system,
        "only_reference": only_reference,
        "neither": neither,
        "difference": diff,
        "interval": [max(-1.0, lo), min(1.0, hi)],
    }


def keep_rows_without(num_prefix: int, drop_chunks: np.ndarray, chunk_tokens: int = CHUNK_TOKENS) -> torch.Tensor:
    """Prefix row ids outside the chunks ``drop_chunks``."""
    keep = np.ones(num_prefix, dtype=bool)
    for c in drop_chunks:
        keep[c * chunk_tokens : (c + 1) * chunk_tokens] = False
    return torch.from_numpy(np.flatnonzero(keep))


def add_device_flag(p) -> None:
    """``--device cpu|cuda``: where the model runs (default: cuda when torch sees one, else cpu)."""
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="where the model runs (default: cuda when present, else cpu)")


def bench_device(args) -> str:
    """The ``--device`` asked for, or the default; a ``BenchError`` for cuda on a machine without it."""
    from .io_jobs import BenchError

    device = getattr(args, "device", None) or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise BenchError("--device cuda: torch sees no CUDA device on this machine")
    return device


def load_pretrained(name: str, threads: int, device: str = "cpu"):
    """``zoo.load(name)`` in float32 on ``threads`` torch threads, on ``device``; an unknown or missing model is a ``BenchError``."""
    from engine_client.model import zoo

    from .io_jobs import BenchError

    torch.set_num_threads(threads)
    try:
        return zoo.load(name, dtype=torch.float32, device=device)
    except (zoo.UnknownModel, zoo.ModelNotInstalled) as exc:
        raise BenchError(str(exc)) from None
