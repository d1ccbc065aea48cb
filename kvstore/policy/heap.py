"""An indexed binary min-heap: O(log n) push, update, remove by key.

Keys are any hashables; priorities anything ordered by ``<`` (the policies
use tuples ``(primary key, recency stamp)``).  ``_pos`` maps each key to its
slot, so update and remove need no search.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator


class IndexedMinHeap:
    def __init__(self):
        self._keys: list[Hashable] = []
        self._prios: list = []
        self._pos: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key) -> bool:
        return key in self._pos

    def priority(self, key):
        return self._prios[self._pos[key]]

    def push(self, key, priority) -> None:
        if key in self._pos:
            raise KeyError(f"{key!r} is already in the heap")
        self._keys.append(key)
        self._prios.append(priority)
        self._pos[key] = len(self._keys) - 1
        self._up(len(self._keys) - 1)

    def update(self, key, priority) -> None:
        i = self._pos[key]
        old = self._prios[i]
        self._prios[i] = priority
        if priority < old:
            self._up(i)
        else:
            self._down(i)

    def remove(self, key):
        """Remove ``key``; returns its priority."""
        i = self._pos.pop(key)
        prio = self._prios[i]
        last = len(self._keys) - 1
        if i != last:
            self._keys[i], self._prios[i] = self._keys[last], self._prios[last]
            self._pos[self._keys[i]] = i
        self._keys.pop()
        self._prios.pop()
        if i < len(self._keys):
            self._up(i)
            self._down(i)
        return prio

    def peek(self):
        return (self._keys[0], self._prios[0]) if self._keys else None

    def pop(self):
        if not self._keys:
            raise IndexError("pop from an empty heap")
        key, prio = self._keys[0], self._prios[0]
        self.remove(key)
        return key, prio

    def smallest(self, k: int | None = None) -> Iterator[tuple]:
        """``(key, priority)`` in ascending priority (the first ``k`` if given), heap untouched.

        A frontier heap over positions: taking ``m`` entries costs
        O(m log m), not a sort of the whole heap.  Do not change the heap
        while iterating.
        """
        if not self._keys or (k is not None and k <= 0):
            return
        frontier = [(self._prios[0], 0)]
        taken = 0
        while frontier:
            prio, i = heapq.heappop(frontier)
            yield self._keys[i], prio
            taken += 1
            if taken == k:
                return
            for c in (2 * i + 1, 2 * i + 2):
                if c < len(self._keys):
                    heapq.heappush(frontier, (self._prios[c], c))

    def items(self):
        return list(zip(self._keys, self._prios))

    def check(self) -> None:
        """Assert the heap property and the index (for tests)."""
        n = len(self._keys)
        assert len(self._prios) == n == len(self._pos)
        for i in range(n):
            assert self._pos[self._keys[i]] == i
            for c in (2 * i + 1, 2 * i + 2):
                if c < n:
                    assert not self._prios[c] < self._prios[i], (i, c)

    def _up(self, i: int) -> None:
        prios = self._prios
        while i:
            parent = (i - 1) // 2
            if not prios[i] < prios[parent]:
                break
            self._swap(i, parent)
            i = parent

    def _down(self, i: int) -> None:
        n = len(self._keys)
        prios = self._prios
        while True:
            small = i
            for c in (2 * i + 1, 2 * i + 2):
                if c < n and prios[c] < prios[small]:
                    small = c
            if small == i:
                return
            self._swap(i, small)
            i = small

    def _swap(self, i: int, j: int) -> None:
        keys, prios = self._keys, self._prios
        keys[i], keys[j] = keys[j], keys[i]
        prios[i], prios[j] = prios[j], prios[i]
        self._pos[keys[i]] = i
        self._pos[keys[j]] = j
