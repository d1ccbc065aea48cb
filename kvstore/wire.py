"""The wire format shared by the daemon and its clients: protobuf <-> domain objects (no I/O).

``engine_client`` imports this module and ``kvstore.geometry`` from the
daemon's package, nothing of ``kvstore.server``.
"""

from __future__ import annotations

import numpy as np

from ._proto import kvstore_pb2 as pb
from .errors import InvalidArgument
from .geometry import ModelSpec, StoreGeometry

# gRPC message size limit, both ways, on both sides of the socket.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


def geometry_from_pb(msg: pb.Geometry, field: str = "geometry") -> StoreGeometry:
    if not msg.HasField("model"):
        raise InvalidArgument(f"{field}.model", "is required")
    m = msg.model
    try:
        spec = ModelSpec(m.num_layers, m.num_kv_heads, m.head_dim, m.dtype or "bfloat16")
        return StoreGeometry(spec, chunk_tokens=msg.chunk_tokens or 16, period_layers=msg.period_layers or 8, probe_keys=msg.probe_keys)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{field}.{'model.' if exc.field in _MODEL_FIELDS else ''}{exc.field}", str(exc).split(": ", 1)[1]) from None


_MODEL_FIELDS = {"num_layers", "num_kv_heads", "head_dim", "dtype"}


def geometry_to_pb(geo: StoreGeometry) -> pb.Geometry:
    m = geo.model
    return pb.Geometry(
        model=pb.ModelSpec(num_layers=m.num_layers, num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, dtype=m.dtype),
        chunk_tokens=geo.chunk_tokens,
        period_layers=geo.period_layers,
        probe_keys=geo.probe_keys,
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
    p = geo.period_layers
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
