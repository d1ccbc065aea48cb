"""The put path after ``Writer.begin_put``: ``PendingPut`` takes the extents, then commits.

Commit order: the segment (with its trailer) and the prefix's manifest
file are written, the segment fdatasynced and its directory fsynced, then
one index transaction lists the prefix; only then is the put acknowledged.
A put that fails or is killed before its commit lists nothing, and what it
wrote is removed at once or by the next startup scan.  A failed fdatasync
is never retried: the store turns read-only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..contract.errors import Conflict, InvalidArgument, StoreFull
from ..contract.results import PutResult
from ..faults import crash_point
from ..holds import PrefixHold
from ..manifest_files import ManifestFiles
from ..records import PREFIX, Piece, PrefixView, SegmentInfo
from ..writer import SegmentImage
from .catalogue import Catalogue
from .new_segment import NewSegment, SegmentSink, is_full, put_manifest, segment_record
from .state import StoreState
from .usage import DiskUsage


@dataclass(frozen=True)
class PutPath:
    """What a put goes through: segment files, manifest files, the index, usage and the store's state."""

    sink: SegmentSink
    manifest_files: ManifestFiles
    catalogue: Catalogue
    usage: DiskUsage
    state: StoreState
    # called with each PendingPut that listed a new prefix, after its commit (the remote tier's replication)
    on_commit: list[Callable[[PendingPut], None]] = field(default_factory=list)


