"""``CommitsBehind``: fills from the remote tier shown to reads while their local write runs behind the request.

Once ``RemoteFill`` has every extent of a fill fetched and checked, ``hand_off``
*shows* it (``Catalogue.show_provisional``: ``describe``, reads and the
daemon's look-ups see it; listings, eviction, compaction and puts that
reuse chunks see the index alone), serves its new segment from the image in
memory (``SegmentFiles.serve_from_memory``) and queues its commit on one
background thread.  The commit writes and fdatasyncs the segment (reads
switch to the file then), lists the prefix, and the fill stops being shown.

A fill is no client's put: the remote copy is the durable one, and nothing
is listed before it is durable.  A commit that fails (or that a concurrent
put of the same prefix beat) stops showing the fill and counts a
``fill_failures``; a read holding its view reads again as listed now
(``Reader.read_held``), and the next look-up fills it again.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from ..io import KeptBuffers
from ..segment_files import MemorySegment, SegmentFiles
from .catalogue import Catalogue
from .pending_put import PendingPut
from .remote_link import RemoteLink

log = logging.getLogger("kvstore.remote")

_KEPT_BYTES = 256 << 20  # image memory kept for later fills (a fresh buffer's pages cost more than zeroing a kept one)


class CommitsBehind:
    def __init__(self, catalogue: Catalogue, files: SegmentFiles, link: RemoteLink):
        self._catalogue = catalogue
        self._files: SegmentFiles | None = files  # None once closed: fills are committed before the request goes on
        self._link = link
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None  # one thread: commits in the order their fills were served
        self._queued = 0  # fills handed off and not yet committed (or given up)
        self.buffers = KeptBuffers(_KEPT_BYTES)  # images of committed fills, for the next fills

    @property
    def queued(self) -> int:
        return self._queued

    def hand_off(self, pending: PendingPut) -> bool:
        """Show the fill, serve its segment from memory and queue its commit; False: the caller commits it now."""
        with self._lock:
            files = self._files
            if files is None or pending.image is None or self._catalogue.is_stored(pending.prefix_id):
                return False
            view, segment = pending.provisional_view()
            seg_id = segment.segment_id
            memory = files.serve_from_memory(seg_id, pending.image.buffer)
            if not self._catalogue.show_provisional(view, segment):  # another fill of this prefix is being written
                files.stop_serving_from_memory(seg_id)
                return False
            pending.on_durable = lambda: files.stop_serving_from_memory(seg_id)  # the file holds every byte now
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="kvstore-fill-commit")
            self._queued += 1
            self._pool.submit(self._commit, pending, files, memory)
        return True

    def _commit(self, pending: PendingPut, files: SegmentFiles, memory: MemorySegment) -> None:
        try:
            pending.commit()
        except Exception as exc:  # noqa: BLE001 - the fill was served; not keeping it is the whole failure
            self._link.count(fill_failures=1)
            log.warning("a fill from the remote tier was served but not stored locally: %s", exc)
        finally:
            pending.abort()  # a no-op after the commit
            files.stop_serving_from_memory(pending.segment_id)
            self._catalogue.drop_provisional(pending.prefix_id)
            if files.released(memory):  # written, synced and no longer read: the next fill's image
                image, pending.image = pending.image, None
                self.buffers.give(image.buffer)
            with self._lock:
                self._queued -= 1

    def settle(self) -> None:
        """Wait until every fill handed off so far is committed (listed, or given up)."""
        with self._lock:
            pool = self._pool
        if pool is not None:
            pool.submit(lambda: None).result()  # one worker: every commit queued before it is done

    def close(self) -> None:
        """Wait for the queued commits; later fills are committed before their requests go on."""
        with self._lock:
            pool, self._pool = self._pool, None
            self._files = None
        if pool is not None:
            pool.shutdown(wait=True)
