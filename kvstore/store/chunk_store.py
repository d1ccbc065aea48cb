"""``ChunkStore``: the store's one entry point, a facade over its parts.

It opens the data directory (lock, index, startup scan), builds the parts
(``__init__.py`` lists them) with the narrow pieces each one uses, and
keeps the calls its callers need: lookup, put, read, delete, the admin
views, scores' flush, close.  The rest is reached through the part that
owns it (``store.catalogue.units``, ``store.scoring.report_attention``,
``store.capacity.evict_to``, ``store.pages``, ``store.merger``,
``store.conversations``).
"""

from __future__ import annotations

import os
import threading

import numpy as np

from .. import index as ix
from ..config import StoreConfig
from ..contract.errors import NotFound
from ..contract.geometry import StoreGeometry
from ..contract.results import LookupResult
from ..conversation_files import DIRECTORY as CONVERSATIONS_DIR
from ..conversation_files import ConversationFiles
from ..file_modes import make_dirs
from ..hashing import chunk_hashes, validate_tokens
from ..holds import PrefixHolds
from ..identity import lock_data_dir
from ..io import IOBackend, make_backend
from ..io.inflight import InFlight
from ..manifest_files import ManifestFiles
from ..reader import ReadResult
from ..records import PrefixView
from ..remote.base import RemoteTier
from ..remote.config import RemoteConfig
from ..remote.records import is_hash_hex
from ..scores import ScoreTable
from ..segment_files import SegmentFiles
from . import opening
from .admin import Admin
from .capacity import DiskCapacity
from .catalogue import Catalogue
from .compaction import Compactor
from .conversations import Conversations
from .merge import SegmentMerger
from .new_segment import SegmentSink
from .pages import PageStore
from .pending_put import PendingPut, PutPath, PutResult, put_with_retries
from .puts import Writer
from .reads import Reader
from .remote_fill import RemoteFill
from .remote_link import RemoteLink
from .removal import Removal
from .replication import Replicator
from .scoring import Scoring
from .state import StoreState
from .usage import DiskUsage

__all__ = ["ChunkStore", "LookupResult", "PendingPut", "PutResult", "put_with_retries"]


