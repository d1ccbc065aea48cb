"""The contract both sides import: everything that crosses the daemon's socket, and all a client needs of ``kvstore``.

``engine_client`` imports from the daemon's package only this package
(``tests/unit/test_import_boundary.py``), and the daemon uses the same
modules for the same things:

- ``pb``: the generated messages; ``kvstore.contract.rpc``: the gRPC stubs
  (apart, so that only a gRPC caller loads grpc);
- ``geometry``: a model's KV shape and the store's layout of it (every
  on-disk and on-wire size); ``layout``: a segment file's byte offsets;
  ``kv_values``: KV dtype conversions and key summaries; ``kvquant``: the
  stored KV's quantization; ``probes``: the probe keys' format;
- ``errors``: the error vocabulary, each class one status code
  (``KVStoreError.code``, mapped by ``kvstore.server.status``);
- ``codec``: geometry, tokens, array frames and layer ranges both ways, and
  every reply read into a value of ``results``;
- ``results``: what the calls answer (``LookupResult``, ``PutResult``,
  ``PrefixDescription``, ``StoreStats``, ``ReadResult``, ...), and
  ``conversation_results``: what the conversation calls answer
  (``ConversationInfo``, ``ConversationDeleted``);
- ``routing``, ``data_frames``: the cluster route and the data connection's framing;
- ``MAX_MESSAGE_BYTES``, the message size limit of both sides.
"""

from . import _proto as pb
from .codec import (
    MAX_MESSAGE_BYTES,
    array_frames,
    array_from_frames,
    compact_from_pb,
    conversation_deleted_from_pb,
    conversation_from_pb,
    description_from_pb,
    evict_from_pb,
    geometry_from_pb,
    geometry_to_pb,
    groups_for_layers,
    lookup_from_pb,
    pages_present_from_pb,
    pages_put_from_pb,
    prefetch_stats_from_pb,
    prefix_info_from_pb,
    put_from_pb,
    read_from_header,
    scores_from_pb,
    segment_report_from_pb,
    stats_from_pb,
    tokens_from_pb,
)
from .conversation_results import CompressedForm, ConversationDeleted, ConversationInfo, ConversationTurn, PrefixKept
from .errors import (
    BackendUnavailable,
    Conflict,
    DataLoss,
    FailedPrecondition,
    IndexDamaged,
    InvalidArgument,
    KVStoreError,
    NotFound,
    PermissionDenied,
    ReadOnly,
    StoreFull,
    StoreLocked,
)
from .results import (
    ChunkScores,
    CompactResult,
    EvictResult,
    LatencySummary,
    LookupResult,
    PagesPresent,
    PagesPutResult,
    PrefetchStats,
    PrefixDescription,
    PrefixInfo,
    PutResult,
    ReadResult,
    SegmentReport,
    StoreStats,
)

__all__ = [
    "MAX_MESSAGE_BYTES",
    "BackendUnavailable",
    "ChunkScores",
    "CompactResult",
    "CompressedForm",
    "Conflict",
    "ConversationDeleted",
    "ConversationInfo",
    "ConversationTurn",
    "DataLoss",
    "EvictResult",
    "FailedPrecondition",
    "IndexDamaged",
    "InvalidArgument",
    "KVStoreError",
    "LatencySummary",
    "LookupResult",
    "NotFound",
    "PagesPresent",
    "PagesPutResult",
    "PermissionDenied",
    "PrefetchStats",
    "PrefixDescription",
    "PrefixInfo",
    "PrefixKept",
    "PutResult",
    "ReadOnly",
    "ReadResult",
    "SegmentReport",
    "StoreFull",
    "StoreLocked",
    "StoreStats",
    "array_frames",
    "array_from_frames",
    "compact_from_pb",
    "conversation_deleted_from_pb",
    "conversation_from_pb",
    "description_from_pb",
    "evict_from_pb",
    "geometry_from_pb",
    "geometry_to_pb",
    "groups_for_layers",
    "lookup_from_pb",
    "pages_present_from_pb",
    "pages_put_from_pb",
    "pb",
    "prefetch_stats_from_pb",
    "prefix_info_from_pb",
    "put_from_pb",
    "read_from_header",
    "scores_from_pb",
    "segment_report_from_pb",
    "stats_from_pb",
    "tokens_from_pb",
]
