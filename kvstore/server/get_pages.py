"""The ``GetPages`` call: pages from the memory tiers where resident, from disk otherwise, as frames or shared memory.

The pages of a call are held against eviction and compaction for the whole
stream, located once, and served batch by batch (the next batch loading
while this one is sent).  For each batch:

- the extents resident in a memory tier are pinned and counted as hits
  (``TierManager.pin_resident``, ``count``): what a Prefetch stream finds
  there, a GetPages finds too;
- the rest is read from disk (one read per holding batch and group) and
  offered to the tiers (``TierManager.admit``: the policy decides);
- the batch's extents go out as ``ExtentData`` frames, or, with a
  shared-memory session, in leases of that session (disk reads land there,
  hits are copied there) described by one ``ShmGroup`` message per group
  (``chunks`` are page indices); a lease holds extents of one group only,
  so the client gives back a message's leases once it has copied them;
- every pin is let go before the batch's messages leave (frames and leases
  are copies), so nothing a tier holds is handed to the client.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

import numpy as np

from ..contract import geometry_from_pb, geometry_to_pb, groups_for_layers, pb
from ..contract.errors import InvalidArgument
from ..store.pages import READ_BATCH_BYTES, PageLocation, not_stored
from .auth import namespaces_of

DIRECT_HOLDERS = 2  # a shared-memory read of one group's pages from this many batches or fewer lands in leases directly


@dataclass
class BatchOut:
    """What loading one batch produced: its messages and counts."""

    messages: list = field(default_factory=list)
    leases: list = field(default_factory=list)  # Lease objects of the session the messages hand over
    bytes_disk: int = 0
    bytes_useful: int = 0
    num_reads: int = 0
    bytes_tier: dict = field(default_factory=lambda: {"cpu": 0, "gpu": 0})
    hits: int = 0
    misses: int = 0


class PageBatches:
    """One GetPages call's pages, loaded batch by batch on the service's threads.

    Leases of a batch are the client's once the call completes; a call that
    ends otherwise gives back every lease it took (``finish``), also those of
    a load still running then.
    """

    def __init__(self, svc, locations: list[PageLocation], groups: list[int], session: int):
        self.svc = svc
        self.pages = svc.store.pages
        self.tiers = svc.tiers if svc.tiers is not None and svc.tiers.enabled else None
        self.arena = svc.arena
        self.locations = locations
        self.groups = groups
        geo = locations[0].view.geometry
        page_bytes = sum(geo.extent_bytes(g, geo.chunk_tokens) for g in groups)
        budget = READ_BATCH_BYTES
        self.session = session
        if session:
            reserve = self.arena.lease_bytes
            if page_bytes > reserve // 4:  # too large to lease beside the next batch's pages: frames instead
                self.session = 0
            else:
                budget = min(budget, reserve // 4)
        step = max(1, budget // page_bytes)
        self.batches = [range(i, min(i + step, len(locations))) for i in range(0, len(locations), step)]
        self._lock = threading.Lock()
        self._finished = False
        self._leases: list[int] = []  # every lease taken, until the call completes or gives them back

    def finish(self, *, completed: bool) -> None:
        """End of the call: the leases are the client's if it completed, else they go back now."""
        with self._lock:
            if self._finished:
                return
            self._finished = True
            leases, self._leases = ([] if completed else self._leases), []
        if leases:
            self.arena.release(self.session, leases)

    # ------------------------------------------------------------ one batch (a thread)
    def load(self, b: int) -> BatchOut | None:
        """Batch ``b``'s messages (None if the call ended meanwhile); tier pins are let go before it returns."""
        pages = self.batches[b]
        locs = [self.locations[i] for i in pages]
        out = BatchOut()
        units = self.pages.units(locs, self.groups) if self.tiers is not None else None
        pins: list = []
        try:
            hits = self.tiers.pin_resident([u[g] for u in units for g in self.groups]) if units else {}
            pins.extend(hits)
            datas = self._read_misses(locs, units, hits, out)  # (page in batch, group) -> bytes
            if hits:
                datas.update(self._residents(units, hits, out))
            for k in range(len(locs)):
                for g in self.groups:
                    unit = units[k][g] if units else None
                    if unit is not None and unit not in hits:
                        out.misses += 1
                        if self.tiers.admit(unit, datas[(k, g)]) is not None:
                            pins.append(unit)  # admitted pinned: let go below
            out.hits = len(hits)
            out.bytes_useful = sum(d.size for d in datas.values())
            self._messages(pages.start, len(locs), datas, out)
        except BaseException:
            self._give_back(out)
            raise
        finally:
            if pins:
                self.tiers.unpin(pins)
        if self.tiers is not None:
            self.tiers.count(out.hits, out.misses)
        with self._lock:
            if not self._finished:
                self._leases.extend(lease.lease_id for lease in out.leases)
                return out
        self._give_back(out)
        return None

    def _give_back(self, out: BatchOut) -> None:
        if out.leases:
            self.arena.release(self.session, [lease.lease_id for lease in out.leases])
            out.leases.clear()

    def _read_misses(self, locs, units, hits, out: BatchOut) -> dict:
        """The extents not resident, read from disk: (page in batch, group) -> bytes.

        On shared memory a group's extents go into leases: straight from the disk when they come from one or two
        batches, else through host memory into one lease (a lease takes whole arena slots, so one per read of a
        page or two would not fit the lease space)."""
        datas: dict = {}
        missing = {g: [k for k in range(len(locs)) if units is None or units[k][g] not in hits] for g in self.groups}
        if not self.session and all(len(ks) == len(locs) for ks in missing.values()):  # nothing resident: one read
            reads = [(list(range(len(locs))), self.groups)]
        else:  # a lease holds one group's extents, so the client can give it back with that group's message
            reads = [(ks, [g]) for g, ks in missing.items() if ks]
        for ks, groups in reads:
            sub = [locs[k] for k in ks]
            direct = self.session and len({loc.view.prefix_id for loc in sub}) <= DIRECT_HOLDERS
            res = self.pages.read(sub, groups, alloc=self._lease_alloc(out) if direct else None)
            out.bytes_disk += res.bytes_read
            out.num_reads += res.num_reads
            if self.session and not direct:
                (g,) = groups
                extents = [res.extent_bytes(g, n) for n in range(len(ks))]
                buf = np.frombuffer(self._lease_alloc(out)(sum(e.size for e in extents)), np.uint8)
                at = 0
                for k, e in zip(ks, extents):
                    datas[(k, g)] = buf[at : at + e.size]
                    datas[(k, g)][:] = e
                    at += e.size
                continue
            for g in groups:
                for n, k in enumerate(ks):
                    datas[(k, g)] = res.extent_bytes(g, n)
        return datas

    def _lease_alloc(self, out: BatchOut):
        """``alloc(nbytes)``: a buffer leased in the client's session, waiting up to ``lease_wait_seconds`` for room."""
        arena, session, wait = self.arena, self.session, self.svc.config.lease_wait_seconds

        def alloc(nbytes: int):
            lease = arena.lease(session, nbytes, wait_seconds=wait)
            out.leases.append(lease)
            return arena.buffer(lease)

        return alloc

    def _residents(self, units, hits: dict, out: BatchOut) -> dict:
        """The hits' bytes, (page in batch, group) -> bytes: the CPU tier's in place on the bytes path (frames
        copy them), else copied into one lease per group (shared memory) or host memory (a GPU hit)."""
        datas = {}
        for g in self.groups:
            found = [(k, hits[u[g]]) for k, u in enumerate(units) if u[g] in hits]
            if not found:
                continue
            if self.session:
                buf = np.frombuffer(self._lease_alloc(out)(sum(res.length for _, res in found)), np.uint8)
            at = 0
            for k, res in found:
                out.bytes_tier[res.tier] += res.length
                if res.tier == "cpu" and not self.session:
                    datas[(k, g)] = self.tiers.cpu_view(res)
                    continue
                dst = buf[at : at + res.length] if self.session else np.empty(res.length, np.uint8)
                at += res.length
                if res.tier == "cpu":
                    dst[:] = self.tiers.cpu_view(res)
                else:
                    self.tiers.read_gpu(res, dst)
                datas[(k, g)] = dst
        return datas

    def _messages(self, first_page: int, num_pages: int, datas: dict, out: BatchOut) -> None:
        if self.session:
            base = np.frombuffer(self.arena.view, np.uint8).ctypes.data
            for g in self.groups:
                refs = []
                for k in range(num_pages):
                    d = datas[(k, g)]
                    offset = d.ctypes.data - base
                    lease = next(lease for lease in out.leases if lease.offset <= offset < lease.offset + lease.nbytes)
                    refs.append(pb.ShmRef(lease_id=lease.lease_id, offset=offset, length=d.size))
                group = pb.ShmGroup(group=g, chunks=range(first_page, first_page + num_pages), refs=refs)
                out.messages.append(pb.GetPagesResponse(shm_group=group))
            return
        frame = self.svc.config.frame_bytes
        for k in range(num_pages):
            for g in self.groups:
                mv = memoryview(datas[(k, g)])
                n = len(mv)
                for off in range(0, n, frame):
                    e = pb.ExtentData(group=g, chunk=first_page + k, offset=off, extent_bytes=n, data=bytes(mv[off : off + frame]))
                    out.messages.append(pb.GetPagesResponse(extent=e))


