from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LatencySummary(_message.Message):
    __slots__ = ("rpc", "count", "p50_ms", "p90_ms", "p99_ms")
    RPC_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    P50_MS_FIELD_NUMBER: _ClassVar[int]
    P90_MS_FIELD_NUMBER: _ClassVar[int]
    P99_MS_FIELD_NUMBER: _ClassVar[int]
    rpc: str
    count: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    def __init__(self, rpc: _Optional[str] = ..., count: _Optional[int] = ..., p50_ms: _Optional[float] = ..., p90_ms: _Optional[float] = ..., p99_ms: _Optional[float] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("backend", "num_prefixes", "num_segments", "bytes_stored", "bytes_free", "bytes_read", "bytes_written", "requests", "read_only", "quarantined_segments", "shm_arena_bytes", "shm_leased_bytes", "shm_sessions", "latency", "index_map_bytes", "version", "cache_policy", "cpu_tier_bytes", "cpu_tier_used_bytes", "gpu_tier_bytes", "gpu_tier_used_bytes", "prefetch_reserve_bytes", "tier_hit_units", "tier_miss_units", "tier_units", "pinned_units", "max_disk_bytes", "disk_used_bytes", "disk_reserved_bytes", "evictions", "evicted_bytes", "compactions", "compaction_reclaimed_bytes", "merges", "segments_merged", "bytes_read_gpu", "bytes_read_cpu", "spec_bytes_used", "spec_bytes_wasted", "spec_units_cancelled", "pinned_bytes", "read_queue_depth", "data_connections", "num_conversations", "remote_state", "remote_node_id", "pending_prefixes", "replicated_prefixes", "failed_prefixes", "replicated_extents", "replicated_bytes", "replication_skipped_extents", "replication_retries", "fill_prefixes", "fill_chunks", "fill_bytes", "fill_pages", "remote_misses", "remote_checksum_failures", "fill_failures", "remote_degraded_events")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    NUM_PREFIXES_FIELD_NUMBER: _ClassVar[int]
    NUM_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    BYTES_STORED_FIELD_NUMBER: _ClassVar[int]
    BYTES_FREE_FIELD_NUMBER: _ClassVar[int]
    BYTES_READ_FIELD_NUMBER: _ClassVar[int]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    SHM_ARENA_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHM_LEASED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHM_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_FIELD_NUMBER: _ClassVar[int]
    INDEX_MAP_BYTES_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CACHE_POLICY_FIELD_NUMBER: _ClassVar[int]
    CPU_TIER_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_TIER_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_TIER_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_TIER_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_RESERVE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIER_HIT_UNITS_FIELD_NUMBER: _ClassVar[int]
    TIER_MISS_UNITS_FIELD_NUMBER: _ClassVar[int]
    TIER_UNITS_FIELD_NUMBER: _ClassVar[int]
    PINNED_UNITS_FIELD_NUMBER: _ClassVar[int]
    MAX_DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    EVICTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPACTIONS_FIELD_NUMBER: _ClassVar[int]
    COMPACTION_RECLAIMED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MERGES_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_MERGED_FIELD_NUMBER: _ClassVar[int]
    BYTES_READ_GPU_FIELD_NUMBER: _ClassVar[int]
    BYTES_READ_CPU_FIELD_NUMBER: _ClassVar[int]
    SPEC_BYTES_USED_FIELD_NUMBER: _ClassVar[int]
    SPEC_BYTES_WASTED_FIELD_NUMBER: _ClassVar[int]
    SPEC_UNITS_CANCELLED_FIELD_NUMBER: _ClassVar[int]
    PINNED_BYTES_FIELD_NUMBER: _ClassVar[int]
    READ_QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    DATA_CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_CONVERSATIONS_FIELD_NUMBER: _ClassVar[int]
    REMOTE_STATE_FIELD_NUMBER: _ClassVar[int]
    REMOTE_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PENDING_PREFIXES_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_PREFIXES_FIELD_NUMBER: _ClassVar[int]
    FAILED_PREFIXES_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_EXTENTS_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_SKIPPED_EXTENTS_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_RETRIES_FIELD_NUMBER: _ClassVar[int]
    FILL_PREFIXES_FIELD_NUMBER: _ClassVar[int]
    FILL_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    FILL_BYTES_FIELD_NUMBER: _ClassVar[int]
    FILL_PAGES_FIELD_NUMBER: _ClassVar[int]
    REMOTE_MISSES_FIELD_NUMBER: _ClassVar[int]
    REMOTE_CHECKSUM_FAILURES_FIELD_NUMBER: _ClassVar[int]
    FILL_FAILURES_FIELD_NUMBER: _ClassVar[int]
    REMOTE_DEGRADED_EVENTS_FIELD_NUMBER: _ClassVar[int]
    backend: str
    num_prefixes: int
    num_segments: int
    bytes_stored: int
    bytes_free: int
    bytes_read: int
    bytes_written: int
    requests: int
    read_only: str
    quarantined_segments: int
    shm_arena_bytes: int
    shm_leased_bytes: int
    shm_sessions: int
    latency: _containers.RepeatedCompositeFieldContainer[LatencySummary]
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
    remote_state: str
    remote_node_id: str
    pending_prefixes: int
    replicated_prefixes: int
    failed_prefixes: int
    replicated_extents: int
    replicated_bytes: int
    replication_skipped_extents: int
    replication_retries: int
    fill_prefixes: int
    fill_chunks: int
    fill_bytes: int
    fill_pages: int
    remote_misses: int
    remote_checksum_failures: int
    fill_failures: int
    remote_degraded_events: int
    def __init__(self, backend: _Optional[str] = ..., num_prefixes: _Optional[int] = ..., num_segments: _Optional[int] = ..., bytes_stored: _Optional[int] = ..., bytes_free: _Optional[int] = ..., bytes_read: _Optional[int] = ..., bytes_written: _Optional[int] = ..., requests: _Optional[int] = ..., read_only: _Optional[str] = ..., quarantined_segments: _Optional[int] = ..., shm_arena_bytes: _Optional[int] = ..., shm_leased_bytes: _Optional[int] = ..., shm_sessions: _Optional[int] = ..., latency: _Optional[_Iterable[_Union[LatencySummary, _Mapping]]] = ..., index_map_bytes: _Optional[int] = ..., version: _Optional[str] = ..., cache_policy: _Optional[str] = ..., cpu_tier_bytes: _Optional[int] = ..., cpu_tier_used_bytes: _Optional[int] = ..., gpu_tier_bytes: _Optional[int] = ..., gpu_tier_used_bytes: _Optional[int] = ..., prefetch_reserve_bytes: _Optional[int] = ..., tier_hit_units: _Optional[int] = ..., tier_miss_units: _Optional[int] = ..., tier_units: _Optional[int] = ..., pinned_units: _Optional[int] = ..., max_disk_bytes: _Optional[int] = ..., disk_used_bytes: _Optional[int] = ..., disk_reserved_bytes: _Optional[int] = ..., evictions: _Optional[int] = ..., evicted_bytes: _Optional[int] = ..., compactions: _Optional[int] = ..., compaction_reclaimed_bytes: _Optional[int] = ..., merges: _Optional[int] = ..., segments_merged: _Optional[int] = ..., bytes_read_gpu: _Optional[int] = ..., bytes_read_cpu: _Optional[int] = ..., spec_bytes_used: _Optional[int] = ..., spec_bytes_wasted: _Optional[int] = ..., spec_units_cancelled: _Optional[int] = ..., pinned_bytes: _Optional[int] = ..., read_queue_depth: _Optional[int] = ..., data_connections: _Optional[int] = ..., num_conversations: _Optional[int] = ..., remote_state: _Optional[str] = ..., remote_node_id: _Optional[str] = ..., pending_prefixes: _Optional[int] = ..., replicated_prefixes: _Optional[int] = ..., failed_prefixes: _Optional[int] = ..., replicated_extents: _Optional[int] = ..., replicated_bytes: _Optional[int] = ..., replication_skipped_extents: _Optional[int] = ..., replication_retries: _Optional[int] = ..., fill_prefixes: _Optional[int] = ..., fill_chunks: _Optional[int] = ..., fill_bytes: _Optional[int] = ..., fill_pages: _Optional[int] = ..., remote_misses: _Optional[int] = ..., remote_checksum_failures: _Optional[int] = ..., fill_failures: _Optional[int] = ..., remote_degraded_events: _Optional[int] = ...) -> None: ...
