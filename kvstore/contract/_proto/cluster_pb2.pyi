from kvstore.contract._proto import geometry_pb2 as _geometry_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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
    geometry: _geometry_pb2.Geometry
    tokens: _containers.RepeatedScalarFieldContainer[int]
    loads: _containers.RepeatedCompositeFieldContainer[NodeLoad]
    max_load_gap: float
    def __init__(self, namespace: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., geometry: _Optional[_Union[_geometry_pb2.Geometry, _Mapping]] = ..., tokens: _Optional[_Iterable[int]] = ..., loads: _Optional[_Iterable[_Union[NodeLoad, _Mapping]]] = ..., max_load_gap: _Optional[float] = ...) -> None: ...

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
