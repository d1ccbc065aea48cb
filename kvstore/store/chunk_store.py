"""The chunk store: prefixes of KV cache as segment files plus an LMDB index.

Write order (docs/ARCHITECTURE.md, "Durability and safety invariants"): segment data -> fdatasync ->
directory fsync -> LMDB commit of the manifest -> acknowledge.  A crash at
any point before the commit leaves only an unreferenced segment file, which
the startup scan removes; a listed prefix always has all of its bytes.  A
failed fsync is never retried: the store turns read-only until restarted.

Recovery without the index.  The store's identity (``identity.py``) is in
the index, in ``STORE_ID`` and in every segment's trailer
(``segment_trailer.py``: the segment record and the manifest of the put that
wrote it).  Every committed prefix also has a manifest file
(``manifests/``, see ``manifest_files.py``), written before its index
commit and removed after its delete's, so a put that writes no segment (all chunks reused) is
recoverable too, and a deleted prefix is not.  Conversation records
(``conversations.py``) have record files the same way
(``conversation_files.py``).  The startup scan deletes a
segment or manifest file only when the index opened cleanly with this
store's identity and does not reference it; a missing, truncated, foreign or
undecodable index is ``IndexDamaged`` and nothing is touched.
``kvstore-admin rebuild-index`` (``rebuild.py``) restores every prefix with a
manifest file whose pieces all verify, finding chunks by hash wherever a
compaction moved them.

``ChunkStore`` is the store's one entry point; its parts live beside it:
``store_state.py`` (read-only state, quarantine, counters),
``store_open.py`` (the startup scan), ``store_put.py`` and
``pending_put.py`` (the two phases of a put), ``store_read.py`` (the read
path), ``store_scores.py`` (cache scores), ``store_admin.py`` (listings,
stats, verify) and ``index_ops.py`` (every index transaction); capacity,
compaction, holds, pages, conversations and rebuild have their own modules.
"""

from __future__ import annotations

import os

import numpy as np

from .. import index as ix
from .. import index_ops as ops
from ..config import StoreConfig
from ..conversation_files import DIRECTORY as CONVERSATIONS_DIR
from ..conversation_files import ConversationFiles
from ..errors import InvalidArgument, NotFound
from ..faults import crash_point
from ..file_modes import make_dirs
from ..geometry import StoreGeometry
from ..hashing import chunk_hashes, validate_tokens
from ..holds import PrefixHolds
from ..identity import fsync_dir, lock_data_dir
from ..io import IOBackend, make_backend
from ..io.inflight import InFlight
from ..manifest_files import ManifestFiles
from ..reader import ReadResult
from ..records import PrefixView, SegmentInfo
from ..scores import ScoreTable, Unit
from ..segment_files import SegmentFiles
from ..wire.results import LookupResult
from ..writer import SegmentImage
from . import admin, opening, puts, reads, scoring
from .capacity import DiskCapacity
from .conversations import Conversations
from .pending_put import PendingPut, PutResult, put_with_retries
from .state import StoreState

__all__ = ["ChunkStore", "LookupResult", "PendingPut", "PutResult", "put_with_retries"]


