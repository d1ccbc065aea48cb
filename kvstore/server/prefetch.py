"""The Prefetch stream: one per Re-Prefill request (see DESIGN.md).

The client sends each Period's chunk set in order.  For period ``p`` with
set ``C`` the engine

- pins the extents of ``C`` already in a memory tier (hits),
- reads the rest from disk, one coalesced read per stored group (the
  SubPeriod), so the first group is ready before the last,
- sends every group as soon as all its extents are in memory (intra-period),
- and, unless told not to, reads ``C`` for period ``p + 1``'s groups
  (inter-period speculation) once the period's needed reads are done; a
  client that opened with ``hints`` names its own guess for ``p + 1``
  instead (a PeriodHint).

When ``p + 1``'s real set arrives, speculative reads that have not started
and are not wholly needed are cancelled, the needed part of started ones is
used, and only the difference is read.  With ``push_speculation`` (shared
memory), a speculative group wholly in memory is described to the client
before it asks; a group whose real set lies within the push is computed on
at once (``covered_groups``) and costs no round trip.  Extents read from disk are offered
to the tiers (the cache policy decides); what the policy keeps out is served
from the stream's own buffers.  Everything a stream hands out (tier pins,
buffers) stays valid until the stream ends, then goes back; buffers a read
is still filling go back when the read finishes, never earlier.

Why one file of ~700 lines: ``PrefetchStream`` still plans (hits, cancels,
reuse of speculative reads, pushes) while it executes them, so the plan and
its lease and message handling cannot be separated without the split into a
pure read planner and one executor shared with ``ReadChunks``; that split is
the next change to this module, not a reshuffle of the same class.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .._proto import kvstore_pb2 as pb
from ..errors import DataLoss, InvalidArgument
from ..reader import validate_chunks
from ..wire import geometry_to_pb
from .arena import new_owner
from .status import ArenaExhausted, Backpressure

log = logging.getLogger(__name__)

_END = object()


@dataclass
class _Job:
    """One disk read: ``chunks`` of one stored group."""

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


@dataclass
class _Source:
    chunk: int
    unit: tuple
    job: _Job | None = None  # None: a tier hit
    resident: object = None  # tiers.Resident of a hit


class StreamFinished(Exception):
    """The stream ended while work for it was under way (the work is dropped)."""


@dataclass
class _Push:
    """A speculative group described to the client: chunk -> (source, data)."""

    period: int
    extents: dict


class PrefetchStream:
    def __init__(self, svc, open_msg: pb.PrefetchOpen):
        self.svc = svc
        self.store = svc.store
        self.tiers = svc.tiers
        self.arena = svc.arena
        self.id = new_owner()  # named in descriptors; grants nothing
        self.owner = new_owner()  # owns the stream's arena leases; never leaves the daemon
        self.prefix_id = self.store.resolve(open_msg.prefix_id)
        view = self.store.describe(self.prefix_id)
        q = self.store.prefix_quarantine(view)
        if q:
            raise DataLoss(f"prefix {self.prefix_id} is quarantined ({q}); delete and store it again")
        self.view = view
        geo = self.geometry = view.geometry
        pl = open_msg.period_layers or geo.model.num_layers
        if pl % geo.period_layers:
            raise InvalidArgument(
                "open.period_layers", f"must be a positive multiple of the stored group ({geo.period_layers} layers), got {pl}"
            )
        self.groups_per_period = pl // geo.period_layers
        self.num_periods = -(-geo.num_groups // self.groups_per_period)
        self.session = open_msg.shm_session
        if self.session:
            if svc.sessions is None:
                raise InvalidArgument("open.shm_session", "this daemon has no shared-memory arena (shm_arena_bytes = 0)")
            svc.sessions.check(self.session)
        self.speculate = not open_msg.no_speculation
        self.coalesce = not open_msg.no_coalesce
        self.hinted = open_msg.hints
        self.push = open_msg.push_speculation
        if self.push and not self.session:
            raise InvalidArgument("open.push_speculation", "needs a shared-memory session (open.shm_session)")
        self.next_period = 0
        self.delivered = -1  # last period whose groups were all sent
        self.stats = pb.PrefetchStats()
        self._lock = threading.Lock()
        self._finished = False
        # What a period's descriptors point at (buffers, tier pins) stays
        # valid until the period is delivered AND the client has sent the next
        # period's set (it computed on them before it could choose that set),
        # or the stream ends; then it goes back.
        self._leases: dict[int, list[int]] = {}
        self._pins: dict[int, list[tuple]] = {}
        self._retired = -1
        self._spec: dict[int, list[_Job]] = {}  # group -> speculative reads
        self._spec_hits: dict[int, dict[int, tuple]] = {}  # group -> chunk -> (unit, Resident) pinned for a push
        self._pushed: dict[int, _Push] = {}  # group -> what the client was sent
        self._hints: set[int] = set()  # periods hinted
        self._jobs: list[_Job] = []
        self._tasks: list[asyncio.Future] = []  # pushes in flight
        self._hold = self.store.holds.hold(self.prefix_id)  # not evicted nor moved while the stream lasts
        self._needed: list[_Job] = []  # the latest period's needed reads
        self.out: asyncio.Queue | None = None  # set by serve_prefetch
        reserve = self.arena.lease_bytes if self.arena is not None else 1 << 62
        self._max_job_bytes = max(1, reserve // 4)  # one read never takes more than a quarter of the reserve

    # ------------------------------------------------------------ messages
    def header(self) -> pb.PrefetchResponse:
        return pb.PrefetchResponse(
            header=pb.PrefetchHeader(
                geometry=geometry_to_pb(self.geometry),
                num_tokens=self.view.num_tokens,
                num_chunks=self.view.num_chunks,
                num_periods=self.num_periods,
                groups_per_period=self.groups_per_period,
                lease_id=self.id,
                cache_policy=self.tiers.policy_name if self.tiers is not None else "",
            )
        )

    def period_groups(self, period: int) -> list[int]:
        first = period * self.groups_per_period
        return list(range(first, min(first + self.groups_per_period, self.geometry.num_groups)))

    # ------------------------------------------------------------ planning
    def check_period(self, msg: pb.PeriodSet, max_ahead: int) -> np.ndarray:
        p = msg.period
        if p >= self.num_periods:
            raise InvalidArgument("period.period", f"period {p} out of range [0, {self.num_periods})")
        if p < self.next_period:
            raise InvalidArgument("period.period", f"period {p} already passed; the next is {self.next_period}")
        if p > self.next_period:
            raise InvalidArgument("period.period", f"periods are sent in order: expected {self.next_period}, got {p}")
        if p - self.delivered > max_ahead:
            raise Backpressure(
                f"period.period: period {p} is {p - self.delivered} ahead of the last delivered one "
                f"({self.delivered}); at most {max_ahead} may be outstanding"
            )
        try:
            chunks = validate_chunks(list(msg.chunks), self.view.num_chunks)
        except InvalidArgument as exc:
            raise InvalidArgument("period.chunks", str(exc).split(": ", 1)[1]) from None
        self._check_covered(p, chunks, list(msg.covered_groups))
        self.next_period = p + 1
        self.retire()
        return chunks

    def _check_covered(self, period: int, chunks: np.ndarray, covered: list[int]) -> None:
        groups = self.period_groups(period)
        wanted = set(chunks.tolist())
        if len(set(covered)) != len(covered):
            raise InvalidArgument("period.covered_groups", f"repeated group in {covered}")
        for g in covered:
            if g not in groups:
                raise InvalidArgument("period.covered_groups", f"group {g} is not one of period {period}'s ({groups})")
            push = self._pushed.get(g)
            if push is None or push.period != period:
                raise InvalidArgument("period.covered_groups", f"group {g} was not pushed")
            extra = sorted(wanted - set(push.extents))
            if extra:
                raise InvalidArgument("period.covered_groups", f"group {g}: chunks {extra[:8]} were not pushed")

    def check_hint(self, msg: pb.PeriodHint) -> np.ndarray:
        if not self.hinted:
            raise InvalidArgument("hint", "the stream was not opened with open.hints")
        p = msg.period
        if p != self.next_period or p >= self.num_periods:
            raise InvalidArgument("hint.period", f"a hint is for the next period not yet sent ({self.next_period}), got {p}")
        if p in self._hints:
            raise InvalidArgument("hint.period", f"period {p} was already hinted")
        try:
            chunks = validate_chunks(list(msg.chunks), self.view.num_chunks)
        except InvalidArgument as exc:
            raise InvalidArgument("hint.chunks", str(exc).split(": ", 1)[1]) from None
        self._hints.add(p)
        return chunks

    def plan(self, period: int, chunks: np.ndarray, covered=()) -> list[tuple]:
        """Sources of every extent of the period; starts the reads it needs.

        Items: ``(group, sources, jobs, pushed)``; ``pushed`` (chunk -> data)
        for a group the client computes on from a push, else None.
        """
        out = []
        wanted = set(chunks.tolist())
        for g in self.period_groups(period):
            units = self.store.units(self.prefix_id, chunks, [g])
            self._spec_hits.pop(g, None)  # its pins stay with the period
            if g in covered:
                out.append(self._plan_covered(period, g, chunks, units))
                continue
            self._pushed.pop(g, None)
            hits = self.tiers.pin_resident(units) if self.tiers is not None else {}
            self._hold_pins(period, list(hits))
            specs = []
            for spec in self._spec.pop(g, []):
                with self._lock:
                    if not spec.started and not wanted.issuperset(spec.chunks.tolist()):
                        spec.cancelled = True  # nothing read yet: drop it, read only what is needed
                        self.stats.spec_units_cancelled += int(spec.chunks.size)
                if not spec.cancelled:
                    specs.append(spec)
            from_spec = {j: spec for spec in specs for j in spec.chunks.tolist() if j in wanted}
            jobs = list(specs)
            sources, missing = [], []
            for j, u in zip(chunks.tolist(), units):
                if u in hits:
                    sources.append(_Source(j, u, resident=hits[u]))
                elif j in from_spec:
                    sources.append(_Source(j, u, job=from_spec[j]))
                else:
                    missing.append(j)
                    sources.append(_Source(j, u))
            for spec in specs:
                spec.used = {s.chunk for s in sources if s.job is spec}
            if missing:
                self._check_fits(period, g, len(missing))
                by_chunk = {}
                for part in self._split(g, missing):
                    job = self._submit(g, part, speculative=False, period=period)
                    jobs.append(job)
                    by_chunk.update(dict.fromkeys(part.tolist(), job))
                for s in sources:
                    if s.job is None and s.resident is None:
                        s.job = by_chunk[s.chunk]
            out.append((g, sources, jobs, None))
        if self.tiers is not None:
            hits = sum(1 for _, sources, _, _ in out for s in sources if s.resident is not None)
            self.tiers.count(hits, sum(len(sources) for _, sources, _, _ in out) - hits)
        self._needed = [job for _, _, jobs, _ in out for job in jobs if not job.speculative]
        if self.speculate and not self.hinted and period + 1 < self.num_periods:
            self.speculate_period(period + 1, chunks)
        return out

    def _plan_covered(self, period: int, g: int, chunks: np.ndarray, units) -> tuple:
        """A group the client already computes on from its push: the push's sources, nothing to read."""
        push = self._pushed.pop(g)
        sources = [push.extents[j][0] for j in chunks.tolist()]
        hits = [s.unit for s in sources if s.resident is not None]
        if hits and self.tiers is not None:
            self._hold_pins(period, list(self.tiers.pin_resident(hits)))  # the access (touch), pinned like any hit
        jobs = self._spec.pop(g, [])
        for job in jobs:
            job.used = {s.chunk for s in sources if s.job is job}
        self.stats.groups_covered += 1
        return g, sources, jobs, {j: push.extents[j][1] for j in chunks.tolist()}

    def speculate_period(self, period: int, chunks: np.ndarray) -> None:
        """Read ``chunks`` for ``period``'s groups ahead of its real set, after the needed reads in flight."""
        wanted = set(chunks.tolist())
        after = [job.future for job in self._needed if not job.future.done()]
        for g in self.period_groups(period):
            kept = []
            for spec in self._spec.pop(g, []):
                with self._lock:
                    if not spec.started and not wanted.issuperset(spec.chunks.tolist()):
                        spec.cancelled = True
                        self.stats.spec_units_cancelled += int(spec.chunks.size)
                if not spec.cancelled:
                    kept.append(spec)
            have = {j for spec in kept for j in spec.chunks.tolist()}
            units = self.store.units(self.prefix_id, chunks, [g])
            hits = {}
            if self.push and self.tiers is not None:
                held = self._spec_hits.setdefault(g, {})
                todo = [u for j, u in zip(chunks.tolist(), units) if j not in held and j not in have]
                hits = self.tiers.pin_resident(todo, touch=False)  # held for the push, not an access
                self._hold_pins(period, list(hits))
                for j, u in zip(chunks.tolist(), units):
                    if u in hits:
                        held[j] = (u, hits[u])
            held = self._spec_hits.get(g, {})
            cold = [
                j
                for j, u in zip(chunks.tolist(), units)
                if j not in have and j not in held and (self.tiers is None or self.tiers.where(u) is None)
            ]
            kept += [self._submit(g, part, speculative=True, period=period, after=after) for part in self._split(g, cold)]
            if kept:
                self._spec[g] = kept
        if self.push:
            self._tasks.append(asyncio.ensure_future(self._push_period(period, wanted)))

    def _extent_bytes(self, group: int) -> int:
        geo = self.geometry
        return -(-geo.extent_bytes(group, geo.chunk_tokens) // 4096) * 4096

    def _check_fits(self, period: int, group: int, num_missing: int) -> None:
        """A group is sent whole, so its disk reads share the reserve at once: one that can never fit fails now."""
        if self.arena is None:
            return
        need = num_missing * self._extent_bytes(group)
        if need > self.arena.lease_bytes:
            cfg = self.svc.config
            raise ArenaExhausted(
                f"period.chunks: period {period} group {group} needs {need} bytes of stream buffers at once "
                f"({num_missing} extents read from disk), more than the whole prefetch reserve ({self.arena.lease_bytes} bytes: "
                f"prefetch_reserve_fraction {cfg.prefetch_reserve_fraction} of shm_arena_bytes {cfg.shm_arena_bytes}); "
                "send fewer chunks or raise shm_arena_bytes"
            )

    def _split(self, group: int, chunks: list[int]) -> list[np.ndarray]:
        per = max(1, self._max_job_bytes // self._extent_bytes(group))
        return [np.asarray(chunks[i : i + per], np.int64) for i in range(0, len(chunks), per)]

    def _submit(self, group: int, chunks: np.ndarray, *, speculative: bool, period: int, after=()) -> _Job:
        job = _Job(group, chunks, speculative, period)
        job.future = asyncio.ensure_future(self._run_after(after, job) if after else self.svc.run(self._load, job))
        self._jobs.append(job)
        return job

    async def _run_after(self, after, job: _Job):
        """A speculative read queues behind the needed reads in flight (it may be cancelled meanwhile)."""
        await asyncio.gather(*after, return_exceptions=True)
        return await self.svc.run(self._load, job)

    # ------------------------------------------------------------ push
    async def _push_period(self, period: int, wanted: set) -> None:
        """Describe each speculative group of ``period`` to the client once it is wholly in memory."""
        try:
            await self._push_groups(period, wanted)
        except StreamFinished:
            pass

    async def _push_groups(self, period: int, wanted: set) -> None:
        for g in self.period_groups(period):
            jobs = list(self._spec.get(g, []))
            await asyncio.gather(*(job.future for job in jobs), return_exceptions=True)
            if self._finished or period < self.next_period:
                return  # the real set came first: the normal path serves it
            if g in self._pushed or any(job.result is None for job in jobs):
                continue  # a read was dropped or cancelled: no push for this group
            sources = []
            for j, (u, res) in self._spec_hits.get(g, {}).items():
                if j in wanted:
                    sources.append(_Source(j, u, resident=res))
            have = {s.chunk for s in sources}
            units = dict(zip(sorted(wanted), self.store.units(self.prefix_id, np.asarray(sorted(wanted), np.int64), [g])))
            for job in jobs:
                for j in job.chunks.tolist():
                    if j in wanted and j not in have:
                        sources.append(_Source(j, units[j], job=job))
                        have.add(j)
            if have != wanted:
                continue  # not all of the guess is in memory (the tiers changed under it)
            sources.sort(key=lambda s: s.chunk)
            msg, datas = await self.svc.deliver(self._push_message, period, g, sources)
            if self._finished or period < self.next_period:
                return
            self._pushed[g] = _Push(period, {s.chunk: (s, d) for s, d in zip(sources, datas)})
            self.stats.groups_pushed += 1
            await self.out.put([msg])

    def _push_message(self, period: int, group: int, sources: list[_Source]):
        """Thread: the descriptors of a speculative group (GPU hits staged in host memory)."""
        datas = []
        for s in sources:
            if s.resident is not None:
                if s.resident.tier == "gpu":
                    data = self._stage(period, s.resident.length)
                    self.tiers.read_gpu(s.resident, data)
                else:
                    data = self.tiers.cpu_view(s.resident)
            else:
                data = s.job.result.extent_bytes(group, s.chunk)
            datas.append(data)
        (msg,) = self._describe(period, group, [s.chunk for s in sources], datas)
        return pb.PrefetchResponse(speculative=msg.group, period=period), datas

    def _load(self, job: _Job):
        """Thread: read one job's extents into a buffer leased to this stream."""
        with self._lock:
            if job.cancelled or self._finished:
                job.cancelled = True
                return None
            job.started = True
        holder = []
        alloc = None
        if self.arena is not None:
            # A speculative read never waits for buffer space (waiting reads
            # could hold the reserve hostage); without room it is dropped.
            # It also leaves half the reserve free for the reads that are needed.
            wait = 0.0 if job.speculative else self.svc.config.lease_wait_seconds
            keep = self.arena.lease_bytes // 2 if job.speculative else 0

            def alloc(nbytes: int):
                lease = self.arena.lease(self.owner, nbytes, wait_seconds=wait, keep_free_bytes=keep)
                holder.append(lease)
                return self.arena.buffer(lease)

        try:
            res = self.store.read(self.prefix_id, job.chunks, [job.group], coalesce=self.coalesce, alloc=alloc)
        except ArenaExhausted:
            if not job.speculative:
                raise
            with self._lock:
                job.cancelled = True
                self.stats.spec_units_cancelled += int(job.chunks.size)
            return None
        except BaseException:
            if holder:
                self.arena.release(self.owner, [holder[0].lease_id])
            raise
        with self._lock:
            if holder:
                if self._finished:  # the stream ended while the read ran
                    self.arena.release(self.owner, [holder[0].lease_id])
                    return None
                job.lease_id = holder[0].lease_id
                self._leases.setdefault(job.period, []).append(job.lease_id)
            job.result = res
            self.stats.bytes_disk += res.bytes_read
            self.stats.num_reads += res.num_reads
        return res

    # ------------------------------------------------------------ delivery
    async def deliver(self, period: int, plan) -> list[pb.PrefetchResponse]:
        """Messages of the period's groups, each list ready as soon as its group is."""
        for g, sources, jobs, pushed in plan:
            if pushed is not None:  # the client has it already: account only
                await self.svc.deliver(self._group_messages, period, g, sources, jobs, pushed)
                continue
            t0 = time.perf_counter()
            for i, job in enumerate(jobs):
                await job.future
                if job.result is None and job.speculative and job.used and not self._finished:
                    # dropped for want of buffer space: read what it held now
                    jobs[i] = redo = self._submit(g, np.asarray(sorted(job.used), np.int64), speculative=False, period=period)
                    for src in sources:
                        if src.job is job:
                            src.job = redo
                    redo.used = job.used
                    await redo.future
            self.stats.daemon_wait_s += time.perf_counter() - t0
            msgs = await self.svc.deliver(self._group_messages, period, g, sources, jobs)
            yield msgs
        self.delivered = period
        self.retire()

    def _group_messages(self, period: int, group: int, sources: list[_Source], jobs: list[_Job], pushed=None) -> list[pb.PrefetchResponse]:
        """Thread: place disk-read extents in the tiers, then describe the group.

        ``pushed``: the client computes on these (chunk -> data) already;
        nothing is sent and their buffers stay until the period retires.
        """
        chunks = [s.chunk for s in sources]
        datas = []
        c = dict.fromkeys(("bytes_gpu", "bytes_cpu", "bytes_useful", "spec_bytes_used", "spec_bytes_wasted"), 0)
        c.update(units_gpu=0, units_cpu=0, units_disk=0, units_admitted=0)
        staged: set[int] = set()  # jobs whose buffer still backs a delivered extent
        for s in sources:
            if s.resident is not None:
                res = s.resident
                if pushed is not None:
                    data = pushed[s.chunk]
                    c[f"bytes_{res.tier}"] += res.length
                    c[f"units_{res.tier}"] += 1
                elif res.tier == "gpu":
                    data = self._stage(period, res.length)
                    self.tiers.read_gpu(res, data)
                    c["bytes_gpu"] += res.length
                    c["units_gpu"] += 1
                else:
                    data = self.tiers.cpu_view(res)
                    c["bytes_cpu"] += res.length
                    c["units_cpu"] += 1
            else:
                data = s.job.result.extent_bytes(group, s.chunk)
                if s.job.speculative:
                    c["spec_bytes_used"] += data.size
                c["units_disk"] += 1
                placed = self.tiers.admit(s.unit, data) if self.tiers is not None else None
                if placed is not None:
                    self._hold_pins(period, [s.unit])
                    c["units_admitted"] += 1
                if pushed is not None:
                    data = pushed[s.chunk]
                    staged.add(id(s.job))
                elif placed is not None and placed.tier == "cpu":
                    data = self.tiers.cpu_view(placed)
                else:
                    staged.add(id(s.job))
            c["bytes_useful"] += data.size
            datas.append(data)
        for job in jobs:
            if job.speculative and job.result is not None:
                c["spec_bytes_wasted"] += sum(job.result.extent_bytes(group, j).size for j in job.chunks.tolist() if j not in job.used)
        self.store.record_access(self.prefix_id, np.asarray(chunks, np.int64), [group])
        msgs = self._describe(period, group, chunks, datas) if pushed is None else []
        done = [job.lease_id for job in jobs if id(job) not in staged and job.lease_id is not None]
        with self._lock:
            for k, v in c.items():
                setattr(self.stats, k, getattr(self.stats, k) + v)
            held = self._leases.get(period, [])
            if not self.session:  # bytes path: the frames are copies, every buffer may go
                done = [job.lease_id for job in jobs if job.lease_id is not None]
            done = [i for i in done if i in held]  # descriptors still point into the others
            for i in done:
                held.remove(i)
        if done:
            self.arena.release(self.owner, done)
        return msgs

    def _stage(self, period: int, nbytes: int) -> np.ndarray:
        lease = self.arena.lease(self.owner, nbytes, wait_seconds=self.svc.config.lease_wait_seconds)
        with self._lock:
            if not self._finished:
                self._leases.setdefault(period, []).append(lease.lease_id)
                return np.frombuffer(self.arena.buffer(lease), np.uint8)
        self.arena.release(self.owner, [lease.lease_id])
        raise StreamFinished()

    def _hold_pins(self, period: int, units: list) -> None:
        """Tier pins the period holds; a stream that already ended lets them go at once."""
        if not units:
            return
        with self._lock:
            if not self._finished:
                self._pins.setdefault(period, []).extend(units)
                return
        self.tiers.unpin(units)

    def _describe(self, period: int, group: int, chunks: list[int], datas: list[np.ndarray]) -> list[pb.PrefetchResponse]:
        if self.session:
            base = np.frombuffer(self.arena.view, np.uint8).ctypes.data
            refs = [pb.ShmRef(lease_id=self.id, offset=d.ctypes.data - base, length=d.size) for d in datas]
            return [pb.PrefetchResponse(group=pb.ShmGroup(group=group, chunks=chunks, refs=refs), period=period)]
        frame = self.svc.config.frame_bytes
        msgs = []
        for j, d in zip(chunks, datas):
            mv = memoryview(d)
            for off in range(0, d.size, frame):
                msgs.append(
                    pb.PrefetchResponse(
                        extent=pb.ExtentData(group=group, chunk=j, offset=off, extent_bytes=d.size, data=bytes(mv[off : off + frame]))
                    )
                )
        msgs.append(pb.PrefetchResponse(group=pb.ShmGroup(group=group, chunks=chunks), period=period))
        return msgs

    async def final_stats(self) -> pb.PrefetchResponse:
        st = self.stats
        for job in [j for jobs in self._spec.values() for j in jobs]:  # speculation nobody asked for
            await asyncio.gather(job.future, return_exceptions=True)
            if job.result is not None:
                st.spec_bytes_wasted += sum(job.result.extent_bytes(job.group, j).size for j in job.chunks.tolist())
            elif not job.started:
                st.spec_units_cancelled += int(job.chunks.size)
        self.svc.metrics.add(  # daemon-wide totals (Stats, /metrics); disk bytes are the store's own counter
            read_bytes_gpu=st.bytes_gpu,
            read_bytes_cpu=st.bytes_cpu,
            spec_bytes_used=st.spec_bytes_used,
            spec_bytes_wasted=st.spec_bytes_wasted,
            spec_units_cancelled=st.spec_units_cancelled,
        )
        return pb.PrefetchResponse(stats=st)

    # ------------------------------------------------------------ end
    def retire(self) -> None:
        """Give back the periods the client is done with (delivered, and a later set sent)."""
        with self._lock:
            last = min(self.delivered, self.next_period - 2)
            periods = [p for p in list(self._leases) + list(self._pins) if self._retired < p <= last]
            self._retired = max(self._retired, last)
            leases = [i for p in set(periods) for i in self._leases.pop(p, [])]
            pins = [u for p in set(periods) for u in self._pins.pop(p, [])]
        self._give_back(leases, pins)

    def _give_back(self, leases, pins) -> None:
        if leases:
            self.arena.release(self.owner, leases)
        if pins and self.tiers is not None:
            self.tiers.unpin(pins)

    def finish(self) -> None:
        """End of the stream, however it ended: every pin and buffer goes back."""
        self._hold.release()
        with self._lock:
            if self._finished:
                return
            self._finished = True
            for job in self._jobs:
                if not job.started:
                    job.cancelled = True
            leases = [i for held in self._leases.values() for i in held]
            pins = [u for held in self._pins.values() for u in held]
            self._leases, self._pins = {}, {}
        self._give_back(leases, pins)


async def serve_prefetch(svc, request_iterator, context, max_ahead: int):
    """The Prefetch call: an async generator of responses (errors raise)."""
    frames = aiter(request_iterator)
    first = await _next(frames, svc.config.stream_idle_seconds)
    if first is None or first.WhichOneof("kind") != "open":
        raise InvalidArgument("open", "the first message of Prefetch must be a PrefetchOpen")
    stream = PrefetchStream(svc, first.open)
    # A cancelled call may never resume this generator: release from the
    # call's own completion too, not only from the generator's finally.
    context.add_done_callback(lambda _ctx: stream.finish())
    out: asyncio.Queue = asyncio.Queue(maxsize=64)
    stream.out = out
    tasks: list[asyncio.Task] = stream._tasks
    try:
        yield stream.header()

        async def pump():
            chain = None
            try:
                while (msg := await _next(frames, svc.config.stream_idle_seconds)) is not None:
                    kind = msg.WhichOneof("kind")
                    if kind == "hint":
                        chunks = stream.check_hint(msg.hint)
                        if stream.speculate:
                            stream.speculate_period(msg.hint.period, chunks)
                        continue
                    if kind != "period":
                        raise InvalidArgument("open", "only the first message may be a PrefetchOpen")
                    chunks = stream.check_period(msg.period, max_ahead)
                    plan = stream.plan(msg.period.period, chunks, set(msg.period.covered_groups))
                    chain = asyncio.ensure_future(_deliver_after(chain, stream, msg.period.period, plan, out))
                    tasks.append(chain)
                if chain is None or await chain:
                    await out.put(_END)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - handed to the generator, which raises it
                await out.put(exc)

        tasks.append(asyncio.ensure_future(pump()))
        try:
            while (item := await out.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                for msg in item:
                    yield msg
            yield await stream.final_stats()
        finally:
            for task in tasks:
                task.cancel()
    finally:
        stream.finish()


async def _deliver_after(prev, stream: PrefetchStream, period: int, plan, out: asyncio.Queue) -> None:
    """Send one period's groups after the previous period's; a failure ends the stream."""
    if prev is not None and not await prev:
        return False
    try:
        async for msgs in stream.deliver(period, plan):
            await out.put(msgs)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # noqa: BLE001 - the generator raises it
        await out.put(exc)
        return False
    return True


async def _next(frames, idle_s: float):
    try:
        return await asyncio.wait_for(anext(frames), idle_s)
    except StopAsyncIteration:
        return None
    except TimeoutError:
        raise InvalidArgument("stream", f"no message for {idle_s}s") from None
