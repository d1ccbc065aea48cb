"""The Prefetch stream: one per Re-Prefill request.

The client sends each Period's chunk set in order.  For period ``p`` with
set ``C`` the daemon

- pins the extents of ``C`` already in a memory tier (hits),
- reads the rest from disk, coalesced per stored group (the SubPeriod), so
  the first group is ready before the last,
- sends every group as soon as all its extents are in memory (intra-period),
- and, unless told not to, reads ``C`` for period ``p + 1``'s groups
  (inter-period speculation) once the period's needed reads are done; a
  client that opened with ``hints`` names its own guess for ``p + 1``
  instead (a PeriodHint).

When ``p + 1``'s real set arrives, speculative reads that have not started
and are not wholly needed are cancelled, the needed part of started ones is
used, and only the difference is read (the rules: ``read_plan.py``).  With
``push_speculation`` (shared memory), a speculative group wholly in memory
is described to the client before it asks; a group whose real set lies
within the push is computed on at once (``covered_groups``) and costs no
round trip.  What a stream hands out (tier pins, buffers) stays valid until
the client is done with its period, then goes back (``read_exec.py``).

This module is the stream's protocol: message checks, the order of
periods, hints and pushes; the decisions are ``read_plan``'s and the work
``ReadExecutor``'s.  Why ~510 lines in one file: the checks, the
speculation and the pushes all read and change one stream's state (the
next period, the reads in flight per group, what was pushed and pinned for
a push), so they stay one class; what could leave it has left.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import numpy as np

from ..contract import geometry_to_pb, pb
from ..contract.errors import DataLoss, InvalidArgument
from ..reader import validate_chunks
from .admission import queue_wait_seconds
from .arena import new_owner
from .prefetch_order import PeriodOrder
from .read_exec import ReadExecutor, ReadJob, Source, StreamFinished, read_flag
from .read_plan import plan_group, plan_speculation
from .remote import fill_first
from .status import ArenaExhausted

log = logging.getLogger(__name__)

_END = object()


@dataclass
class _Push:
    """A speculative group described to the client: chunk -> (source, data)."""

    period: int
    extents: dict


class PrefetchHandler:
    """One Prefetch call: checks its messages and drives the executor period by period."""

    def __init__(self, svc, open_msg: pb.PrefetchOpen, queue_wait=None, max_ahead: int | None = None):
        """``queue_wait()``: how long a period may wait for its turn in the arena (default ``lease_wait_seconds``)."""
        self.svc = svc
        self.queue_wait = queue_wait or (lambda: svc.config.lease_wait_seconds)
        max_ahead = svc.config.max_periods_ahead if max_ahead is None else max_ahead
        self.store = svc.store
        self.tiers = svc.tiers
        self.arena = svc.arena
        self.id = new_owner()  # named in descriptors; grants nothing
        self.prefix_id = self.store.resolve(open_msg.prefix_id)
        view = self.store.describe(self.prefix_id)
        q = self.store.state.prefix_quarantine(view)
        if q:
            raise DataLoss(f"prefix {self.prefix_id} is quarantined ({q}); delete and store it again")
        self.view = view
        geo = self.geometry = view.geometry
        pl = open_msg.period_layers or geo.model.num_layers
        if pl % geo.group_layers:
            raise InvalidArgument(
                "open.period_layers", f"must be a positive multiple of the stored group ({geo.group_layers} layers), got {pl}"
            )
        self.groups_per_period = pl // geo.group_layers
        self.num_periods = -(-geo.num_groups // self.groups_per_period)
        self.session = open_msg.shm_session
        if self.session:
            if svc.sessions is None:
                raise InvalidArgument("open.shm_session", "this daemon has no shared-memory arena (shm_arena_bytes = 0)")
            svc.sessions.check(self.session)
        self.speculate = read_flag(open_msg, "speculation", "no_speculation")
        self.hinted = open_msg.hints
        self.push = open_msg.push_speculation
        if self.push and not self.session:
            raise InvalidArgument("open.push_speculation", "needs a shared-memory session (open.shm_session)")
        self.order = PeriodOrder(self.num_periods, self.groups_per_period, geo.num_groups, max_ahead=max_ahead, hinted=bool(open_msg.hints))
        # What a period's descriptors point at (buffers, tier pins) stays
        # valid until the period is delivered AND the client has sent the next
        # period's set (it computed on them before it could choose that set),
        # or the stream ends; then it goes back.
        self.exec = ReadExecutor(
            svc,
            self.prefix_id,
            geo,
            arena=self.arena,
            lease_owner=new_owner(),  # owns the stream's arena leases; never leaves the daemon
            tiers=self.tiers,
            coalesce=read_flag(open_msg, "coalesce", "no_coalesce"),
            copies=not self.session,
            ref_id=self.id,
        )
        self._daemon_wait_s = 0.0
        self._groups_pushed = 0
        self._groups_covered = 0
        self._spec: dict[int, list[ReadJob]] = {}  # group -> speculative reads
        self._spec_hits: dict[int, dict[int, tuple]] = {}  # group -> chunk -> (unit, Resident) pinned for a push
        self._pushed: dict[int, _Push] = {}  # group -> what the client was sent
        self._tasks: list[asyncio.Future] = []  # pushes in flight
        self._hold = self.store.holds.hold(self.prefix_id)  # not evicted nor moved while the stream lasts
        self._needed: list[ReadJob] = []  # the latest period's needed reads
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
        return self.order.period_groups(period)

    def check_period(self, msg: pb.PeriodSet) -> np.ndarray:
        p, covered = msg.period, list(msg.covered_groups)
        self.order.check_set(p)
        chunks = self._chunks(msg.chunks, "period.chunks")
        pushed = {g: (push.period, set(push.extents)) for g, push in self._pushed.items()}
        self.order.check_covered(p, set(chunks.tolist()), covered, pushed)
        self.order.accept_set(p, covered)
        self.retire()
        return chunks

    def check_hint(self, msg: pb.PeriodHint) -> np.ndarray:
        self.order.check_hint(msg.period)
        chunks = self._chunks(msg.chunks, "hint.chunks")
        self.order.accept_hint(msg.period)
        return chunks

    def _chunks(self, chunks, field: str) -> np.ndarray:
        try:
            return validate_chunks(list(chunks), self.view.num_chunks)
        except InvalidArgument as exc:
            raise InvalidArgument(field, str(exc).split(": ", 1)[1]) from None

    # ------------------------------------------------------------ planning
    def plan(self, period: int, chunks: np.ndarray, covered=()) -> list[tuple]:
        """Sources of every extent of the period; starts the reads it needs.

        Items: ``(group, sources, jobs, pushed)``; ``pushed`` (chunk -> data)
        for a group the client computes on from a push, else None.
        """
        out = []
        wanted = chunks.tolist()
        # What is held at once is admitted at once: on shared memory the
        # client computes on the whole period before its buffers go back, so
        # one grant covers the period; framed bytes free each group's buffers
        # as it is sent, so a grant per group.
        period_grant = self.exec.admission.grant(period) if self.session else None
        for g in self.period_groups(period):
            units = self.store.catalogue.units(self.prefix_id, chunks, [g])
            unit_of = dict(zip(wanted, units))
            self._spec_hits.pop(g, None)  # its pins stay with the period
            if g in covered:
                out.append(self._plan_covered(period, g, chunks))
                continue
            self._pushed.pop(g, None)
            hits = self.tiers.pin_resident(units) if self.tiers is not None else {}
            self.exec.hold_pins(period, list(hits))
            inflight = {job.read_id: job for job in self._spec.pop(g, [])}
            with self.exec.lock:  # read states cannot change between the plan and its cancels
                gp = plan_group(
                    g,
                    wanted,
                    [j for j in wanted if unit_of[j] in hits],
                    [job.in_flight() for job in inflight.values()],
                    per_read=self._per_read(g),
                )
                self.exec.cancel([inflight[i] for i in gp.cancel])
                jobs = [inflight[i] for i in gp.keep]
                grant = period_grant or self.exec.admission.grant(period)
                for job in jobs:
                    job.used = set(gp.from_reads.get(job.read_id, ()))
                    if job.result is None:  # not read yet: it may still be dropped for room, then read again from the grant
                        job.grant = grant
                        self.exec.admission.need(grant, g, int(job.chunks.size))
            for part in gp.reads:
                self.exec.admission.need(grant, g, len(part))
            by_chunk = {j: inflight[i] for i, served in gp.from_reads.items() for j in served}
            for part in gp.reads:
                job = self.exec.submit(g, part, speculative=False, period=period, grant=grant)
                jobs.append(job)
                by_chunk.update(dict.fromkeys(part, job))
            if period_grant is None:
                self._open(grant, f"period {period} group {g}")
            hit = set(gp.hits)
            sources = [
                Source(j, unit_of[j], resident=hits[unit_of[j]]) if j in hit else Source(j, unit_of[j], job=by_chunk[j]) for j in wanted
            ]
            out.append((g, sources, jobs, None))
        if period_grant is not None:
            gs = self.period_groups(period)
            self._open(period_grant, f"period {period} group {gs[0]}" if len(gs) == 1 else f"period {period} groups {gs[0]}-{gs[-1]}")
        if self.tiers is not None:
            hits = sum(1 for _, sources, _, _ in out for s in sources if s.resident is not None)
            self.tiers.count(hits, sum(len(sources) for _, sources, _, _ in out) - hits)
        self._needed = [job for _, _, jobs, _ in out for job in jobs if not job.speculative]
        if self.speculate and not self.hinted and period + 1 < self.num_periods:
            self.speculate_period(period + 1, chunks)
        return out

    def _plan_covered(self, period: int, g: int, chunks: np.ndarray) -> tuple:
        """A group the client already computes on from its push: the push's sources, nothing to read."""
        push = self._pushed.pop(g)
        sources = [push.extents[j][0] for j in chunks.tolist()]
        hits = [s.unit for s in sources if s.resident is not None]
        if hits and self.tiers is not None:
            self.exec.hold_pins(period, list(self.tiers.pin_resident(hits)))  # the access (touch), pinned like any hit
        jobs = self._spec.pop(g, [])
        for job in jobs:
            job.used = {s.chunk for s in sources if s.job is job}
        self._groups_covered += 1
        return g, sources, jobs, {j: push.extents[j][1] for j in chunks.tolist()}

    def speculate_period(self, period: int, chunks: np.ndarray) -> None:
        """Read ``chunks`` for ``period``'s groups ahead of its real set, after the needed reads in flight."""
        wanted = chunks.tolist()
        after = [job.future for job in self._needed if not job.future.done()]
        push = self.push and self.tiers is not None
        for g in self.period_groups(period):
            unit_of = dict(zip(wanted, self.store.catalogue.units(self.prefix_id, chunks, [g])))
            resident = [j for j in wanted if self.tiers is not None and self.tiers.where(unit_of[j]) is not None]
            held = self._spec_hits.setdefault(g, {}) if push else self._spec_hits.get(g, {})
            inflight = {job.read_id: job for job in self._spec.pop(g, [])}
            with self.exec.lock:
                sp = plan_speculation(
                    g,
                    wanted,
                    resident,
                    [job.in_flight() for job in inflight.values()],
                    held=held,
                    per_read=self._per_read(g),
                    push=push,
                )
                self.exec.cancel([inflight[i] for i in sp.cancel])
            kept = [inflight[i] for i in sp.keep]
            if sp.pin:
                hits = self.tiers.pin_resident([unit_of[j] for j in sp.pin], touch=False)  # held for the push, not an access
                self.exec.hold_pins(period, list(hits))
                for j in sp.pin:
                    if unit_of[j] in hits:
                        held[j] = (unit_of[j], hits[unit_of[j]])
            kept += [self.exec.submit(g, part, speculative=True, period=period, after=after) for part in sp.reads]
            if kept:
                self._spec[g] = kept
        if self.push:
            self._tasks.append(asyncio.ensure_future(self._push_period(period, set(wanted))))

    def _per_read(self, group: int) -> int:
        return max(1, self._max_job_bytes // self.geometry.extent_padded_bytes(group))

    def _open(self, grant, what: str) -> None:
        """Admit a grant's buffers in one step; what can never fit the reserve fails now."""
        if self.arena is not None and grant.nbytes > self.arena.lease_bytes:
            cfg = self.svc.config
            raise ArenaExhausted(
                f"period.chunks: {what} needs {grant.nbytes} bytes of stream buffers at once "
                f"(extents read from disk), more than the whole prefetch reserve ({self.arena.lease_bytes} bytes: "
                f"prefetch_reserve_fraction {cfg.prefetch_reserve_fraction} of shm_arena_bytes {cfg.shm_arena_bytes}); "
                "send fewer chunks or raise shm_arena_bytes"
            )
        self.exec.admission.open(grant, self.queue_wait())

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
            if self.exec.finished or period < self.order.next_period:
                return  # the real set came first: the normal path serves it
            if g in self._pushed or any(job.result is None for job in jobs):
                continue  # a read was dropped or cancelled: no push for this group
            sources = []
            for j, (u, res) in self._spec_hits.get(g, {}).items():
                if j in wanted:
                    sources.append(Source(j, u, resident=res))
            have = {s.chunk for s in sources}
            units = dict(zip(sorted(wanted), self.store.catalogue.units(self.prefix_id, np.asarray(sorted(wanted), np.int64), [g])))
            for job in jobs:
                for j in job.chunks.tolist():
                    if j in wanted and j not in have:
                        sources.append(Source(j, units[j], job=job))
                        have.add(j)
            if have != wanted:
                continue  # not all of the guess is in memory (the tiers changed under it)
            sources.sort(key=lambda s: s.chunk)
            msg, datas = await self.svc.deliver(self._push_message, period, g, sources)
            if self.exec.finished or period < self.order.next_period:
                return
            self._pushed[g] = _Push(period, {s.chunk: (s, d) for s, d in zip(sources, datas)})
            self._groups_pushed += 1
            await self.out.put([msg])

    def _push_message(self, period: int, group: int, sources: list[Source]):
        """Thread: the descriptors of a speculative group (GPU hits staged in host memory)."""
        datas = [self.exec.extent(period, group, s) for s in sources]
        return pb.PrefetchResponse(speculative=self.exec.shm_group(group, sources, datas), period=period), datas

    # ------------------------------------------------------------ delivery
    async def deliver(self, period: int, plan) -> list[pb.PrefetchResponse]:
        """Messages of the period's groups, each list ready as soon as its group is.

        Groups the client has from pushes are accounted first: once the last
        served group's messages are out, nothing is left to wait for before
        ``delivered`` moves, so a client that received them cannot be ahead of it.
        """
        for g, sources, jobs, pushed in plan:
            if pushed is not None:  # the client has it already: account only
                await self.svc.deliver(self.exec.serve, period, g, sources, jobs, lambda datas: [], pushed)
        for g, sources, jobs, pushed in plan:
            if pushed is not None:
                continue
            self._daemon_wait_s += await self.exec.settle(period, g, sources, jobs)
            yield await self.svc.deliver(self.exec.serve, period, g, sources, jobs, self._describer(period, g, sources))
        self.exec.admission.close(period, period)  # every read of the period has its buffer: the rest of its space goes back
        self.order.mark_delivered(period)
        self.retire()

    def _describer(self, period: int, group: int, sources: list[Source]):
        """The messages of a served group: descriptors, or byte frames then the group."""
        chunks = [s.chunk for s in sources]
        if self.session:
            return lambda datas: [pb.PrefetchResponse(group=self.exec.shm_group(group, sources, datas), period=period)]
        return lambda datas: (
            [pb.PrefetchResponse(extent=e) for e in self.exec.frames(group, sources, datas)]
            + [pb.PrefetchResponse(group=pb.ShmGroup(group=group, chunks=chunks), period=period)]
        )

    async def final_stats(self) -> pb.PrefetchResponse:
        c = self.exec.counts
        for job in [j for jobs in self._spec.values() for j in jobs]:  # speculation nobody asked for
            await asyncio.gather(job.future, return_exceptions=True)
            if job.result is not None:
                c.spec_bytes_wasted += sum(job.result.extent_bytes(job.group, j).size for j in job.chunks.tolist())
            elif not job.started:
                c.spec_units_cancelled += int(job.chunks.size)
        st = pb.PrefetchStats(
            **c.as_dict(), daemon_wait_s=self._daemon_wait_s, groups_pushed=self._groups_pushed, groups_covered=self._groups_covered
        )
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
        span = self.order.to_retire()
        if span is not None:
            self.exec.retire(*span)

    def finish(self) -> None:
        """End of the stream, however it ended: every pin and buffer goes back."""
        self._hold.release()
        self.exec.finish()


async def serve_prefetch(svc, request_iterator, context, max_ahead: int):
    """The Prefetch call: an async generator of responses (errors raise)."""
    frames = aiter(request_iterator)
    first = await _next(frames, svc.config.stream_idle_seconds)
    if first is None or first.WhichOneof("kind") != "open":
        raise InvalidArgument("open", "the first message of Prefetch must be a PrefetchOpen")
    await fill_first(svc, first.open.prefix_id)  # a prefix only the remote tier has: filled off the event loop
    stream = PrefetchHandler(svc, first.open, lambda: queue_wait_seconds(context, svc.config), max_ahead)
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
                    chunks = stream.check_period(msg.period)
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


async def _deliver_after(prev, stream: PrefetchHandler, period: int, plan, out: asyncio.Queue) -> None:
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