class PendingPut:
    """A put between ``begin_put`` and ``commit``/``abort``.

    ``reused_chunks`` leading chunks are already stored (shared with another
    prefix); the caller sends extents for chunks ``[reused_chunks, num_chunks)``
    of every group, then commits.  Nothing is listed before ``commit`` returns.

    ``Writer`` passes the prefix hold at construction, opens the segment
    (``open_segment``) and records the bytes it reserved (``reserved``).
    """

    def __init__(
        self,
        path: PutPath,
        prefix_id,
        tokens,
        geometry,
        namespace,
        model_fingerprint,
        hashes,
        reused_chunks,
        reused,
        *,
        kind=PREFIX,
        hold: PrefixHold | None = None,
    ):
        self._path = path
        self.kind = kind
        self.requires: list[bytes] = []  # chunk hashes that must still be held at the commit (else Conflict)
        self.prefix_id = prefix_id
        self.tokens = tokens
        self.geometry = geometry
        self.namespace = namespace
        self.model_fingerprint = model_fingerprint
        self.hashes = hashes
        self.reused_chunks = reused_chunks
        self.reused: list[Piece] = reused
        self.segment_id: int | None = None
        self.image: SegmentImage | None = None
        self._segment: NewSegment | None = None
        self._done = False
        self._committing = False  # commit owns the outcome: abort from another thread waits it out
        self._state_lock = threading.Lock()
        self._hold = hold  # this prefix and the one it reuses chunks of
        self.reserved = 0  # bytes of max_disk_bytes reserved for the new segment
        self.origin = "put"  # "remote": filled from the remote tier (store/remote_fill.py), not a client's put
        self.on_durable: Callable[[], None] | None = None  # called once the segment and manifest file are synced
        self._prepared: tuple[dict | None, dict] | None = None  # (segment record, manifest), made once
        # [groups][chunks] checksums every extent of the new segment was checked against as it came in (a fill's)
        self.extent_xxh3: list[list[int]] | None = None

    @property
    def num_chunks(self) -> int:
        return len(self.hashes)

    @property
    def needed_chunks(self) -> range:
        return range(self.reused_chunks, self.num_chunks)

    def open_segment(self, segment_id: int, image: SegmentImage) -> None:
        self.segment_id, self.image = segment_id, image
        try:
            self._segment = self._path.sink.open(segment_id, image)
        except OSError as exc:
            self.abort()
            if is_full(exc):
                raise StoreFull(f"data file system is full ({exc.strerror}) reserving {image.layout.total_bytes} bytes") from None
            raise

    def put_extent(self, group: int, chunk: int, payload) -> None:
        self._image().put_extent(group, chunk, payload)

    def put_extents(self, group: int, chunks, payloads) -> None:
        """Whole extents of one group for consecutive chunks (``SegmentImage.put_extents``)."""
        self._image().put_extents(group, chunks, payloads)

    def copy_extents(self, group: int, chunks, payloads) -> list[int]:
        """``put_extents`` without the derivation (``SegmentImage.copy_extents``); ``derive_extents`` of the chunks follows."""
        return self._image().copy_extents(group, chunks, payloads)

    def extent_views(self, group: int, chunks) -> list[memoryview]:
        return self._image().extent_views(group, chunks)

    def received_in_place(self, group: int, chunks) -> list[int]:
        return self._image().received_in_place(group, chunks)

    def derive_extents(self, group: int, chunks: list[int]) -> None:
        self._image().derive_extents(group, chunks)

    def put_extent_part(self, group: int, chunk: int, offset: int, payload) -> None:
        self._image().put_extent_part(group, chunk, offset, payload)

    def _image(self) -> SegmentImage:
        if self.image is None:
            raise InvalidArgument("extent.chunk", f"all {self.num_chunks} chunks are already stored; send no extents")
        return self.image

    def put_kv(self, kv: np.ndarray) -> None:
        """Send every needed extent from a full ``[layers, 2, heads, tokens, dim]`` array."""
        geo = self.geometry
        m = geo.model
        expected = (m.num_layers, 2, m.num_kv_heads, self.tokens.size, m.head_dim)
        if not isinstance(kv, np.ndarray):
            raise InvalidArgument("kv", f"must be a numpy array, got {type(kv).__name__}")
        if kv.shape != expected:
            raise InvalidArgument("kv", f"shape must be {expected} [layers, 2, kv_heads, tokens, head_dim], got {kv.shape}")
        if kv.dtype != m.numpy_dtype():
            raise InvalidArgument("kv", f"dtype must be {m.numpy_dtype()} for {m.dtype}, got {kv.dtype}")
        if self.image is None:
            return
        c = geo.chunk_tokens
        for g in range(geo.num_groups):
            layers = geo.group_layer_range(g)
            for j in self.needed_chunks:
                self.image.put_extent(
                    g, j, geo.extent_payload(np.ascontiguousarray(kv[layers.start : layers.stop, :, :, j * c : (j + 1) * c]), g)
                )

    def commit(self) -> PutResult:
        """Write, sync, index, and only then acknowledge."""
        with self._state_lock:
            if self._done or self._committing:
                raise InvalidArgument("put", "this put was already committed or aborted")
            self._committing = True
        path = self._path
        try:
            path.state.check_writable()
            if self.image is not None and self.image.missing:
                g, j = self.image.first_missing()
                raise InvalidArgument("extents", f"{self.image.missing} extents missing, first: group {g} chunk {j}")
            record, _ = self._prepare()
            with path.manifest_files.locked(self.prefix_id):
                stored, written = (False, 0) if path.catalogue.is_stored(self.prefix_id) else self._write_and_commit(record)
        except BaseException:
            self._abort()
            raise
        self._close_file()
        self._done = True
        self._settle(record["total_bytes"] if stored and record else 0)
        if not stored and self.segment_id is not None:
            path.sink.remove(self.segment_id)  # a concurrent put stored it first
            written = 0
        path.state.count(puts=1, bytes_written=written)
        if stored:
            for hook in path.on_commit:
                hook(self)
        return PutResult(self.prefix_id, int(self.tokens.size), self.num_chunks, self.reused_chunks, written, not stored)

    def _prepare(self) -> tuple[dict | None, dict]:
        """The segment's index record (None when every chunk is reused) and the prefix's manifest, made once."""
        if self._prepared is None:
            record = segment_record(self.segment_id, self.geometry, self.image, self.extent_xxh3) if self.image is not None else None
            self._prepared = (record, self._manifest())
        return self._prepared

    def provisional_view(self) -> tuple[PrefixView, SegmentInfo | None]:
        """What the commit will list, before it: the prefix's view and its new segment's (every extent must be in)."""
        if self.image is not None and self.image.missing:
            g, j = self.image.first_missing()
            raise InvalidArgument("extents", f"{self.image.missing} extents missing, first: group {g} chunk {j}")
        record, manifest = self._prepare()
        return PrefixView.from_manifest(manifest), SegmentInfo.from_record(record) if record is not None else None

    def _write_and_commit(self, record: dict | None) -> tuple[bool, int]:
        """Segment and manifest file durable, then the index commit; (stored, bytes written)."""
        _, manifest = self._prepare()
        written = self._write_and_sync(record, manifest)
        if self.on_durable is not None:
            self.on_durable()
        try:
            stored = self._path.catalogue.commit_put(
                self.prefix_id,
                manifest,
                record,
                reused_segments=[p.segment_id for p in self.reused],
                requires=self.requires,
                hashes=self.hashes,
            )
        except BaseException:
            self._path.manifest_files.remove(self.prefix_id)
            raise
        return stored, written

    def _manifest(self) -> dict:
        pieces = list(self.reused)
        if self.image is not None:
            pieces.append(Piece(self.segment_id, self.reused_chunks, self.num_chunks - self.reused_chunks, 0))
        return put_manifest(
            prefix_id=self.prefix_id,
            namespace=self.namespace,
            model_fingerprint=self.model_fingerprint,
            geometry=self.geometry,
            num_tokens=int(self.tokens.size),
            chunk_hashes=[h.hex() for h in self.hashes],
            pieces=pieces,
            kind=self.kind,
        )

    def _write_and_sync(self, record: dict | None, manifest: dict) -> int:
        """Segment (with its trailer) and manifest file written and synced, with their directory."""
        try:
            written = self._segment.write(record, manifest) if record is not None else 0
            self._path.manifest_files.write(manifest)
        except OSError as exc:
            if is_full(exc):
                raise StoreFull(f"data file system is full ({exc.strerror}) writing prefix {self.prefix_id}") from None
            raise
        if record is not None:
            self._segment.sync()
        crash_point("put:synced")
        return written

    def _close_file(self) -> None:
        if self._segment is not None:
            self._segment.close()

    def _settle(self, stored_bytes: int) -> None:
        """The put is over: its reservation becomes stored bytes (or goes), its hold ends."""
        usage = self._path.usage
        usage.unreserve(self.reserved)
        usage.segments_added(stored_bytes)
        self.reserved = 0
        if self._hold is not None:
            self._hold.release()

    def abort(self) -> None:
        """Drop an uncommitted put; its file (if any) is removed.

        A no-op after a commit, and while one runs: the commit either indexes
        the prefix or aborts the put itself, so a client cut off mid-commit
        never unlinks a segment the index is about to name.
        """
        with self._state_lock:
            if self._done or self._committing:
                return
        self._abort()

    def _abort(self) -> None:
        if self._done:
            return
        self._done = True
        self._settle(0)
        self._close_file()
        if self.segment_id is not None:
            self._path.sink.discard(self.segment_id)


def put_with_retries(begin, fill, attempts: int = 3):
    """``begin()`` a put, ``fill(pending)`` it and commit; again from the start on Conflict
    (a reused piece was deleted meanwhile), up to ``attempts`` times.  A failed try is aborted."""
    for attempt in range(attempts):
        pending = begin()
        try:
            fill(pending)
            return pending.commit()
        except Conflict:
            if attempt == attempts - 1:
                raise
        finally:
            pending.abort()  # a no-op after a commit
    raise AssertionError("unreachable")
