from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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

class AppendTurnResponse(_message.Message):
    __slots__ = ("conversation",)
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    conversation: ConversationInfo
    def __init__(self, conversation: _Optional[_Union[ConversationInfo, _Mapping]] = ...) -> None: ...

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

class MarkInactiveResponse(_message.Message):
    __slots__ = ("conversation",)
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    conversation: ConversationInfo
    def __init__(self, conversation: _Optional[_Union[ConversationInfo, _Mapping]] = ...) -> None: ...

class GetConversationRequest(_message.Message):
    __slots__ = ("namespace", "conversation_id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    conversation_id: str
    def __init__(self, namespace: _Optional[str] = ..., conversation_id: _Optional[str] = ...) -> None: ...

class GetConversationResponse(_message.Message):
    __slots__ = ("conversation",)
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    conversation: ConversationInfo
    def __init__(self, conversation: _Optional[_Union[ConversationInfo, _Mapping]] = ...) -> None: ...

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
