from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InspectRequest(_message.Message):
    __slots__ = ("prefix_id",)
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    prefix_id: str
    def __init__(self, prefix_id: _Optional[str] = ...) -> None: ...

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
    __slots__ = ("segments_compacted", "bytes_reclaimed", "disk_used_bytes", "merges", "segments_merged")
    SEGMENTS_COMPACTED_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECLAIMED_FIELD_NUMBER: _ClassVar[int]
    DISK_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MERGES_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_MERGED_FIELD_NUMBER: _ClassVar[int]
    segments_compacted: int
    bytes_reclaimed: int
    disk_used_bytes: int
    merges: int
    segments_merged: int
    def __init__(self, segments_compacted: _Optional[int] = ..., bytes_reclaimed: _Optional[int] = ..., disk_used_bytes: _Optional[int] = ..., merges: _Optional[int] = ..., segments_merged: _Optional[int] = ...) -> None: ...
