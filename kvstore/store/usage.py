"""Disk usage of the chunk store, as running counters.

``used_bytes`` is the bytes of the segment files the index references (each
record's ``total_bytes``), ``reserved_bytes`` what puts in progress have
reserved for their new segments.  Whoever adds or frees a segment says so
here; ``on_segments_freed`` listeners (the memory tiers) hear of each freed
segment.  What to do when usage runs high is ``capacity.py``'s.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..contract.errors import StoreFull


class DiskUsage:
    def __init__(self, used_bytes: int):
        self._lock = threading.Lock()
        self._used = used_bytes
        self._reserved = 0
        self.on_segments_freed: list[Callable[[int], None]] = []  # e.g. memory tiers dropping the extents

    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def reserved_bytes(self) -> int:
        return self._reserved

    def segments_added(self, nbytes: int) -> None:
        with self._lock:
            self._used += nbytes

    def segments_freed(self, segment_ids: list[int], nbytes: int) -> None:
        with self._lock:
            self._used -= nbytes
        for seg_id in segment_ids:
            for listener in self.on_segments_freed:
                listener(seg_id)

    def reserve(self, nbytes: int, max_bytes: int) -> None:
        """Reserve ``nbytes`` if used and reserved bytes stay within ``max_bytes``, else StoreFull."""
        with self._lock:
            if self._used + self._reserved + nbytes > max_bytes:
                raise StoreFull(
                    f"store is at its capacity: {nbytes} bytes needed, {self._used} stored and "
                    f"{self._reserved} reserved of max_disk_bytes {max_bytes}, the rest in use or held by "
                    "conversation records (kvstore-admin conversations; delete the ones no longer needed)"
                )
            self._reserved += nbytes

    def unreserve(self, nbytes: int) -> None:
        with self._lock:
            self._reserved -= nbytes

    def stats(self) -> dict:
        with self._lock:
            return {"disk_used_bytes": self._used, "disk_reserved_bytes": self._reserved}
