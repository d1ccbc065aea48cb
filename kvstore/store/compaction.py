"""Compaction: copy the live chunks of a mostly-dead segment into a new one.

The new segment is written exactly as a put writes one (``SegmentImage``
derives its summaries and probes; ``SegmentSink`` opens, writes,
fdatasyncs and fsyncs the directory), then ONE index transaction
(``Catalogue.replace_segment``) points every referencing manifest at it,
adds its record, moves the chunks' scores and removes the old record; only
then is the old file unlinked (its descriptor closes after readers drain).
A crash before the commit leaves the new file unreferenced, after it the
old one: either is an orphan for the startup scan, and every listed prefix
has all of its bytes throughout.  The referencing prefixes are claimed for
the copy, so no read or put uses them while their pieces move.

``maintenance`` is the lock eviction shares (``capacity.py``): one
eviction or compaction runs at a time.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict

import numpy as np
import xxhash

from ..contract.errors import NotFound, StoreFull
from ..contract.layout import SegmentLayout
from ..faults import crash_point
from ..holds import PrefixHolds
from ..io import aligned_buffer
from ..manifest_files import ManifestFiles
from ..policy.disk import SegmentUse, live_span, segments_to_compact
from ..records import Piece, SegmentInfo
from ..scores import ScoreTable
from ..writer import SegmentImage
from .catalogue import Catalogue
from .new_segment import NewSegment, SegmentSink, is_full, put_manifest, segment_record
from .state import StoreState
from .usage import DiskUsage

log = logging.getLogger("kvstore.compaction")  # the name it had as kvstore/compaction.py


def refs_by_segment(manifests: list[dict]) -> dict[int, list[tuple[str, dict]]]:
    """segment id -> (prefix id, piece) of every manifest piece stored in it."""
    out: dict[int, list[tuple[str, dict]]] = defaultdict(list)
    for m in manifests:
        for p in m["segments"]:
            out[p["segment_id"]].append((m["prefix_id"], p))
    return out


def _covering_prefix(use: SegmentUse, refs: list[tuple[str, dict]], hi: int) -> str:
    """A referencing prefix whose piece in the segment reaches local chunk ``hi - 1``."""
    return min(pid for pid, p in refs if p["segment_chunk"] + p["num_chunks"] == hi)


class Compactor:
    def __init__(
        self,
        catalogue: Catalogue,
        state: StoreState,
        holds: PrefixHolds,
        scores: ScoreTable,
        sink: SegmentSink,
        manifest_files: ManifestFiles,
        usage: DiskUsage,
        *,
        maintenance: threading.RLock,
        compact_live_fraction: float,
    ):
        self._catalogue = catalogue
        self._state = state
        self._holds = holds
        self._scores = scores
        self._sink = sink
        self._manifest_files = manifest_files
        self._usage = usage
        self._maintenance = maintenance
        self._live_fraction = compact_live_fraction
        self._lock = threading.Lock()  # the counters
        self._counters = {"compactions": 0, "compaction_reclaimed_bytes": 0}

    def stats(self) -> dict:
        with self._lock:
            return dict(self._counters)

    def compact(self, *, progress=None) -> dict:
        """Copy the live chunks of mostly-dead segments into new ones (``progress``: see ChunkStore.verify)."""
        with self._maintenance:
            uses, refs = self.segment_uses()
            compacted = reclaimed = 0
            todo = list(segments_to_compact(uses, self._live_fraction))
            for use in progress(todo, "compact", total=len(todo), unit="seg") if progress else todo:
                if self._state.read_only:
                    break
                freed = self.compact_segment(use, refs[use.segment_id])
                if freed is not None:
                    compacted += 1
                    reclaimed += freed
                    with self._lock:
                        self._counters["compactions"] += 1
                        self._counters["compaction_reclaimed_bytes"] += freed
        return {"segments_compacted": compacted, "bytes_reclaimed": reclaimed, "disk_used_bytes": self._usage.used_bytes}

    def segment_uses(self) -> tuple[list[SegmentUse], dict[int, list[tuple[str, dict]]]]:
        """Every healthy segment's referenced chunk spans, and its (prefix, piece) refs."""
        manifests, records = self._catalogue.manifests_and_segments()
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
                    in_use=any(self._holds.in_use(pid) for pid, _ in pieces),
                )
            )
        return uses, refs

    def compact_segment(self, use: SegmentUse, refs: list[tuple[str, dict]]) -> int | None:
        """Replace segment ``use`` by a copy of its live span; bytes freed, or None if skipped."""
        prefix_ids = {pid for pid, _ in refs}
        if not self._holds.claim(prefix_ids):
            return None  # a read or put started meanwhile: next time
        try:
            return self._compact_claimed(use, refs, prefix_ids)
        finally:
            self._holds.unclaim(prefix_ids)

    def _compact_claimed(self, use: SegmentUse, refs: list[tuple[str, dict]], prefix_ids: set[str]) -> int | None:
        old = self._catalogue.segment_info(use.segment_id)
        lo, hi = live_span(use)
        image = self._copy_span(old, lo, hi)
        if image is None:
            return None
        # the trailer names the chunks by the hashes of a prefix that holds the
        # span's last chunk: chain hashes make it hold every earlier one too
        view = self._catalogue.describe(_covering_prefix(use, refs, hi))
        new_id = self._state.new_segment_id()
        segment = open_segment(self._sink, new_id, image)
        try:
            crash_point("compact:opened")
            record = segment_record(new_id, view.geometry, image)
            manifest = put_manifest(
                prefix_id=view.prefix_id,
                namespace=view.namespace,
                model_fingerprint=view.model_fingerprint,
                geometry=view.geometry,
                num_tokens=view.num_tokens,
                chunk_hashes=list(view.chunk_hashes),
                pieces=[Piece(new_id, image.first_chunk, view.num_chunks - image.first_chunk, 0)],
                kind=view.kind,
            )
            write_segment(segment, record, manifest)
            crash_point("compact:synced")
            moved = self._scores.span_scores(old.segment_id, lo, hi, new_id)
            self._catalogue.replace_segment(old.segment_id, record, lo, moved, prefix_ids)
        except BaseException:
            segment.close()
            self._sink.discard(new_id)
            raise
        segment.close()
        crash_point("compact:committed")
        self._scores.replace_segment(old.segment_id, moved)
        self._sink.remove(old.segment_id)
        refresh_manifest_files(self._catalogue, self._manifest_files, prefix_ids)
        self._usage.segments_freed([old.segment_id], old.layout.total_bytes)
        self._usage.segments_added(image.layout.total_bytes)
        log.info("compacted segment %d chunks [%d, %d) into segment %d", old.segment_id, lo, hi, new_id)
        return old.layout.total_bytes - image.layout.total_bytes

    def _copy_span(self, old: SegmentInfo, lo: int, hi: int) -> SegmentImage | None:
        """An image of local chunks ``[lo, hi)`` of ``old``, every extent checked on the way."""
        lay = old.layout
        arr = read_whole(self._sink, old)
        if not extents_intact(self._state, old, arr, lo, hi):
            return None
        num_tokens = int(lay.token_offsets[hi] - lay.token_offsets[lo])
        image = SegmentImage(SegmentLayout(lay.geometry, num_tokens), first_chunk=old.first_chunk + lo)
        copy_extents(image, old, arr, lo, hi, old.first_chunk + lo)
        return image


