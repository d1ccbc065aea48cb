from kvstore.contract._proto import frames_pb2 as _frames_pb2
from kvstore.contract._proto import geometry_pb2 as _geometry_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PutHeader(_message.Message):
    __slots__ = ("namespace", "model_fingerprint", "geometry", "tokens", "reuse_chunks")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    REUSE_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    model_fingerprint: str
    geometry: _geometry_pb2.Geometry
    tokens: _containers.RepeatedScalarFieldContainer[int]
    reuse_chunks: int
    def __init__(self, namespace: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., geometry: _Optional[_Union[_geometry_pb2.Geometry, _Mapping]] = ..., tokens: _Optional[_Iterable[int]] = ..., reuse_chunks: _Optional[int] = ...) -> None: ...

class PutPrefixRequest(_message.Message):
    __slots__ = ("header", "extent")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    EXTENT_FIELD_NUMBER: _ClassVar[int]
    header: PutHeader
    extent: _frames_pb2.ExtentFrame
    def __init__(self, header: _Optional[_Union[PutHeader, _Mapping]] = ..., extent: _Optional[_Union[_frames_pb2.ExtentFrame, _Mapping]] = ...) -> None: ...

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
    geometry: _geometry_pb2.Geometry
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, namespace: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., geometry: _Optional[_Union[_geometry_pb2.Geometry, _Mapping]] = ..., tokens: _Optional[_Iterable[int]] = ...) -> None: ...

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

class DescribeRequest(_message.Message):
    __slots__ = ("prefix_id",)
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    prefix_id: str
    def __init__(self, prefix_id: _Optional[str] = ...) -> None: ...

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
    geometry: _geometry_pb2.Geometry
    num_tokens: int
    num_chunks: int
    quarantined: str
    kind: str
    def __init__(self, prefix_id: _Optional[str] = ..., namespace: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., geometry: _Optional[_Union[_geometry_pb2.Geometry, _Mapping]] = ..., num_tokens: _Optional[int] = ..., num_chunks: _Optional[int] = ..., quarantined: _Optional[str] = ..., kind: _Optional[str] = ...) -> None: ...

class DeleteRequest(_message.Message):
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
