"""Two tiers, GPU above CPU, and the design's placement rule (pure planning).

A unit read from disk goes to the upper tier if that policy admits it;
each unit the upper tier evicts for it drops to the lower tier when it beats
what the lower tier would have to evict (or there is room), else leaves
memory.  A unit the upper tier turns away may still enter the lower tier.
``plan`` / ``plan_promote`` only look; ``apply`` changes both policies'
books (the caller moves the bytes in between).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .base import CachePolicy

_END = object()


@dataclass
class Placement:
    tier: str | None  # "upper" | "lower" | None: not cached
    evict_upper: list = field(default_factory=list)
    demote: list = field(default_factory=list)  # the part of evict_upper that moves to lower
    evict_lower: list = field(default_factory=list)
    promote: bool = False  # the unit moves from lower to upper


class TierPair:
    def __init__(self, upper: CachePolicy, lower: CachePolicy):
        self.upper = upper
        self.lower = lower

    def plan(self, unit, nbytes: int, stats_fn) -> Placement:
        if unit in self.upper or unit in self.lower:
            raise ValueError(f"{unit!r} is already resident")
        stats = stats_fn(unit)
        victims = self.upper.victims(nbytes, incoming=(unit, stats)) if self.upper.capacity_bytes else None
        if victims is not None:
            demote, evict_lower = self._demotions(victims, stats_fn, extra_free=0, exclude=None)
            return Placement("upper", list(victims), demote, evict_lower)
        victims = self.lower.victims(nbytes, incoming=(unit, stats)) if self.lower.capacity_bytes else None
        if victims is not None:
            return Placement("lower", evict_lower=list(victims))
        return Placement(None)

    def plan_promote(self, unit, stats_fn) -> Placement:
        """A lower-tier unit was hit: move it up if the upper tier admits it."""
        if unit not in self.lower or self.lower.leased(unit) or not self.upper.capacity_bytes:
            return Placement(None)
        nbytes = self.lower.size(unit)
        victims = self.upper.victims(nbytes, incoming=(unit, stats_fn(unit)))
        if victims is None:
            return Placement(None)
        demote, evict_lower = self._demotions(victims, stats_fn, extra_free=nbytes, exclude=unit)
        return Placement("upper", list(victims), demote, evict_lower, promote=True)

    def _demotions(self, victims, stats_fn, *, extra_free: int, exclude) -> tuple[list, list]:
        """Which upper victims move to lower, best first, and what lower drops for them.

        A victim goes down if it fits in the free room or if lower units of
        strictly lower priority (in lower's own order) can be dropped to make
        room; lower units are only dropped for a victim that then fits, so
        nothing leaves memory for nothing.  ``extra_free``: bytes the caller
        frees in lower anyway (a promoted unit, ``exclude``).
        """
        lower = self.lower
        if not lower.capacity_bytes or not victims:
            return [], []
        free = lower.free_bytes + extra_free
        stream = (u for u, _ in lower.smallest() if u != exclude)
        seen: list = []  # lower candidates pulled from the heap so far, ascending
        taken = 0  # seen[:taken] are dropped
        demote = []
        ranked = sorted(victims, key=lambda u: lower.priority(u, stats_fn(u)), reverse=True)
        for u in ranked:
            size = self.upper.size(u)
            if size > lower.capacity_bytes:
                continue
            limit = lower.priority(u, stats_fn(u))
            room, j = free, taken
            while room < size:
                if j == len(seen):
                    nxt = next(stream, _END)
                    if nxt is _END:
                        break
                    seen.append(nxt)
                cand = seen[j]
                if not lower.priority(cand, stats_fn(cand)) < limit:
                    break
                room += lower.size(cand)
                j += 1
            if room >= size:
                demote.append(u)
                free, taken = room - size, j
        return demote, seen[:taken]

    def apply(self, placement: Placement, unit, nbytes: int, stats_fn) -> None:
        """Carry out a plan in both policies' books: drops first, then demotions, then the unit.

        The plan must be fresh (nothing changed in either policy since it was
        made); ``nbytes`` is ignored for a promotion (the unit keeps its size).
        """
        if placement.promote:
            nbytes = self.lower.remove(unit)
        for u in placement.evict_lower:
            self.lower.remove(u)
        demoted = set(placement.demote)
        for u in placement.evict_upper:
            size = self.upper.remove(u)
            if u in demoted:
                self.lower.admit(u, size, stats_fn(u))
        if placement.tier == "upper":
            self.upper.admit(unit, nbytes, stats_fn(unit))
        elif placement.tier == "lower":
            self.lower.admit(unit, nbytes, stats_fn(unit))
