"""Baseline selectors that need neither probe keys nor summaries."""

from __future__ import annotations

import torch

from .base import PeriodInputs, Selector
from .budget import budget_count


class FullSelector(Selector):
    """Loads every chunk, whatever the budget (the full-load baseline)."""

    name = "full"
    loads_all = True

    def score(self, inputs: PeriodInputs) -> torch.Tensor:
        return torch.ones(inputs.num_chunks, dtype=torch.float32, device=inputs.queries.device)  # [m]

    def select(self, inputs: PeriodInputs, budget: float | int, *, sink_chunks: int = 1, local_chunks: int = 1) -> torch.Tensor:
        m = inputs.num_chunks
        budget_count(m, budget, sink_chunks, local_chunks)  # validates, result unused
        return torch.arange(m, device=inputs.queries.device)


class RecencySelector(Selector):
    """Sink chunks plus the most recent ones (StreamingLLM-style baseline)."""

    name = "recent"

    def score(self, inputs: PeriodInputs) -> torch.Tensor:
        return torch.arange(inputs.num_chunks, dtype=torch.float32, device=inputs.queries.device)  # [m]
