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
