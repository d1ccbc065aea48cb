from kvstore.contract._proto import frames_pb2 as _frames_pb2
from kvstore.contract._proto import geometry_pb2 as _geometry_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PagesExistRequest(_message.Message):
    __slots__ = ("namespace", "model_fingerprint", "geometry", "keys")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    model_fingerprint: str
    geometry: _geometry_pb2.Geometry
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, namespace: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., geometry: _Optional[_Union[_geometry_pb2.Geometry, _Mapping]] = ..., keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

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
    geometry: _geometry_pb2.Geometry
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    skip_pages: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, namespace: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., geometry: _Optional[_Union[_geometry_pb2.Geometry, _Mapping]] = ..., keys: _Optional[_Iterable[bytes]] = ..., skip_pages: _Optional[_Iterable[int]] = ...) -> None: ...

class PutPagesRequest(_message.Message):
    __slots__ = ("header", "extent")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    EXTENT_FIELD_NUMBER: _ClassVar[int]
    header: PutPagesHeader
    extent: _frames_pb2.ExtentFrame
    def __init__(self, header: _Optional[_Union[PutPagesHeader, _Mapping]] = ..., extent: _Optional[_Union[_frames_pb2.ExtentFrame, _Mapping]] = ...) -> None: ...

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
    geometry: _geometry_pb2.Geometry
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    layer_start: int
    layer_end: int
    shm_session: int
    def __init__(self, namespace: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., geometry: _Optional[_Union[_geometry_pb2.Geometry, _Mapping]] = ..., keys: _Optional[_Iterable[bytes]] = ..., layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ..., shm_session: _Optional[int] = ...) -> None: ...

class PagesHeader(_message.Message):
    __slots__ = ("geometry", "num_pages", "groups")
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    geometry: _geometry_pb2.Geometry
    num_pages: int
    groups: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, geometry: _Optional[_Union[_geometry_pb2.Geometry, _Mapping]] = ..., num_pages: _Optional[int] = ..., groups: _Optional[_Iterable[int]] = ...) -> None: ...

class GetPagesResponse(_message.Message):
    __slots__ = ("header", "extent", "stats", "shm_group")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    EXTENT_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    SHM_GROUP_FIELD_NUMBER: _ClassVar[int]
    header: PagesHeader
    extent: _frames_pb2.ExtentData
    stats: _frames_pb2.ReadStats
    shm_group: _frames_pb2.ShmGroup
    def __init__(self, header: _Optional[_Union[PagesHeader, _Mapping]] = ..., extent: _Optional[_Union[_frames_pb2.ExtentData, _Mapping]] = ..., stats: _Optional[_Union[_frames_pb2.ReadStats, _Mapping]] = ..., shm_group: _Optional[_Union[_frames_pb2.ShmGroup, _Mapping]] = ...) -> None: ...
