"""The ``ReadChunks`` call: a short driver over the read executor and one sink per transport.

A read is one Period of the shared executor (``read_exec``): no tier is
consulted, one coalesced read per stored group, the next group loading
while this one is delivered.  What differs by transport is only where a
group's extents go and when their buffers may be reused, so each transport
is a sink owning that rule:

- ``ShmSink``: descriptors into the arena; the leases are the client's
  session's and are handed to it (it releases them), so the whole read is
  admitted at once (``admission``): the client holds every group together;
- ``FrameSink``: the extents as byte frames in the stream (copies: the
  buffers go at once);
- ``DataSink``: the extents on the client's raw data connection, each read's
  as it completes; the stream carries the header first and the stats last.

Every sink's messages carry the header on the first and the stats on the
last; an abandoned call's buffers and leases go back (``ex.finish``).
"""

from __future__ import annotations

from ..contract import geometry_to_pb, groups_for_layers, pb
from ..contract.errors import FailedPrecondition, InvalidArgument
from ..reader import validate_chunks
from .admission import queue_wait_seconds
from .read_exec import ReadExecutor, Source, read_flag
from .read_plan import plan_group
from .remote import fill_first


class ShmSink:
    """Descriptors into the client's shared-memory session."""

    streams_before_reads = False

    def __init__(self, svc, session: int):
        if svc.sessions is None:
            raise InvalidArgument("shm_session", "this daemon has no shared-memory arena (shm_arena_bytes = 0)")
        svc.sessions.check(session)
        self.svc = svc
        self.session = session

    def executor_args(self) -> dict:
        return {"arena": self.svc.arena, "lease_owner": self.session, "copies": False}

    def check(self, nbytes: int) -> None:
        self.svc.arena.check_fits(nbytes, "read")  # held together until released: refused at once if it can never fit

    async def group(self, ex: ReadExecutor, group: int, sources: list[Source], jobs: list, last: bool) -> list:
        return ex.serve(0, group, sources, jobs, lambda d: [pb.ReadChunksResponse(shm_group=ex.shm_group(group, sources, d))], record=False)


class FrameSink:
    """Byte frames in the stream."""

    streams_before_reads = False

    def __init__(self, svc):
        self.svc = svc

    def executor_args(self) -> dict:
        return {"arena": None, "lease_owner": 0, "copies": True}

    def check(self, nbytes: int) -> None:
        pass

    async def group(self, ex: ReadExecutor, group: int, sources: list[Source], jobs: list, last: bool) -> list:
        return ex.serve(
            0, group, sources, jobs, lambda d: [pb.ReadChunksResponse(extent=e) for e in ex.frames(group, sources, d)], record=False
        )


class DataSink:
    """The client's raw data connection; the stream carries the header first and the stats last."""

    streams_before_reads = True  # the client learns what the connection will carry before it arrives

    def __init__(self, svc, request, context):
        if svc.data_channels is None:
            raise FailedPrecondition(f"data_channel: this daemon offers no data connections ({svc.data_channel_reason})")
        self.svc = svc
        self.conn = svc.data_channels.claim(request.data_channel, request.data_secret)
        self.sent = False  # let go before the last message: the client may reuse the connection at once
        context.add_done_callback(lambda _ctx: None if self.sent else svc.data_channels.let_go(self.conn, complete=False))

    def executor_args(self) -> dict:
        return {"arena": None, "lease_owner": 0, "copies": True}

    def check(self, nbytes: int) -> None:
        pass

    async def group(self, ex: ReadExecutor, group: int, sources: list[Source], jobs: list, last: bool) -> list:
        for job in jobs:  # each read's extents as that read completes
            await job.future
            part = [s for s in sources if s.job is job]
            datas = ex.serve(0, group, part, [job], list, record=False)  # no arena: the buffers are this call's
            await self.svc.data_channels.send(self.conn, group, [(s.chunk, d) for s, d in zip(part, datas)])
        if not last:
            return []
        self.sent = True
        self.svc.data_channels.let_go(self.conn, complete=True)
        return [pb.ReadChunksResponse()]  # the stats go in the stream


def _sink(svc, request, context):
    if request.data_channel:
        if request.shm_session:
            raise InvalidArgument("data_channel", "a read goes to shared memory or to a data connection, not both")
        return DataSink(svc, request, context)
    if request.shm_session:
        return ShmSink(svc, request.shm_session)
    return FrameSink(svc)


async def serve_read_chunks(svc, request, context):
    """The ReadChunks call: an async generator of responses (errors raise)."""
    await fill_first(svc, request.prefix_id)  # a prefix only the remote tier has: filled off the event loop
    # resolve and describe are index lookups of microseconds (the manifest is cached): inline
    pid = svc.reach(request.prefix_id, context)
    view = svc.store.describe(pid)
    geo = view.geometry
    groups = groups_for_layers(geo, request.layer_start, request.layer_end)
    chunks = validate_chunks(list(request.chunks), view.num_chunks)
    sink = _sink(svc, request, context)
    hold = svc.store.holds.hold(pid)  # not evicted nor moved while the stream lasts
    context.add_done_callback(lambda _ctx: hold.release())
    header = pb.ReadHeader(
        geometry=geometry_to_pb(geo),
        chunks=chunks.tolist(),
        chunk_tokens=geo.chunk_token_counts(view.num_tokens)[chunks].tolist(),
        groups=groups,
        num_tokens=view.num_tokens,
    )
    coalesce = read_flag(request, "coalesce", "no_coalesce")
    ex = ReadExecutor(svc, pid, geo, tiers=None, coalesce=coalesce, handover=True, **sink.executor_args())
    completed = []
    # a cancelled call may never resume this generator: release from the call's own completion too
    context.add_done_callback(lambda _ctx: ex.finish(handed_over=bool(completed)))
    wanted = chunks.tolist()
    plans = [plan_group(g, wanted, per_read=len(wanted)) for g in groups]
    grant = ex.admission.grant(0)
    for g in groups:
        ex.admission.need(grant, g, len(wanted))
    sink.check(grant.nbytes)
    ex.admission.open(grant, queue_wait_seconds(context, svc.config))

    def start(i: int) -> list:
        return [ex.submit(plans[i].group, part, speculative=False, period=0, grant=grant) for part in plans[i].reads]

    try:
        jobs = start(0)
        if sink.streams_before_reads:
            yield pb.ReadChunksResponse(header=header)
            header = None
        for i, gp in enumerate(plans):
            if not sink.streams_before_reads:
                for job in jobs:
                    await job.future
            by_chunk = {j: job for job in jobs for j in job.chunks.tolist()}
            last = i + 1 == len(plans)
            group_jobs, jobs = jobs, (None if last else start(i + 1))  # the next group loads while this one is delivered
            msgs = await sink.group(ex, gp.group, [Source(j, None, job=by_chunk[j]) for j in wanted], group_jobs, last)
            if header is not None:
                msgs[0].header.CopyFrom(header)
                header = None
            if last:
                c = ex.counts
                msgs[-1].stats.CopyFrom(pb.ReadStats(bytes_read=c.bytes_disk, bytes_useful=c.bytes_useful, num_reads=c.num_reads))
            for msg in msgs:
                yield msg
        completed.append(True)
        svc.store.scoring.record_access(pid, chunks, groups)
    finally:
        ex.finish(handed_over=bool(completed))
        hold.release()
