from kvstore.contract._proto import frames_pb2 as _frames_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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
    __slots__ = ("prefix_id", "layer_step")
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    LAYER_STEP_FIELD_NUMBER: _ClassVar[int]
    prefix_id: str
    layer_step: int
    def __init__(self, prefix_id: _Optional[str] = ..., layer_step: _Optional[int] = ...) -> None: ...

class GetSummariesResponse(_message.Message):
    __slots__ = ("frame",)
    FRAME_FIELD_NUMBER: _ClassVar[int]
    frame: _frames_pb2.ArrayFrame
    def __init__(self, frame: _Optional[_Union[_frames_pb2.ArrayFrame, _Mapping]] = ...) -> None: ...

class GetProbeKeysRequest(_message.Message):
    __slots__ = ("prefix_id", "group")
    PREFIX_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    prefix_id: str
    group: int
    def __init__(self, prefix_id: _Optional[str] = ..., group: _Optional[int] = ...) -> None: ...

class GetProbeKeysResponse(_message.Message):
    __slots__ = ("frame",)
    FRAME_FIELD_NUMBER: _ClassVar[int]
    frame: _frames_pb2.ArrayFrame
    def __init__(self, frame: _Optional[_Union[_frames_pb2.ArrayFrame, _Mapping]] = ...) -> None: ...
