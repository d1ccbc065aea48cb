"""Disk capacity of the chunk store: room for puts against ``max_disk_bytes``, eviction.

Usage is ``DiskUsage``'s running counters (``usage.py``).  A put that would
take usage past ``disk_high_watermark`` first evicts down to
``disk_low_watermark`` (with its own bytes counted), by the policy in
``kvstore.policy.disk``; prefixes in use, and those conversation records
hold (``held_by_records``), are never evicted.  If usage still cannot fit
the put under ``max_disk_bytes``, the put fails as full.  Evictions delete
through the store's delete path (``Removal``), then compaction
(``Compactor``) reclaims what they left dead in shared segments; one
eviction, compaction or merge (``SegmentMerger``) runs at a time (the
``maintenance`` lock they share).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..config import StoreConfig
from ..contract.errors import NotFound
from ..faults import crash_point
from ..holds import PrefixHolds
from ..policy.disk import PrefixCost, choose_victims
from ..scores import ScoreTable
from .catalogue import Catalogue
from .compaction import Compactor
from .merge import SegmentMerger
from .removal import Removal
from .usage import DiskUsage

log = logging.getLogger("kvstore.capacity")  # the name it had as kvstore/capacity.py


class DiskCapacity:
    def __init__(
        self,
        config: StoreConfig,
        usage: DiskUsage,
        catalogue: Catalogue,
        holds: PrefixHolds,
        scores: ScoreTable,
        removal: Removal,
        compactor: Compactor,
        merger: SegmentMerger,
        *,
        held_by_records: Callable[[], set[str]],
        maintenance: threading.RLock,
    ):
        self.max_bytes = config.max_disk_bytes
        self._high = config.disk_high_watermark
        self._low = config.disk_low_watermark
        self._usage = usage
        self._catalogue = catalogue
        self._holds = holds
        self._scores = scores
        self._removal = removal
        self._compactor = compactor
        self._merger = merger
        self._held_by_records = held_by_records
        self._maintenance = maintenance
        self._lock = threading.Lock()  # the counters
        self._counters = {"evictions": 0, "evicted_bytes": 0}

    @property
    def on_segments_freed(self) -> list[Callable[[int], None]]:
        """Listeners told of every freed segment's id (``DiskUsage.on_segments_freed``)."""
        return self._usage.on_segments_freed

    def reserve(self, nbytes: int) -> int:
        """Room for a new segment of ``nbytes``, evicting first if needed; the bytes reserved."""
        if not self.max_bytes:
            return 0
        usage = self._usage
        with self._maintenance:
            if usage.used_bytes + usage.reserved_bytes + nbytes > self._high * self.max_bytes:
                self.evict_to(int(self._low * self.max_bytes) - usage.reserved_bytes - nbytes)
            usage.reserve(nbytes, self.max_bytes)
        return nbytes

    def stats(self) -> dict:
        with self._lock:
            evictions = dict(self._counters)
        return {"max_disk_bytes": self.max_bytes, **self._usage.stats(), **evictions, **self._compactor.stats(), **self._merger.stats()}

    # ------------------------------------------------------------ eviction
    def evict_to(self, target_bytes: int) -> dict:
        """Evict whole prefixes until stored bytes are at most ``target_bytes``."""
        usage = self._usage
        evicted: list[str] = []
        freed_before = usage.used_bytes
        with self._maintenance:
            while usage.used_bytes > target_bytes:
                victims = choose_victims(self._costs(), usage.used_bytes - max(target_bytes, 0))
                done = [p for p in victims if self._evict(p)]
                if not done:
                    break
                evicted += done
            self._compactor.compact()
        if evicted:
            log.info("evicted %d prefixes to reach %d stored bytes (now %d)", len(evicted), target_bytes, usage.used_bytes)
        return {"evicted": evicted, "bytes_freed": freed_before - usage.used_bytes, "disk_used_bytes": usage.used_bytes}

    def compact(self, *, progress=None) -> dict:
        """Compaction now (admin ``Compact``): ``Compactor.compact``."""
        return self._compactor.compact(progress=progress)

    def compact_and_merge(self, *, progress=None) -> dict:
        """Admin ``Compact``: compaction, then the merging of small page-batch segments (``SegmentMerger.merge``)."""
        res = self._compactor.compact(progress=progress)
        return {**res, **self._merger.merge(progress=progress), "disk_used_bytes": self._usage.used_bytes}

    def _evict(self, prefix_id: str) -> bool:
        if not self._holds.claim([prefix_id]):
            return False  # a read or put took it meanwhile
        try:
            if prefix_id in self._held_by_records():
                return False  # a record named it after the victims were chosen (recording holds the prefix)
            crash_point("evict:claimed")
            before = self._usage.used_bytes
            self._removal.delete(prefix_id)  # compacted once, after the last victim
        except NotFound:
            return False
        finally:
            self._holds.unclaim([prefix_id])
        with self._lock:
            self._counters["evictions"] += 1
            self._counters["evicted_bytes"] += before - self._usage.used_bytes
        return True

    def _costs(self) -> list[PrefixCost]:
        manifests, records = self._catalogue.manifests_and_segments()
        seg_scores = self._scores.segment_totals()
        held = self._held_by_records()
        costs = []
        for m in manifests:
            own = {p["segment_id"] for p in m["segments"] if records[p["segment_id"]]["refcount"] == 1}
            costs.append(
                PrefixCost(
                    prefix_id=m["prefix_id"],
                    bytes_freed=sum(records[s]["total_bytes"] for s in own),
                    score=sum(seg_scores.get(s, 0.0) for s in own),
                    created=m["created"],
                    in_use=m["prefix_id"] in held or self._holds.in_use(m["prefix_id"]),
                )
            )
        return costs
