"""Merging: the small segments of page batches of one model, copied into one segment.

Each page put that waits for its answer writes a segment of its own, so an
engine storing a few pages at a time leaves many small files.  When a
group (namespace, model fingerprint, geometry) has ``merge_min_segments``
segments smaller than ``merge_small_segment_bytes``, each held only by page
batches, they are merged in runs of at most ``merge_max_bytes``
(``policy.disk.segments_to_merge``): in the background after the page put
that reached the count (``on_due``: the daemon runs ``merge_due`` on its
thread pool; the count starts at open with one pass), and in admin
``Compact``.  Batches keep their ids and their listing; only where their
chunks lie changes.

Crash-safe as compaction (``compaction.py``), whose helpers it uses: the
referencing batches are claimed, every extent of every old segment is
checked (a mismatch quarantines that segment, and the others merge without
it), the new segment is written as a put writes one (data, trailer,
fdatasync, directory fsync), then ONE index transaction
(``Catalogue.merge_segments``) repoints every batch, adds the new record,
moves the scores and removes the old records; only then are the old files
unlinked and the batches' manifest files rewritten.  A crash before the
commit leaves the new file unreferenced, after it the old ones: orphans the
startup scan removes.  The new segment's trailer names the hash of every
chunk it holds, in order, so ``rebuild-index`` finds the batches' chunks
there whatever their manifest files say.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable

from ..contract.errors import Conflict, NotFound
from ..contract.geometry import StoreGeometry
from ..contract.layout import SegmentLayout
from ..faults import crash_point
from ..holds import PrefixHolds
from ..manifest_files import ManifestFiles
from ..policy.disk import MergeCandidate, segments_to_merge, small_segments_by_group
from ..records import PAGES, Piece, SegmentInfo
from ..scores import ScoreTable
from ..writer import SegmentImage
from .catalogue import Catalogue
from .compaction import copy_extents, extents_intact, open_segment, read_whole, refresh_manifest_files, refs_by_segment, write_segment
from .new_segment import SegmentSink, put_manifest, segment_record
from .pending_put import PendingPut
from .state import StoreState
from .usage import DiskUsage

log = logging.getLogger("kvstore.merge")

_MERGE_TAG = b"kvstore.segment-merge.v1"


def group_key(namespace: str, model_fingerprint: str, geometry_record: dict) -> tuple[str, str, str]:
    """Segments merge only with segments of the same namespace, model and geometry."""
    return namespace, model_fingerprint, json.dumps(geometry_record, sort_keys=True)


class SegmentMerger:
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
        min_segments: int,
        small_bytes: int,
        max_bytes: int,
    ):
        self._catalogue = catalogue
        self._state = state
        self._holds = holds
        self._scores = scores
        self._sink = sink
        self._manifest_files = manifest_files
        self._usage = usage
        self._maintenance = maintenance
        self._min = min_segments
        self._small = small_bytes
        self._max = max_bytes
        self._lock = threading.Lock()  # the counters, the counts and the flag below
        self._counters = {"merges": 0, "segments_merged": 0}
        self._small_counts: dict[tuple, int] | None = None  # group -> small segments (None: not counted since open)
        self._scheduled = False  # a background pass is due and not yet started
        self._notes: dict[tuple, int] | None = None  # small batches committed while a pass runs (None: no pass)
        # called (no arguments) when a background pass is due: the daemon runs ``merge_due`` on its pool
        self.on_due: list[Callable[[], None]] = []

    def stats(self) -> dict:
        with self._lock:
            return dict(self._counters)

    # ------------------------------------------------------------ when
    def on_commit(self, pending: PendingPut) -> None:
        """``PutPath.on_commit``: a page batch that wrote a small segment counts towards its group (cheap:
        the acknowledgement waits for it)."""
        if not self._min or not self.on_due or pending.kind != PAGES or pending.image is None:
            return
        if pending.image.layout.total_bytes >= self._small:
            return
        key = group_key(pending.namespace, pending.model_fingerprint, pending.geometry.to_record())
        with self._lock:
            counts = self._small_counts
            if counts is not None:
                counts[key] = counts.get(key, 0) + 1
            if self._notes is not None:
                self._notes[key] = self._notes.get(key, 0) + 1
            due = not self._scheduled and (counts is None or counts[key] >= self._min)
            self._scheduled |= due
        if due:
            self._call_on_due()

    def _call_on_due(self) -> None:
        for fn in self.on_due:
            fn()

    def merge_due(self) -> dict:
        """The background pass ``on_due`` asked for; failures are logged, never raised."""
        with self._lock:
            self._scheduled = False
        try:
            return self.merge()
        except Exception:
            log.exception("merging small page segments failed")
            return {"merges": 0, "segments_merged": 0}

    # ------------------------------------------------------------ what
    def merge(self, *, progress=None) -> dict:
        """Merge every group that has enough small segments now (``progress``: see ChunkStore.verify)."""
        merges = merged = 0
        if not self._min:
            return {"merges": 0, "segments_merged": 0}
        with self._maintenance:
            with self._lock:
                self._notes = {}
            candidates, refs = self.candidates()
            runs = segments_to_merge(candidates, small_bytes=self._small, min_segments=self._min, max_bytes=self._max)
            for run in progress(runs, "merge", total=len(runs), unit="run") if progress else runs:
                if self._state.read_only:
                    break
                n = self.merge_segments(run, refs)
                if n:
                    merges += 1
                    merged += n
                    with self._lock:
                        self._counters["merges"] += 1
                        self._counters["segments_merged"] += n
            counts = small_segments_by_group(self.candidates()[0], self._small)
            with self._lock:
                # a batch committed during the pass may be missing from the count: add it (counted twice at
                # worst, which costs one more pass), and pass again if that brings its group to the count
                notes, self._notes = self._notes, None
                for key, n in notes.items():
                    counts[key] = counts.get(key, 0) + n
                due = bool(self.on_due) and not self._scheduled and any(counts[k] >= self._min for k in notes)
                self._scheduled |= due
                self._small_counts = counts
        if due:
            self._call_on_due()
        return {"merges": merges, "segments_merged": merged}

    def candidates(self) -> tuple[list[MergeCandidate], dict[int, list[tuple[str, dict]]]]:
        """Every healthy segment as the merge policy sees it, and its (batch, piece) refs."""
        manifests, records = self._catalogue.manifests_and_segments()
        refs = refs_by_segment(manifests)
        by_id = {m["prefix_id"]: m for m in manifests}
        out = []
        for seg_id, rec in records.items():
            pieces = refs.get(seg_id, [])
            if rec.get("quarantined") or seg_id in self._state.quarantined or not pieces:
                continue
            holders = [by_id[pid] for pid, _ in pieces]
            key = group_key(holders[0]["namespace"], holders[0]["model_fingerprint"], rec["geometry"])
            geo = StoreGeometry.from_dict(rec["geometry"])
            num_chunks = -(-rec["num_tokens"] // geo.chunk_tokens)
            covered = {p["segment_chunk"] + i for _, p in pieces for i in range(p["num_chunks"])}
            pages_only = (
                rec["num_tokens"] == num_chunks * geo.chunk_tokens  # whole chunks
                and covered == set(range(num_chunks))  # every chunk a batch's: the trailer can name each
                and all(m.get("kind") == PAGES and group_key(m["namespace"], m["model_fingerprint"], m["geometry"]) == key for m in holders)
            )
            in_use = any(self._holds.in_use(pid) for pid, _ in pieces)
            out.append(MergeCandidate(seg_id, key, rec["total_bytes"], pages_only, in_use))
        return out, refs

    # ------------------------------------------------------------ how
    def merge_segments(self, segment_ids, refs: dict[int, list[tuple[str, dict]]]) -> int:
        """Merge the segments (a policy run) into one; how many were merged (0: skipped)."""
        prefix_ids = {pid for s in segment_ids for pid, _ in refs[s]}
        if not self._holds.claim(prefix_ids):
            return 0  # a read or put started meanwhile: next time
        try:
            return self._merge_claimed(segment_ids, refs)
        except (Conflict, NotFound) as exc:  # a batch deleted or stored meanwhile
            log.info("merge of segments %s skipped: %s", list(segment_ids), exc)
            return 0
        finally:
            self._holds.unclaim(prefix_ids)

    def _merge_claimed(self, segment_ids, refs: dict[int, list[tuple[str, dict]]]) -> int:
        olds, arrays = [], []
        for seg_id in segment_ids:
            info = self._catalogue.segment_info(seg_id)
            arr = read_whole(self._sink, info)
            if extents_intact(self._state, info, arr, 0, info.layout.num_chunks):  # else quarantined: left out
                olds.append(info)
                arrays.append(arr)
        if len(olds) < 2:
            return 0
        geo = olds[0].layout.geometry
        image = SegmentImage(SegmentLayout(geo, sum(o.layout.num_tokens for o in olds)), first_chunk=0)
        offsets: dict[int, int] = {}
        hashes: list[str] = []
        for info, arr in zip(olds, arrays):
            offsets[info.segment_id] = len(hashes)
            copy_extents(image, info, arr, 0, info.layout.num_chunks, len(hashes))
            hashes += _chunk_hashes(info, refs[info.segment_id], self._catalogue)
        prefix_ids = {pid for s in offsets for pid, _ in refs[s]}
        new_id = self._state.new_segment_id()
        segment = open_segment(self._sink, new_id, image)
        try:
            crash_point("merge:opened")
            record = segment_record(new_id, geo, image)
            view = self._catalogue.describe(min(prefix_ids))
            write_segment(segment, record, _trailer_manifest(new_id, view.namespace, view.model_fingerprint, geo, hashes))
            crash_point("merge:synced")
            moved = self._scores.merged_scores(offsets, new_id)
            self._catalogue.merge_segments(offsets, record, moved, prefix_ids)
        except BaseException:
            segment.close()
            self._sink.discard(new_id)
            raise
        segment.close()
        crash_point("merge:committed")
        self._scores.replace_segments(offsets, moved)
        for seg_id in offsets:
            self._sink.remove(seg_id)
        refresh_manifest_files(self._catalogue, self._manifest_files, prefix_ids)
        self._usage.segments_freed(list(offsets), sum(o.layout.total_bytes for o in olds))
        self._usage.segments_added(image.layout.total_bytes)
        log.info("merged %d segments (%s) of %d chunks into segment %d", len(olds), list(offsets), len(hashes), new_id)
        return len(olds)


def _chunk_hashes(info: SegmentInfo, refs: list[tuple[str, dict]], catalogue: Catalogue) -> list[str]:
    """The hash of each local chunk of a segment, from the batches holding them (they cover every one)."""
    out: list[str | None] = [None] * info.layout.num_chunks
    for pid, p in refs:
        view = catalogue.describe(pid)
        out[p["segment_chunk"] : p["segment_chunk"] + p["num_chunks"]] = view.chunk_hashes[
            p["first_chunk"] : p["first_chunk"] + p["num_chunks"]
        ]
    if None in out:
        raise Conflict(f"segment {info.segment_id} has a chunk no batch holds")
    return out


def _trailer_manifest(segment_id: int, namespace: str, model_fingerprint: str, geo: StoreGeometry, hashes: list[str]) -> dict:
    """What the merged segment's trailer carries: one entry naming all of its chunks in order (never listed itself:
    it has no manifest file, so ``rebuild-index`` uses it only to find chunks by hash)."""
    merge_id = hashlib.sha256(_MERGE_TAG + segment_id.to_bytes(8, "little") + "".join(hashes).encode()).hexdigest()
    return put_manifest(
        prefix_id=merge_id,
        namespace=namespace,
        model_fingerprint=model_fingerprint,
        geometry=geo,
        num_tokens=len(hashes) * geo.chunk_tokens,
        chunk_hashes=hashes,
        pieces=[Piece(segment_id, 0, len(hashes), 0)],
        kind=PAGES,
    )
