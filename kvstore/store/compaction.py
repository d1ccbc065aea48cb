"""Compaction: copy the live chunks of a mostly-dead segment into a new one.

The new segment is written exactly as a put writes one (``SegmentImage``
derives its summaries and probes; ``PendingPut`` opens, writes, fdatasyncs
and fsyncs the directory), then ONE index transaction points every
referencing manifest at it, adds its record, moves the chunks' scores and
removes the old record; only then is the old file unlinked (its descriptor
closes after readers drain).  A crash before the commit leaves the new file
unreferenced, after it the old one: either is an orphan for the startup
scan, and every listed prefix has all of its bytes throughout.  The
referencing prefixes are claimed for the copy, so no read or put uses them
while their pieces move.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import numpy as np
import xxhash

from .. import index as ix
from ..errors import NotFound
from ..faults import crash_point
from ..geometry import SegmentLayout
from ..io import aligned_buffer
from ..policy.disk import SegmentUse, live_span
from ..records import SegmentInfo
from ..scores import encode as encode_score
from ..writer import SegmentImage

log = logging.getLogger("kvstore.compaction")  # the name it had as kvstore/compaction.py


def refs_by_segment(manifests: list[dict]) -> dict[int, list[tuple[str, dict]]]:
    """segment id -> (prefix id, piece) of every manifest piece stored in it."""
    out: dict[int, list[tuple[str, dict]]] = defaultdict(list)
    for m in manifests:
        for p in m["segments"]:
            out[p["segment_id"]].append((m["prefix_id"], p))
    return out


def segment_uses(store) -> tuple[list[SegmentUse], dict[int, list[tuple[str, dict]]]]:
    """Every healthy segment's referenced chunk spans, and its (prefix, piece) refs."""
    with store.index.read() as txn:
        manifests = [ix.loads(v) for _, v in txn.cursor(db=store.index.manifests)]
        records = {int.from_bytes(k, "big"): ix.loads(v) for k, v in txn.cursor(db=store.index.segments)}
    refs = refs_by_segment(manifests)
    uses = []
    for seg_id, rec in records.items():
        if rec.get("quarantined"):
            continue
        pieces = refs.get(seg_id, [])
        uses.append(
            SegmentUse(
                segment_id=seg_id,
                num_chunks=SegmentInfo.from_record(rec).layout.num_chunks,
                spans=tuple((p["segment_chunk"], p["segment_chunk"] + p["num_chunks"]) for _, p in pieces),
                in_use=any(store.holds.in_use(pid) for pid, _ in pieces),
            )
        )
    return uses, refs


def compact_segment(store, use: SegmentUse, refs: list[tuple[str, dict]]) -> int | None:
    """Replace segment ``use`` by a copy of its live span; bytes freed, or None if skipped."""
    prefix_ids = {pid for pid, _ in refs}
    if not store.holds.claim(prefix_ids):
        return None  # a read or put started meanwhile: next time
    try:
        return _compact_claimed(store, use, refs, prefix_ids)
    finally:
        store.holds.unclaim(prefix_ids)


def _covering_prefix(use: SegmentUse, refs: list[tuple[str, dict]], hi: int) -> str:
    """A referencing prefix whose piece in the segment reaches local chunk ``hi - 1``."""
    return min(pid for pid, p in refs if p["segment_chunk"] + p["num_chunks"] == hi)


