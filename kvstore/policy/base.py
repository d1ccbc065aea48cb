"""The cache-policy interface: which resident units to evict, and whether to admit one.

A policy only keeps books: unit -> size, eviction priority, leases.  The
statistics behind a priority (``importance`` I, ``frequency`` F, as in
``kvstore.scores.UnitScore``) come from the caller on every call; recency
is the policy's own logical clock, bumped on admit and touch, and breaks
ties, so among equals the least recently used goes first.  Unleased
residents sit in an indexed min-heap on ``(primary key, last touch)``;
leased ones are kept out of it until their last lease ends, so they can
never be chosen.  Every query (``victims``, ``can_admit``, ``min_priority``)
is free of side effects.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from typing import ClassVar

from .heap import IndexedMinHeap


class CachePolicy(ABC):
    name: ClassVar[str]

    def __init__(self, capacity_bytes: int):
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self.capacity_bytes = int(capacity_bytes)
        self.used_bytes = 0
        self._sizes: dict[Hashable, int] = {}
        self._stamp: dict[Hashable, int] = {}
        self._heap = IndexedMinHeap()  # unleased residents
        self._held: dict[Hashable, tuple] = {}  # leased residents -> priority
        self._leases: dict[Hashable, int] = {}
        self._clock = 0

    @abstractmethod
    def primary(self, stats) -> float:
        """The policy's key for a unit with these statistics (lower is evicted first)."""

    # ------------------------------------------------------------ queries
    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes

    def __len__(self) -> int:
        return len(self._sizes)

    def __contains__(self, unit) -> bool:
        return unit in self._sizes

    def units(self) -> list:
        return list(self._sizes)

    def size(self, unit) -> int:
        return self._sizes[unit]

    def leased(self, unit) -> bool:
        return unit in self._leases

    def priority(self, unit, stats) -> tuple:
        """A resident unit's key with these stats; a non-resident one's as if touched now."""
        stamp = self._stamp[unit] if unit in self._sizes else self._clock + 1
        return (self.primary(stats), stamp)

    def smallest(self, k: int | None = None):
        """Unleased residents in eviction order, ``(unit, priority)``, the first ``k`` if given (no side effects)."""
        return self._heap.smallest(k)

    def min_priority(self):
        top = self._heap.peek()
        return top[1] if top else None

    def victims(self, nbytes: int, incoming=None) -> list | None:
        """Lowest-priority unleased units to evict so ``nbytes`` fit; ``[]``: fits now.

        ``None`` when no such set exists.  With ``incoming=(unit, stats)``
        only units whose priority is below the incoming unit's qualify.
        """
        if nbytes > self.capacity_bytes:
            return None
        need = nbytes - self.free_bytes
        if need <= 0:
            return []
        limit = self.priority(incoming[0], incoming[1]) if incoming is not None else None
        out, freed = [], 0
        for unit, prio in self._heap.smallest():
            if limit is not None and not prio < limit:
                return None
            out.append(unit)
            freed += self._sizes[unit]
            if freed >= need:
                return out
        return None

    def can_admit(self, unit, nbytes: int, stats) -> bool:
        return self.victims(nbytes, incoming=(unit, stats)) is not None

    # ------------------------------------------------------------ updates
    def admit(self, unit, nbytes: int, stats) -> None:
        if nbytes < 0:
            raise ValueError(f"{unit!r}: negative size {nbytes}")
        if unit in self._sizes:
            raise ValueError(f"{unit!r} is already resident")
        if nbytes > self.free_bytes:
            raise ValueError(f"{unit!r}: {nbytes} bytes do not fit ({self.free_bytes} free); evict first")
        self._clock += 1
        self._stamp[unit] = self._clock
        self._sizes[unit] = int(nbytes)
        self.used_bytes += int(nbytes)
        self._heap.push(unit, (self.primary(stats), self._clock))

    def touch(self, unit, stats) -> None:
        """An access: the unit becomes the most recent, its key follows ``stats``."""
        if unit not in self._sizes:
            raise KeyError(f"{unit!r} is not resident")
        self._clock += 1
        self._stamp[unit] = self._clock
        self._set(unit, (self.primary(stats), self._clock))

    def update_score(self, unit, stats) -> None:
        """The statistics changed without an access (importance reported): re-key, recency kept."""
        if unit not in self._sizes:
            raise KeyError(f"{unit!r} is not resident")
        self._set(unit, (self.primary(stats), self._stamp[unit]))

    def remove(self, unit) -> int:
        """Forget a resident unit; returns its size.  A leased unit cannot be removed."""
        if unit not in self._sizes:
            raise KeyError(f"{unit!r} is not resident")
        if unit in self._leases:
            raise ValueError(f"{unit!r} is leased and cannot be removed")
        self._heap.remove(unit)
        del self._stamp[unit]
        size = self._sizes.pop(unit)
        self.used_bytes -= size
        return size

    def lease(self, unit) -> None:
        if unit not in self._sizes:
            raise KeyError(f"{unit!r} is not resident")
        if unit not in self._leases:
            self._held[unit] = self._heap.remove(unit)
        self._leases[unit] = self._leases.get(unit, 0) + 1

    def unlease(self, unit) -> None:
        count = self._leases.get(unit)
        if count is None:
            raise ValueError(f"{unit!r} is not leased")
        if count > 1:
            self._leases[unit] = count - 1
            return
        del self._leases[unit]
        self._heap.push(unit, self._held.pop(unit))

    def _set(self, unit, prio: tuple) -> None:
        if unit in self._held:
            self._held[unit] = prio
        else:
            self._heap.update(unit, prio)