def may_read(context, namespace: str) -> bool:
    """Whether the caller's token allows reading ``namespace`` (no token limits: every namespace)."""
    allowed = namespaces_of(context)
    return allowed is None or namespace in allowed


async def serve_get_pages(svc, request, context):
    """The GetPages call: an async generator of responses (errors raise)."""
    pages = svc.store.pages
    geo = geometry_from_pb(request.geometry)
    groups = groups_for_layers(geo, request.layer_start, request.layer_end)
    keys, ns, fp = list(request.keys), request.namespace, request.model_fingerprint
    if not may_read(context, ns):  # as if not stored: existence does not leak
        pages.hashes(keys, geo, ns, fp)
        raise not_stored(0)
    session = request.shm_session
    if session:
        if svc.sessions is None:
            raise InvalidArgument("shm_session", "this daemon has no shared-memory arena (shm_arena_bytes = 0)")
        svc.sessions.check(session)
    locations, hold = await svc.run_owned(
        pages.hold, keys, geo, namespace=ns, model_fingerprint=fp, on_abandon=lambda located: located[1].release()
    )
    context.add_done_callback(lambda _ctx: hold.release())  # not evicted nor moved while the stream lasts
    work = PageBatches(svc, locations, groups, session)
    completed = []
    # a cancelled call may never resume this generator: give back from the call's own completion too
    context.add_done_callback(lambda _ctx: work.finish(completed=bool(completed)))
    try:
        stats = pb.ReadStats()
        task = asyncio.ensure_future(svc.run(work.load, 0))
        for b in range(len(work.batches)):
            res = await task
            if res is None:  # the call ended meanwhile
                return
            if b + 1 < len(work.batches):  # the next batch loads while this one streams
                task = asyncio.ensure_future(svc.run(work.load, b + 1))
            stats.bytes_read += res.bytes_disk
            stats.bytes_useful += res.bytes_useful
            stats.num_reads += res.num_reads
            svc.metrics.add(read_bytes_cpu=res.bytes_tier["cpu"], read_bytes_gpu=res.bytes_tier["gpu"])
            msgs = res.messages
            if b == 0:
                msgs[0].header.CopyFrom(pb.PagesHeader(geometry=geometry_to_pb(geo), num_pages=len(keys), groups=groups))
            if b + 1 == len(work.batches):
                msgs[-1].stats.CopyFrom(stats)
            for msg in msgs:
                yield msg
        completed.append(True)
        pages.record_access(locations, groups)
    finally:
        work.finish(completed=bool(completed))
        hold.release()
