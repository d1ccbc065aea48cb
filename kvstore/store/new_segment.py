"""Writing a new segment file, the same way for a put and for compaction's copy.

``SegmentSink.open`` opens the file with its blocks allocated;
``NewSegment.write`` writes the image (in ``write_piece_bytes`` pieces) and
then its trailer (``segment_trailer.py``: the store id, the segment record
and the manifest of the put that wrote it); ``sync`` fdatasyncs the file
and fsyncs its directory.  A failed sync is never retried: the store turns
read-only.  ``segment_record`` and ``put_manifest`` build the two records a
put commits and a trailer carries.
"""

from __future__ import annotations

import errno
import os
import time

from ..contract.errors import ReadOnly
from ..contract.geometry import StoreGeometry
from ..identity import fsync_dir
from ..io import IOBackend, aligned_buffer
from ..records import Piece
from ..segment_files import SegmentFiles
from ..segment_trailer import encode_trailer
from ..writer import SegmentImage
from .state import StoreState


def is_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def segment_record(segment_id: int, geometry: StoreGeometry, image: SegmentImage, extent_xxh3: list[list[int]] | None = None) -> dict:
    """The index record of a new segment holding ``image`` (``extent_xxh3``: ``SegmentImage.checksums``)."""
    return {
        "segment_id": segment_id,
        "geometry": geometry.to_record(),
        "num_tokens": image.layout.num_tokens,
        "first_chunk": image.first_chunk,
        "total_bytes": image.layout.total_bytes,
        "refcount": 1,
        "created": time.time(),
        "quarantined": None,
        **image.checksums(extent_xxh3),
    }


def put_manifest(
    *,
    prefix_id: str,
    namespace: str,
    model_fingerprint: str,
    geometry: StoreGeometry,
    num_tokens: int,
    chunk_hashes: list[str],
    pieces: list[Piece],
    kind: str,
) -> dict:
    """The manifest a put commits (and its segment's trailer carries)."""
    return {
        "prefix_id": prefix_id,
        "namespace": namespace,
        "model_fingerprint": model_fingerprint,
        "geometry": geometry.to_record(),
        "num_tokens": num_tokens,
        "chunk_hashes": chunk_hashes,
        "segments": [p.to_dict() for p in pieces],
        "created": time.time(),
        "kind": kind,
    }


class SegmentSink:
    """Where new segments are written: the segment directory, through the store's I/O backend."""

    def __init__(self, files: SegmentFiles, backend: IOBackend, state: StoreState, *, store_id: str, write_piece_bytes: int):
        self.files = files
        self.backend = backend
        self._state = state
        self._store_id = store_id
        self._piece_bytes = write_piece_bytes

    @property
    def directory(self) -> str:
        return self.files.directory

    def open(self, segment_id: int, image: SegmentImage) -> NewSegment:
        """The segment's file, created with ``image``'s size allocated; OSError as the backend raised it."""
        fh = self.backend.open(self.files.path(segment_id), write=True)
        try:
            self.backend.allocate(fh, image.layout.total_bytes)
        except BaseException:
            self.backend.close(fh)
            raise
        return NewSegment(
            segment_id,
            image,
            fh,
            self.backend,
            self._state,
            directory=self.directory,
            store_id=self._store_id,
            write_piece_bytes=self._piece_bytes,
        )

    def sync_dir(self) -> None:
        fsync_dir(self.files.directory)

    def discard(self, segment_id: int) -> None:
        """Unlink a segment file nothing lists (left alone once read-only: the next startup scan removes it)."""
        if self._state.read_only:
            return
        try:
            os.unlink(self.files.path(segment_id))
        except FileNotFoundError:
            pass

    def remove(self, segment_id: int) -> None:
        """Unlink a segment file now, closing its descriptor after its last reader (``SegmentFiles.remove``)."""
        self.files.remove(segment_id)


class NewSegment:
    """A segment file being written; ``close`` it (and ``SegmentSink.discard`` it if it is not committed)."""

    def __init__(
        self,
        segment_id: int,
        image: SegmentImage,
        fh,
        backend: IOBackend,
        state: StoreState,
        *,
        directory: str,
        store_id: str,
        write_piece_bytes: int,
    ):
        self.segment_id = segment_id
        self._directory = directory
        self.image = image
        self._fh = fh
        self._backend = backend
        self._state = state
        self._store_id = store_id
        self._piece_bytes = write_piece_bytes

    def write(self, record: dict, manifest: dict) -> int:
        """The image and its trailer; the layout's bytes (the trailer is a few KiB more)."""
        img, piece = self.image, self._piece_bytes
        total = img.layout.total_bytes
        trailer = encode_trailer(total, self._store_id, record, manifest)
        tail = aligned_buffer(len(trailer))
        tail[:] = trailer
        futures = [self._backend.pwrite(self._fh, img.buffer[o : min(o + piece, total)], o) for o in range(0, total, piece)]
        futures.append(self._backend.pwrite(self._fh, tail, total))
        for f in futures:
            f.result()
        return total

    def sync(self) -> None:
        """fdatasync the file and fsync its directory; on failure the store turns read-only (ReadOnly)."""
        try:
            self._backend.fdatasync(self._fh)
            fsync_dir(self._directory)
        except OSError as exc:
            self._state.turn_read_only(f"fdatasync of segment {self.segment_id} failed: {exc.strerror or exc}")
            raise ReadOnly(f"write not durable ({exc.strerror or exc}); store is now read-only") from None

    def close(self) -> None:
        if self._fh is not None:
            self._backend.close(self._fh)
            self._fh = None
