from kvstore.contract._proto import frames_pb2 as _frames_pb2
from kvstore.contract._proto import geometry_pb2 as _geometry_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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

class ReadHeader(_message.Message):
    __slots__ = ("geometry", "chunks", "chunk_tokens", "groups", "num_tokens")
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    geometry: _geometry_pb2.Geometry
    chunks: _containers.RepeatedScalarFieldContainer[int]
    chunk_tokens: _containers.RepeatedScalarFieldContainer[int]
    groups: _containers.RepeatedScalarFieldContainer[int]
    num_tokens: int
    def __init__(self, geometry: _Optional[_Union[_geometry_pb2.Geometry, _Mapping]] = ..., chunks: _Optional[_Iterable[int]] = ..., chunk_tokens: _Optional[_Iterable[int]] = ..., groups: _Optional[_Iterable[int]] = ..., num_tokens: _Optional[int] = ...) -> None: ...

class ReadChunksResponse(_message.Message):
    __slots__ = ("header", "extent", "stats", "shm_group")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    EXTENT_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    SHM_GROUP_FIELD_NUMBER: _ClassVar[int]
    header: ReadHeader
    extent: _frames_pb2.ExtentData
    stats: _frames_pb2.ReadStats
    shm_group: _frames_pb2.ShmGroup
    def __init__(self, header: _Optional[_Union[ReadHeader, _Mapping]] = ..., extent: _Optional[_Union[_frames_pb2.ExtentData, _Mapping]] = ..., stats: _Optional[_Union[_frames_pb2.ReadStats, _Mapping]] = ..., shm_group: _Optional[_Union[_frames_pb2.ShmGroup, _Mapping]] = ...) -> None: ...

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
    geometry: _geometry_pb2.Geometry
    num_tokens: int
    num_chunks: int
    num_periods: int
    groups_per_period: int
    lease_id: int
    cache_policy: str
    def __init__(self, geometry: _Optional[_Union[_geometry_pb2.Geometry, _Mapping]] = ..., num_tokens: _Optional[int] = ..., num_chunks: _Optional[int] = ..., num_periods: _Optional[int] = ..., groups_per_period: _Optional[int] = ..., lease_id: _Optional[int] = ..., cache_policy: _Optional[str] = ...) -> None: ...

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
    extent: _frames_pb2.ExtentData
    group: _frames_pb2.ShmGroup
    period: int
    stats: PrefetchStats
    speculative: _frames_pb2.ShmGroup
    def __init__(self, header: _Optional[_Union[PrefetchHeader, _Mapping]] = ..., extent: _Optional[_Union[_frames_pb2.ExtentData, _Mapping]] = ..., group: _Optional[_Union[_frames_pb2.ShmGroup, _Mapping]] = ..., period: _Optional[int] = ..., stats: _Optional[_Union[PrefetchStats, _Mapping]] = ..., speculative: _Optional[_Union[_frames_pb2.ShmGroup, _Mapping]] = ...) -> None: ...

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
