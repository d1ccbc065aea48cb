"""Which layers load everything, and how many chunks each other Period gets.

A Re-Prefill budget ``B`` is a fraction of the prefix's KV.  With one
selection of ``ceil(B * m)`` chunks per Period (``budget.budget_count``),
every layer loads ``k = ceil(B * m)`` chunks, ``k * L`` chunk-layers in all.
``full_layers = F`` loads the first ``F`` layers whole (``F * m``
chunk-layers) and charges them to the same total: the other ``L - F`` layers
share what is left,

    k_sparse = floor((k * L - F * m) / (L - F)),

so the chunk-layers loaded never exceed the plain schedule's ``k * L``.  A
plan whose sparse layers would get fewer chunks than the sink and local ones
is refused rather than silently exceeding the budget.

``PeriodPlan.periods`` lists ``(first_layer, num_layers, chunk_count)``; a
``chunk_count`` equal to ``m`` means "load all".
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.errors import InvalidArgument

from .budget import _check_count, budget_count


@dataclass(frozen=True)
class PeriodPlan:
    num_chunks: int
    num_layers: int
    periods: tuple[tuple[int, int, int], ...]  # (first layer, layers, chunks loaded per layer)

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
    budget: float | int,
    *,
    period_layers: int,
    full_layers: int = 0,
    sink_chunks: int = 1,
    local_chunks: int = 1,
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
    m = num_chunks
    k = budget_count(m, budget, sink_chunks, local_chunks)
    sparse = num_layers - full_layers
    k_sparse = (k * num_layers - full_layers * m) // sparse
    floor = min(m, sink_chunks + local_chunks)
    if full_layers and k_sparse < floor:
        raise InvalidArgument(
            "full_layers",
            f"{full_layers} full layers of {m} chunks leave {max(k_sparse, 0)} chunks per other layer "
            f"within the budget ({k} x {num_layers} chunk-layers), fewer than the {floor} sink and local chunks",
        )
    periods = []
    for first in range(0, num_layers, period_layers):
        layers = min(period_layers, num_layers - first)
        periods.append((first, layers, m if first < full_layers else (k if not full_layers else k_sparse)))
    return PeriodPlan(m, num_layers, tuple(periods))
