"""The first phase of a put: what must be written, its space, its segment.

``Writer.begin_put`` matches the stored leading chunks (reused, not written
again), holds the prefix and the one it reuses, reserves the new segment's
bytes (``DiskCapacity``, which may evict) and opens the segment file; the
returned ``PendingPut`` takes the extents and commits.
"""

from __future__ import annotations

import os

import numpy as np

from ..contract.errors import Conflict, InvalidArgument, StoreFull
from ..contract.geometry import StoreGeometry
from ..contract.layout import SegmentLayout
from ..faults import crash_point
from ..hashing import chunk_hashes, validate_tokens
from ..holds import PrefixHolds
from ..io import KeptBuffers
from ..writer import SegmentImage
from .capacity import DiskCapacity
from .pending_put import PendingPut, PutPath


class Writer:
    def __init__(self, path: PutPath, holds: PrefixHolds, capacity: DiskCapacity, *, max_prefix_tokens: int, min_free_bytes: int):
        self._path = path
        self._holds = holds
        self._capacity = capacity
        self._max_prefix_tokens = max_prefix_tokens
        self._min_free_bytes = min_free_bytes

    def begin_put(self, tokens, geometry: StoreGeometry, *, namespace: str, model_fingerprint: str, reuse_chunks: int | None) -> PendingPut:
        """``ChunkStore.begin_put``: the reused pieces are those of the holder ``Catalogue.match`` found."""
        self._path.state.check_writable()
        if not isinstance(geometry, StoreGeometry):
            raise InvalidArgument("geometry", "must be a StoreGeometry")
        arr = validate_tokens(tokens, self._max_prefix_tokens)
        hashes = chunk_hashes(arr, geometry, namespace, model_fingerprint)
        prefix_id = hashes[-1].hex()
        k, holder = self._path.catalogue.match(hashes)
        if reuse_chunks is not None:
            if isinstance(reuse_chunks, bool) or not 0 <= reuse_chunks <= len(hashes):
                raise InvalidArgument("reuse_chunks", f"must be in [0, {len(hashes)}], got {reuse_chunks}")
            if k < reuse_chunks:
                raise Conflict(f"only {k} of the {reuse_chunks} leading chunks to reuse are stored; look up again")
            k = reuse_chunks
        reused = holder.pieces_upto(k) if holder and k else []
        hold = self._holds.hold(prefix_id, holder.prefix_id if reused else None)
        pending = PendingPut(self._path, prefix_id, arr, geometry, namespace, model_fingerprint, hashes, k, reused, hold=hold)
        return self._open(pending)

    def begin_chunks(
        self, prefix_id: str, hashes: list[bytes], geometry: StoreGeometry, *, namespace: str, model_fingerprint: str, kind: str
    ) -> PendingPut:
        """A put of whole chunks named by ``hashes`` rather than by tokens (``pages.py``).

        The caller has validated ``namespace`` and ``model_fingerprint`` (they
        are in the hashes); nothing is reused, and ``kind`` is recorded in the
        manifest.  Written, synced, indexed and acknowledged as a prefix put.
        """
        self._path.state.check_writable()
        tokens = np.zeros(len(hashes) * geometry.chunk_tokens, dtype=np.int64)  # sizes only: pages carry no tokens
        pending = PendingPut(
            self._path,
            prefix_id,
            tokens,
            geometry,
            namespace,
            model_fingerprint,
            hashes,
            0,
            [],
            kind=kind,
            hold=self._holds.hold(prefix_id),
        )
        return self._open(pending)

    def begin_fill(
        self,
        prefix_id: str,
        hashes: list[bytes],
        num_tokens: int,
        geometry: StoreGeometry,
        *,
        namespace: str,
        model_fingerprint: str,
        buffers: KeptBuffers | None = None,
    ) -> PendingPut:
        """A put of a prefix known by its chunk hashes (``remote_fill.py``: a prefix fetched from the remote tier).

        As ``begin_put`` without the tokens: the stored leading chunks are
        reused, the rest written, synced, indexed and acknowledged the same
        way; the put's ``origin`` is ``remote``.  ``buffers``: where its segment image's memory comes from.
        """
        self._path.state.check_writable()
        k, holder = self._path.catalogue.match(hashes)
        reused = holder.pieces_upto(k) if holder and k else []
        hold = self._holds.hold(prefix_id, holder.prefix_id if reused else None)
        tokens = np.zeros(num_tokens, dtype=np.int64)  # sizes only: the store keeps no tokens
        pending = PendingPut(self._path, prefix_id, tokens, geometry, namespace, model_fingerprint, hashes, k, reused, hold=hold)
        pending.origin = "remote"
        return self._open(pending, buffers)

    def _open(self, pending: PendingPut, buffers: KeptBuffers | None = None) -> PendingPut:
        """Reserve space for and open the segment of the chunks ``pending`` writes (none: nothing to open)."""
        k, geometry = pending.reused_chunks, pending.geometry
        if k == pending.num_chunks:
            return pending
        c = geometry.chunk_tokens
        layout = SegmentLayout(geometry, pending.tokens.size - k * c)
        try:
            pending.reserved = self._capacity.reserve(layout.total_bytes)
            self._check_space(layout.total_bytes)
        except BaseException:
            pending.abort()
            raise
        buffer = buffers.take(layout.total_bytes) if buffers is not None else None
        pending.open_segment(self._path.state.new_segment_id(), SegmentImage(layout, first_chunk=k, buffer=buffer))
        crash_point("put:opened")
        return pending

    def _check_space(self, nbytes: int) -> None:
        st = os.statvfs(self._path.sink.directory)
        free = st.f_bavail * st.f_frsize
        if free - nbytes < self._min_free_bytes:
            raise StoreFull(
                f"data file system is full: {nbytes} bytes needed, {free} free, {self._min_free_bytes} kept in reserve (min_free_bytes)"
            )
