"""Which layers load everything, and how many chunks each other Period gets.

A Re-Prefill budget ``B`` is a fraction of the prefix's KV: of ``m`` chunks
and ``L`` layers, at most ``floor(B * m * L)`` chunk-layers are loaded, all
layers counted (the project's one rounding rule, ``engine_client.rounding``;
an ``int`` budget is a chunk count per layer: ``B * L``).
``full_layers = F`` loads the first ``F`` layers whole (``F * m``
chunk-layers, charged to the same total); every other layer loads

    k = floor((floor(B * m * L) - F * m) / (L - F))

chunks, its sink and local chunks included.  Only when ``k`` is below the
sink and local chunks does a plan exceed ``B``: without full layers ``k`` is
raised to them (as ``budget.budget_count`` does for tiny prefixes); with
full layers the plan is refused, since the full layers are what overspend.

``PeriodPlan.periods`` lists ``(first_layer, num_layers, chunk_count)``; a
``chunk_count`` equal to ``m`` means "load all".

A Period of sliding-window layers (``window_layers``) loads the last
``window_chunks`` chunks, the ones its queries can still see
(``window_chunk_count``), whatever the budget: like ``whole_layers`` a
fixed set, not charged to the budget and never selected
(``PeriodPlan.windowed`` names those Periods).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.contract import InvalidArgument

from ..rounding import fraction_count
from .budget import Budget, _check_count, budget_amount, budget_count


@dataclass(frozen=True)
class PeriodPlan:
    num_chunks: int
    num_layers: int
    periods: tuple[tuple[int, int, int], ...]  # (first layer, layers, chunks loaded per layer)
    windowed: tuple[int, ...] = ()  # first layers of the Periods that load their window's last chunks

    @property
    def chunk_layers(self) -> int:
        """Chunk-layers loaded in all (the KV loaded, in chunks x layers)."""
        return sum(layers * count for _, layers, count in self.periods)

    @property
    def kv_fraction(self) -> float:
        """Fraction of the prefix's KV loaded (all layers), padding of a short last chunk ignored."""
        return self.chunk_layers / (self.num_chunks * self.num_layers)


def plan_periods(
    num_layers: int,
    num_chunks: int,
    budget: Budget | float | int,
    *,
    period_layers: int,
    full_layers: int = 0,
    whole_layers: tuple = (),
    sink_chunks: int = 1,
    local_chunks: int = 1,
    window_layers: tuple = (),
    window_chunks: int = 0,
) -> PeriodPlan:
    """The Periods of a Re-Prefill and each one's chunk count (module docstring).

    ``full_layers`` must be a multiple of ``period_layers`` (a Period is either
    loaded whole or selected) and less than ``num_layers``.
    """
    num_layers = _check_count("num_layers", num_layers, 1)
    period_layers = _check_count("period_layers", period_layers, 1)
    full_layers = _check_count("full_layers", full_layers, 0)
    if full_layers % period_layers or full_layers >= num_layers:
        raise InvalidArgument(
            "full_layers", f"must be a multiple of period_layers ({period_layers}) below {num_layers} layers, got {full_layers}"
        )
    whole = set(whole_layers)
    if len(whole) != len(whole_layers) or any(
        isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < num_layers or x % period_layers for x in whole_layers
    ):
        raise InvalidArgument(
            "whole_layers",
            f"must be distinct Period first layers (multiples of period_layers {period_layers}) in [0, {num_layers}), got {tuple(whole_layers)}",
        )
    windowed = set(window_layers)
    if len(windowed) != len(window_layers) or any(
        isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < num_layers or x % period_layers for x in window_layers
    ):
        raise InvalidArgument(
            "window_layers",
            f"must be distinct Period first layers (multiples of period_layers {period_layers}) in [0, {num_layers}), got {tuple(window_layers)}",
        )
    if windowed & (whole | set(range(full_layers))):
        raise InvalidArgument(
            "whole_layers", f"layers {sorted(windowed & (whole | set(range(full_layers))))} slide: they load their window"
        )
    m = _check_count("num_chunks", num_chunks, 1)
    if windowed:
        _check_count("window_chunks", window_chunks, 1)
    budget = budget_amount(budget)
    budget_count(m, budget, sink_chunks, local_chunks)  # validates the budget, sink and local
    if isinstance(budget, float):
        allowed = fraction_count(m * num_layers, budget)
    else:
        allowed = int(budget) * num_layers
    sparse = num_layers - full_layers
    k = min(m, (allowed - full_layers * m) // sparse)
    forced = min(m, sink_chunks + local_chunks)
    if k < forced:
        if full_layers:
            raise InvalidArgument(
                "full_layers",
                f"{full_layers} full layers of {m} chunks leave {max(k, 0)} chunks per other layer within the "
                f"budget ({allowed} chunk-layers of {m} x {num_layers}), fewer than the {forced} sink and local chunks",
            )
        k = forced
    periods = []
    for first in range(0, num_layers, period_layers):
        layers = min(period_layers, num_layers - first)
        if first in windowed:
            periods.append((first, layers, min(m, window_chunks)))
        else:
            periods.append((first, layers, m if first < full_layers or first in whole else k))
    return PeriodPlan(m, num_layers, tuple(periods), tuple(sorted(windowed)))


def window_chunk_count(num_tokens: int, window: int, chunk_tokens: int) -> int:
    """The last chunks of a ``num_tokens`` prefix that a sliding layer of ``window`` positions still sees:
    the first suffix query (position ``num_tokens``) sees keys at ``> num_tokens - window``, and each
    later query a subset of those, so every chunk holding a position ``>= num_tokens - window + 1``."""
    num_tokens = _check_count("num_tokens", num_tokens, 1)
    window = _check_count("window", window, 1)
    chunk_tokens = _check_count("chunk_tokens", chunk_tokens, 1)
    m = -(-num_tokens // chunk_tokens)
    return m - max(0, num_tokens - window + 1) // chunk_tokens
