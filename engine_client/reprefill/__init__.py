"""Sparse Re-Prefill over a stored prefix, as a request pipeline.

    runner = ModelRunner(model, client)                 # 1-layer groups, 4-bit probe keys stored
    handle = runner.store_prefix(prefix_tokens)
    out = runner.reprefill(handle.prefix_id, suffix_tokens)   # ReprefillConfig(): the accurate system
    cfg = parse_system("ckv+int4-probes+query=last:16", budget=Budget.fraction(0.05))
    ans = runner.answer(prefix_tokens, suffix_tokens, profile=parse_profile("file:machine.json"))  # cheapest path

Modules: ``config`` (the request's vocabulary: ``Budget`` and five frozen
sub-configs), ``systems`` (named systems: a base plus modifiers, and the old
names), ``checks`` (a request against the runner and the prefix), ``state``
(what the runner keeps per prefix), ``select`` (a Period's set from what the
selector declares it needs), ``period`` (a Period's layers as its groups
arrive), ``pipeline`` (the request loop), ``decode`` (decoding after it),
``device`` (host and device), ``choice`` (a request's cheapest path:
recompute, whole load or sparse), ``runner`` (``ModelRunner``).
"""

from ..selection import Budget
from .choice import Answer
from .config import AttentionConfig, DecodeConfig, FetchConfig, ReprefillConfig, ScheduleConfig, SelectionConfig
from .result import PrefixHandle, ReprefillResult
from .runner import ModelRunner, model_geometry, window_periods
from .systems import DEFAULT_SYSTEM, parse_system

__all__ = [
    "DEFAULT_SYSTEM",
    "Answer",
    "AttentionConfig",
    "Budget",
    "DecodeConfig",
    "FetchConfig",
    "ModelRunner",
    "PrefixHandle",
    "ReprefillConfig",
    "ReprefillResult",
    "ScheduleConfig",
    "SelectionConfig",
    "model_geometry",
    "parse_system",
    "window_periods",
]
