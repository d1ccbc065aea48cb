"""One lock per key, created on first use and dropped when nobody holds or waits for it.

A put and a delete of one prefix hold its manifest lock (``manifest_files``);
the changes of one conversation record hold its record lock
(``conversations``).  Different keys never wait for each other.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from contextlib import contextmanager


class KeyedLocks:
    def __init__(self):
        self._guard = threading.Lock()
        self._locks: dict[Hashable, list] = {}  # key -> [lock, holders and waiters]

    @contextmanager
    def locked(self, key: Hashable):
        """Hold ``key``'s lock for the block."""
        with self._guard:
            entry = self._locks.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._guard:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._locks[key]
