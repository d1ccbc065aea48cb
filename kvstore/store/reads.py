"""The chunk store's read path: extents, key summaries and probe keys of a stored prefix.

Every byte read is checked against its segment record's checksum; a
mismatch, or a file gone or short, quarantines the segment and is
``DataLoss``.  The prefix is held while it is read (``PrefixHolds``; the
caller of ``read_held`` holds it), so no eviction or compaction moves it.
"""

from __future__ import annotations

import numpy as np
import xxhash

from ..contract.errors import DataLoss, InvalidArgument, NotFound
from ..contract.geometry import StoreGeometry, align_up
from ..holds import PrefixHolds
from ..io import aligned_buffer
from ..io.inflight import InFlight
from ..reader import ReadResult, SegmentUnreadable, execute_reads, plan_extents, validate_chunks, validate_groups
from ..records import Piece, PrefixView, SegmentInfo
from ..segment_files import SegmentFiles
from .catalogue import Catalogue
from .state import StoreState


class _UnlistedSegment(Exception):
    """A read reached a segment the index does not record (a shown fill's, gone since)."""


class Reader:
    def __init__(
        self,
        catalogue: Catalogue,
        state: StoreState,
        files: SegmentFiles,
        holds: PrefixHolds,
        *,
        in_flight: InFlight,
        max_read_run_bytes: int,
    ):
        self._catalogue = catalogue
        self._state = state
        self._files = files
        self._holds = holds
        self._in_flight = in_flight
        self._max_run_bytes = max_read_run_bytes

    def read(self, prefix_id: str, chunks, groups=None, *, coalesce: bool = True, alloc=None) -> ReadResult:
        """``ChunkStore.read``: the prefix held while it is read."""
        with self._holds.hold(prefix_id):
            return self.read_held(prefix_id, chunks, groups, coalesce=coalesce, alloc=alloc)

    def read_held(self, prefix_id: str, chunks, groups, *, coalesce: bool, alloc) -> ReadResult:
        """``read`` of a prefix the caller holds (``pages.py`` holds every batch of a call at once).

        A fill shown before its commit (``Catalogue.show_provisional``) whose segment went before the
        read reached it (its commit failed, or a put of the same prefix won) is read again as listed now.
        """
        try:
            return self._read_held(prefix_id, chunks, groups, coalesce=coalesce, alloc=alloc)
        except _UnlistedSegment:
            pass
        try:
            return self._read_held(prefix_id, chunks, groups, coalesce=coalesce, alloc=alloc)
        except _UnlistedSegment as exc:
            raise NotFound(f"prefix {prefix_id}: segment {exc.args[0]} is no longer stored; look the prefix up again") from None

    def _read_held(self, prefix_id: str, chunks, groups, *, coalesce: bool, alloc) -> ReadResult:
        view = self._catalogue.describe(prefix_id)
        q = self._state.prefix_quarantine(view)
        if q:
            raise DataLoss(f"prefix {prefix_id} is quarantined ({q}); delete and store it again")
        sel = validate_chunks(chunks, view.num_chunks)
        grp = validate_groups(groups, view.geometry.num_groups)
        segments = {s: self._catalogue.segment_info(s) for s in view.segment_ids}
        refs = plan_extents(view, segments, sel, grp)
        try:
            views, buf, nreads, bad = execute_reads(
                refs,
                self._files,
                coalesce_reads=coalesce,
                max_run_bytes=self._max_run_bytes,
                alloc=alloc,
                in_flight=self._in_flight,
            )
        except SegmentUnreadable as exc:
            if not self._catalogue.segment_listed(exc.segment_id):
                raise _UnlistedSegment(exc.segment_id) from None
            raise self._state.unreadable(exc.segment_id, exc.cause) from None
        nbytes = sum(r.padded for r in refs)  # runs are unions of padded extents
        self._state.count(bytes_read=nbytes, reads=1)
        if bad:
            for m in bad:
                self._state.quarantine(m.segment_id, f"checksum mismatch in {m.region}")
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

    def read_summaries(self, prefix_id: str, layer_step: int = 1) -> np.ndarray:
        """Key summaries ``[chunks, layers, kv_heads, 2 (min|max), head_dim]`` float32, of layers ``0, layer_step, ...``
        (a client keeping each Period's first layer asks for those alone)."""
        with self._holds.hold(prefix_id):
            view = self._catalogue.describe(prefix_id)
            if isinstance(layer_step, bool) or not isinstance(layer_step, int) or layer_step < 1:  # past the last layer: layer 0
                raise InvalidArgument("layer_step", f"must be a positive integer (0 in a request: every layer), got {layer_step!r}")
            return np.concatenate([self._piece_summaries(view, p)[:, ::layer_step] for p in view.pieces], axis=0)

    def _piece_summaries(self, view: PrefixView, p: Piece) -> np.ndarray:
        seg = self._catalogue.segment_info(p.segment_id)
        arr = self._read_region(seg, "summaries", seg.layout.summaries_offset, seg.layout.summaries_length, seg.summaries_xxh3)
        full = arr.view(np.float32).reshape(seg.layout.num_chunks, *_summary_tail(view.geometry))
        return full[p.segment_chunk : p.segment_chunk + p.num_chunks]

    def read_probe_keys(self, prefix_id: str, group: int) -> np.ndarray:
        """Keys of the group's first layer: ``[kv_heads, tokens, head_dim]`` in the KV dtype, or, for a
        geometry with ``probe_bits``, their packed rows ``[kv_heads, tokens, row_bytes]`` uint8
        (``kvstore.contract.probes``)."""
        with self._holds.hold(prefix_id):
            view = self._catalogue.describe(prefix_id)
            geo = view.geometry
            if not geo.probe_keys:
                raise InvalidArgument("group", "this prefix was stored without probe keys")
            (g,) = validate_groups([group], geo.num_groups)
            return np.concatenate([self._piece_probe_keys(view, p, g) for p in view.pieces], axis=1)

    def _piece_probe_keys(self, view: PrefixView, p: Piece, g: int) -> np.ndarray:
        seg = self._catalogue.segment_info(p.segment_id)
        lay = seg.layout
        arr = self._read_region(seg, f"probe[group={g}]", lay.probe_offsets[g], lay.probe_length, seg.probe_xxh3[g])
        keys = view.geometry.probe_array(arr, lay.num_tokens)
        t0 = int(lay.token_offsets[p.segment_chunk])
        t1 = int(lay.token_offsets[p.segment_chunk + p.num_chunks])
        return keys[:, t0:t1]

    def _read_region(self, seg: SegmentInfo, name: str, offset: int, length: int, xxh3: int) -> np.ndarray:
        state = self._state
        if seg.segment_id in state.quarantined:
            raise DataLoss(f"segment {seg.segment_id} is quarantined: {state.quarantined[seg.segment_id]}")
        buf = aligned_buffer(align_up(length))
        try:
            with self._files.reading(seg.segment_id) as fh:
                self._in_flight.track(self._files.pread(fh, buf, offset)).result()
        except (OSError, EOFError) as exc:
            if not self._catalogue.segment_listed(seg.segment_id):  # a shown fill's, gone since: not damage
                raise NotFound(f"segment {seg.segment_id} is no longer stored; look the prefix up again") from None
            raise state.unreadable(seg.segment_id, exc) from None
        state.count(bytes_read=len(buf))
        arr = np.frombuffer(buf, dtype=np.uint8)[:length]
        if xxhash.xxh3_64_intdigest(arr) != xxh3:
            state.quarantine(seg.segment_id, f"checksum mismatch in {name}")
            raise DataLoss(f"segment {seg.segment_id}: checksum mismatch in {name}")
        return arr


def _summary_tail(geo: StoreGeometry) -> tuple[int, int, int, int]:
    m = geo.model
    return (m.num_layers, m.num_kv_heads, 2, m.head_dim)
