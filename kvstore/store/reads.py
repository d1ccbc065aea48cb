"""The chunk store's read path: extents, key summaries and probe keys of a stored prefix.

Every byte read is checked against its segment record's checksum; a
mismatch, or a file gone or short, quarantines the segment and is
``DataLoss``.  The prefix is held while it is read (``PrefixHolds``; the
caller of ``read_held`` holds it), so no eviction or compaction moves it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import xxhash

from ..errors import DataLoss, InvalidArgument
from ..geometry import StoreGeometry, align_up
from ..io import aligned_buffer
from ..reader import ReadResult, SegmentUnreadable, execute_reads, plan_extents, validate_chunks, validate_groups
from ..records import Piece, PrefixView, SegmentInfo

if TYPE_CHECKING:
    from .chunk_store import ChunkStore


def read_held(store: ChunkStore, prefix_id: str, chunks, groups, *, coalesce: bool, alloc) -> ReadResult:
    """``ChunkStore.read`` once the prefix is held."""
    view = store.describe(prefix_id)
    q = store.state.prefix_quarantine(view)
    if q:
        raise DataLoss(f"prefix {prefix_id} is quarantined ({q}); delete and store it again")
    sel = validate_chunks(chunks, view.num_chunks)
    grp = validate_groups(groups, view.geometry.num_groups)
    segments = {s: store.segment_info(s) for s in view.segment_ids}
    refs = plan_extents(view, segments, sel, grp)
    try:
        views, buf, nreads, bad = execute_reads(
            refs,
            store.files,
            store.backend,
            coalesce_reads=coalesce,
            max_run_bytes=store.config.max_read_run_bytes,
            alloc=alloc,
            in_flight=store.reads_in_flight,
        )
    except SegmentUnreadable as exc:
        raise store.state.unreadable(exc.segment_id, exc.cause) from None
    nbytes = sum(r.padded for r in refs)  # runs are unions of padded extents
    store.state.count(bytes_read=nbytes, reads=1)
    if bad:
        for m in bad:
            store.state.quarantine(m.segment_id, f"checksum mismatch in {m.region}")
        raise DataLoss(f"prefix {prefix_id}: checksum mismatch in segment {bad[0].segment_id} {bad[0].region}")
    counts = view.geometry.chunk_token_counts(view.num_tokens)[sel]
    return ReadResult(
        prefix_id=prefix_id,
        geometry=view.geometry,
        chunks=sel,
        groups=grp,
        chunk_tokens=counts,
        bytes_read=nbytes,
        bytes_useful=sum(r.length for r in refs),
        num_reads=nreads,
        buffer=buf,
        _views=views,
    )


def read_summaries(store: ChunkStore, prefix_id: str) -> np.ndarray:
    """Key summaries ``[chunks, layers, kv_heads, 2 (min|max), head_dim]`` float32."""
    with store.holds.hold(prefix_id):
        view = store.describe(prefix_id)
        return np.concatenate([_piece_summaries(store, view, p) for p in view.pieces], axis=0)


def _piece_summaries(store: ChunkStore, view: PrefixView, p: Piece) -> np.ndarray:
    seg = store.segment_info(p.segment_id)
    arr = _read_region(store, seg, "summaries", seg.layout.summaries_offset, seg.layout.summaries_length, seg.summaries_xxh3)
    full = arr.view(np.float32).reshape(seg.layout.num_chunks, *_summary_tail(view.geometry))
    return full[p.segment_chunk : p.segment_chunk + p.num_chunks]


def read_probe_keys(store: ChunkStore, prefix_id: str, group: int) -> np.ndarray:
    """Keys of the group's first layer: ``[kv_heads, tokens, head_dim]`` in the KV dtype, or, for a
    geometry with ``probe_bits``, their packed rows ``[kv_heads, tokens, row_bytes]`` uint8
    (``kvstore.wire.probes``)."""
    with store.holds.hold(prefix_id):
        view = store.describe(prefix_id)
        geo = view.geometry
        if not geo.probe_keys:
            raise InvalidArgument("group", "this prefix was stored without probe keys")
        (g,) = validate_groups([group], geo.num_groups)
        return np.concatenate([_piece_probe_keys(store, view, p, g) for p in view.pieces], axis=1)


def _piece_probe_keys(store: ChunkStore, view: PrefixView, p: Piece, g: int) -> np.ndarray:
    seg = store.segment_info(p.segment_id)
    lay = seg.layout
    arr = _read_region(store, seg, f"probe[group={g}]", lay.probe_offsets[g], lay.probe_length, seg.probe_xxh3[g])
    keys = view.geometry.probe_array(arr, lay.num_tokens)
    t0 = int(lay.token_offsets[p.segment_chunk])
    t1 = int(lay.token_offsets[p.segment_chunk + p.num_chunks])
    return keys[:, t0:t1]


def _summary_tail(geo: StoreGeometry) -> tuple[int, int, int, int]:
    m = geo.model
    return (m.num_layers, m.num_kv_heads, 2, m.head_dim)


def _read_region(store: ChunkStore, seg: SegmentInfo, name: str, offset: int, length: int, xxh3: int) -> np.ndarray:
    if seg.segment_id in store.state.quarantined:
        raise DataLoss(f"segment {seg.segment_id} is quarantined: {store.state.quarantined[seg.segment_id]}")
    buf = aligned_buffer(align_up(length))
    try:
        with store.files.reading(seg.segment_id) as fh:
            store.reads_in_flight.track(store.backend.pread(fh, buf, offset)).result()
    except (OSError, EOFError) as exc:
        raise store.state.unreadable(seg.segment_id, exc) from None
    store.state.count(bytes_read=len(buf))
    arr = np.frombuffer(buf, dtype=np.uint8)[:length]
    if xxhash.xxh3_64_intdigest(arr) != xxh3:
        store.state.quarantine(seg.segment_id, f"checksum mismatch in {name}")
        raise DataLoss(f"segment {seg.segment_id}: checksum mismatch in {name}")
    return arr
