"""What the daemon's calls answer, as plain values (no protobuf, no I/O).

The client returns these instead of the generated messages; their field
names are the messages' own, so ``res.prefix_id`` reads the same either
way.  Repeated fields are tuples (arrays where they hold numbers), a
``Geometry`` is a ``StoreGeometry``.  ``codec`` fills them from the
messages; ``tests/unit/test_wire.py`` keeps their fields equal to the
messages' fields.

``ReadResult`` is the one mutable type: a read fills it group by group, and
the same type is what ``ChunkStore.read`` returns in the daemon.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .geometry import StoreGeometry


@dataclass(frozen=True)
class LookupResult:
    matched_chunks: int
    matched_tokens: int
    num_chunks: int  # chunks of the queried sequence
    prefix_id: str  # a stored prefix holding the matched chunks; "" if none


@dataclass(frozen=True)
class PutResult:
    prefix_id: str
    num_tokens: int
    num_chunks: int
    reused_chunks: int
    bytes_written: int
    already_stored: bool


@dataclass(frozen=True)
class PagesPresent:
    exists: np.ndarray  # bool, one per key
    num_leading: int  # keys stored before the first one that is not: what an engine may load instead of computing


@dataclass(frozen=True)
class PagesPutResult:
    num_pages: int
    pages_written: int
    pages_already_stored: int
    bytes_written: int
    batch_id: str  # the entry ListPrefixes shows for the pages written; "" when every page was stored already


@dataclass(frozen=True)
class PrefixDescription:
    """A stored prefix's geometry and identity (Describe)."""

    prefix_id: str
    namespace: str
    model_fingerprint: str
    geometry: StoreGeometry
    num_tokens: int
    num_chunks: int
    quarantined: str  # "" if healthy
    kind: str  # "prefix", or "pages": a PutPages batch (num_tokens = pages x chunk_tokens)


@dataclass(frozen=True)
class PrefixInfo:
    """One entry of ListPrefixes."""

    prefix_id: str
    namespace: str
    model_fingerprint: str
    num_tokens: int
    num_chunks: int
    num_segments: int
    created: float
    quarantined: str  # "" if healthy
    kind: str


@dataclass(frozen=True)
class ChunkScores:
    """Cache scores of a prefix's chunks in one period group: ``S_j = I_j x F_j``."""

    importance: np.ndarray  # I_j, float64
    frequency: np.ndarray  # F_j, reads counted
    score: np.ndarray  # S_j, float64


@dataclass(frozen=True)
class LatencySummary:
    rpc: str
    count: int
    p50_ms: float
    p90_ms: float
    p99_ms: float


@dataclass(frozen=True)
class StoreStats:
    """The daemon's figures (Stats); see ``StatsResponse`` in proto/kvstore/v1/stats.proto for each one."""

    backend: str
    num_prefixes: int
    num_segments: int
    bytes_stored: int
    bytes_free: int
    bytes_read: int
    bytes_written: int
    requests: int
    read_only: str  # "" while writable, else why not
    quarantined_segments: int
    shm_arena_bytes: int
    shm_leased_bytes: int
    shm_sessions: int
    latency: tuple[LatencySummary, ...]
    index_map_bytes: int
    version: str
    cache_policy: str
    cpu_tier_bytes: int
    cpu_tier_used_bytes: int
    gpu_tier_bytes: int
    gpu_tier_used_bytes: int
    prefetch_reserve_bytes: int
    tier_hit_units: int
    tier_miss_units: int
    tier_units: int
    pinned_units: int
    max_disk_bytes: int
    disk_used_bytes: int
    disk_reserved_bytes: int
    evictions: int
    evicted_bytes: int
    compactions: int
    compaction_reclaimed_bytes: int
    merges: int
    segments_merged: int
    bytes_read_gpu: int
    bytes_read_cpu: int
    spec_bytes_used: int
    spec_bytes_wasted: int
    spec_units_cancelled: int
    pinned_bytes: int
    read_queue_depth: int
    data_connections: int
    num_conversations: int
    # the remote tier (docs/cluster.md); "" and 0 without one
    remote_state: str = ""
    remote_node_id: str = ""
    pending_prefixes: int = 0
    replicated_prefixes: int = 0
    failed_prefixes: int = 0
    replicated_extents: int = 0
    replicated_bytes: int = 0
    replication_skipped_extents: int = 0
    replication_retries: int = 0
    fill_prefixes: int = 0
    fill_chunks: int = 0
    fill_bytes: int = 0
    fill_pages: int = 0
    remote_misses: int = 0
    remote_checksum_failures: int = 0
    fill_failures: int = 0
    remote_degraded_events: int = 0


