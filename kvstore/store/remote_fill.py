"""Local misses served from the remote tier: fetch, verify, write a local segment through the normal put path.

The read path does not change.  A look-up whose longest local match is
shorter than what the remote tier holds, a prefix id this node has never
seen (``ChunkStore.resolve``: ReadChunks, Prefetch, Describe, ...), or
pages it does not have (``PageStore.hold``: GetPages) first *fill* the local
tier: the remote manifest gives the chunk hashes and every extent's
checksum; each extent is fetched, checked (``records.decode_extent``) and
handed to a ``PendingPut`` opened by ``Writer.begin_fill`` (leading chunks
stored locally already are reused, the space is reserved under the local
capacity policy, which may evict); the commit makes it durable and listed
like any put.  Then the caller goes on exactly as for a local hit, so the
client sees the same API and the same bytes, and the next read is local.

The write runs behind the request (``fill_behind.CommitsBehind``): once
every extent is fetched and checked, the fill is shown to reads, served
from memory, and committed on a background thread, so a cross-node hit
costs the fetch, not the fetch plus a local write and fdatasync.

A prefix filled for a look-up is the leading part that matched: its id is
the chain hash of its last chunk (any chunk hash names the prefix ending
there), so a 3-chunk match in a 100-chunk remote prefix moves 3 chunks.

Misses and damage.  A value the engine evicted is a remote miss: a look-up
keeps the leading chunks it could fetch (or none), a read by id is
NOT_FOUND.  A value that fails its checks is never served: the look-up
stops before that chunk, a read by id is DATA_LOSS naming it.  While the
link is degraded nothing here touches the remote tier.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..contract.errors import DataLoss, KVStoreError, StoreFull
from ..contract.geometry import StoreGeometry
from ..policy.remote import ttl_seconds
from ..records import PAGES, PREFIX
from ..remote.base import RemoteUnavailable
from ..remote.records import EXTENT_HEAD, RemoteChecksumError, RemoteManifest, check_extent, decode_extent, decode_manifest, is_hash_hex
from ..segment_files import SegmentFiles
from .catalogue import Catalogue
from .fill_behind import CommitsBehind
from .pages import batch_id
from .pending_put import PendingPut
from .puts import Writer
from .remote_link import RemoteLink

log = logging.getLogger("kvstore.remote")

_ATTEMPTS = 3  # a look-up's fill shortened by evicted values at most this often
_OVERLAP_BATCHES = 4  # a fill's fetch is cut into at least this many batches, each fetched while the one before is checked
_FETCH_THREADS = 4  # fills whose next batch can be in flight at once
_PROBES = 8  # chunks whose holders one round trip of the longest-run search asks for (~0.12 ms a call + ~14 us a key)


@dataclass(frozen=True)
class _Stop:
    """Where a fetch stopped: the first chunk not fetched, and why (``missing`` or a checksum failure)."""

    chunk: int
    reason: str
    damaged: bool


class RemoteFill:
    def __init__(
        self,
        link: RemoteLink,
        catalogue: Catalogue,
        writer: Writer,
        *,
        batch_bytes: int,
        ttl_s: int,
        files: SegmentFiles | None = None,
    ):
        self._link = link
        self._catalogue = catalogue
        self._writer = writer
        self._batch_bytes = batch_bytes
        self._ttl_s = ttl_s
        self._behind = CommitsBehind(catalogue, files, link) if files is not None else None
        self._fetcher: ThreadPoolExecutor | None = None  # fetches of each fill's next batch
        self._fetcher_lock = threading.Lock()

    def settle(self) -> None:
        """Wait until every fill served so far is committed (listed, or given up)."""
        if self._behind is not None:
            self._behind.settle()

    def close(self) -> None:
        """Wait for the fills still being written behind their requests."""
        with self._fetcher_lock:
            fetcher, self._fetcher = self._fetcher, None
        if fetcher is not None:
            fetcher.shutdown(wait=True)
        if self._behind is not None:
            self._behind.close()

    # ------------------------------------------------------------ look-up
    def extend(self, hashes: list[bytes], local_chunks: int) -> bool:
        """Fill the leading chunks of ``hashes`` beyond ``local_chunks`` that the remote tier holds; whether any were."""
        if not self._link.usable or local_chunks >= len(hashes):
            return False
        names = [h.hex() for h in hashes]
        try:
            found = self._longest(names, local_chunks)
            if found is None:
                self._link.count(remote_misses=1)
                return False
            last, holder = found
            manifest = self._manifest(holder)
            if manifest is None or manifest.kind != PREFIX or last >= manifest.num_chunks or manifest.chunk_hashes[last] != names[last]:
                self._link.count(remote_misses=1)
                return False
            return self._fill(manifest, last + 1, shorter_ok=True) > local_chunks
        except RemoteUnavailable:
            return False  # degraded now: the local answer stands
        except KVStoreError as exc:  # the local tier cannot take it (full, read-only)
            self._link.count(fill_failures=1)
            log.warning("remote hit not filled locally: %s", exc)
            return False

    def _longest(self, names: list[str], lo: int) -> tuple[int, str] | None:
        """``(index of the last chunk, a manifest holding it)`` of the longest run the chunk index knows beyond ``lo``.

        A manifest holding chunk ``j`` holds every chunk before it, so the run
        ends where the chunk index stops naming holders.  The search probes up
        to ``_PROBES`` chunks spread over the open interval in one pipelined
        round trip and narrows to the gap between the last named and the first
        unnamed: 64 chunks take two round trips, 4,096 four.
        """
        hi, best = len(names), None
        while lo < hi:
            span = hi - lo
            at = list(range(lo, hi)) if span <= _PROBES else sorted({lo + (span * k) // _PROBES for k in range(1, _PROBES + 1)} - {hi})
            holders = self._link.call(self._link.tier.holders, [names[j] for j in at])
            for j, holder in zip(at, holders):
                if holder is None or not is_hash_hex(holder):
                    hi = j
                    break
                lo, best = j + 1, (j, holder)
        return best

    # ------------------------------------------------------------ by id
    def fill_prefix(self, prefix_id: str) -> bool:
        """Fill the prefix ``prefix_id`` (a manifest's id, or any chunk hash of one); False on a remote miss.

        DataLoss when the remote copy is damaged.
        """
        if not self._link.usable:
            return False
        try:
            manifest = self._manifest(prefix_id)
            upto = manifest.num_chunks if manifest is not None else 0
            if manifest is None:
                holder = self._link.call(self._link.tier.holders, [prefix_id])[0]
                manifest = self._manifest(holder) if holder and is_hash_hex(holder) else None
                if manifest is None or prefix_id not in manifest.chunk_hashes:
                    self._link.count(remote_misses=1)
                    return False
                upto = manifest.chunk_hashes.index(prefix_id) + 1
            if manifest.kind != PREFIX:
                return False
            return self._fill(manifest, upto, shorter_ok=False) == upto
        except RemoteUnavailable:
            return False

    # ------------------------------------------------------------ pages
    def present(self, hashes: list[bytes]) -> list[bool]:
        """Whether the chunk index names a holder of each page hash (nothing is fetched)."""
        if not self._link.usable or not hashes:
            return [False] * len(hashes)
        try:
            return [h is not None for h in self._link.call(self._link.tier.holders, [h.hex() for h in hashes])]
        except RemoteUnavailable:
            return [False] * len(hashes)

    def fill_pages(self, hashes: list[bytes], geometry: StoreGeometry, namespace: str, model_fingerprint: str) -> int:
        """Fill the pages ``hashes`` the remote tier has into one new local batch; how many were filled."""
        if not self._link.usable or not hashes:
            return 0
        try:
            return self._fill_pages(hashes, geometry, namespace, model_fingerprint)
        except RemoteUnavailable:
            return 0
        except KVStoreError as exc:
            self._link.count(fill_failures=1)
            log.warning("remote pages not filled locally: %s", exc)
            return 0

    def _fill_pages(self, hashes, geometry, namespace, model_fingerprint) -> int:
        names = [h.hex() for h in hashes]
        holders = self._link.call(self._link.tier.holders, names)
        manifests: dict[str, RemoteManifest | None] = {}
        for holder in {h for h in holders if h is not None and is_hash_hex(h)}:
            manifests[holder] = self._manifest(holder)
        located = []  # (page hash, its manifest, its chunk there)
        for h, name, holder in zip(hashes, names, holders):
            m = manifests.get(holder) if holder else None
            if m is not None and m.kind == PAGES and m.geometry == geometry and name in m.chunk_hashes:
                located.append((h, m, m.chunk_hashes.index(name)))
        groups = range(geometry.num_groups)
        keys = [m.extent_key(j, g) for _, m, j in located for g in groups]
        values = self._link.call(self._link.tier.get_extents, keys) if keys else []
        good, payloads = [], {}
        for i, (h, m, j) in enumerate(located):
            try:
                parts = []
                for g in groups:
                    value = values[i * geometry.num_groups + g]
                    if value is None:
                        raise LookupError
                    parts.append(decode_extent(value, length=m.extent_length(j, g), xxh3=int(m.extent_xxh3[j, g])))
            except LookupError:
                self._link.count(remote_misses=1)
                continue
            except RemoteChecksumError as exc:
                self._link.count(remote_checksum_failures=1)
                log.error("remote page %s is damaged and not served: %s", h.hex(), exc)
                continue
            payloads[len(good)] = parts
            good.append(h)
        if not good:
            return 0
        pending = self._writer.begin_chunks(
            batch_id(good), good, geometry, namespace=namespace, model_fingerprint=model_fingerprint, kind=PAGES
        )
        pending.origin = "remote"
        try:
            for j, parts in payloads.items():
                for g, payload in zip(groups, parts):
                    pending.put_extent(g, j, payload)
            pending.commit()
        finally:
            pending.abort()  # a no-op after the commit
        nbytes = sum(p.nbytes for parts in payloads.values() for p in parts)
        self._link.count(fill_pages=len(good), fill_bytes=nbytes)
        self._touch(keys)
        return len(good)

    # ------------------------------------------------------------ the fill
    def _manifest(self, manifest_id: str) -> RemoteManifest | None:
        blob = self._link.call(self._link.tier.get_manifest, manifest_id)
        if blob is None:
            return None
        try:
            return decode_manifest(blob, manifest_id)
        except RemoteChecksumError as exc:
            self._link.count(remote_checksum_failures=1)
            log.error("remote manifest is damaged and not used: %s", exc)
            return None

    def _fill(self, manifest: RemoteManifest, upto: int, *, shorter_ok: bool) -> int:
        """Store chunks ``[0, upto)`` of ``manifest`` locally as the prefix ending at chunk ``upto - 1``; the chunks now local.

        ``shorter_ok``: an evicted or damaged chunk shortens the fill to the
        chunks before it; otherwise it is a miss (0) or DataLoss.
        """
        self._settle_reused([bytes.fromhex(h) for h in manifest.chunk_hashes[:upto]])
        for _ in range(_ATTEMPTS):
            pending = self._begin(manifest, upto)
            handed_off = False
            try:
                stop, nbytes = self._fetch_into(pending, manifest)
                if stop is None:
                    handed_off = self._behind is not None and self._behind.hand_off(pending)
                    if not handed_off:
                        pending.commit()
                    self._link.count(fill_prefixes=1, fill_chunks=upto - pending.reused_chunks, fill_bytes=nbytes)
                    return upto
            finally:
                if not handed_off:
                    pending.abort()  # a no-op after the commit
            if stop.damaged and not shorter_ok:
                raise DataLoss(f"prefix {manifest.chunk_hashes[upto - 1]}: remote chunk {stop.chunk} {stop.reason}; not served")
            if not shorter_ok or stop.chunk <= pending.reused_chunks:
                return 0
            upto = stop.chunk
        return 0

    def _begin(self, manifest: RemoteManifest, upto: int) -> PendingPut:
        """``Writer.begin_fill`` of chunks ``[0, upto)``; when the store is full while fills are written behind,
        again once they are committed (their reservations become stored bytes the capacity policy can evict)."""

        def begin():
            return self._writer.begin_fill(
                manifest.chunk_hashes[upto - 1],
                [bytes.fromhex(h) for h in manifest.chunk_hashes[:upto]],
                manifest.tokens_upto(upto),
                manifest.geometry,
                namespace=manifest.namespace,
                model_fingerprint=manifest.model_fingerprint,
                buffers=self._behind.buffers if self._behind is not None else None,
            )

        try:
            return begin()
        except StoreFull:
            if self._behind is None or not self._behind.queued:
                raise
        self.settle()
        return begin()

    def _settle_reused(self, hashes: list[bytes]) -> None:
        """A fill reuses only listed chunks: when some of ``hashes`` are a shown fill's, wait for the commits behind."""
        if self._catalogue.match(hashes)[0] < self._catalogue.match(hashes, provisional=True)[0]:
            self.settle()

    def _fetch_into(self, pending: PendingPut, manifest: RemoteManifest) -> tuple[_Stop | None, int]:
        """Fetch and check every needed extent into ``pending``, in batches; where it stopped (None: all), and the bytes.

        Each batch is received in place, into its extents of the segment image (``get_extents_into``:
        no copy), the next one (on the fetch pool) while this one is checked; each checked batch's
        summaries and probe keys are derived on the pool too (numpy lets go of the interpreter lock
        for them): batches of at most ``remote_batch_bytes``, and at least ``_OVERLAP_BATCHES`` of
        them for a fill that large.
        """
        geo = manifest.geometry
        groups = range(geo.num_groups)
        per_chunk = sum(geo.extent_bytes(g, geo.chunk_tokens) for g in groups)
        needed = list(pending.needed_chunks)
        step = max(1, min(self._batch_bytes // per_chunk, -(-len(needed) // _OVERLAP_BATCHES)))
        batches = [needed[i : i + step] for i in range(0, len(needed), step)]

        def keys_of(chunks):
            return [manifest.extent_key(j, g) for j in chunks for g in groups]

        def fetch(chunks):  # received in place: each payload straight into its extent of the image
            views = [pending.extent_views(g, chunks) for g in groups]
            outs = [views[g][i] for i in range(len(chunks)) for g in groups]
            return self._link.call(self._link.tier.get_extents_into, keys_of(chunks), outs, EXTENT_HEAD), outs

        def derive(copied):
            for g, chunks in enumerate(copied):
                pending.derive_extents(g, chunks)

        nbytes = 0
        derived = []  # each batch's summaries and probe keys, derived on the pool while the next batch is copied
        ahead = self._fetch_pool().submit(fetch, batches[0]) if batches else None
        try:
            for k, chunks in enumerate(batches):
                (heads, outs), ahead = ahead.result(), None
                if k + 1 < len(batches):
                    ahead = self._fetch_pool().submit(fetch, batches[k + 1])
                for i, j in enumerate(chunks):
                    for g in groups:
                        head = heads[i * geo.num_groups + g]
                        if head is None:
                            self._link.count(remote_misses=1)
                            return _Stop(j, "is not stored (evicted)", False), nbytes
                        length, xxh3 = manifest.extent_length(j, g), int(manifest.extent_xxh3[j, g])
                        try:  # whatever the view holds now is what is served: it is what the checksum covers
                            if len(head) == EXTENT_HEAD:
                                check_extent(head, outs[i * geo.num_groups + g], length=length, xxh3=xxh3)
                            else:  # a value of another length came back whole: this refuses it
                                decode_extent(head, length=length, xxh3=xxh3)
                        except RemoteChecksumError as exc:
                            self._link.count(remote_checksum_failures=1)
                            log.error("remote chunk %d group %d of prefix %s is damaged and not served: %s", j, g, manifest.prefix_id, exc)
                            return _Stop(j, f"failed its checksum ({exc})", True), nbytes
                received = [pending.received_in_place(g, chunks) for g in groups]
                derived.append(self._fetch_pool().submit(derive, received))
                nbytes += sum(o.nbytes for o in outs)
                self._touch(keys_of(chunks))
            for job in derived:
                job.result()
            image = pending.image
            if image is not None:  # every extent was checked against these: the record need not hash them again
                chunks = range(image.first_chunk, image.first_chunk + image.layout.num_chunks)
                pending.extent_xxh3 = [[int(manifest.extent_xxh3[j, g]) for j in chunks] for g in groups]
            return None, nbytes
        finally:
            if ahead is not None and not ahead.cancel():  # stopped early: the fetch already running ends unused
                ahead.exception()
            for job in derived:  # nothing writes into the image once this returns (a stopped fill is aborted)
                job.exception()

    def _fetch_pool(self) -> ThreadPoolExecutor:
        with self._fetcher_lock:
            if self._fetcher is None:
                self._fetcher = ThreadPoolExecutor(_FETCH_THREADS, thread_name_prefix="kvstore-fill-fetch")
            return self._fetcher

    def _touch(self, keys: list[str]) -> None:
        """A remote hit keeps its values longer (``remote_ttl_seconds``)."""
        if self._ttl_s:
            try:
                self._link.call(self._link.tier.touch, keys, ttl_seconds(self._ttl_s, 1))
            except RemoteUnavailable:
                pass
