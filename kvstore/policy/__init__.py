"""Cache policies of the memory tiers (pure: no I/O, no threads)."""

from .base import CachePolicy
from .heap import IndexedMinHeap
from .policies import POLICIES, ImpressPolicy, LFUPolicy, LRUPolicy, ScorePolicy, make_policy
from .tiers import Placement, TierPair

__all__ = [
    "POLICIES",
    "CachePolicy",
    "ImpressPolicy",
    "IndexedMinHeap",
    "LFUPolicy",
    "LRUPolicy",
    "Placement",
    "ScorePolicy",
    "TierPair",
    "make_policy",
]
