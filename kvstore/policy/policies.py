"""The policies, selected by name (``make_policy``)."""

from __future__ import annotations

from ..contract.errors import InvalidArgument
from .base import CachePolicy


class ScorePolicy(CachePolicy):
    """ContiguousKV's: ``S = I x F``, cumulative attention times accesses."""

    name = "score"

    def primary(self, stats) -> float:
        return float(stats.importance) * float(stats.frequency)


class LRUPolicy(CachePolicy):
    """Least recently used (AttentionStore's tiers)."""

    name = "lru"

    def primary(self, stats) -> float:
        return 0.0


class LFUPolicy(CachePolicy):
    """Least frequently used: accesses only."""

    name = "lfu"

    def primary(self, stats) -> float:
        return float(stats.frequency)


class ImpressPolicy(CachePolicy):
    """IMPRESS's score-based policy: how much attention the unit's tokens drew, however often read."""

    name = "impress"

    def primary(self, stats) -> float:
        return float(stats.importance)


_CLASSES = {cls.name: cls for cls in (ScorePolicy, LRUPolicy, LFUPolicy, ImpressPolicy)}
POLICIES = tuple(_CLASSES)


def make_policy(name: str, capacity_bytes: int) -> CachePolicy:
    cls = _CLASSES.get(name)
    if cls is None:
        raise InvalidArgument("policy", f"unknown cache policy {name!r}; choose from {', '.join(POLICIES)}")
    return cls(capacity_bytes)