# ------------------------------------------------------------ shared with merging (merge.py)
def open_segment(sink: SegmentSink, segment_id: int, image: SegmentImage) -> NewSegment:
    """The new segment's file, or StoreFull / the OSError (nothing left behind)."""
    try:
        return sink.open(segment_id, image)
    except OSError as exc:
        sink.discard(segment_id)
        if is_full(exc):
            raise StoreFull(f"data file system is full ({exc.strerror}) reserving {image.layout.total_bytes} bytes") from None
        raise


def write_segment(segment: NewSegment, record: dict, manifest: dict) -> None:
    """The image and its trailer written, then fdatasync and the directory's fsync."""
    try:
        segment.write(record, manifest)
    except OSError as exc:
        if is_full(exc):
            raise StoreFull(f"data file system is full ({exc.strerror}) writing segment {segment.segment_id}") from None
        raise
    segment.sync()


def refresh_manifest_files(catalogue: Catalogue, manifest_files: ManifestFiles, prefix_ids) -> None:
    """Point the moved prefixes' manifest files at their new segment (a rebuild
    after a crash before this finds the chunks by their hashes anyway)."""
    for pid in sorted(prefix_ids):
        with manifest_files.locked(pid):
            try:
                manifest = catalogue.describe(pid).to_manifest()
            except NotFound:  # deleted meanwhile: its file went with it
                continue
            manifest_files.write(manifest)


def read_whole(sink: SegmentSink, info: SegmentInfo) -> np.ndarray:
    """The bytes of a segment's layout, as one array."""
    buf = aligned_buffer(info.layout.total_bytes)
    with sink.files.reading(info.segment_id) as fh:
        sink.files.pread(fh, buf, 0).result()
    return np.frombuffer(buf, dtype=np.uint8)


def extents_intact(state: StoreState, info: SegmentInfo, arr: np.ndarray, lo: int, hi: int) -> bool:
    """Whether every extent of local chunks ``[lo, hi)`` matches its checksum; the segment is quarantined if not."""
    lay = info.layout
    for g in range(lay.geometry.num_groups):
        for j in range(lo, hi):
            off, n = int(lay.extent_offsets[g, j]), int(lay.extent_lengths[g, j])
            if xxhash.xxh3_64_intdigest(arr[off : off + n]) != int(info.extent_xxh3[g, j]):
                state.quarantine(info.segment_id, f"checksum mismatch in extent[group={g},chunk={info.first_chunk + j}]")
                return False
    return True


def copy_extents(image: SegmentImage, info: SegmentInfo, arr: np.ndarray, lo: int, hi: int, to_chunk: int) -> None:
    """Local chunks ``[lo, hi)`` of ``info`` (bytes ``arr``) into ``image`` from its chunk ``to_chunk`` on."""
    lay = info.layout
    for g in range(lay.geometry.num_groups):
        for j in range(lo, hi):
            off, n = int(lay.extent_offsets[g, j]), int(lay.extent_lengths[g, j])
            image.put_extent(g, to_chunk + j - lo, arr[off : off + n])
