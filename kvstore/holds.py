"""Which prefixes are in use: held by reads and puts, claimed by maintenance.

A read or a put *holds* its prefix for as long as it runs (a stream: until
it ends).  Eviction and compaction *claim* prefixes before they change
them; a claim is refused while any hold exists, and a hold taken during a
claim waits until the claim ends (a few milliseconds: one index
transaction, or one segment copy).  So maintenance never changes a prefix
under a reader, and a reader never sees half of a change.
"""

from __future__ import annotations

import threading
from collections import Counter


class PrefixHold:
    """One hold; ``release`` is idempotent (streams release from two places)."""

    def __init__(self, holds: PrefixHolds, prefix_ids: tuple[str, ...]):
        self._holds = holds
        self._prefix_ids = prefix_ids
        self._released = False

    def release(self) -> None:
        with self._holds._cond:
            if self._released:
                return
            self._released = True
            count = self._holds._count
            for p in self._prefix_ids:
                count[p] -= 1
                if not count[p]:
                    del count[p]

    def __enter__(self) -> PrefixHold:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class PrefixHolds:
    def __init__(self):
        self._cond = threading.Condition()
        self._count: Counter[str] = Counter()
        self._claimed: set[str] = set()

    def hold(self, *prefix_ids: str | None) -> PrefixHold:
        ids = tuple(p for p in prefix_ids if p)
        with self._cond:
            self._cond.wait_for(lambda: self._claimed.isdisjoint(ids))
            self._count.update(ids)
        return PrefixHold(self, ids)

    def in_use(self, prefix_id: str) -> bool:
        with self._cond:
            return self._count[prefix_id] > 0

    def claim(self, prefix_ids) -> bool:
        """Claim every one of ``prefix_ids`` (none held or claimed), or none."""
        ids = set(prefix_ids)
        with self._cond:
            if any(self._count[p] for p in ids) or not self._claimed.isdisjoint(ids):
                return False
            self._claimed |= ids
            return True

    def unclaim(self, prefix_ids) -> None:
        with self._cond:
            self._claimed -= set(prefix_ids)
            self._cond.notify_all()
