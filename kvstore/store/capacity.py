"""Disk capacity of the chunk store: usage against ``max_disk_bytes``, eviction.

Usage is the bytes of segment files the index references (each record's
``total_bytes``) plus what puts in progress have reserved, kept as running
counters.  A put that would take usage past ``disk_high_watermark`` first
evicts down to ``disk_low_watermark`` (with its own bytes counted), by the
policy in ``kvstore.policy.disk``; prefixes in use, and those conversation
records hold (``conversations.held_prefix_id``), are never evicted.  If
usage still cannot fit the put under ``max_disk_bytes``, the put fails as
full.  Evictions delete through the store's normal delete path, then
compaction reclaims what they left dead in shared segments.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .. import index as ix
from ..errors import NotFound, StoreFull
from ..faults import crash_point
from ..policy.disk import PrefixCost, choose_victims, segments_to_compact
from .compaction import compact_segment, segment_uses

log = logging.getLogger("kvstore.capacity")  # the name it had as kvstore/capacity.py


class DiskCapacity:
    def __init__(self, store):
        self.store = store
        self.max_bytes = store.config.max_disk_bytes
        self._lock = threading.Lock()  # the counters
        self._run_lock = threading.RLock()  # one eviction or compaction at a time
        with store.index.read() as txn:
            self.used_bytes = sum(ix.loads(v)["total_bytes"] for _, v in txn.cursor(db=store.index.segments))
        self.reserved_bytes = 0
        self.counters = {"evictions": 0, "evicted_bytes": 0, "compactions": 0, "compaction_reclaimed_bytes": 0}
        self.on_segments_freed: list[Callable[[int], None]] = []  # e.g. memory tiers dropping the extents

    # ------------------------------------------------------------ accounting
    def _add(self, **deltas: int) -> None:
        with self._lock:
            for k, v in deltas.items():
                if k in self.counters:
                    self.counters[k] += v
                else:
                    setattr(self, k, getattr(self, k) + v)

    def segments_added(self, nbytes: int) -> None:
        self._add(used_bytes=nbytes)

    def segments_freed(self, segment_ids: list[int], nbytes: int) -> None:
        self._add(used_bytes=-nbytes)
        for seg_id in segment_ids:
            for listener in self.on_segments_freed:
                listener(seg_id)

    def reserve(self, nbytes: int) -> int:
        """Room for a new segment of ``nbytes``, evicting first if needed; the bytes reserved."""
        if not self.max_bytes:
            return 0
        cfg = self.store.config
        with self._run_lock:
            if self.used_bytes + self.reserved_bytes + nbytes > cfg.disk_high_watermark * self.max_bytes:
                self.evict_to(int(cfg.disk_low_watermark * self.max_bytes) - self.reserved_bytes - nbytes)
            with self._lock:
                if self.used_bytes + self.reserved_bytes + nbytes > self.max_bytes:
                    raise StoreFull(
                        f"store is at its capacity: {nbytes} bytes needed, {self.used_bytes} stored and "
                        f"{self.reserved_bytes} reserved of max_disk_bytes {self.max_bytes}, the rest in use or held by "
                        "conversation records (kvstore-admin conversations; delete the ones no longer needed)"
                    )
                self.reserved_bytes += nbytes
        return nbytes

    def unreserve(self, nbytes: int) -> None:
        self._add(reserved_bytes=-nbytes)

    def stats(self) -> dict:
        with self._lock:
            return {
                "max_disk_bytes": self.max_bytes,
                "disk_used_bytes": self.used_bytes,
                "disk_reserved_bytes": self.reserved_bytes,
                **self.counters,
            }

    # ------------------------------------------------------------ eviction
    def evict_to(self, target_bytes: int) -> dict:
        """Evict whole prefixes until stored bytes are at most ``target_bytes``."""
        evicted: list[str] = []
        freed_before = self.used_bytes
        with self._run_lock:
            while self.used_bytes > target_bytes:
                victims = choose_victims(self._costs(), self.used_bytes - max(target_bytes, 0))
                done = [p for p in victims if self._evict(p)]
                if not done:
                    break
                evicted += done
            self.compact()
        if evicted:
            log.info("evicted %d prefixes to reach %d stored bytes (now %d)", len(evicted), target_bytes, self.used_bytes)
        return {"evicted": evicted, "bytes_freed": freed_before - self.used_bytes, "disk_used_bytes": self.used_bytes}

    def _evict(self, prefix_id: str) -> bool:
        holds = self.store.holds
        if not holds.claim([prefix_id]):
            return False  # a read or put took it meanwhile
        try:
            if prefix_id in self.store.conversations.held():
                return False  # a record named it after the victims were chosen (recording holds the prefix)
            crash_point("evict:claimed")
            before = self.used_bytes
            self.store.delete(prefix_id, compact=False)  # compacted once, after the last victim
        except NotFound:
            return False
        finally:
            holds.unclaim([prefix_id])
        self._add(evictions=1, evicted_bytes=before - self.used_bytes)
        return True

    def _costs(self) -> list[PrefixCost]:
        store = self.store
        with store.index.read() as txn:
            manifests = [ix.loads(v) for _, v in txn.cursor(db=store.index.manifests)]
            records = {int.from_bytes(k, "big"): ix.loads(v) for k, v in txn.cursor(db=store.index.segments)}
        seg_scores = store.scores.segment_totals()
        held = store.conversations.held()
        costs = []
        for m in manifests:
            own = {p["segment_id"] for p in m["segments"] if records[p["segment_id"]]["refcount"] == 1}
            costs.append(
                PrefixCost(
                    prefix_id=m["prefix_id"],
                    bytes_freed=sum(records[s]["total_bytes"] for s in own),
                    score=sum(seg_scores.get(s, 0.0) for s in own),
                    created=m["created"],
                    in_use=m["prefix_id"] in held or store.holds.in_use(m["prefix_id"]),
                )
            )
        return costs

    # ------------------------------------------------------------ compaction
    def compact(self, *, progress=None) -> dict:
        """Copy the live chunks of mostly-dead segments into new ones (``progress``: see ChunkStore.verify)."""
        store = self.store
        with self._run_lock:
            uses, refs = segment_uses(store)
            compacted = reclaimed = 0
            todo = list(segments_to_compact(uses, store.config.compact_live_fraction))
            for use in progress(todo, "compact", total=len(todo), unit="seg") if progress else todo:
                if store.read_only:
                    break
                freed = compact_segment(store, use, refs[use.segment_id])
                if freed is not None:
                    compacted += 1
                    reclaimed += freed
                    self._add(compactions=1, compaction_reclaimed_bytes=freed)
        return {"segments_compacted": compacted, "bytes_reclaimed": reclaimed, "disk_used_bytes": self.used_bytes}
