"""Protobuf <-> domain objects, both ways, for the daemon and its clients (no I/O).

The daemon reads requests with it (``geometry_from_pb``, ``tokens_from_pb``,
``groups_for_layers``) and writes geometry and arrays into its replies
(``geometry_to_pb``, ``array_frames``); the client does the reverse and
reads every reply into a value of ``results`` (``*_from_pb``,
``array_from_frames``, ``read_from_header``), so no protobuf message
leaves ``engine_client``.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from . import _proto as pb
from .conversation_results import CompressedForm, ConversationDeleted, ConversationInfo, ConversationTurn, PrefixKept
from .errors import InvalidArgument
from .geometry import ModelSpec, StoreGeometry
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

# gRPC message size limit, both ways, on both sides of the socket.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


def geometry_from_pb(msg: pb.Geometry, field: str = "geometry") -> StoreGeometry:
    if not msg.HasField("model"):
        raise InvalidArgument(f"{field}.model", "is required")
    m = msg.model
    try:
        spec = ModelSpec(m.num_layers, m.num_kv_heads, m.head_dim, m.dtype or "bfloat16")
        return StoreGeometry(
            spec,
            chunk_tokens=msg.chunk_tokens or 16,
            group_layers=msg.group_layers or 8,
            probe_keys=msg.probe_keys,
            probe_bits=msg.probe_bits,
            kv_quant=msg.kv_quant,
            streaming_heads=tuple(tuple(h.heads) for h in msg.streaming_heads),
        )
    except InvalidArgument as exc:
        raise InvalidArgument(f"{field}.{'model.' if exc.field in _MODEL_FIELDS else ''}{exc.field}", str(exc).split(": ", 1)[1]) from None


_MODEL_FIELDS = {"num_layers", "num_kv_heads", "head_dim", "dtype"}


def geometry_to_pb(geo: StoreGeometry) -> pb.Geometry:
    m = geo.model
    return pb.Geometry(
        model=pb.ModelSpec(num_layers=m.num_layers, num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, dtype=m.dtype),
        chunk_tokens=geo.chunk_tokens,
        group_layers=geo.group_layers,
        probe_keys=geo.probe_keys,
        probe_bits=geo.probe_bits,
        kv_quant=geo.kv_quant,
        streaming_heads=[pb.HeadSet(heads=list(h)) for h in geo.streaming_heads],
    )


def tokens_from_pb(values) -> np.ndarray:
    return np.fromiter(values, dtype=np.int64, count=len(values))


def groups_for_layers(geo: StoreGeometry, layer_start: int, layer_end: int) -> list[int]:
    """Period groups covering layers ``[layer_start, layer_end)`` (0 = to the end)."""
    num_layers = geo.model.num_layers
    end = layer_end or num_layers
    if not 0 <= layer_start < num_layers:
        raise InvalidArgument("layer_start", f"must be in [0, {num_layers}), got {layer_start}")
    if not layer_start < end <= num_layers:
        raise InvalidArgument("layer_end", f"must be in ({layer_start}, {num_layers}] or 0, got {layer_end}")
    p = geo.group_layers
    return list(range(layer_start // p, (end - 1) // p + 1))


def array_frames(arr: np.ndarray, frame_bytes: int):
    """Split an array into ArrayFrame messages (shape and dtype on the first)."""
    raw = memoryview(np.ascontiguousarray(arr)).cast("B")
    dtype = str(arr.dtype)
    if len(raw) == 0:
        yield pb.ArrayFrame(shape=list(arr.shape), dtype=dtype)
    for off in range(0, len(raw), frame_bytes):
        first = off == 0
        yield pb.ArrayFrame(
            shape=list(arr.shape) if first else [],
            dtype=dtype if first else "",
            offset=off,
            data=bytes(raw[off : off + frame_bytes]),
        )


def array_from_frames(frames) -> np.ndarray:
    """The array ``array_frames`` split (shape and dtype from the first frame)."""
    out = None
    for f in frames:
        if out is None:
            shape, dtype = tuple(f.shape), np.dtype(f.dtype)
            out = np.empty(int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
        out[f.offset : f.offset + len(f.data)] = np.frombuffer(f.data, dtype=np.uint8)
    if out is None:
        raise ValueError("the array arrived without a frame")
    return out.view(dtype).reshape(shape)


# ------------------------------------------------------------ replies -> results
def _result(cls, msg, **converted):
    """``cls`` from the message's fields of the same names; ``converted`` gives the rest."""
    return cls(**{f.name: getattr(msg, f.name) for f in fields(cls) if f.name not in converted}, **converted)


def lookup_from_pb(msg: pb.LookupResponse) -> LookupResult:
    return _result(LookupResult, msg)


def put_from_pb(msg: pb.PutPrefixResponse) -> PutResult:
    return _result(PutResult, msg)


def pages_present_from_pb(msg: pb.PagesExistResponse) -> PagesPresent:
    return PagesPresent(np.array(msg.exists, dtype=bool), msg.num_leading)


def pages_put_from_pb(msg: pb.PutPagesResponse) -> PagesPutResult:
    return _result(PagesPutResult, msg)


def description_from_pb(msg: pb.DescribeResponse) -> PrefixDescription:
    return _result(PrefixDescription, msg, geometry=geometry_from_pb(msg.geometry))


def prefix_info_from_pb(msg: pb.PrefixInfo) -> PrefixInfo:
    return _result(PrefixInfo, msg)


def scores_from_pb(msg: pb.GetScoresResponse) -> ChunkScores:
    return ChunkScores(np.array(msg.importance), np.array(msg.frequency), np.array(msg.score))


def stats_from_pb(msg: pb.StatsResponse) -> StoreStats:
    return _result(StoreStats, msg, latency=tuple(_result(LatencySummary, row) for row in msg.latency))


def prefetch_stats_from_pb(msg: pb.PrefetchStats) -> PrefetchStats:
    return _result(PrefetchStats, msg)


def segment_report_from_pb(msg: pb.SegmentReport) -> SegmentReport:
    return _result(SegmentReport, msg, bad_regions=tuple(msg.bad_regions))


def evict_from_pb(msg: pb.EvictResponse) -> EvictResult:
    return _result(EvictResult, msg, evicted=tuple(msg.evicted))


def compact_from_pb(msg: pb.CompactResponse) -> CompactResult:
    return _result(CompactResult, msg)


def conversation_from_pb(msg: pb.ConversationInfo) -> ConversationInfo:
    return _result(
        ConversationInfo,
        msg,
        turns=tuple(_result(ConversationTurn, t) for t in msg.turns),
        compressed=_result(CompressedForm, msg.compressed) if msg.HasField("compressed") else None,
    )


def conversation_deleted_from_pb(msg: pb.DeleteConversationResponse) -> ConversationDeleted:
    return ConversationDeleted(msg.conversation_id, tuple(msg.deleted_prefixes), tuple(_result(PrefixKept, k) for k in msg.kept_prefixes))


def read_from_header(prefix_id: str, h: pb.ReadHeader, zero_copy: bool) -> ReadResult:
    """The empty ``ReadResult`` a ReadChunks header announces; the extents follow."""
    return ReadResult(
        prefix_id=prefix_id,
        geometry=geometry_from_pb(h.geometry),
        chunks=np.array(h.chunks, dtype=np.int64),
        groups=list(h.groups),
        chunk_tokens=np.array(h.chunk_tokens, dtype=np.int64),
        num_tokens=h.num_tokens,
        zero_copy=zero_copy,
    )