def _compact_claimed(store, use: SegmentUse, refs: list[tuple[str, dict]], prefix_ids: set[str]) -> int | None:
    old = store._segment(use.segment_id)
    lo, hi = live_span(use)
    image = _copy_span(store, old, lo, hi)
    if image is None:
        return None
    # the trailer names the chunks by the hashes of a prefix that holds the
    # span's last chunk: chain hashes make it hold every earlier one too
    view = store.describe(_covering_prefix(use, refs, hi))
    new_id = store._new_segment_id()
    pending = store.pending_segment(view, new_id, image)
    try:
        crash_point("compact:opened")
        record = pending._segment_record()
        pending.write_segment_synced(record, pending._manifest())
        crash_point("compact:synced")
        moved = store.scores.span_scores(old.segment_id, lo, hi, new_id)
        store.index.write(lambda txn: _commit(store, txn, old.segment_id, record, lo, moved, prefix_ids))
    except BaseException:
        pending.abort()
        raise
    pending._close_file()
    pending._done = True
    crash_point("compact:committed")
    for pid in prefix_ids:
        store._views.pop(pid, None)
    store._segments.pop(old.segment_id, None)
    store.scores.replace_segment(old.segment_id, moved)
    store.files.remove(old.segment_id)
    _refresh_manifest_files(store, prefix_ids)
    store.capacity.segments_freed([old.segment_id], old.layout.total_bytes)
    store.capacity.segments_added(image.layout.total_bytes)
    log.info("compacted segment %d chunks [%d, %d) into segment %d", old.segment_id, lo, hi, new_id)
    return old.layout.total_bytes - image.layout.total_bytes


def _refresh_manifest_files(store, prefix_ids: set[str]) -> None:
    """Point the moved prefixes' manifest files at the new segment (a rebuild
    after a crash before this finds the chunks by their hashes anyway)."""
    for pid in sorted(prefix_ids):
        with store.manifest_files.locked(pid):
            try:
                manifest = store.describe(pid).to_manifest()
            except NotFound:  # deleted meanwhile: its file went with it
                continue
            store.manifest_files.write(manifest)


def _copy_span(store, old: SegmentInfo, lo: int, hi: int) -> SegmentImage | None:
    """An image of local chunks ``[lo, hi)`` of ``old``, every extent checked on the way."""
    lay = old.layout
    buf = aligned_buffer(lay.total_bytes)
    with store.files.reading(old.segment_id) as fh:
        store.backend.pread(fh, buf, 0).result()
    arr = np.frombuffer(buf, dtype=np.uint8)
    num_tokens = int(lay.token_offsets[hi] - lay.token_offsets[lo])
    image = SegmentImage(SegmentLayout(lay.geometry, num_tokens), first_chunk=old.first_chunk + lo)
    for g in range(lay.geometry.num_groups):
        for j in range(lo, hi):
            off, n = int(lay.extent_offsets[g, j]), int(lay.extent_lengths[g, j])
            if xxhash.xxh3_64_intdigest(arr[off : off + n]) != int(old.extent_xxh3[g, j]):
                store._quarantine(old.segment_id, f"checksum mismatch in extent[group={g},chunk={old.first_chunk + j}]")
                return None
            image.put_extent(g, old.first_chunk + j, arr[off : off + n])
    return image


def _commit(store, txn, old_id: int, record: dict, lo: int, moved, prefix_ids) -> None:
    """Point every piece in ``old_id`` at the new segment; one transaction."""
    index = store.index
    new_id = record["segment_id"]
    old_rec = ix.loads(txn.get(ix.seg_key(old_id), db=index.segments))
    for pid in prefix_ids:
        key = bytes.fromhex(pid)
        m = ix.loads(txn.get(key, db=index.manifests))
        for p in m["segments"]:
            if p["segment_id"] == old_id:
                p["segment_id"], p["segment_chunk"] = new_id, p["segment_chunk"] - lo
        txn.put(key, ix.dumps(m), db=index.manifests)
    txn.put(ix.seg_key(new_id), ix.dumps({**record, "refcount": old_rec["refcount"]}), db=index.segments)
    txn.delete(ix.seg_key(old_id), db=index.segments)
    score_cur = txn.cursor(db=index.scores)
    prefix = ix.seg_key(old_id)
    if score_cur.set_range(prefix):
        while score_cur.key()[:8] == prefix:
            if not score_cur.delete():
                break
    for unit, score in moved:
        txn.put(*encode_score(unit, score), db=index.scores)
