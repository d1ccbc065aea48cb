from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelSpec(_message.Message):
    __slots__ = ("num_layers", "num_kv_heads", "head_dim", "dtype")
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    def __init__(self, num_layers: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., dtype: _Optional[str] = ...) -> None: ...

class Geometry(_message.Message):
    __slots__ = ("model", "chunk_tokens", "group_layers", "probe_keys", "probe_bits", "kv_quant", "streaming_heads")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GROUP_LAYERS_FIELD_NUMBER: _ClassVar[int]
    PROBE_KEYS_FIELD_NUMBER: _ClassVar[int]
    PROBE_BITS_FIELD_NUMBER: _ClassVar[int]
    KV_QUANT_FIELD_NUMBER: _ClassVar[int]
    STREAMING_HEADS_FIELD_NUMBER: _ClassVar[int]
    model: ModelSpec
    chunk_tokens: int
    group_layers: int
    probe_keys: bool
    probe_bits: int
    kv_quant: str
    streaming_heads: _containers.RepeatedCompositeFieldContainer[HeadSet]
    def __init__(self, model: _Optional[_Union[ModelSpec, _Mapping]] = ..., chunk_tokens: _Optional[int] = ..., group_layers: _Optional[int] = ..., probe_keys: _Optional[bool] = ..., probe_bits: _Optional[int] = ..., kv_quant: _Optional[str] = ..., streaming_heads: _Optional[_Iterable[_Union[HeadSet, _Mapping]]] = ...) -> None: ...

class HeadSet(_message.Message):
    __slots__ = ("heads",)
    HEADS_FIELD_NUMBER: _ClassVar[int]
    heads: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, heads: _Optional[_Iterable[int]] = ...) -> None: ...

class PutHeader(_message.Message):
    __slots__ = ("namespace", "model_fingerprint", "geometry", "tokens", "reuse_chunks")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    REUSE_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    model_fingerprint: str
    geometry: Geometry
    tokens: _containers.RepeatedScalarFieldContainer[int]
    reuse_chunks: int
    def __init__(self, namespace: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., geometry: _Optional[_Union[Geometry, _Mapping]] = ..., tokens: _Optional[_Iterable[int]] = ..., reuse_chunks: _Optional[int] = ...) -> None: ...

