"""Carrying out read plans: the one executor behind ``ReadChunks`` and ``Prefetch``.

``read_plan`` decides what to read; this module does it, for one call:

- disk reads on the service's thread pool, into buffers leased from the
  arena (or private memory on the bytes path without an arena);
- a speculative read never waits for buffer space and leaves half the
  reserve to the reads that are needed; without room it is dropped, and if
  a later Period needed part of it, that part is read again (``settle``);
- extents read from disk are offered to the memory tiers (the policy
  decides); tier hits are pinned; what a call hands out stays valid until
  the call gives it back (``retire`` for a Prefetch Period, ``finish``);
- descriptors (shared memory) or byte frames for a group's extents.

Who owns the leases differs by call: a Prefetch stream owns them itself and
names its own id in descriptors (the client releases nothing); a
``ReadChunks`` on shared memory leases in the client's session and names
each lease, which the client releases (``handover``).

Buffers that are held together are taken together (``admission``): a
read submitted under a ``Grant`` starts once the arena has admitted the
grant whole and carves its buffer from it.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from ..contract import pb
from .admission import Admissions, Grant
from .read_plan import InFlight
from .status import ArenaExhausted


@dataclass
class ReadCounts:
    """What one call read and served, by source; named as in PrefetchStats."""

    bytes_gpu: int = 0
    bytes_cpu: int = 0
    bytes_disk: int = 0
    bytes_useful: int = 0
    spec_bytes_used: int = 0
    spec_bytes_wasted: int = 0
    units_gpu: int = 0
    units_cpu: int = 0
    units_disk: int = 0
    units_admitted: int = 0
    spec_units_cancelled: int = 0
    num_reads: int = 0

    def hit(self, tier: str, nbytes: int) -> None:
        """An extent served from a memory tier (``gpu`` or ``cpu``)."""
        setattr(self, f"bytes_{tier}", getattr(self, f"bytes_{tier}") + nbytes)
        setattr(self, f"units_{tier}", getattr(self, f"units_{tier}") + 1)

    def add(self, other: ReadCounts) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict:
        return asdict(self)


def read_flag(msg, name: str, negated: str) -> bool:
    """A default-on read option: ``name`` when the client set it, else not the older ``negated`` spelling."""
    return getattr(msg, name) if msg.HasField(name) else not getattr(msg, negated)


class StreamFinished(Exception):
    """The call ended while work for it was under way (the work is dropped)."""


@dataclass(eq=False)
class ReadJob:
    """One disk read: ``chunks`` of one stored group."""

    read_id: int
    group: int
    chunks: np.ndarray
    speculative: bool
    period: int  # whose resources hold its buffer
    future: asyncio.Future | None = None
    started: bool = False
    cancelled: bool = False
    lease_id: int | None = None
    result: object = None  # ReadResult
    used: set = field(default_factory=set)
    grant: Grant | None = None  # the space its buffer is carved from

    def in_flight(self) -> InFlight:
        return InFlight(self.read_id, tuple(self.chunks.tolist()), self.started)


@dataclass
class Source:
    """Where one extent of a group comes from: a read, or a tier hit."""

    chunk: int
    unit: tuple | None
    job: ReadJob | None = None
    resident: object = None  # tiers.Resident of a hit


class ReadExecutor:
    def __init__(
        self,
        svc,
        prefix_id: str,
        geometry,
        *,
        arena,
        lease_owner: int,
        tiers,
        coalesce: bool,
        copies: bool,
        handover: bool = False,
        ref_id: int = 0,
    ):
        """``copies``: the extents leave as byte frames (a buffer may go once framed).

        ``handover``: descriptors name each read's own lease, which the
        client releases; otherwise they name ``ref_id`` and the executor
        gives every lease back itself.
        """
        self.svc = svc
        self.store = svc.store
        self.prefix_id = prefix_id
        self.geometry = geometry  # StoreGeometry of the prefix
        self.arena = arena
        self.owner = lease_owner
        self.tiers = tiers
        self.coalesce = coalesce
        self.copies = copies
        self.handover = handover
        self.ref_id = ref_id
        self.counts = ReadCounts()
        self.lock = threading.Lock()
        self.finished = False
        self.jobs: list[ReadJob] = []
        self._ids = itertools.count()
        self._leases: dict[int, list[int]] = {}  # period -> leases its extents live in
        self._pins: dict[int, list[tuple]] = {}  # period -> tier units pinned for it
        self.admission = Admissions(arena, lease_owner, geometry)

    # ------------------------------------------------------------ reads
    def submit(self, group: int, chunks, *, speculative: bool, period: int, after=(), grant: Grant | None = None) -> ReadJob:
        """Start one read; a speculative one queues behind ``after`` (futures of needed reads).

        ``grant``: the read carves its buffer from that admission and starts once it is granted.
        """
        job = ReadJob(next(self._ids), group, np.asarray(chunks, np.int64), speculative, period, grant=grant)
        if grant is not None and not speculative:
            after = (*after, grant.ready)
        job.future = asyncio.ensure_future(self._run_after(after, job) if after else self.svc.run(self._load, job))
        self.jobs.append(job)
        return job

    async def _run_after(self, after, job: ReadJob):
        await asyncio.gather(*after, return_exceptions=True)
        if job.grant is not None and not job.speculative:
            if job.grant.ready.cancelled():  # the call ended before its turn came
                job.cancelled = True
                return None
            job.grant.ready.result()  # not admitted: the read fails with the arena's refusal
        return await self.svc.run(self._load, job)

    def cancel(self, jobs: list[ReadJob]) -> None:
        """Drop reads that have not started (caller holds ``lock``, having planned on their state)."""
        for job in jobs:
            if not job.started and not job.cancelled:
                job.cancelled = True
                self.counts.spec_units_cancelled += int(job.chunks.size)

    def _load(self, job: ReadJob):
        """Thread: read one job's extents into a leased buffer."""
        with self.lock:
            if job.cancelled or self.finished:
                job.cancelled = True
                return None
            job.started = True
        holder = []
        alloc = None
        if self.arena is not None:
            wait = 0.0 if job.speculative else self.svc.config.lease_wait_seconds
            keep = self.arena.lease_bytes // 2 if job.speculative else 0

            def alloc(nbytes: int):
                lease = self.admission.carve(job.grant, nbytes) if job.grant is not None else None
                if lease is None:  # no admission (or not granted yet: a speculative read takes its chance)
                    lease = self.arena.lease(self.owner, nbytes, wait_seconds=wait, keep_free_bytes=keep)
                holder.append(lease)
                return self.arena.buffer(lease)

        try:
            res = self.store.read(self.prefix_id, job.chunks, [job.group], coalesce=self.coalesce, alloc=alloc)
        except ArenaExhausted:
            if not job.speculative:
                raise
            with self.lock:
                job.cancelled = True
                self.counts.spec_units_cancelled += int(job.chunks.size)
            return None
        except BaseException:
            if holder:
                self.arena.release(self.owner, [holder[0].lease_id])
            raise
        with self.lock:
            if holder:
                if self.finished:  # the call ended while the read ran
                    self.arena.release(self.owner, [holder[0].lease_id])
                    return None
                job.lease_id = holder[0].lease_id
                self._leases.setdefault(job.period, []).append(job.lease_id)
            job.result = res
            self.counts.bytes_disk += res.bytes_read
            self.counts.num_reads += res.num_reads
        return res

    async def settle(self, period: int, group: int, sources: list[Source], jobs: list[ReadJob]) -> float:
        """Wait for a group's reads; a needed part of a dropped speculative read is read now. Returns the wait."""
        t0 = time.perf_counter()
        for i, job in enumerate(jobs):
            await job.future
            if job.result is None and job.speculative and job.used and not self.finished:
                jobs[i] = redo = self.submit(group, sorted(job.used), speculative=False, period=period, grant=job.grant)
                for src in sources:
                    if src.job is job:
                        src.job = redo
                redo.used = job.used
                await redo.future
        return time.perf_counter() - t0

    # ------------------------------------------------------------ serving
    def serve(self, period: int, group: int, sources: list[Source], jobs: list[ReadJob], describe, pushed=None, *, record: bool = True):
        """Thread: a settled group's extents, disk reads offered to the tiers; returns ``describe(datas)``.

        Buffers that no descriptor points into go back once ``describe`` has
        run (frames are copies).  ``pushed``: the client computes on these
        (chunk -> data) already; their buffers stay until the period retires.
        """
        datas = []
        c = ReadCounts()
        staged: set[int] = set()  # jobs whose buffer still backs an extent handed out
        for s in sources:
            if s.resident is not None:
                data = pushed[s.chunk] if pushed is not None else self.extent(period, group, s)
                c.hit(s.resident.tier, s.resident.length)
            else:
                data = self.extent(period, group, s)
                if s.job.speculative:
                    c.spec_bytes_used += data.size
                c.units_disk += 1
                placed = self.tiers.admit(s.unit, data) if self.tiers is not None else None
                if placed is not None:
                    self.hold_pins(period, [s.unit])
                    c.units_admitted += 1
                if pushed is not None:
                    data = pushed[s.chunk]
                    staged.add(id(s.job))
                elif placed is not None and placed.tier == "cpu":
                    data = self.tiers.cpu_view(placed)
                else:
                    staged.add(id(s.job))
            c.bytes_useful += data.size
            datas.append(data)
        for job in jobs:
            if job.speculative and job.result is not None:
                c.spec_bytes_wasted += sum(job.result.extent_bytes(group, j).size for j in job.chunks.tolist() if j not in job.used)
        if record:
            self.store.scoring.record_access(self.prefix_id, np.asarray([s.chunk for s in sources], np.int64), [group])
        out = describe(datas)
        done = [] if self.handover else [job.lease_id for job in jobs if id(job) not in staged and job.lease_id is not None]
        with self.lock:
            self.counts.add(c)
            held = self._leases.get(period, [])
            if self.copies:  # framed bytes are copies: every buffer may go
                done = [job.lease_id for job in jobs if job.lease_id is not None]
            done = [i for i in done if i in held]  # descriptors still point into the others
            for i in done:
                held.remove(i)
        if done:
            self.arena.release(self.owner, done)
        return out

    def extent(self, period: int, group: int, s: Source) -> np.ndarray:
        """Thread: a source's bytes in host memory, wherever it lives: the CPU tier in place, a GPU-tier hit
        staged through a leased buffer (held for ``period``), a disk read's buffer."""
        res = s.resident
        if res is None:
            return s.job.result.extent_bytes(group, s.chunk)
        if res.tier == "gpu":
            data = self.stage(period, res.length)
            self.tiers.read_gpu(res, data)
            return data
        return self.tiers.cpu_view(res)

    def shm_group(self, group: int, sources: list[Source], datas: list[np.ndarray]) -> pb.ShmGroup:
        """Descriptors of a group's extents in the arena."""
        base = np.frombuffer(self.arena.view, np.uint8).ctypes.data
        refs = [
            pb.ShmRef(lease_id=s.job.lease_id if self.handover else self.ref_id, offset=d.ctypes.data - base, length=d.size)
            for s, d in zip(sources, datas)
        ]
        return pb.ShmGroup(group=group, chunks=[s.chunk for s in sources], refs=refs)

    def frames(self, group: int, sources: list[Source], datas: list[np.ndarray]) -> list[pb.ExtentData]:
        """A group's extents as bytes, cut into frames of ``frame_bytes``."""
        frame = self.svc.config.frame_bytes
        out = []
        for s, d in zip(sources, datas):
            mv = memoryview(d)
            for off in range(0, d.size, frame):
                out.append(pb.ExtentData(group=group, chunk=s.chunk, offset=off, extent_bytes=d.size, data=bytes(mv[off : off + frame])))
        return out

    # ------------------------------------------------------------ resources
    def stage(self, period: int, nbytes: int) -> np.ndarray:
        """A leased host buffer (a GPU hit is copied through it)."""
        lease = self.arena.lease(self.owner, nbytes, wait_seconds=self.svc.config.lease_wait_seconds)
        with self.lock:
            if not self.finished:
                self._leases.setdefault(period, []).append(lease.lease_id)
                return np.frombuffer(self.arena.buffer(lease), np.uint8)
        self.arena.release(self.owner, [lease.lease_id])
        raise StreamFinished()

    def hold_pins(self, period: int, units: list) -> None:
        """Tier pins the period holds; a call that already ended lets them go at once."""
        if not units:
            return
        with self.lock:
            if not self.finished:
                self._pins.setdefault(period, []).extend(units)
                return
        self.tiers.unpin(units)

    def retire(self, first: int, last: int) -> None:
        """Give back what periods ``first..last`` hold."""
        with self.lock:
            periods = {p for p in list(self._leases) + list(self._pins) if first <= p <= last}
            leases = [i for p in periods for i in self._leases.pop(p, [])]
            pins = [u for p in periods for u in self._pins.pop(p, [])]
        self.admission.close(first, last)
        self._give_back(leases, pins)

    def finish(self, *, handed_over: bool = False) -> None:
        """End of the call, however it ended: pins and buffers go back, unless handed to the client."""
        with self.lock:
            if self.finished:
                return
            self.finished = True
            for job in self.jobs:
                if not job.started:
                    job.cancelled = True
            leases = [] if handed_over else [i for held in self._leases.values() for i in held]
            pins = [u for held in self._pins.values() for u in held]
            self._leases, self._pins = {}, {}
        self.admission.close_all()
        self._give_back(leases, pins)

    def _give_back(self, leases, pins) -> None:
        if leases:
            self.arena.release(self.owner, leases)
        if pins and self.tiers is not None:
            self.tiers.unpin(pins)
