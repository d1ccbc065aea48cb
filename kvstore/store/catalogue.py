"""The catalogue: what the index says is stored, read as views, and the transactions that change it.

A prefix's manifest (``describe``) and a segment's record (``segment_info``)
are immutable until a delete (``unlist``), a compaction
(``replace_segment``) or a merge (``merge_segments``) changes them, so their
views are cached, and those drop the entries they change.  Look-ups by chunk hash (``holder``,
``match``, ``still_held``) count a prefix with a quarantined segment as not
stored.  Every transaction is one of ``index_ops``.

A prefix filled from the remote tier is *shown* before its commit lists it
(``show_provisional``, ``store/fill_behind.py``): ``describe`` and
``segment_info`` answer for it, and look-ups that ask (``match(...,
provisional=True)``, the daemon's look-up) find it, so it is read while
its write runs behind; listings, puts that reuse chunks and every
transaction see the index alone.  The commit lists it, then it is dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Collection

from .. import index_ops as ops
from ..contract.errors import InvalidArgument, NotFound
from ..index import Index
from ..reader import validate_chunks, validate_groups
from ..records import PrefixView, SegmentInfo
from ..scores import Unit, UnitScore
from .state import StoreState


class Catalogue:
    def __init__(self, index: Index, state: StoreState):
        self._index = index
        self._state = state
        self._views: dict[str, PrefixView] = {}
        self._segments: dict[int, SegmentInfo] = {}
        # a view read before a change commits is not cached after it: changes bump the generation
        self._cache_lock = threading.Lock()
        self._generation = 0
        # fills shown before their commit: prefix id -> (view, its new segment); chunk hash -> prefix id
        self._provisional: dict[str, tuple[PrefixView, SegmentInfo]] = {}
        self._provisional_hashes: dict[bytes, str] = {}

    # ------------------------------------------------------------ views
    def describe(self, prefix_id: str) -> PrefixView:
        """The stored prefix's manifest (geometry, tokens, chunks, segments)."""
        view = self._views.get(prefix_id)
        if view is not None:
            return view
        shown = self._provisional.get(prefix_id)
        if shown is not None:
            return shown[0]
        generation = self._generation
        m = ops.manifest(self._index, prefix_id)
        if m is None:
            raise NotFound(f"prefix {prefix_id} is not stored")
        view = PrefixView.from_manifest(m)
        with self._cache_lock:
            if generation == self._generation:
                self._views[prefix_id] = view
        return view

    def _forget(self, prefix_ids: Collection[str], segment_ids: Collection[int]) -> None:
        """Drop the cached views a committed change made stale."""
        with self._cache_lock:
            self._generation += 1
            for pid in prefix_ids:
                self._views.pop(pid, None)
            for seg_id in segment_ids:
                self._segments.pop(seg_id, None)

    def segment_info(self, segment_id: int) -> SegmentInfo:
        """The immutable part of the segment's record."""
        info = self._segments.get(segment_id)
        if info is None:
            info = self._provisional_segment(segment_id)
        if info is None:
            rec = ops.segment_record(self._index, segment_id)
            if rec is None:
                raise NotFound(f"segment {segment_id} is not stored")
            info = self._segments[segment_id] = SegmentInfo.from_record(rec)
        return info

    # ------------------------------------------------------------ shown before their commit
    def show_provisional(self, view: PrefixView, segment: SegmentInfo) -> bool:
        """Answer for ``view`` (whose new chunks are in ``segment``) until ``drop_provisional``; False when one is shown already."""
        with self._cache_lock:
            if view.prefix_id in self._provisional:
                return False
            self._provisional[view.prefix_id] = (view, segment)
            for h in view.chunk_hashes:
                self._provisional_hashes.setdefault(bytes.fromhex(h), view.prefix_id)
        return True

    def drop_provisional(self, prefix_id: str) -> None:
        """Stop answering for a shown prefix (its commit listed it, or failed)."""
        with self._cache_lock:
            shown = self._provisional.pop(prefix_id, None)
            if shown is not None:
                for h in shown[0].chunk_hashes:
                    key = bytes.fromhex(h)
                    if self._provisional_hashes.get(key) == prefix_id:
                        del self._provisional_hashes[key]

    def segment_listed(self, segment_id: int) -> bool:
        """Whether the index records the segment (a shown fill's new segment is not, until its commit)."""
        return segment_id in self._segments or ops.segment_record(self._index, segment_id) is not None

    def _provisional_segment(self, segment_id: int) -> SegmentInfo | None:
        for _, segment in list(self._provisional.values()):
            if segment.segment_id == segment_id:
                return segment
        return None

    def resolve(self, prefix: str) -> str:
        """Full prefix id from a unique leading part of it (at least 8 hex digits)."""
        prefix = prefix.lower()
        if len(prefix) == 64:
            return prefix
        if len(prefix) < 8 or any(c not in "0123456789abcdef" for c in prefix):
            raise InvalidArgument("prefix_id", "must be at least 8 hex digits of a prefix id")
        found = ops.prefix_ids_starting(self._index, prefix)
        if not found:
            raise NotFound(f"no stored prefix id starts with {prefix}")
        if len(found) > 1:
            raise InvalidArgument("prefix_id", f"{prefix} is ambiguous ({len(found)} prefixes)")
        return found[0]

    def is_stored(self, prefix_id: str) -> bool:
        return ops.is_stored(self._index, prefix_id)

    def units(self, prefix_id: str, chunks, groups) -> list[Unit]:
        """The stored units (segment, local chunk, group) of a prefix's chunks."""
        view = self.describe(prefix_id)
        sel = validate_chunks(chunks, view.num_chunks)
        grp = validate_groups(groups, view.geometry.num_groups)
        which, local = view.locate(sel)
        seg_ids = [view.pieces[p].segment_id for p in which.tolist()]
        return [(s, loc, g) for g in grp for s, loc in zip(seg_ids, local.tolist())]

    # ------------------------------------------------------------ by chunk hash
    def holder(self, chunk_hash: bytes, *, provisional: bool = False) -> PrefixView | None:
        """A healthy stored prefix (or page batch) holding the chunk, or None; ``provisional``: a shown fill counts."""
        for pid in ops.chunk_holders(self._index, chunk_hash):
            try:
                view = self.describe(pid)
            except NotFound:
                continue
            if self._state.prefix_quarantine(view) is None:
                return view
        if provisional and (pid := self._provisional_hashes.get(chunk_hash)) is not None:
            shown = self._provisional.get(pid)
            if shown is not None and self._state.prefix_quarantine(shown[0]) is None:
                return shown[0]
        return None

    def match(self, hashes: list[bytes], *, provisional: bool = False) -> tuple[int, PrefixView | None]:
        """Leading chunks stored, and a holder of them: a healthy manifest holding chunk j holds all before it (binary search);
        ``provisional``: fills shown before their commit count."""
        lo, hi, best = 0, len(hashes), None  # invariant: chunks [0, lo) matched
        while lo < hi:
            mid = (lo + hi) // 2
            view = self.holder(hashes[mid], provisional=provisional)
            if view is not None:
                lo, best = mid + 1, view
            else:
                hi = mid
        return lo, best

    def still_held(self, chunk_hashes: list[bytes]) -> bool:
        """Whether every chunk has a healthy holder now (one read transaction)."""
        return ops.all_held(self._index, chunk_hashes, self._state.quarantined)

    # ------------------------------------------------------------ listings
    def manifests(self) -> list[dict]:
        return ops.manifests(self._index)

    def manifests_and_segments(self) -> tuple[list[dict], dict[int, dict]]:
        """Every manifest and segment record, as one transaction saw them (eviction and compaction plan over it)."""
        return ops.manifests_and_segments(self._index)

    def segment_ids(self) -> list[int]:
        return ops.segment_ids(self._index)

    def segment_records(self, segment_ids: list[int]) -> dict[int, dict]:
        return ops.segment_records(self._index, segment_ids)

    def totals(self) -> tuple[int, int, int]:
        """``(prefixes, segments, bytes of the segments)`` stored."""
        return ops.totals(self._index)

    # ------------------------------------------------------------ changes
    def commit_put(
        self, prefix_id: str, manifest: dict, segment_record: dict | None, *, reused_segments: Collection[int], requires, hashes
    ) -> bool:
        """List a put's prefix (``index_ops.commit_put``); False when it was stored meanwhile."""
        return ops.commit_put(
            self._index,
            prefix_id,
            manifest,
            segment_record,
            reused_segments=reused_segments,
            requires=requires,
            hashes=hashes,
            quarantined=self._state.quarantined,
        )

    def unlist(self, prefix_id: str) -> tuple[list[int], int]:
        """Unlist the prefix (``index_ops.unlist_prefix``): ``(segments freed, their bytes)``."""
        freed, freed_bytes = ops.unlist_prefix(self._index, prefix_id)
        self._forget([prefix_id], freed)
        return freed, freed_bytes

    def replace_segment(self, old_id: int, record: dict, lo: int, moved: list[tuple[Unit, UnitScore]], prefix_ids: Collection[str]) -> None:
        """Compaction's commit (``index_ops.replace_segment``): the prefixes' pieces in ``old_id`` move to ``record``'s segment."""
        ops.replace_segment(self._index, old_id, record, lo, moved, prefix_ids)
        self._forget(prefix_ids, [old_id])

    def merge_segments(
        self, offsets: dict[int, int], record: dict, moved: list[tuple[Unit, UnitScore]], prefix_ids: Collection[str]
    ) -> None:
        """A merge's commit (``index_ops.merge_segments``): the pieces in the segments of ``offsets`` move to ``record``'s."""
        try:
            ops.merge_segments(self._index, offsets, record, moved, prefix_ids, self._state.quarantined)
        finally:  # a Conflict follows a change made meanwhile: read again either way
            self._forget(prefix_ids, offsets)