class ChunkStore:
    def __init__(
        self,
        config: StoreConfig | None = None,
        *,
        backend: IOBackend | None = None,
        remote: RemoteTier | None = None,
        remote_config: RemoteConfig | None = None,
    ):
        """``remote``: a remote tier below this one (docs/cluster.md), with its ``remote_config`` (default: its defaults)."""
        self.config = config = config or StoreConfig()
        self.data_dir = os.path.abspath(config.data_dir)
        self.segment_dir = os.path.join(self.data_dir, "segments")
        make_dirs(self.segment_dir)  # the data directory too, if missing
        self._lock_fd = lock_data_dir(self.data_dir)
        self.manifest_files = ManifestFiles(os.path.join(self.data_dir, "manifests"))
        conversation_files = ConversationFiles(os.path.join(self.data_dir, CONVERSATIONS_DIR))
        try:
            self.backend = backend or make_backend(config.backend, queue_depth=config.io_queue_depth, direct=config.direct_io)
            self.index, self.identity = ix.open_index(
                self.data_dir,
                map_bytes=config.index_map_bytes,
                max_map_bytes=config.index_max_map_bytes,
                has_store_files=opening.has_store_files(self.data_dir, self.segment_dir, self.manifest_files, conversation_files),
            )
        except BaseException:
            os.close(self._lock_fd)  # releases the flock: the directory may be opened again
            raise
        self.files = SegmentFiles(self.segment_dir, self.backend)
        self.state = StoreState(self.index, "opened read-only (read_only = true)" if config.read_only else None)
        self.catalogue = Catalogue(self.index, self.state)
        self.holds = PrefixHolds()  # prefixes being read or written are never evicted or moved
        self.reads_in_flight = InFlight()  # disk reads the backend has and has not completed
        self.scores = ScoreTable()
        try:
            records, prefixes = opening.load_records(self.index, self.scores, self.data_dir)
            self.state.next_segment_id, self.last_scan = opening.startup_scan(
                self.files, self.manifest_files, self.state, (records, prefixes), data_dir=self.data_dir
            )
            self._build_parts(conversation_files, used_bytes=sum(rec["total_bytes"] for rec in records.values()))
            if not self.state.read_only:
                self.conversations.reconcile_files()
            self._build_remote(remote, remote_config or RemoteConfig())
        except BaseException:
            self.index.close()
            os.close(self._lock_fd)
            raise

    def _build_parts(self, conversation_files: ConversationFiles, *, used_bytes: int) -> None:
        """Each part gets the pieces it uses, nothing more."""
        config, state, catalogue, holds = self.config, self.state, self.catalogue, self.holds
        usage = DiskUsage(used_bytes)
        sink = SegmentSink(self.files, self.backend, state, store_id=self.identity.store_id, write_piece_bytes=config.write_piece_bytes)
        maintenance = threading.RLock()  # one eviction, compaction or merge at a time
        removal = Removal(catalogue, state, self.manifest_files, self.files, self.scores, usage)
        compactor = Compactor(
            catalogue,
            state,
            holds,
            self.scores,
            sink,
            self.manifest_files,
            usage,
            maintenance=maintenance,
            compact_live_fraction=config.compact_live_fraction,
        )
        self.merger = SegmentMerger(
            catalogue,
            state,
            holds,
            self.scores,
            sink,
            self.manifest_files,
            usage,
            maintenance=maintenance,
            min_segments=config.merge_min_segments,
            small_bytes=config.merge_small_segment_bytes,
            max_bytes=config.merge_max_bytes,
        )
        self.conversations = Conversations(
            self.index, conversation_files, catalogue, holds, state, removal, compactor, data_dir=self.data_dir
        )
        self.capacity = DiskCapacity(
            config,
            usage,
            catalogue,
            holds,
            self.scores,
            removal,
            compactor,
            self.merger,
            held_by_records=self.conversations.held,
            maintenance=maintenance,
        )
        self._removal = removal
        self._put_path = PutPath(sink, self.manifest_files, catalogue, usage, state)
        self._put_path.on_commit.append(self.merger.on_commit)  # small page batches count towards a merge
        self.writer = Writer(
            self._put_path,
            holds,
            self.capacity,
            max_prefix_tokens=config.max_prefix_tokens,
            min_free_bytes=config.min_free_bytes,
        )
        self.reader = Reader(
            catalogue,
            state,
            self.files,
            holds,
            in_flight=self.reads_in_flight,
            max_read_run_bytes=config.max_read_run_bytes,
        )
        self.scoring = Scoring(catalogue, self.scores, self.index)
        self.pages = PageStore(catalogue, self.writer, self.reader, self.scoring, holds, state, max_prefix_tokens=config.max_prefix_tokens)
        self._admin = Admin(catalogue, state, self.files, self.backend)

    def _build_remote(self, tier: RemoteTier | None, cfg: RemoteConfig) -> None:
        """The remote tier's parts: fills of local misses, write-back replication and the prefix directory."""
        self.remote_link = self.remote_fill = self.replicator = None
        if tier is None:
            return
        self.remote_link = link = RemoteLink(tier)
        self.remote_fill = RemoteFill(
            link, self.catalogue, self.writer, batch_bytes=cfg.remote_batch_bytes, ttl_s=cfg.remote_ttl_seconds, files=self.files
        )
        self.pages.remote = self.remote_fill
        self.replicator = Replicator(
            link,
            self.catalogue,
            self.reader,
            self.holds,
            self.scores,
            node_id=cfg.node_id or self.identity.store_id,
            directory=cfg.remote_directory,
            queue_prefixes=cfg.remote_queue_prefixes,
            batch_bytes=cfg.remote_batch_bytes,
            max_attempts=cfg.remote_max_attempts,
            ttl_s=cfg.remote_ttl_seconds,
        )
        self._put_path.on_commit.append(self.replicator.on_commit)
        self._removal.on_removed.append(self.replicator.on_removed)
        self.replicator.start(backfill=not self.state.read_only)

    def remote_stats(self) -> dict:
        """The remote tier's state and counters (``remote_link.COUNTERS``); empty without one."""
        if self.remote_link is None:
            return {}
        return {**self.remote_link.stats(), "pending_prefixes": self.replicator.pending, "remote_node_id": self.replicator.node_id}

    # ------------------------------------------------------------ lifecycle
    def close(self) -> None:
        if self.remote_fill is not None:
            self.remote_fill.close()
        if self.replicator is not None:
            self.replicator.stop()
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

    @property
    def read_only(self) -> str | None:
        """Why the store refuses writes, or None."""
        return self.state.read_only

    # ------------------------------------------------------------ prefixes
    def describe(self, prefix_id: str) -> PrefixView:
        """The stored prefix's manifest (geometry, tokens, chunks, segments)."""
        return self.catalogue.describe(prefix_id)

    def resolve(self, prefix: str) -> str:
        """Full prefix id from a unique leading part of it (at least 8 hex digits).

        With a remote tier, a full id this node does not hold is filled from
        there first (``RemoteFill.fill_prefix``), so every call that names a
        prefix serves it locally afterwards.
        """
        pid = self.catalogue.resolve(prefix)
        if self.needs_fill(pid):
            self.remote_fill.fill_prefix(pid)
        return pid

    def needs_fill(self, prefix_id: str) -> bool:
        """Whether ``resolve`` would fetch this prefix from the remote tier (a full id, not held here): the
        daemon then resolves it on a worker thread, not on its event loop (``server/remote.fill_first``)."""
        return self.remote_fill is not None and is_hash_hex(prefix_id) and not self._listed(prefix_id)

    def _listed(self, prefix_id: str) -> bool:
        try:
            self.catalogue.describe(prefix_id)
            return True
        except NotFound:
            return False

    def lookup(self, tokens, geometry: StoreGeometry, *, namespace: str = "", model_fingerprint: str = "") -> LookupResult:
        """Longest stored prefix of ``tokens``, at chunk granularity."""
        arr = validate_tokens(tokens, self.config.max_prefix_tokens)
        hashes = chunk_hashes(arr, geometry, namespace, model_fingerprint)
        k, holder = self.catalogue.match(hashes, provisional=True)
        if self.remote_fill is not None and k < len(hashes) and self.remote_fill.extend(hashes, k):
            k, holder = self.catalogue.match(hashes, provisional=True)  # the remote tier's leading chunks are here now
        tokens_matched = min(k * geometry.chunk_tokens, arr.size)
        return LookupResult(k, tokens_matched, len(hashes), holder.prefix_id if holder else "")

    def delete(self, prefix_id: str) -> list[int]:
        """Unlist the prefix, free segments no other prefix references (returned), then compact
        the segments it shared that are now mostly dead."""
        freed = self._removal.delete(prefix_id)
        self.capacity.compact()
        return freed

    # ------------------------------------------------------------ put (puts.py, pending_put.py)
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
        return self.writer.begin_put(tokens, geometry, namespace=namespace, model_fingerprint=model_fingerprint, reuse_chunks=reuse_chunks)

    def put(self, tokens, kv: np.ndarray, geometry: StoreGeometry, *, namespace: str = "", model_fingerprint: str = "") -> PutResult:
        """Store ``kv`` (``[layers, 2, kv_heads, tokens, head_dim]``) for ``tokens``."""
        return put_with_retries(
            lambda: self.begin_put(tokens, geometry, namespace=namespace, model_fingerprint=model_fingerprint),
            lambda pending: pending.put_kv(kv),
        )

    # ------------------------------------------------------------ read (reads.py)
    def read(self, prefix_id: str, chunks, groups=None, *, coalesce: bool = True, alloc=None) -> ReadResult:
        """Read the extents of ``chunks`` for period ``groups`` (default: all).

        ``alloc(nbytes) -> buffer`` may supply the (4 KiB aligned) destination.
        """
        return self.reader.read(prefix_id, chunks, groups, coalesce=coalesce, alloc=alloc)

    def read_summaries(self, prefix_id: str, layer_step: int = 1) -> np.ndarray:
        """Key summaries ``[chunks, layers, kv_heads, 2 (min|max), head_dim]`` float32, of layers ``0, layer_step, ...``."""
        return self.reader.read_summaries(prefix_id, layer_step)

    def read_probe_keys(self, prefix_id: str, group: int) -> np.ndarray:
        """Keys of the group's first layer: ``[kv_heads, tokens, head_dim]`` (``Reader.read_probe_keys``)."""
        return self.reader.read_probe_keys(prefix_id, group)

    def flush_scores(self) -> int:
        """Persist changed cache scores to the index (one transaction); entries written."""
        return self.scoring.flush()

    # ------------------------------------------------------------ admin (admin.py)
    def verify(self, prefix_id: str | None = None, *, progress=None) -> list[dict]:
        """Re-read every checksummed region (of one prefix, or of the store).

        ``progress(iterable, desc)`` wraps the loop over segments (a bar, see kvstore.progress).
        """
        return self._admin.verify(prefix_id, progress=progress)

    def list_prefixes(self) -> list[dict]:
        return self._admin.list_prefixes()

    def inspect(self, prefix_id: str) -> dict:
        return self._admin.inspect(prefix_id)

    def stats(self) -> dict:
        num_prefixes, num_segments, stored = self.catalogue.totals()
        st = os.statvfs(self.segment_dir)
        counters = self.state.counters_now()
        return {
            "data_dir": self.data_dir,
            "backend": self.backend.name,
            "num_prefixes": num_prefixes,
            "num_conversations": self.conversations.count(),
            "num_segments": num_segments,
            "bytes_stored": stored,
            "bytes_free": st.f_bavail * st.f_frsize,
            "index_map_bytes": self.index.map_bytes,
            "index_resizes": self.index.resizes,
            "read_only": self.state.read_only,
            "quarantined_segments": len(self.state.quarantined),
            "read_queue_depth": self.reads_in_flight.count,
            **self.capacity.stats(),
            **counters,
        }
