"""Admin views of the chunk store: listings, inspect, stats and verify.

None of it is on the data path (lookup, read, put).  Verify re-reads whole
segments and quarantines one that fails, as a failed read would.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

import numpy as np
import xxhash

from .. import index_ops as ops
from ..io import aligned_buffer
from ..records import PrefixView
from ..segment_files import segment_file_name

if TYPE_CHECKING:
    from .chunk_store import ChunkStore


def verify(store: ChunkStore, prefix_id: str | None = None, *, progress=None) -> list[dict]:
    """Re-read every checksummed region (of one prefix, or of the store).

    ``progress(iterable, desc)`` wraps the loop over segments (a bar, see kvstore.progress).
    """
    if prefix_id is not None:
        seg_ids = store.describe(prefix_id).segment_ids
    else:
        seg_ids = ops.segment_ids(store.index)
    if progress is not None:
        seg_ids = progress(seg_ids, "verify", total=len(seg_ids), unit="seg")
    return [verify_segment(store, s) for s in seg_ids]


def verify_segment(store: ChunkStore, segment_id: int) -> dict:
    seg = store.segment_info(segment_id)
    bad: list[str] = []
    error = None
    buf = aligned_buffer(seg.layout.total_bytes)
    try:
        with store.files.reading(segment_id) as fh:
            store.backend.pread(fh, buf, 0).result()
    except (OSError, EOFError) as exc:
        error = f"{exc.__class__.__name__}: {exc}"
    if error is None:
        arr = np.frombuffer(buf, dtype=np.uint8)
        for name, off, length, xx in seg.regions():
            if xxhash.xxh3_64_intdigest(arr[off : off + length]) != xx:
                bad.append(name)
        store.state.count(bytes_read=len(buf))
    if bad or error:
        store.state.quarantine(
            segment_id, error or f"checksum mismatch in {bad[0]}" + (f" and {len(bad) - 1} more" if len(bad) > 1 else "")
        )
    return {
        "segment_id": segment_id,
        "ok": not bad and error is None,
        "regions": len(seg.regions()),
        "bad_regions": bad,
        "error": error,
        "quarantined": store.state.quarantined.get(segment_id),
    }


def list_prefixes(store: ChunkStore) -> list[dict]:
    out = []
    for m in ops.manifests(store.index):
        view = PrefixView.from_manifest(m)
        out.append(
            {
                "prefix_id": view.prefix_id,
                "namespace": view.namespace,
                "model_fingerprint": view.model_fingerprint,
                "num_tokens": view.num_tokens,
                "num_chunks": view.num_chunks,
                "num_segments": len(view.segment_ids),
                "created": view.created,
                "quarantined": store.state.prefix_quarantine(view),
                "kind": view.kind,
            }
        )
    return out


def inspect(store: ChunkStore, prefix_id: str) -> dict:
    view = store.describe(prefix_id)
    recs = ops.segment_records(store.index, view.segment_ids)
    segments = []
    for p in view.pieces:
        lay = store.segment_info(p.segment_id).layout
        segments.append(
            {
                **p.to_dict(),
                "file": segment_file_name(p.segment_id),
                "segment_chunks": lay.num_chunks,
                "total_bytes": lay.total_bytes,
                "payload_bytes": lay.payload_bytes,
                "padding_bytes": lay.padding_bytes,
                "refcount": recs[p.segment_id]["refcount"],
                "checksums": len(store.segment_info(p.segment_id).regions()),
                "quarantined": store.state.quarantined.get(p.segment_id),
            }
        )
    geo = view.geometry
    return {
        "prefix_id": view.prefix_id,
        "kind": view.kind,
        "namespace": view.namespace,
        "model_fingerprint": view.model_fingerprint,
        "geometry": geo.to_dict(),
        "num_tokens": view.num_tokens,
        "num_chunks": view.num_chunks,
        "num_groups": geo.num_groups,
        "kv_quant": geo.kv_quant or geo.model.dtype,
        "kv_bytes": view.kv_bytes,  # as stored (quantized when kv_quant)
        "kv_bytes_unquantized": view.num_tokens * geo.model.num_layers * geo.model.token_layer_bytes,
        # (layer, KV head) pairs whose rows extents leave out (their sink and recent rows are client pages)
        "streaming_heads": sum(map(len, geo.streaming_heads)),
        "kv_bytes_full_layout": dataclasses.replace(geo, streaming_heads=()).kv_bytes(view.num_tokens),
        "segments": segments,
        "created": view.created,
        "quarantined": store.state.prefix_quarantine(view),
    }


def stats(store: ChunkStore) -> dict:
    num_prefixes, num_segments, stored = ops.totals(store.index)
    st = os.statvfs(store.segment_dir)
    counters = store.state.counters_now()
    return {
        "data_dir": store.data_dir,
        "backend": store.backend.name,
        "num_prefixes": num_prefixes,
        "num_conversations": ops.num_conversations(store.index),
        "num_segments": num_segments,
        "bytes_stored": stored,
        "bytes_free": st.f_bavail * st.f_frsize,
        "index_map_bytes": store.index.map_bytes,
        "index_resizes": store.index.resizes,
        "read_only": store.state.read_only,
        "quarantined_segments": len(store.state.quarantined),
        "read_queue_depth": store.reads_in_flight.count,
        **store.capacity.stats(),
        **counters,
    }
