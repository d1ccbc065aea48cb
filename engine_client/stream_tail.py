"""The streaming heads' sink and recent rows of a stored prefix, kept as pages (LServe's second layout).

A geometry with ``streaming_heads`` (``kvstore.contract.geometry``) stores each
chunk's extents without those heads' rows: a streaming head reads only the
first ``sink_tokens`` rows of a prefix and its last ``recent_tokens``.  Which
rows are the last depends on where the prefix ends, and a chunk is shared by
every prefix that starts with it (its hash covers the tokens up to its end,
not after), so those rows are kept per prefix: the **tail**, pages
(``KVStoreClient.put_pages``) holding

* page 0..S-1: prefix positions ``[0, S*c)``, the sink (``S = ceil(sink / c)``);
* page S..: the last ``R = ceil(recent / c) * c`` positions, ``[n - R, n)``
  (rows before position 0 are zero when the prefix is that short),

under keys drawn from the prefix id (which covers the tokens, the geometry,
the namespace and the model), so a tail is found from the prefix alone and
two prefixes never share one.

A page holds only the streaming heads' rows: its geometry (``tail_geometry``)
has one single-head "layer" per left-out (layer, KV head) pair, in layer
order, in the KV dtype (pages are stored unquantized), one stored group, no
probe keys.  At SmolLM2-135M's 31 left-out pairs, sink 16 + recent 64 that
is 5 pages of 80 rows x 31 pairs: 1.3 MB in float32 per prefix, 2.0% of the
full layout's 63 MB at 4096 tokens (``tail_bytes``).

The prefix is stored first, then its tail; the tail can also be evicted on
its own.  A request finding no tail is told so (``TailMissing``) and
``ModelRunner.store_prefix`` puts a missing tail again, so an interrupted
put heals on the next store of the same prefix.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import grpc
import numpy as np
import torch

from kvstore.contract import NotFound
from kvstore.contract.geometry import ModelSpec, StoreGeometry

from .rpc import KVStoreRpcError

_KEY_TAG = b"kvstore.stream-tail.v1\0"


class TailMissing(NotFound):
    """The prefix keeps its streaming heads' (or sliding layers') rows as pages, and they are not stored."""


def tail_pairs(geometry: StoreGeometry) -> list[tuple[int, int]]:
    """The (layer, KV head) pairs a ``geometry`` prefix leaves out of its extents, in layer order."""
    return [(layer, h) for layer, heads in enumerate(geometry.streaming_heads) for h in heads]


def tail_geometry(geometry: StoreGeometry, pairs=None) -> StoreGeometry:
    """The geometry the tail pages of a ``geometry`` prefix are stored in (module docstring); ``pairs``: the
    (layer, KV head) pairs they hold, ``tail_pairs(geometry)`` by default (a window tail's are its own)."""
    pairs = len(tail_pairs(geometry) if pairs is None else pairs)
    if not pairs:
        raise ValueError("the geometry leaves no head out: its prefixes have no tail")
    m = geometry.model
    spec = ModelSpec(num_layers=pairs, num_kv_heads=1, head_dim=m.head_dim, dtype=m.dtype)
    return StoreGeometry(spec, chunk_tokens=geometry.chunk_tokens, group_layers=pairs, probe_keys=False)


def sink_pages(sink_tokens: int, chunk_tokens: int) -> int:
    return -(-sink_tokens // chunk_tokens)


def recent_rows(recent_tokens: int, chunk_tokens: int) -> int:
    """``R``: the recent window rounded up to whole pages."""
    return -(-recent_tokens // chunk_tokens) * chunk_tokens


def tail_positions(num_tokens: int, sink_tokens: int, recent_tokens: int, chunk_tokens: int) -> np.ndarray:
    """The prefix position of each tail row, page by page: ``[pages * chunk_tokens]`` int64, -1 for a zero row."""
    sink = np.arange(sink_pages(sink_tokens, chunk_tokens) * chunk_tokens)
    r = recent_rows(recent_tokens, chunk_tokens)
    recent = np.arange(num_tokens - r, num_tokens)
    pos = np.concatenate([sink, recent]).astype(np.int64)
    pos[(pos < 0) | (pos >= num_tokens)] = -1
    return pos


def tail_keys(prefix_id: str, sink_tokens: int, recent_tokens: int, chunk_tokens: int) -> list[bytes]:
    """The page keys of ``prefix_id``'s tail (32 bytes each)."""
    base = hashlib.sha256(_KEY_TAG + bytes.fromhex(prefix_id) + np.array([sink_tokens, recent_tokens], "<i8").tobytes()).digest()[:30]
    pages = len(tail_positions(0, sink_tokens, recent_tokens, chunk_tokens)) // chunk_tokens
    return [base + i.to_bytes(2, "big") for i in range(pages)]


def tail_pages(kv: np.ndarray, pairs: list[tuple[int, int]], sink_tokens: int, recent_tokens: int, chunk_tokens: int) -> np.ndarray:
    """A prefix's tail from its KV ``[layers, 2, kv_heads, n, head_dim]``:
    ``[pages, pairs, 2, 1, chunk_tokens, head_dim]`` (the pages of ``tail_geometry``)."""
    n, dim = kv.shape[3], kv.shape[4]
    pos = tail_positions(n, sink_tokens, recent_tokens, chunk_tokens)
    rows = np.zeros((len(pairs), 2, pos.size, dim), dtype=kv.dtype)
    held = pos >= 0
    for i, (layer, h) in enumerate(pairs):
        rows[i][:, held] = kv[layer, :, h][:, pos[held]]
    pages = pos.size // chunk_tokens
    return np.ascontiguousarray(rows.reshape(len(pairs), 2, 1, pages, chunk_tokens, dim).transpose(3, 0, 1, 2, 4, 5))


def tail_bytes(geometry: StoreGeometry, sink_tokens: int, recent_tokens: int, pairs=None) -> int:
    """Bytes of one prefix's tail pages as stored (whatever the prefix's length); ``pairs`` as ``tail_geometry``'s."""
    rows = tail_positions(0, sink_tokens, recent_tokens, geometry.chunk_tokens).size
    return tail_geometry(geometry, pairs).kv_bytes(rows)


@dataclass(frozen=True)
class StreamTail:
    """One prefix's tail as loaded: ``rows [pairs, 2, r, head_dim]`` at prefix ``positions [r]`` (ascending),
    pair ``i`` being ``pairs[i]`` = (layer, KV head)."""

    pairs: list[tuple[int, int]]
    positions: np.ndarray
    rows: np.ndarray


def put_tail(
    client,
    prefix_id: str,
    kv: np.ndarray,
    geometry: StoreGeometry,
    sink_tokens: int,
    recent_tokens: int,
    *,
    namespace="",
    model_fingerprint="",
    pairs=None,
):
    """Store ``prefix_id``'s tail from its KV (numpy, the KV dtype, every layer of the model); returns the
    ``PagesPutResult``.  ``pairs``: see ``tail_geometry``."""
    c = geometry.chunk_tokens
    pairs = tail_pairs(geometry) if pairs is None else pairs
    return client.put_pages(
        tail_keys(prefix_id, sink_tokens, recent_tokens, c),
        tail_pages(kv, pairs, sink_tokens, recent_tokens, c),
        tail_geometry(geometry, pairs),
        namespace=namespace,
        model_fingerprint=model_fingerprint,
    )


def has_tail(
    client, prefix_id: str, geometry: StoreGeometry, sink_tokens: int, recent_tokens: int, *, namespace="", model_fingerprint="", pairs=None
) -> bool:
    keys = tail_keys(prefix_id, sink_tokens, recent_tokens, geometry.chunk_tokens)
    present = client.pages_exist(keys, tail_geometry(geometry, pairs), namespace=namespace, model_fingerprint=model_fingerprint)
    return bool(np.all(present.exists))


def get_tail(
    client,
    prefix_id: str,
    num_tokens: int,
    geometry: StoreGeometry,
    sink_tokens: int,
    recent_tokens: int,
    *,
    namespace="",
    model_fingerprint="",
    pairs=None,
) -> StreamTail:
    """``prefix_id``'s tail, its zero rows dropped; ``TailMissing`` when any page of it is not stored.
    ``pairs``: see ``tail_geometry``."""
    c = geometry.chunk_tokens
    pairs = tail_pairs(geometry) if pairs is None else pairs
    try:
        pages = client.get_pages(
            tail_keys(prefix_id, sink_tokens, recent_tokens, c),
            tail_geometry(geometry, pairs),
            namespace=namespace,
            model_fingerprint=model_fingerprint,
        )  # [pages, pairs, 2, 1, c, d]
    except KVStoreRpcError as exc:
        if exc.code != grpc.StatusCode.NOT_FOUND:
            raise
        raise TailMissing(
            f"prefix {prefix_id} keeps its streaming heads' or sliding layers' last rows as pages, and they are not stored "
            "(evicted, or the put was cut short): store the prefix again"
        ) from None
    pos = tail_positions(num_tokens, sink_tokens, recent_tokens, c)
    p, npairs, _, _, _, dim = pages.shape
    rows = pages[:, :, :, 0].transpose(1, 2, 0, 3, 4).reshape(npairs, 2, p * c, dim)
    positions, first = np.unique(pos, return_index=True)  # ascending; a short prefix's sink and recent rows overlap
    keep = positions >= 0
    return StreamTail(list(pairs), positions[keep], np.ascontiguousarray(rows[:, :, first[keep]]))


def left_out_heads(heads) -> tuple[tuple[int, ...], ...]:
    """Per layer, the streaming KV heads (``model.streaming.StreamingHeads``) a streaming layout leaves out
    of the extents.  Where every head of a layer streams, the least local one (lowest calibrated mass)
    stays stored: an extent keeps at least one head of each layer; the runner still masks it as streaming."""
    out = []
    for flags, mass in zip(heads.streaming, heads.mass):
        streaming = [h for h, s in enumerate(flags) if s]
        if len(streaming) == len(flags):
            streaming.remove(min(streaming, key=lambda h: mass[h]))
        out.append(tuple(streaming))
    return tuple(out)


def fill_tail(kv, geometry: StoreGeometry, group: int, row_pos, positions, rows, pair_index: dict):
    """``kv [group layers, 2, Hkv, r, d]`` (torch, delivered rows at prefix positions ``row_pos``, host) with each
    layer's left-out heads filled, in place, from a loaded tail (``positions``, ``rows [pairs, 2, t, d]``,
    ``pair_index[(layer, head)]`` its pair) where the tail holds the row.  ``kv`` is the reader's own copy:
    a streaming-layout extent is always read into a new zero-filled array (``StoreGeometry.extent_array``)."""
    hit = torch.isin(row_pos, positions)  # both on the host: no wait on the device
    if bool(hit.any()):
        at, idx = torch.searchsorted(positions, row_pos[hit]).to(kv.device), torch.nonzero(hit).reshape(-1).to(kv.device)
        for i, layer in enumerate(geometry.group_layer_range(group)):
            for h in geometry.streaming_heads[layer]:
                kv[i, :, h, idx] = rows[pair_index[(layer, h)], :, at]
    return kv
