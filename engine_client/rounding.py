"""The one rounding rule of a budget fraction: ``floor(fraction x total)``, at least 1.

What a fraction of a prefix's chunks (or chunk-layers) buys is never more
than the fraction, except that it always buys one.  The Re-Prefill plan
(``selection.schedule.plan_periods``), and through it the baselines'
``token_cap``, round with it, and so do the demo and the chunked I/O
benchmark, so a budget means the same count everywhere.  Torch-free, for
the tools that run without it.
"""

from __future__ import annotations

import math


def fraction_floor(total: int, fraction: float) -> int:
    """``floor(fraction x total)`` with nothing added: 0 of anything is 0 (``fraction`` in [0, 1]).

    The product is rounded to 9 decimals first: 0.29 of 100 is 29, not the
    28 that ``0.29 * 100 == 28.999999999999996`` would give.  Krul's layer
    ratio counts with it (``krul.strategy``), where a ratio of 0 pairs nothing.
    """
    return math.floor(round(fraction * total, 9))


def fraction_count(total: int, fraction: float) -> int:
    """``fraction_floor``, at least 1 and at most ``total`` (``fraction`` in (0, 1])."""
    return min(total, max(1, fraction_floor(total, fraction)))
