from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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

class ShmRef(_message.Message):
    __slots__ = ("lease_id", "offset", "length")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    offset: int
    length: int
    def __init__(self, lease_id: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

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