@dataclass(frozen=True)
class PrefetchStats:
    """One Prefetch stream's figures, sent when it closes; see ``PrefetchStats`` in proto/kvstore/v1/reads.proto."""

    bytes_gpu: int
    bytes_cpu: int
    bytes_disk: int  # read from disk, padding included
    bytes_useful: int  # extent bytes delivered
    spec_bytes_used: int
    spec_bytes_wasted: int
    units_gpu: int
    units_cpu: int
    units_disk: int
    spec_units_cancelled: int
    num_reads: int
    daemon_wait_s: float
    units_admitted: int
    groups_pushed: int
    groups_covered: int


@dataclass(frozen=True)
class SegmentReport:
    """One segment's checksums re-read (admin Verify)."""

    segment_id: int
    ok: bool
    regions: int
    bad_regions: tuple[str, ...]
    error: str


@dataclass(frozen=True)
class EvictResult:
    evicted: tuple[str, ...]  # prefix ids, in eviction order
    bytes_freed: int
    disk_used_bytes: int


@dataclass(frozen=True)
class CompactResult:
    segments_compacted: int
    bytes_reclaimed: int
    disk_used_bytes: int
    merges: int  # runs of small page-batch segments merged, each into one segment
    segments_merged: int  # the small segments those merges replaced


@dataclass
class ReadResult:
    """Extents of ``chunks`` (ascending) x ``groups`` of one prefix.

    ``bytes_read`` counts what came off the disk (padding included);
    ``bytes_useful`` the extents' own bytes; their ratio is the read
    amplification.  Extents read into shared memory are views into the
    daemon's arena, valid until ``release()`` (also on leaving a ``with``);
    bytes held in this process need no release.
    """

    prefix_id: str
    geometry: StoreGeometry
    chunks: np.ndarray
    groups: list[int]
    chunk_tokens: np.ndarray  # tokens of each selected chunk
    bytes_read: int = 0
    bytes_useful: int = 0
    num_reads: int = 0
    num_tokens: int = 0  # of the whole prefix, where the reader says (ReadChunks does, ChunkStore.read does not)
    zero_copy: bool = False  # extents are views into the daemon's shared-memory arena
    layers: range | None = None  # the layers asked for (ReadChunks' layer range); None: every layer of ``groups``
    buffer: memoryview | None = field(default=None, repr=False)  # holds every extent (ChunkStore.read)
    _views: dict = field(default_factory=dict, repr=False)  # (group, chunk) -> uint8 array
    _release: Callable[[], None] | None = field(default=None, repr=False)

    def extent_bytes(self, group: int, chunk: int) -> np.ndarray:
        """The extent's raw bytes (a uint8 view)."""
        return self._views[(group, chunk)]

    @property
    def read_amplification(self) -> float:
        return self.bytes_read / self.bytes_useful if self.bytes_useful else 1.0

    def extent(self, group: int, chunk: int) -> np.ndarray:
        """``[layers_in_group, 2, kv_heads, tokens, head_dim]`` (numpy KV dtype; dequantized when the geometry's ``kv_quant``)."""
        raw = self._views[(group, chunk)]
        tokens = int(self.chunk_tokens[np.searchsorted(self.chunks, chunk)])
        return self.geometry.extent_array(raw, group, tokens)

    def group_kv(self, group: int) -> np.ndarray:
        """The group's selected tokens: ``[layers_in_group, 2, kv_heads, tokens, head_dim]``."""
        raws = [self._views[(group, int(j))] for j in self.chunks]
        return self.geometry.group_array(raws, group, self.chunk_tokens)

    def to_kv(self) -> np.ndarray:
        """Exactly the layers asked for (``layers``; else every layer of ``groups``): ``[layers, 2, kv_heads, tokens, head_dim]`` (a copy).

        Extents are whole stored groups (``extent``, ``group_kv``); this cuts them to the range."""
        want = self.layers or range(self.geometry.model.num_layers)
        parts = []
        for g in self.groups:
            span = self.geometry.group_layer_range(g)
            lo, hi = max(span.start, want.start), min(span.stop, want.stop)
            if lo < hi:
                parts.append(self.group_kv(g)[lo - span.start : hi - span.start])
        return np.concatenate(parts, axis=0)

    def release(self) -> None:
        """Hand shared-memory leases back; the extents are gone afterwards."""
        if self._release is not None:
            self._release()
            self._release = None
        self._views.clear()

    def __enter__(self) -> ReadResult:
        return self

    def __exit__(self, *exc) -> None:
        self.release()
