"""Write-back to the remote tier: every local put is copied there after the client has its answer.

Why write-back.  A put is acknowledged when its local copy is durable
(segment fdatasynced, index committed), exactly as without a remote tier:
its latency does not include a network round trip, and a put succeeds while
the cluster is down.  The remote copy follows on this one thread: the
prefix's extents are read back from the local tier (checksums verified),
written to the remote tier (absent keys only, acknowledged by ``WAIT``),
then its manifest and chunk index; only then does it count as replicated.
The cost is a window in which a prefix exists on one node only; it is
visible as ``pending`` (Stats, ``/metrics``, ``kvstore-admin remote``).

The queue holds prefix ids (bounded by ``remote_queue_prefixes``; a put
finding it full is counted failed).  At start it also walks every local
prefix once (``backfill``) when the queue is idle: a prefix whose remote
manifest exists costs one look-up, one that does not (written while the
cluster was down, or before a restart) is replicated.  While the link is
degraded the thread waits, then catches up.  A try that fewer replicas
acknowledged is retried with backoff, up to ``remote_max_attempts``.

The same thread keeps the prefix directory: the chunks of each local
prefix (put or filled) under this node's id, removed when the last local
prefix holding them is deleted or evicted.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass

import numpy as np

from ..contract.errors import KVStoreError, NotFound
from ..holds import PrefixHolds
from ..policy.remote import ttl_seconds
from ..records import PREFIX, PrefixView
from ..remote.base import NotReplicated, RemoteFull, RemoteUnavailable
from ..remote.records import RemoteManifest, encode_extent, encode_manifest, extent_key
from ..scores import ScoreTable
from .catalogue import Catalogue
from .reads import Reader
from .remote_link import RemoteLink

log = logging.getLogger("kvstore.remote")

BACKOFF_CAP_S = 5.0


@dataclass
class Job:
    kind: str  # "replicate" | "directory" (a filled prefix: only the directory) | "unlist" (a removed prefix)
    prefix_id: str
    view: PrefixView | None = None  # "unlist": the removed prefix


class Replicator:
    def __init__(
        self,
        link: RemoteLink,
        catalogue: Catalogue,
        reader: Reader,
        holds: PrefixHolds,
        scores: ScoreTable,
        *,
        node_id: str,
        directory: bool,
        queue_prefixes: int,
        batch_bytes: int,
        max_attempts: int,
        ttl_s: int,
    ):
        self._link = link
        self._catalogue = catalogue
        self._reader = reader
        self._holds = holds
        self._scores = scores
        self.node_id = node_id
        self._directory = directory
        self._max_queue = queue_prefixes
        self._batch_bytes = batch_bytes
        self._max_attempts = max_attempts
        self._ttl_s = ttl_s
        self._cond = threading.Condition()
        self._queue: collections.deque[Job] = collections.deque()
        self._backfill: list[str] = []
        self._busy = 0  # jobs taken off the queue and not finished
        self._stopping = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ life
    def start(self, *, backfill: bool = True) -> None:
        if backfill:
            self._backfill = [m["prefix_id"] for m in self._catalogue.manifests()]
        self._thread = threading.Thread(target=self._run, name="kvstore-replicator", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop after the job in hand (pending ones are found again by the next start's backfill)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._link.mark_healthy()  # wakes a thread waiting for the cluster
        if self._thread is not None:
            self._thread.join(timeout_s)

    # ------------------------------------------------------------ hooks
    def on_commit(self, pending) -> None:
        """``PutPath.on_commit``: a new local prefix (a client's put, or a fill from the remote tier)."""
        kind = "directory" if pending.origin == "remote" else "replicate"
        if kind == "directory" and (not self._directory or pending.kind != PREFIX):
            return
        self._enqueue(Job(kind, pending.prefix_id), counted=kind == "replicate")

    def on_removed(self, view: PrefixView) -> None:
        """``Removal.on_removed``: the prefix left the local tier; its chunks leave the directory unless still held."""
        if self._directory and view.kind == PREFIX:
            self._enqueue(Job("unlist", view.prefix_id, view), counted=False)

    def _enqueue(self, job: Job, *, counted: bool) -> None:
        with self._cond:
            if len(self._queue) >= self._max_queue:
                if counted:
                    self._link.count(failed_prefixes=1)
                    log.error(
                        "replication queue full (remote_queue_prefixes = %d): prefix %s not replicated", self._max_queue, job.prefix_id
                    )
                return
            self._queue.append(job)
            self._cond.notify()

    # ------------------------------------------------------------ figures
    @property
    def pending(self) -> int:
        """Prefixes not yet known to be on the remote tier: queued, in hand, and not yet walked by the backfill."""
        with self._cond:
            return sum(j.kind == "replicate" for j in self._queue) + self._busy + len(self._backfill)

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until nothing is pending (tests, benchmarks, a drain)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._busy or self._backfill:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    # ------------------------------------------------------------ the thread
    def _next(self) -> Job | None:
        with self._cond:
            while not self._stopping:
                if self._queue:
                    job = self._queue.popleft()
                elif self._backfill:
                    job = Job("replicate", self._backfill.pop(0))
                else:
                    self._cond.wait(0.5)
                    continue
                self._busy += 1
                return job
            return None

    def _done(self) -> None:
        with self._cond:
            self._busy -= 1
            self._cond.notify_all()

    def _run(self) -> None:
        while (job := self._next()) is not None:
            try:
                self._run_job(job)
            except Exception:  # one job's surprise must not stop replication
                log.exception("remote tier: job %s %s failed", job.kind, job.prefix_id)
                if job.kind == "replicate":
                    self._link.count(failed_prefixes=1)
            finally:
                self._done()

    def _run_job(self, job: Job) -> None:
        attempts, backoff = 0, 0.05
        while not self._stopping:
            if not self._link.usable:
                self._link.wait_usable(1.0)
                continue
            try:
                self._do(job)
                return
            except NotReplicated as exc:
                attempts += 1
                self._link.count(replication_retries=1)
                if attempts >= self._max_attempts:
                    log.error("prefix %s not replicated after %d tries: %s", job.prefix_id, attempts, exc)
                    self._link.count(failed_prefixes=1)
                    return
                time.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_CAP_S)
            except RemoteFull as exc:
                log.error("remote tier refused prefix %s for lack of memory: %s", job.prefix_id, exc)
                self._link.count(failed_prefixes=int(job.kind == "replicate"))
                return
            except RemoteUnavailable:
                continue  # the link is degraded now: wait for it, then try again
            except NotFound:
                return  # deleted or evicted before its turn: nothing to copy
            except KVStoreError as exc:  # the local copy went bad (DataLoss): it is not spread further
                log.error("prefix %s not replicated: %s", job.prefix_id, exc)
                self._link.count(failed_prefixes=int(job.kind == "replicate"))
                return

    def _do(self, job: Job) -> None:
        tier = self._link.tier
        if job.kind == "unlist":
            gone = [h for h in job.view.chunk_hashes if self._catalogue.holder(bytes.fromhex(h)) is None]
            if gone:
                self._link.call(tier.directory_remove, self.node_id, gone)
            return
        view = self._catalogue.describe(job.prefix_id)
        if job.kind == "replicate":
            if self._link.call(tier.get_manifest, view.prefix_id) is None:
                self._replicate(view)
            self._link.count(replicated_prefixes=1)
        if self._directory and view.kind == PREFIX:
            self._link.call(tier.directory_add, self.node_id, list(view.chunk_hashes))

    def _replicate(self, view: PrefixView) -> None:
        """Extents (acknowledged), then the manifest and chunk index (acknowledged)."""
        geo = view.geometry
        groups = list(range(geo.num_groups))
        per_chunk = sum(geo.extent_bytes(g, geo.chunk_tokens) for g in groups)
        step = max(1, self._batch_bytes // per_chunk)
        ttl = ttl_seconds(self._ttl_s, self._accesses(view))
        xxh3 = np.zeros((view.num_chunks, geo.num_groups), dtype=np.uint64)
        with self._holds.hold(view.prefix_id):
            for start in range(0, view.num_chunks, step):
                chunks = np.arange(start, min(start + step, view.num_chunks))
                res = self._reader.read_held(view.prefix_id, chunks, groups, coalesce=True, alloc=None)
                items = []
                for j in chunks.tolist():
                    for g in groups:
                        x, value = encode_extent(res.extent_bytes(g, j))
                        xxh3[j, g] = x
                        items.append((extent_key(view.chunk_hashes[j], g, x), value))
                out = self._link.call(self._link.tier.put_extents, items, ttl_s=ttl)
                self._link.count(
                    replicated_extents=out.written, replicated_bytes=out.written_bytes, replication_skipped_extents=out.present
                )
        manifest = RemoteManifest(
            prefix_id=view.prefix_id,
            namespace=view.namespace,
            model_fingerprint=view.model_fingerprint,
            geometry=geo,
            num_tokens=view.num_tokens,
            chunk_hashes=view.chunk_hashes,
            kind=view.kind,
            extent_xxh3=xxh3,
        )
        self._link.call(self._link.tier.put_manifest, view.prefix_id, encode_manifest(manifest), list(view.chunk_hashes), ttl_s=ttl)

    def _accesses(self, view: PrefixView) -> int:
        """Reads of the prefix's first chunk (every group), as the score table counts them: how much the TTL is stretched."""
        if not self._ttl_s:
            return 0
        try:
            units = self._catalogue.units(view.prefix_id, [0], None)
        except KVStoreError:
            return 0
        return sum(self._scores.get(u).frequency for u in units)
