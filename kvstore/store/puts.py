"""The first phase of a put: what must be written, its space, its segment.

``begin_put`` matches the stored leading chunks (reused, not written again),
holds the prefix and the one it reuses, reserves the new segment's bytes
(``DiskCapacity``, which may evict) and opens the segment file; the
returned ``PendingPut`` takes the extents and commits.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from ..errors import Conflict, InvalidArgument, StoreFull
from ..faults import crash_point
from ..geometry import SegmentLayout, StoreGeometry
from ..hashing import chunk_hashes, validate_tokens
from ..records import PrefixView
from ..writer import SegmentImage
from .pending_put import PendingPut

if TYPE_CHECKING:
    from .chunk_store import ChunkStore


def begin_put(
    store: ChunkStore, tokens, geometry: StoreGeometry, *, namespace: str, model_fingerprint: str, reuse_chunks: int | None
) -> PendingPut:
    """``ChunkStore.begin_put``: the reused pieces are those of the holder ``ChunkStore.match`` found."""
    store.state.check_writable()
    if not isinstance(geometry, StoreGeometry):
        raise InvalidArgument("geometry", "must be a StoreGeometry")
    arr = validate_tokens(tokens, store.config.max_prefix_tokens)
    hashes = chunk_hashes(arr, geometry, namespace, model_fingerprint)
    prefix_id = hashes[-1].hex()
    k, holder = store.match(hashes)
    if reuse_chunks is not None:
        if isinstance(reuse_chunks, bool) or not 0 <= reuse_chunks <= len(hashes):
            raise InvalidArgument("reuse_chunks", f"must be in [0, {len(hashes)}], got {reuse_chunks}")
        if k < reuse_chunks:
            raise Conflict(f"only {k} of the {reuse_chunks} leading chunks to reuse are stored; look up again")
        k = reuse_chunks
    reused = holder.pieces_upto(k) if holder and k else []
    hold = store.holds.hold(prefix_id, holder.prefix_id if reused else None)
    pending = PendingPut(store, prefix_id, arr, geometry, namespace, model_fingerprint, hashes, k, reused, hold=hold)
    return _open(store, pending)


def begin_chunks(
    store: ChunkStore, prefix_id: str, hashes: list[bytes], geometry: StoreGeometry, *, namespace: str, model_fingerprint: str, kind: str
) -> PendingPut:
    """``ChunkStore.begin_chunks``.

    The caller has validated ``namespace`` and ``model_fingerprint`` (they
    are in the hashes); nothing is reused, and ``kind`` is recorded in the
    manifest.  Written, synced, indexed and acknowledged as a prefix put.
    """
    store.state.check_writable()
    tokens = np.zeros(len(hashes) * geometry.chunk_tokens, dtype=np.int64)  # sizes only: pages carry no tokens
    pending = PendingPut(
        store, prefix_id, tokens, geometry, namespace, model_fingerprint, hashes, 0, [], kind=kind, hold=store.holds.hold(prefix_id)
    )
    return _open(store, pending)


def _open(store: ChunkStore, pending: PendingPut) -> PendingPut:
    """Reserve space for and open the segment of the chunks ``pending`` writes (none: nothing to open)."""
    k, geometry = pending.reused_chunks, pending.geometry
    if k == pending.num_chunks:
        return pending
    c = geometry.chunk_tokens
    layout = SegmentLayout(geometry, pending.tokens.size - k * c)
    try:
        pending.reserved = store.capacity.reserve(layout.total_bytes)
        _check_space(store, layout.total_bytes)
    except BaseException:
        pending.abort()
        raise
    pending.open_segment(store.state.new_segment_id(), SegmentImage(layout, first_chunk=k))
    crash_point("put:opened")
    return pending


def pending_segment(store: ChunkStore, view: PrefixView, segment_id: int, image: SegmentImage) -> PendingPut:
    """``ChunkStore.pending_segment`` (compaction's copy): no hold, no reservation."""
    hashes = [bytes.fromhex(h) for h in view.chunk_hashes]
    tokens = np.zeros(view.num_tokens, dtype=np.int64)  # sizes only: a segment holds no tokens
    pending = PendingPut(
        store,
        view.prefix_id,
        tokens,
        view.geometry,
        view.namespace,
        view.model_fingerprint,
        hashes,
        image.first_chunk,
        [],
        kind=view.kind,
    )
    pending.open_segment(segment_id, image)
    return pending


def _check_space(store: ChunkStore, nbytes: int) -> None:
    st = os.statvfs(store.segment_dir)
    free = st.f_bavail * st.f_frsize
    if free - nbytes < store.config.min_free_bytes:
        raise StoreFull(
            f"data file system is full: {nbytes} bytes needed, {free} free, {store.config.min_free_bytes} kept in reserve (min_free_bytes)"
        )