class ChunkStore:
    def __init__(self, config: StoreConfig | None = None, *, backend: IOBackend | None = None):
        self.config = config = config or StoreConfig()
        self.data_dir = os.path.abspath(config.data_dir)
        self.segment_dir = os.path.join(self.data_dir, "segments")
        make_dirs(self.segment_dir)  # the data directory too, if missing
        self._lock_fd = lock_data_dir(self.data_dir)
        self.manifest_files = ManifestFiles(os.path.join(self.data_dir, "manifests"))
        self.conversation_files = ConversationFiles(os.path.join(self.data_dir, CONVERSATIONS_DIR))
        try:
            self.backend = backend or make_backend(config.backend, queue_depth=config.io_queue_depth, direct=config.direct_io)
            self.index, self.identity = ix.open_index(
                self.data_dir,
                map_bytes=config.index_map_bytes,
                max_map_bytes=config.index_max_map_bytes,
                has_store_files=opening.has_store_files(self),
            )
        except BaseException:
            os.close(self._lock_fd)  # releases the flock: the directory may be opened again
            raise
        self.files = SegmentFiles(self.segment_dir, self.backend)
        self.state = StoreState(self.index, "opened read-only (read_only = true)" if config.read_only else None)
        self._views: dict[str, PrefixView] = {}
        self._segments: dict[int, SegmentInfo] = {}
        self.holds = PrefixHolds()  # prefixes being read or written are never evicted or moved
        self.reads_in_flight = InFlight()  # disk reads the backend has and has not completed
        self.scores = ScoreTable()
        try:
            self.state.next_segment_id, self.last_scan = opening.startup_scan(self, opening.load_records(self))
            self.conversations = Conversations(self)
            if not self.state.read_only:
                self.conversations.reconcile_files()
        except BaseException:
            self.index.close()
            os.close(self._lock_fd)
            raise
        self.capacity = DiskCapacity(self)
        from .pages import PageStore  # pages are stored through this store's put path

        self.pages = PageStore(self)

    # ------------------------------------------------------------ lifecycle
    def close(self) -> None:
        if not self.state.read_only:
            self.flush_scores()
        self.files.close_all()
        self.index.close()
        self.backend.shutdown()
        os.close(self._lock_fd)

    def __enter__(self) -> ChunkStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ state
    @property
    def read_only(self) -> str | None:
        """Why the store refuses writes, or None."""
        return self.state.read_only

    def _check_writable(self) -> None:  # pages.py
        self.state.check_writable()

    def _quarantine(self, segment_id: int, reason: str) -> None:  # compaction.py
        self.state.quarantine(segment_id, reason)

    def _new_segment_id(self) -> int:  # compaction.py
        return self.state.new_segment_id()

    # ------------------------------------------------------------ records
    def segment_info(self, segment_id: int) -> SegmentInfo:
        """The immutable part of the segment's record (cached)."""
        info = self._segments.get(segment_id)
        if info is None:
            rec = ops.segment_record(self.index, segment_id)
            if rec is None:
                raise NotFound(f"segment {segment_id} is not stored")
            info = self._segments[segment_id] = SegmentInfo.from_record(rec)
        return info

    _segment = segment_info  # the name compaction.py and tests use

    def describe(self, prefix_id: str) -> PrefixView:
        """The stored prefix's manifest (geometry, tokens, chunks, segments)."""
        view = self._views.get(prefix_id)
        if view is not None:
            return view
        m = ops.manifest(self.index, prefix_id)
        if m is None:
            raise NotFound(f"prefix {prefix_id} is not stored")
        view = self._views[prefix_id] = PrefixView.from_manifest(m)
        return view

    def prefix_quarantine(self, view: PrefixView) -> str | None:
        """Why the prefix's data is refused (a quarantined segment), or None."""
        return self.state.prefix_quarantine(view)

    def resolve(self, prefix: str) -> str:
        """Full prefix id from a unique leading part of it (at least 8 hex digits)."""
        prefix = prefix.lower()
        if len(prefix) == 64:
            return prefix
        if len(prefix) < 8 or any(c not in "0123456789abcdef" for c in prefix):
            raise InvalidArgument("prefix_id", "must be at least 8 hex digits of a prefix id")
        found = ops.prefix_ids_starting(self.index, prefix)
        if not found:
            raise NotFound(f"no stored prefix id starts with {prefix}")
        if len(found) > 1:
            raise InvalidArgument("prefix_id", f"{prefix} is ambiguous ({len(found)} prefixes)")
        return found[0]

    # ------------------------------------------------------------ lookup
    def lookup(self, tokens, geometry: StoreGeometry, *, namespace: str = "", model_fingerprint: str = "") -> LookupResult:
        """Longest stored prefix of ``tokens``, at chunk granularity."""
        arr = validate_tokens(tokens, self.config.max_prefix_tokens)
        hashes = chunk_hashes(arr, geometry, namespace, model_fingerprint)
        k, holder = self.match(hashes)
        tokens_matched = min(k * geometry.chunk_tokens, arr.size)
        return LookupResult(k, tokens_matched, len(hashes), holder.prefix_id if holder else "")

    def holder(self, chunk_hash: bytes) -> PrefixView | None:
        """A healthy stored prefix (or page batch) holding the chunk, or None."""
        for pid in ops.chunk_holders(self.index, chunk_hash):
            try:
                view = self.describe(pid)
            except NotFound:
                continue
            if self.state.prefix_quarantine(view) is None:
                return view
        return None

    def match(self, hashes: list[bytes]) -> tuple[int, PrefixView | None]:
        """Binary search: a healthy manifest holding chunk j holds all before it."""
        lo, hi, best = 0, len(hashes), None  # invariant: chunks [0, lo) matched
        while lo < hi:
            mid = (lo + hi) // 2
            view = self.holder(hashes[mid])
            if view is not None:
                lo, best = mid + 1, view
            else:
                hi = mid
        return lo, best

    def still_held(self, chunk_hashes: list[bytes]) -> bool:
        """Whether every chunk has a healthy holder now (one read transaction)."""
        return ops.all_held(self.index, chunk_hashes, self.state.quarantined)

    # ------------------------------------------------------------ put (store_put.py, pending_put.py)
    def begin_put(
        self,
        tokens,
        geometry: StoreGeometry,
        *,
        namespace: str = "",
        model_fingerprint: str = "",
        reuse_chunks: int | None = None,
    ) -> PendingPut:
        """First phase of a put: plan what must be written, reserve its space.

        By default every stored leading chunk is reused.  ``reuse_chunks``
        pins the number (a client that sends extents from that chunk on);
        if fewer are stored now, the put fails with Conflict.
        """
        return puts.begin_put(self, tokens, geometry, namespace=namespace, model_fingerprint=model_fingerprint, reuse_chunks=reuse_chunks)

    def begin_chunks(
        self, prefix_id: str, hashes: list[bytes], geometry: StoreGeometry, *, namespace: str, model_fingerprint: str, kind: str
    ) -> PendingPut:
        """A put of whole chunks named by ``hashes`` rather than by tokens (``pages.py``)."""
        return puts.begin_chunks(self, prefix_id, hashes, geometry, namespace=namespace, model_fingerprint=model_fingerprint, kind=kind)

    def pending_segment(self, view: PrefixView, segment_id: int, image: SegmentImage) -> PendingPut:
        """A segment written exactly as a put writes one, for ``view``'s chunks in ``image``."""
        return puts.pending_segment(self, view, segment_id, image)

    def put(self, tokens, kv: np.ndarray, geometry: StoreGeometry, *, namespace: str = "", model_fingerprint: str = "") -> PutResult:
        """Store ``kv`` (``[layers, 2, kv_heads, tokens, head_dim]``) for ``tokens``."""
        return put_with_retries(
            lambda: self.begin_put(tokens, geometry, namespace=namespace, model_fingerprint=model_fingerprint),
            lambda pending: pending.put_kv(kv),
        )

    # ------------------------------------------------------------ what PendingPut calls
    def is_stored(self, prefix_id: str) -> bool:
        return ops.is_stored(self.index, prefix_id)

    def commit_put(self, pending: PendingPut, segment_record: dict | None, manifest: dict) -> bool:
        """Commit a put's manifest; False when the prefix was stored meanwhile."""
        return ops.commit_put(
            self.index,
            pending.prefix_id,
            manifest,
            segment_record,
            reused_segments=[p.segment_id for p in pending.reused],
            requires=pending.requires,
            hashes=pending.hashes,
            quarantined=self.state.quarantined,
        )

    def sync_segment_dir(self) -> None:
        fsync_dir(self.segment_dir)

    # ------------------------------------------------------------ read (store_read.py)
    def read(self, prefix_id: str, chunks, groups=None, *, coalesce: bool = True, alloc=None) -> ReadResult:
        """Read the extents of ``chunks`` for period ``groups`` (default: all).

        ``alloc(nbytes) -> buffer`` may supply the (4 KiB aligned) destination.
        """
        with self.holds.hold(prefix_id):
            return self._read(prefix_id, chunks, groups, coalesce=coalesce, alloc=alloc)

    def _read(self, prefix_id: str, chunks, groups, *, coalesce: bool, alloc) -> ReadResult:  # pages.py holds its own
        return reads.read_held(self, prefix_id, chunks, groups, coalesce=coalesce, alloc=alloc)

    def read_summaries(self, prefix_id: str) -> np.ndarray:
        """Key summaries ``[chunks, layers, kv_heads, 2 (min|max), head_dim]`` float32."""
        return reads.read_summaries(self, prefix_id)

    def read_probe_keys(self, prefix_id: str, group: int) -> np.ndarray:
        """Keys of the group's first layer: ``[kv_heads, tokens, head_dim]``."""
        return reads.read_probe_keys(self, prefix_id, group)

    # ------------------------------------------------------------ delete
    def delete(self, prefix_id: str, *, compact: bool = True) -> list[int]:
        """Unlist the prefix, then free segments no other prefix references; returns those.

        Then (unless ``compact`` is false) segments it shared that are now
        mostly dead are compacted.
        """
        self.state.check_writable()
        ix.prefix_key(prefix_id)  # InvalidArgument before the prefix's manifest lock is taken
        with self.manifest_files.locked(prefix_id):
            freed, freed_bytes = ops.unlist_prefix(self.index, prefix_id)
            crash_point("delete:committed")
            self._remove_manifest_file(prefix_id)
        self._views.pop(prefix_id, None)
        for seg_id in freed:
            self._segments.pop(seg_id, None)
            self.scores.drop_segment(seg_id)
            self.files.remove(seg_id)
            self.state.forget(seg_id)
        self.state.count(deletes=1)
        self.capacity.segments_freed(freed, freed_bytes)
        if compact:
            self.capacity.compact()
        return freed

    def _remove_manifest_file(self, prefix_id: str) -> None:
        try:
            self.manifest_files.remove(prefix_id)
        except OSError as exc:  # the delete is committed; a rebuild could bring the prefix back
            self.state.turn_read_only(f"removing the manifest file of {prefix_id} failed: {exc.strerror or exc}")

    # ------------------------------------------------------------ scores (store_scores.py)
    def units(self, prefix_id: str, chunks, groups) -> list[Unit]:
        """The stored units (segment, local chunk, group) of a prefix's chunks."""
        return scoring.units(self, prefix_id, chunks, groups)

    def record_access(self, prefix_id: str, chunks, groups) -> None:
        """``F_j += 1`` for every unit read (in memory; see ``flush_scores``)."""
        scoring.record_access(self, prefix_id, chunks, groups)

    def report_attention(self, prefix_id: str, group: int, chunks, attention) -> int:
        """``I_j += A_j``: the attention mass the client measured for each chunk."""
        return scoring.report_attention(self, prefix_id, group, chunks, attention)

    def flush_scores(self) -> int:
        """Persist changed scores to the index (one transaction); entries written."""
        return scoring.flush_scores(self)

    # ------------------------------------------------------------ admin (store_admin.py)
    def verify(self, prefix_id: str | None = None, *, progress=None) -> list[dict]:
        """Re-read every checksummed region (of one prefix, or of the store).

        ``progress(iterable, desc)`` wraps the loop over segments (a bar, see kvstore.progress).
        """
        return admin.verify(self, prefix_id, progress=progress)

    def list_prefixes(self) -> list[dict]:
        return admin.list_prefixes(self)

    def inspect(self, prefix_id: str) -> dict:
        return admin.inspect(self, prefix_id)

    def stats(self) -> dict:
        return admin.stats(self)