class ExtentFrame(_message.Message):
    __slots__ = ("group", "chunk", "offset", "data")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    group: int
    chunk: int
    offset: int
    data: bytes
    def __init__(self, group: _Optional[int] = ..., chunk: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class PutPrefixRequest(_message.Message):
    __slots__ = ("header", "extent")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    EXTENT_FIELD_NUMBER: _ClassVar[int]
    header: PutHeader
    extent: ExtentFrame
    def __init__(self, header: _Optional[_Union[PutHeader, _Mapping]] = ..., extent: _Optional[_Union[ExtentFrame, _Mapping]] = ...) -> None: ...

class PutPrefixResponse(_message.Message):
    __slots__ = ("prefix_id", "num_tokens", "num_chunks", "reused_chunks", "bytes_written", "already_stored")
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    REUSED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    ALREADY_STORED_FIELD_NUMBER: _ClassVar[int]
    prefix_id: str
    num_tokens: int
    num_chunks: int
    reused_chunks: int
    bytes_written: int
    already_stored: bool
    def __init__(self, prefix_id: _Optional[str] = ..., num_tokens: _Optional[int] = ..., num_chunks: _Optional[int] = ..., reused_chunks: _Optional[int] = ..., bytes_written: _Optional[int] = ..., already_stored: _Optional[bool] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("namespace", "model_fingerprint", "geometry", "tokens")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    model_fingerprint: str
    geometry: Geometry
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, namespace: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., geometry: _Optional[_Union[Geometry, _Mapping]] = ..., tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("matched_chunks", "matched_tokens", "num_chunks", "prefix_id")
    MATCHED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    MATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    matched_chunks: int
    matched_tokens: int
    num_chunks: int
    prefix_id: str
    def __init__(self, matched_chunks: _Optional[int] = ..., matched_tokens: _Optional[int] = ..., num_chunks: _Optional[int] = ..., prefix_id: _Optional[str] = ...) -> None: ...

class ReadChunksRequest(_message.Message):
    __slots__ = ("prefix_id", "chunks", "layer_start", "layer_end", "shm_session", "coalesce", "no_coalesce", "data_channel", "data_secret")
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    SHM_SESSION_FIELD_NUMBER: _ClassVar[int]
    COALESCE_FIELD_NUMBER: _ClassVar[int]
    NO_COALESCE_FIELD_NUMBER: _ClassVar[int]
    DATA_CHANNEL_FIELD_NUMBER: _ClassVar[int]
    DATA_SECRET_FIELD_NUMBER: _ClassVar[int]
    prefix_id: str
    chunks: _containers.RepeatedScalarFieldContainer[int]
    layer_start: int
    layer_end: int
    shm_session: int
    coalesce: bool
    no_coalesce: bool
    data_channel: int
    data_secret: bytes
    def __init__(self, prefix_id: _Optional[str] = ..., chunks: _Optional[_Iterable[int]] = ..., layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ..., shm_session: _Optional[int] = ..., coalesce: _Optional[bool] = ..., no_coalesce: _Optional[bool] = ..., data_channel: _Optional[int] = ..., data_secret: _Optional[bytes] = ...) -> None: ...

class ShmRef(_message.Message):
    __slots__ = ("lease_id", "offset", "length")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    offset: int
    length: int
    def __init__(self, lease_id: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class ReadHeader(_message.Message):
    __slots__ = ("geometry", "chunks", "chunk_tokens", "groups", "num_tokens")
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    geometry: Geometry
    chunks: _containers.RepeatedScalarFieldContainer[int]
    chunk_tokens: _containers.RepeatedScalarFieldContainer[int]
    groups: _containers.RepeatedScalarFieldContainer[int]
    num_tokens: int
    def __init__(self, geometry: _Optional[_Union[Geometry, _Mapping]] = ..., chunks: _Optional[_Iterable[int]] = ..., chunk_tokens: _Optional[_Iterable[int]] = ..., groups: _Optional[_Iterable[int]] = ..., num_tokens: _Optional[int] = ...) -> None: ...

class ExtentData(_message.Message):
    __slots__ = ("group", "chunk", "offset", "extent_bytes", "data")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    EXTENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    group: int
    chunk: int
    offset: int
    extent_bytes: int
    data: bytes
    def __init__(self, group: _Optional[int] = ..., chunk: _Optional[int] = ..., offset: _Optional[int] = ..., extent_bytes: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class ShmGroup(_message.Message):
    __slots__ = ("group", "chunks", "refs")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    REFS_FIELD_NUMBER: _ClassVar[int]
    group: int
    chunks: _containers.RepeatedScalarFieldContainer[int]
    refs: _containers.RepeatedCompositeFieldContainer[ShmRef]
    def __init__(self, group: _Optional[int] = ..., chunks: _Optional[_Iterable[int]] = ..., refs: _Optional[_Iterable[_Union[ShmRef, _Mapping]]] = ...) -> None: ...

class ReadStats(_message.Message):
    __slots__ = ("bytes_read", "bytes_useful", "num_reads")
    BYTES_READ_FIELD_NUMBER: _ClassVar[int]
    BYTES_USEFUL_FIELD_NUMBER: _ClassVar[int]
    NUM_READS_FIELD_NUMBER: _ClassVar[int]
    bytes_read: int
    bytes_useful: int
    num_reads: int
    def __init__(self, bytes_read: _Optional[int] = ..., bytes_useful: _Optional[int] = ..., num_reads: _Optional[int] = ...) -> None: ...

class ReadChunksResponse(_message.Message):
    __slots__ = ("header", "extent", "stats", "shm_group")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    EXTENT_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    SHM_GROUP_FIELD_NUMBER: _ClassVar[int]
    header: ReadHeader
    extent: ExtentData
    stats: ReadStats
    shm_group: ShmGroup
    def __init__(self, header: _Optional[_Union[ReadHeader, _Mapping]] = ..., extent: _Optional[_Union[ExtentData, _Mapping]] = ..., stats: _Optional[_Union[ReadStats, _Mapping]] = ..., shm_group: _Optional[_Union[ShmGroup, _Mapping]] = ...) -> None: ...

class PrefetchOpen(_message.Message):
    __slots__ = ("prefix_id", "shm_session", "period_layers", "speculation", "coalesce", "no_speculation", "no_coalesce", "hints", "push_speculation")
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    SHM_SESSION_FIELD_NUMBER: _ClassVar[int]
    PERIOD_LAYERS_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    COALESCE_FIELD_NUMBER: _ClassVar[int]
    NO_SPECULATION_FIELD_NUMBER: _ClassVar[int]
    NO_COALESCE_FIELD_NUMBER: _ClassVar[int]
    HINTS_FIELD_NUMBER: _ClassVar[int]
    PUSH_SPECULATION_FIELD_NUMBER: _ClassVar[int]
    prefix_id: str
    shm_session: int
    period_layers: int
    speculation: bool
    coalesce: bool
    no_speculation: bool
    no_coalesce: bool
    hints: bool
    push_speculation: bool
    def __init__(self, prefix_id: _Optional[str] = ..., shm_session: _Optional[int] = ..., period_layers: _Optional[int] = ..., speculation: _Optional[bool] = ..., coalesce: _Optional[bool] = ..., no_speculation: _Optional[bool] = ..., no_coalesce: _Optional[bool] = ..., hints: _Optional[bool] = ..., push_speculation: _Optional[bool] = ...) -> None: ...

class PeriodSet(_message.Message):
    __slots__ = ("period", "chunks", "covered_groups")
    PERIOD_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    COVERED_GROUPS_FIELD_NUMBER: _ClassVar[int]
    period: int
    chunks: _containers.RepeatedScalarFieldContainer[int]
    covered_groups: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, period: _Optional[int] = ..., chunks: _Optional[_Iterable[int]] = ..., covered_groups: _Optional[_Iterable[int]] = ...) -> None: ...

class PeriodHint(_message.Message):
    __slots__ = ("period", "chunks")
    PERIOD_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    period: int
    chunks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, period: _Optional[int] = ..., chunks: _Optional[_Iterable[int]] = ...) -> None: ...

class PrefetchRequest(_message.Message):
    __slots__ = ("open", "period", "hint")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    PERIOD_FIELD_NUMBER: _ClassVar[int]
    HINT_FIELD_NUMBER: _ClassVar[int]
    open: PrefetchOpen
    period: PeriodSet
    hint: PeriodHint
    def __init__(self, open: _Optional[_Union[PrefetchOpen, _Mapping]] = ..., period: _Optional[_Union[PeriodSet, _Mapping]] = ..., hint: _Optional[_Union[PeriodHint, _Mapping]] = ...) -> None: ...

class PrefetchHeader(_message.Message):
    __slots__ = ("geometry", "num_tokens", "num_chunks", "num_periods", "groups_per_period", "lease_id", "cache_policy")
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    NUM_PERIODS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_PER_PERIOD_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CACHE_POLICY_FIELD_NUMBER: _ClassVar[int]
    geometry: Geometry
    num_tokens: int
    num_chunks: int
    num_periods: int
    groups_per_period: int
    lease_id: int
    cache_policy: str
    def __init__(self, geometry: _Optional[_Union[Geometry, _Mapping]] = ..., num_tokens: _Optional[int] = ..., num_chunks: _Optional[int] = ..., num_periods: _Optional[int] = ..., groups_per_period: _Optional[int] = ..., lease_id: _Optional[int] = ..., cache_policy: _Optional[str] = ...) -> None: ...

class PrefetchStats(_message.Message):
    __slots__ = ("bytes_gpu", "bytes_cpu", "bytes_disk", "bytes_useful", "spec_bytes_used", "spec_bytes_wasted", "units_gpu", "units_cpu", "units_disk", "spec_units_cancelled", "num_reads", "daemon_wait_s", "units_admitted", "groups_pushed", "groups_covered")
    BYTES_GPU_FIELD_NUMBER: _ClassVar[int]
    BYTES_CPU_FIELD_NUMBER: _ClassVar[int]
    BYTES_DISK_FIELD_NUMBER: _ClassVar[int]
    BYTES_USEFUL_FIELD_NUMBER: _ClassVar[int]
    SPEC_BYTES_USED_FIELD_NUMBER: _ClassVar[int]
    SPEC_BYTES_WASTED_FIELD_NUMBER: _ClassVar[int]
    UNITS_GPU_FIELD_NUMBER: _ClassVar[int]
    UNITS_CPU_FIELD_NUMBER: _ClassVar[int]
    UNITS_DISK_FIELD_NUMBER: _ClassVar[int]
    SPEC_UNITS_CANCELLED_FIELD_NUMBER: _ClassVar[int]
    NUM_READS_FIELD_NUMBER: _ClassVar[int]
    DAEMON_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    UNITS_ADMITTED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_PUSHED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_COVERED_FIELD_NUMBER: _ClassVar[int]
    bytes_gpu: int
    bytes_cpu: int
    bytes_disk: int
    bytes_useful: int
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
    def __init__(self, bytes_gpu: _Optional[int] = ..., bytes_cpu: _Optional[int] = ..., bytes_disk: _Optional[int] = ..., bytes_useful: _Optional[int] = ..., spec_bytes_used: _Optional[int] = ..., spec_bytes_wasted: _Optional[int] = ..., units_gpu: _Optional[int] = ..., units_cpu: _Optional[int] = ..., units_disk: _Optional[int] = ..., spec_units_cancelled: _Optional[int] = ..., num_reads: _Optional[int] = ..., daemon_wait_s: _Optional[float] = ..., units_admitted: _Optional[int] = ..., groups_pushed: _Optional[int] = ..., groups_covered: _Optional[int] = ...) -> None: ...

class PrefetchResponse(_message.Message):
    __slots__ = ("header", "extent", "group", "period", "stats", "speculative")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    EXTENT_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PERIOD_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_FIELD_NUMBER: _ClassVar[int]
    header: PrefetchHeader
    extent: ExtentData
    group: ShmGroup
    period: int
    stats: PrefetchStats
    speculative: ShmGroup
    def __init__(self, header: _Optional[_Union[PrefetchHeader, _Mapping]] = ..., extent: _Optional[_Union[ExtentData, _Mapping]] = ..., group: _Optional[_Union[ShmGroup, _Mapping]] = ..., period: _Optional[int] = ..., stats: _Optional[_Union[PrefetchStats, _Mapping]] = ..., speculative: _Optional[_Union[ShmGroup, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("shm_session", "lease_ids")
    SHM_SESSION_FIELD_NUMBER: _ClassVar[int]
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    shm_session: int
    lease_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, shm_session: _Optional[int] = ..., lease_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...

class ReportAttentionRequest(_message.Message):
    __slots__ = ("prefix_id", "group", "chunks", "attention")
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_FIELD_NUMBER: _ClassVar[int]
    prefix_id: str
    group: int
    chunks: _containers.RepeatedScalarFieldContainer[int]
    attention: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, prefix_id: _Optional[str] = ..., group: _Optional[int] = ..., chunks: _Optional[_Iterable[int]] = ..., attention: _Optional[_Iterable[float]] = ...) -> None: ...

class ReportAttentionResponse(_message.Message):
    __slots__ = ("units",)
    UNITS_FIELD_NUMBER: _ClassVar[int]
    units: int
    def __init__(self, units: _Optional[int] = ...) -> None: ...

class GetScoresRequest(_message.Message):
    __slots__ = ("prefix_id", "group")
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    prefix_id: str
    group: int
    def __init__(self, prefix_id: _Optional[str] = ..., group: _Optional[int] = ...) -> None: ...

class GetScoresResponse(_message.Message):
    __slots__ = ("importance", "frequency", "score")
    IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    importance: _containers.RepeatedScalarFieldContainer[float]
    frequency: _containers.RepeatedScalarFieldContainer[int]
    score: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, importance: _Optional[_Iterable[float]] = ..., frequency: _Optional[_Iterable[int]] = ..., score: _Optional[_Iterable[float]] = ...) -> None: ...

class GetSummariesRequest(_message.Message):
    __slots__ = ("prefix_id",)
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    prefix_id: str
    def __init__(self, prefix_id: _Optional[str] = ...) -> None: ...

class GetProbeKeysRequest(_message.Message):
    __slots__ = ("prefix_id", "group")
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    prefix_id: str
    group: int
    def __init__(self, prefix_id: _Optional[str] = ..., group: _Optional[int] = ...) -> None: ...

class ArrayFrame(_message.Message):
    __slots__ = ("shape", "dtype", "offset", "data")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    offset: int
    data: bytes
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class PagesExistRequest(_message.Message):
    __slots__ = ("namespace", "model_fingerprint", "geometry", "keys")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    model_fingerprint: str
    geometry: Geometry
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, namespace: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., geometry: _Optional[_Union[Geometry, _Mapping]] = ..., keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class PagesExistResponse(_message.Message):
    __slots__ = ("exists", "num_leading")
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    NUM_LEADING_FIELD_NUMBER: _ClassVar[int]
    exists: _containers.RepeatedScalarFieldContainer[bool]
    num_leading: int
    def __init__(self, exists: _Optional[_Iterable[bool]] = ..., num_leading: _Optional[int] = ...) -> None: ...

class PutPagesHeader(_message.Message):
    __slots__ = ("namespace", "model_fingerprint", "geometry", "keys", "skip_pages")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    SKIP_PAGES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    model_fingerprint: str
    geometry: Geometry
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    skip_pages: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, namespace: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., geometry: _Optional[_Union[Geometry, _Mapping]] = ..., keys: _Optional[_Iterable[bytes]] = ..., skip_pages: _Optional[_Iterable[int]] = ...) -> None: ...

class PutPagesRequest(_message.Message):
    __slots__ = ("header", "extent")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    EXTENT_FIELD_NUMBER: _ClassVar[int]
    header: PutPagesHeader
    extent: ExtentFrame
    def __init__(self, header: _Optional[_Union[PutPagesHeader, _Mapping]] = ..., extent: _Optional[_Union[ExtentFrame, _Mapping]] = ...) -> None: ...

class PutPagesResponse(_message.Message):
    __slots__ = ("num_pages", "pages_written", "pages_already_stored", "bytes_written", "batch_id")
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    PAGES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    PAGES_ALREADY_STORED_FIELD_NUMBER: _ClassVar[int]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    num_pages: int
    pages_written: int
    pages_already_stored: int
    bytes_written: int
    batch_id: str
    def __init__(self, num_pages: _Optional[int] = ..., pages_written: _Optional[int] = ..., pages_already_stored: _Optional[int] = ..., bytes_written: _Optional[int] = ..., batch_id: _Optional[str] = ...) -> None: ...

class GetPagesRequest(_message.Message):
    __slots__ = ("namespace", "model_fingerprint", "geometry", "keys", "layer_start", "layer_end", "shm_session")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    SHM_SESSION_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    model_fingerprint: str
    geometry: Geometry
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    layer_start: int
    layer_end: int
    shm_session: int
    def __init__(self, namespace: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., geometry: _Optional[_Union[Geometry, _Mapping]] = ..., keys: _Optional[_Iterable[bytes]] = ..., layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ..., shm_session: _Optional[int] = ...) -> None: ...

class PagesHeader(_message.Message):
    __slots__ = ("geometry", "num_pages", "groups")
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    geometry: Geometry
    num_pages: int
    groups: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, geometry: _Optional[_Union[Geometry, _Mapping]] = ..., num_pages: _Optional[int] = ..., groups: _Optional[_Iterable[int]] = ...) -> None: ...

class GetPagesResponse(_message.Message):
    __slots__ = ("header", "extent", "stats", "shm_group")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    EXTENT_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    SHM_GROUP_FIELD_NUMBER: _ClassVar[int]
    header: PagesHeader
    extent: ExtentData
    stats: ReadStats
    shm_group: ShmGroup
    def __init__(self, header: _Optional[_Union[PagesHeader, _Mapping]] = ..., extent: _Optional[_Union[ExtentData, _Mapping]] = ..., stats: _Optional[_Union[ReadStats, _Mapping]] = ..., shm_group: _Optional[_Union[ShmGroup, _Mapping]] = ...) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("prefix_id", "namespace", "model_fingerprint", "geometry", "num_tokens", "num_chunks", "quarantined", "kind")
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    prefix_id: str
    namespace: str
    model_fingerprint: str
    geometry: Geometry
    num_tokens: int
    num_chunks: int
    quarantined: str
    kind: str
    def __init__(self, prefix_id: _Optional[str] = ..., namespace: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., geometry: _Optional[_Union[Geometry, _Mapping]] = ..., num_tokens: _Optional[int] = ..., num_chunks: _Optional[int] = ..., quarantined: _Optional[str] = ..., kind: _Optional[str] = ...) -> None: ...

class PrefixRequest(_message.Message):
    __slots__ = ("prefix_id",)
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    prefix_id: str
    def __init__(self, prefix_id: _Optional[str] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("prefix_id",)
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    prefix_id: str
    def __init__(self, prefix_id: _Optional[str] = ...) -> None: ...

class ListPrefixesRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class PrefixInfo(_message.Message):
    __slots__ = ("prefix_id", "namespace", "model_fingerprint", "num_tokens", "num_chunks", "num_segments", "created", "quarantined", "kind")
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    NUM_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    prefix_id: str
    namespace: str
    model_fingerprint: str
    num_tokens: int
    num_chunks: int
    num_segments: int
    created: float
    quarantined: str
    kind: str
    def __init__(self, prefix_id: _Optional[str] = ..., namespace: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., num_tokens: _Optional[int] = ..., num_chunks: _Optional[int] = ..., num_segments: _Optional[int] = ..., created: _Optional[float] = ..., quarantined: _Optional[str] = ..., kind: _Optional[str] = ...) -> None: ...

class ListPrefixesResponse(_message.Message):
    __slots__ = ("prefixes",)
    PREFIXES_FIELD_NUMBER: _ClassVar[int]
    prefixes: _containers.RepeatedCompositeFieldContainer[PrefixInfo]
    def __init__(self, prefixes: _Optional[_Iterable[_Union[PrefixInfo, _Mapping]]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DataChannelRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DataChannelResponse(_message.Message):
    __slots__ = ("port", "reason")
    PORT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    port: int
    reason: str
    def __init__(self, port: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

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
    __slots__ = ("backend", "num_prefixes", "num_segments", "bytes_stored", "bytes_free", "bytes_read", "bytes_written", "requests", "read_only", "quarantined_segments", "shm_arena_bytes", "shm_leased_bytes", "shm_sessions", "latency", "index_map_bytes", "version", "cache_policy", "cpu_tier_bytes", "cpu_tier_used_bytes", "gpu_tier_bytes", "gpu_tier_used_bytes", "prefetch_reserve_bytes", "tier_hit_units", "tier_miss_units", "tier_units", "pinned_units", "max_disk_bytes", "disk_used_bytes", "disk_reserved_bytes", "evictions", "evicted_bytes", "compactions", "compaction_reclaimed_bytes", "bytes_read_gpu", "bytes_read_cpu", "spec_bytes_used", "spec_bytes_wasted", "spec_units_cancelled", "pinned_bytes", "read_queue_depth", "data_connections", "num_conversations", "remote_state", "remote_node_id", "pending_prefixes", "replicated_prefixes", "failed_prefixes", "replicated_extents", "replicated_bytes", "replication_skipped_extents", "replication_retries", "fill_prefixes", "fill_chunks", "fill_bytes", "fill_pages", "remote_misses", "remote_checksum_failures", "fill_failures", "remote_degraded_events")
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
    def __init__(self, backend: _Optional[str] = ..., num_prefixes: _Optional[int] = ..., num_segments: _Optional[int] = ..., bytes_stored: _Optional[int] = ..., bytes_free: _Optional[int] = ..., bytes_read: _Optional[int] = ..., bytes_written: _Optional[int] = ..., requests: _Optional[int] = ..., read_only: _Optional[str] = ..., quarantined_segments: _Optional[int] = ..., shm_arena_bytes: _Optional[int] = ..., shm_leased_bytes: _Optional[int] = ..., shm_sessions: _Optional[int] = ..., latency: _Optional[_Iterable[_Union[LatencySummary, _Mapping]]] = ..., index_map_bytes: _Optional[int] = ..., version: _Optional[str] = ..., cache_policy: _Optional[str] = ..., cpu_tier_bytes: _Optional[int] = ..., cpu_tier_used_bytes: _Optional[int] = ..., gpu_tier_bytes: _Optional[int] = ..., gpu_tier_used_bytes: _Optional[int] = ..., prefetch_reserve_bytes: _Optional[int] = ..., tier_hit_units: _Optional[int] = ..., tier_miss_units: _Optional[int] = ..., tier_units: _Optional[int] = ..., pinned_units: _Optional[int] = ..., max_disk_bytes: _Optional[int] = ..., disk_used_bytes: _Optional[int] = ..., disk_reserved_bytes: _Optional[int] = ..., evictions: _Optional[int] = ..., evicted_bytes: _Optional[int] = ..., compactions: _Optional[int] = ..., compaction_reclaimed_bytes: _Optional[int] = ..., bytes_read_gpu: _Optional[int] = ..., bytes_read_cpu: _Optional[int] = ..., spec_bytes_used: _Optional[int] = ..., spec_bytes_wasted: _Optional[int] = ..., spec_units_cancelled: _Optional[int] = ..., pinned_bytes: _Optional[int] = ..., read_queue_depth: _Optional[int] = ..., data_connections: _Optional[int] = ..., num_conversations: _Optional[int] = ..., remote_state: _Optional[str] = ..., remote_node_id: _Optional[str] = ..., pending_prefixes: _Optional[int] = ..., replicated_prefixes: _Optional[int] = ..., failed_prefixes: _Optional[int] = ..., replicated_extents: _Optional[int] = ..., replicated_bytes: _Optional[int] = ..., replication_skipped_extents: _Optional[int] = ..., replication_retries: _Optional[int] = ..., fill_prefixes: _Optional[int] = ..., fill_chunks: _Optional[int] = ..., fill_bytes: _Optional[int] = ..., fill_pages: _Optional[int] = ..., remote_misses: _Optional[int] = ..., remote_checksum_failures: _Optional[int] = ..., fill_failures: _Optional[int] = ..., remote_degraded_events: _Optional[int] = ...) -> None: ...

class NodeLoad(_message.Message):
    __slots__ = ("node_id", "load")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    load: float
    def __init__(self, node_id: _Optional[str] = ..., load: _Optional[float] = ...) -> None: ...

class RouteRequest(_message.Message):
    __slots__ = ("namespace", "model_fingerprint", "geometry", "tokens", "loads", "max_load_gap")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOADS_FIELD_NUMBER: _ClassVar[int]
    MAX_LOAD_GAP_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    model_fingerprint: str
    geometry: Geometry
    tokens: _containers.RepeatedScalarFieldContainer[int]
    loads: _containers.RepeatedCompositeFieldContainer[NodeLoad]
    max_load_gap: float
    def __init__(self, namespace: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., geometry: _Optional[_Union[Geometry, _Mapping]] = ..., tokens: _Optional[_Iterable[int]] = ..., loads: _Optional[_Iterable[_Union[NodeLoad, _Mapping]]] = ..., max_load_gap: _Optional[float] = ...) -> None: ...

class NodeMatch(_message.Message):
    __slots__ = ("node_id", "local_chunks", "load", "address")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LOCAL_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    local_chunks: int
    load: float
    address: str
    def __init__(self, node_id: _Optional[str] = ..., local_chunks: _Optional[int] = ..., load: _Optional[float] = ..., address: _Optional[str] = ...) -> None: ...

class RouteResponse(_message.Message):
    __slots__ = ("node_id", "reason", "local_chunks", "remote_chunks", "num_chunks", "nodes", "address")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LOCAL_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    REMOTE_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    NUM_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    reason: str
    local_chunks: int
    remote_chunks: int
    num_chunks: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeMatch]
    address: str
    def __init__(self, node_id: _Optional[str] = ..., reason: _Optional[str] = ..., local_chunks: _Optional[int] = ..., remote_chunks: _Optional[int] = ..., num_chunks: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeMatch, _Mapping]]] = ..., address: _Optional[str] = ...) -> None: ...

class InspectResponse(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("prefix_id",)
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    prefix_id: str
    def __init__(self, prefix_id: _Optional[str] = ...) -> None: ...

class SegmentReport(_message.Message):
    __slots__ = ("segment_id", "ok", "regions", "bad_regions", "error")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    BAD_REGIONS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    ok: bool
    regions: int
    bad_regions: _containers.RepeatedScalarFieldContainer[str]
    error: str
    def __init__(self, segment_id: _Optional[int] = ..., ok: _Optional[bool] = ..., regions: _Optional[int] = ..., bad_regions: _Optional[_Iterable[str]] = ..., error: _Optional[str] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ("segments",)
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedCompositeFieldContainer[SegmentReport]
    def __init__(self, segments: _Optional[_Iterable[_Union[SegmentReport, _Mapping]]] = ...) -> None: ...

class EvictRequest(_message.Message):
    __slots__ = ("to_bytes",)
    TO_BYTES_FIELD_NUMBER: _ClassVar[int]
    to_bytes: int
    def __init__(self, to_bytes: _Optional[int] = ...) -> None: ...

class EvictResponse(_message.Message):
    __slots__ = ("evicted", "bytes_freed", "disk_used_bytes")
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    BYTES_FREED_FIELD_NUMBER: _ClassVar[int]
    DISK_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    evicted: _containers.RepeatedScalarFieldContainer[str]
    bytes_freed: int
    disk_used_bytes: int
    def __init__(self, evicted: _Optional[_Iterable[str]] = ..., bytes_freed: _Optional[int] = ..., disk_used_bytes: _Optional[int] = ...) -> None: ...

class CompactRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CompactResponse(_message.Message):
    __slots__ = ("segments_compacted", "bytes_reclaimed", "disk_used_bytes")
    SEGMENTS_COMPACTED_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECLAIMED_FIELD_NUMBER: _ClassVar[int]
    DISK_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    segments_compacted: int
    bytes_reclaimed: int
    disk_used_bytes: int
    def __init__(self, segments_compacted: _Optional[int] = ..., bytes_reclaimed: _Optional[int] = ..., disk_used_bytes: _Optional[int] = ...) -> None: ...

class ConversationTurn(_message.Message):
    __slots__ = ("turn", "prefix_id", "num_tokens", "created", "stored", "kv_bytes")
    TURN_FIELD_NUMBER: _ClassVar[int]
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    turn: int
    prefix_id: str
    num_tokens: int
    created: float
    stored: bool
    kv_bytes: int
    def __init__(self, turn: _Optional[int] = ..., prefix_id: _Optional[str] = ..., num_tokens: _Optional[int] = ..., created: _Optional[float] = ..., stored: _Optional[bool] = ..., kv_bytes: _Optional[int] = ...) -> None: ...

class CompressedForm(_message.Message):
    __slots__ = ("prefix_id", "format", "strategy_json", "num_tokens", "stored", "kv_bytes")
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_JSON_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    prefix_id: str
    format: str
    strategy_json: str
    num_tokens: int
    stored: bool
    kv_bytes: int
    def __init__(self, prefix_id: _Optional[str] = ..., format: _Optional[str] = ..., strategy_json: _Optional[str] = ..., num_tokens: _Optional[int] = ..., stored: _Optional[bool] = ..., kv_bytes: _Optional[int] = ...) -> None: ...

class ConversationInfo(_message.Message):
    __slots__ = ("conversation_id", "namespace", "model_fingerprint", "state", "num_turns", "num_tokens", "turns", "compressed", "created", "updated", "uncompressed_bytes", "compressed_bytes", "stored_bytes", "missing_prefixes")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NUM_TURNS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    COMPRESSED_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    UNCOMPRESSED_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPRESSED_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MISSING_PREFIXES_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    namespace: str
    model_fingerprint: str
    state: str
    num_turns: int
    num_tokens: int
    turns: _containers.RepeatedCompositeFieldContainer[ConversationTurn]
    compressed: CompressedForm
    created: float
    updated: float
    uncompressed_bytes: int
    compressed_bytes: int
    stored_bytes: int
    missing_prefixes: int
    def __init__(self, conversation_id: _Optional[str] = ..., namespace: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., state: _Optional[str] = ..., num_turns: _Optional[int] = ..., num_tokens: _Optional[int] = ..., turns: _Optional[_Iterable[_Union[ConversationTurn, _Mapping]]] = ..., compressed: _Optional[_Union[CompressedForm, _Mapping]] = ..., created: _Optional[float] = ..., updated: _Optional[float] = ..., uncompressed_bytes: _Optional[int] = ..., compressed_bytes: _Optional[int] = ..., stored_bytes: _Optional[int] = ..., missing_prefixes: _Optional[int] = ...) -> None: ...

class AppendTurnRequest(_message.Message):
    __slots__ = ("namespace", "conversation_id", "turn", "prefix_id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    conversation_id: str
    turn: int
    prefix_id: str
    def __init__(self, namespace: _Optional[str] = ..., conversation_id: _Optional[str] = ..., turn: _Optional[int] = ..., prefix_id: _Optional[str] = ...) -> None: ...

class MarkInactiveRequest(_message.Message):
    __slots__ = ("namespace", "conversation_id", "compressed_prefix_id", "format", "strategy_json")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    COMPRESSED_PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_JSON_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    conversation_id: str
    compressed_prefix_id: str
    format: str
    strategy_json: str
    def __init__(self, namespace: _Optional[str] = ..., conversation_id: _Optional[str] = ..., compressed_prefix_id: _Optional[str] = ..., format: _Optional[str] = ..., strategy_json: _Optional[str] = ...) -> None: ...

class ConversationRequest(_message.Message):
    __slots__ = ("namespace", "conversation_id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    conversation_id: str
    def __init__(self, namespace: _Optional[str] = ..., conversation_id: _Optional[str] = ...) -> None: ...

class ListConversationsRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class ListConversationsResponse(_message.Message):
    __slots__ = ("conversations",)
    CONVERSATIONS_FIELD_NUMBER: _ClassVar[int]
    conversations: _containers.RepeatedCompositeFieldContainer[ConversationInfo]
    def __init__(self, conversations: _Optional[_Iterable[_Union[ConversationInfo, _Mapping]]] = ...) -> None: ...

class DeleteConversationRequest(_message.Message):
    __slots__ = ("namespace", "conversation_id", "delete_prefixes")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    DELETE_PREFIXES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    conversation_id: str
    delete_prefixes: bool
    def __init__(self, namespace: _Optional[str] = ..., conversation_id: _Optional[str] = ..., delete_prefixes: _Optional[bool] = ...) -> None: ...

class PrefixKept(_message.Message):
    __slots__ = ("prefix_id", "reason")
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    prefix_id: str
    reason: str
    def __init__(self, prefix_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class DeleteConversationResponse(_message.Message):
    __slots__ = ("conversation_id", "deleted_prefixes", "kept_prefixes")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    DELETED_PREFIXES_FIELD_NUMBER: _ClassVar[int]
    KEPT_PREFIXES_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    deleted_prefixes: _containers.RepeatedScalarFieldContainer[str]
    kept_prefixes: _containers.RepeatedCompositeFieldContainer[PrefixKept]
    def __init__(self, conversation_id: _Optional[str] = ..., deleted_prefixes: _Optional[_Iterable[str]] = ..., kept_prefixes: _Optional[_Iterable[_Union[PrefixKept, _Mapping]]] = ...) -> None: ...
