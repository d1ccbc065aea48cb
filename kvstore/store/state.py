"""The chunk store's mutable state: read-only, quarantined segments, counters, segment ids.

One lock guards its changes.  A read-only store stays so until restarted (a
failed fsync is never retried).  A quarantine holds in memory at once and is
recorded in the segment's index record while the store is writable; a
quarantined segment's data is refused until the prefixes using it are
deleted.
"""

from __future__ import annotations

import logging
import threading

import lmdb

from .. import index_ops as ops
from ..contract.errors import DataLoss, ReadOnly, StoreFull
from ..index import Index
from ..records import PrefixView

log = logging.getLogger("kvstore.store")  # the store's log lines keep one logger name


class StoreState:
    def __init__(self, index: Index, read_only: str | None):
        self.index = index
        self.lock = threading.Lock()
        self.read_only = read_only  # why the store refuses writes, or None
        self.quarantined: dict[int, str] = {}  # segment id -> why its data is refused
        self.counters = {"bytes_read": 0, "bytes_written": 0, "reads": 0, "puts": 0, "deletes": 0}
        self.next_segment_id = 0  # set by the startup scan, past every segment id on disk

    def check_writable(self) -> None:
        if self.read_only:
            raise ReadOnly(f"store is read-only: {self.read_only}; restart after checking the device")

    def turn_read_only(self, reason: str) -> None:
        with self.lock:
            if not self.read_only:
                self.read_only = reason
                log.critical("store turned read-only: %s", reason)

    def count(self, **deltas: int) -> None:
        with self.lock:
            for k, v in deltas.items():
                self.counters[k] += v

    def counters_now(self) -> dict[str, int]:
        with self.lock:
            return dict(self.counters)

    def new_segment_id(self) -> int:
        with self.lock:
            segment_id = self.next_segment_id
            self.next_segment_id += 1
        return segment_id

    def restore_quarantine(self, segment_id: int, reason: str) -> None:
        """A quarantine the segment's record kept across a restart (already persisted)."""
        with self.lock:
            self.quarantined[segment_id] = reason

    def quarantine(self, segment_id: int, reason: str) -> None:
        with self.lock:
            if segment_id in self.quarantined:
                return
            self.quarantined[segment_id] = reason
        log.error("segment %d quarantined: %s", segment_id, reason)
        if self.read_only:
            return
        try:
            ops.mark_quarantined(self.index, segment_id, reason)
        except (lmdb.Error, StoreFull) as exc:  # quarantine still holds in memory
            log.error("could not persist quarantine of segment %d: %s", segment_id, exc)

    def unreadable(self, segment_id: int, cause: BaseException) -> DataLoss:
        """Quarantine a segment whose file is gone or short, as a checksum failure would."""
        reason = f"segment file unreadable ({cause.__class__.__name__}: {cause})"
        self.quarantine(segment_id, reason)
        return DataLoss(f"segment {segment_id}: {reason}")

    def forget(self, segment_id: int) -> None:
        """A deleted segment's quarantine ends with it."""
        with self.lock:
            self.quarantined.pop(segment_id, None)

    def prefix_quarantine(self, view: PrefixView) -> str | None:
        """Why the prefix's data is refused (a quarantined segment), or None."""
        for seg_id in view.segment_ids:
            if seg_id in self.quarantined:
                return f"segment {seg_id}: {self.quarantined[seg_id]}"
        return None
