"""Thin gRPC servicers: validate, translate, call the store, translate back.

Why ~620 lines in one file: each handler is short (``ReadChunks`` and
``Prefetch`` drive the shared read executor, ``read_exec.py``), and they stay
together so the service's surface reads in one place.
"""

from __future__ import annotations

import asyncio
import functools
import json
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from .. import __version__
from ..contract import array_frames, geometry_from_pb, geometry_to_pb, pb, tokens_from_pb
from ..contract import rpc as pb_grpc
from ..contract.errors import InvalidArgument, NotFound, PermissionDenied
from ..store import ChunkStore
from .arena import Arena
from .auth import check_namespace, namespaces_of
from .config import ServerConfig
from .conversations import ConversationRpcs
from .get_pages import may_read, serve_get_pages
from .metrics import Metrics
from .prefetch import serve_prefetch
from .read_chunks import serve_read_chunks
from .remote import fill_first
from .routing import RouteRpcs
from .shm_sessions import ShmSessions
from .status import Draining, PutStalled, streaming, unary
from .tiers import TierManager

# Figures of ChunkStore.stats() that Stats reports as they are.
STORE_STATS = (
    "backend",
    "num_prefixes",
    "num_conversations",
    "num_segments",
    "bytes_stored",
    "bytes_free",
    "bytes_read",
    "bytes_written",
    "quarantined_segments",
    "index_map_bytes",
    "max_disk_bytes",
    "disk_used_bytes",
    "disk_reserved_bytes",
    "evictions",
    "evicted_bytes",
    "compactions",
    "compaction_reclaimed_bytes",
    "merges",
    "segments_merged",
    "read_queue_depth",
)
STATS_FIELDS = frozenset(f.name for f in pb.StatsResponse.DESCRIPTOR.fields if f.name != "latency")


class Service:
    """What every servicer shares: the store, its thread pool, drain state."""

    def __init__(
        self, store: ChunkStore, config: ServerConfig, arena: Arena | None, sessions: ShmSessions | None, tiers: TierManager | None = None
    ):
        self.store = store
        self.config = config
        self.arena = arena
        self.sessions = sessions
        self.tiers = tiers
        self.data_channels = None  # DataChannels: raw data connections for TCP clients (app.py)
        self.data_channel_reason = "not offered"
        self.router = None  # kvstore.remote.router.Router: Route's answers, with a remote tier (app.py)
        self.metrics = Metrics()
        self.pool = ThreadPoolExecutor(max_workers=config.io_threads, thread_name_prefix="kvstore-svc")
        # Prefetch deliveries (tier placement, descriptors) free buffers that
        # reads may be waiting for: they never queue behind those reads.
        self.delivery_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kvstore-deliver")
        self.draining = False
        self.active_calls = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @contextmanager
    def admitted(self):
        """Admit a call unless draining; count it while it runs."""
        if self.draining:
            raise Draining("the daemon is shutting down")
        self.active_calls += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.active_calls -= 1
            if self.active_calls == 0:
                self._idle.set()

    async def drain(self, grace_s: float) -> bool:
        """Refuse new calls (UNAVAILABLE) and wait for the running ones; True if all finished."""
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), grace_s)
            return True
        except TimeoutError:
            return False

    def reach(self, prefix_id: str, context) -> str:
        """The full id of a prefix the caller may use.

        A prefix in a namespace the caller's token does not allow is
        NOT_FOUND, exactly as an unknown one: its existence does not leak.
        """
        pid = self.store.resolve(prefix_id)
        allowed = namespaces_of(context)
        if allowed is not None and self.store.describe(pid).namespace not in allowed:
            raise NotFound(f"prefix {pid} is not stored")
        return pid

    def snapshot(self) -> dict:
        """Every store-wide figure, read now: ``Stats`` answers with it and ``/metrics`` is built from it."""
        s = self.store.stats()
        counters = self.metrics.counters()
        return {
            **{k: s[k] for k in STORE_STATS},
            "read_only": s["read_only"] or "",
            "requests": self.metrics.requests,
            "shm_arena_bytes": self.arena.nbytes if self.arena else 0,
            "shm_leased_bytes": self.arena.leased_bytes if self.arena else 0,
            "shm_sessions": self.sessions.num_sessions if self.sessions else 0,
            "data_connections": self.data_channels.open_count if self.data_channels else 0,
            "version": __version__,
            "bytes_read_gpu": counters["read_bytes_gpu"],
            "bytes_read_cpu": counters["read_bytes_cpu"],
            **{k: counters[k] for k in ("spec_bytes_used", "spec_bytes_wasted", "spec_units_cancelled")},
            **_tier_stats(self),
            **self.store.remote_stats(),
        }

    async def run(self, fn, *args, **kwargs):
        return await asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))

    async def run_owned(self, fn, *args, on_abandon, **kwargs):
        """``run`` for a call whose result holds something (a segment file, a reservation).

        A cancelled caller (the client went away) does not stop the thread;
        what the thread returns afterwards goes to ``on_abandon`` instead of
        being dropped on the floor.
        """
        fut = asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            fut.add_done_callback(lambda f: f.cancelled() or f.exception() is not None or on_abandon(f.result()))
            raise

    async def deliver(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.delivery_pool, functools.partial(fn, *args))


class KVStoreServicer(ConversationRpcs, RouteRpcs, pb_grpc.KVStoreServicer):
    """The KVStore service; its conversation calls are in ``conversations.py``."""

    def __init__(self, service: Service):
        self.svc = service
        self.metrics = service.metrics
        self.admitted = service.admitted

    @unary
    async def PutPrefix(self, request_iterator, context):
        svc = self.svc
        frames = aiter(request_iterator)
        first = await self._next(frames)
        if first is None or first.WhichOneof("kind") != "header":
            raise InvalidArgument("header", "the first message of PutPrefix must be a PutHeader")
        h = first.header
        check_namespace(context, h.namespace)
        pending = await svc.run_owned(
            svc.store.begin_put,
            tokens_from_pb(h.tokens),
            geometry_from_pb(h.geometry, "header.geometry"),
            namespace=h.namespace,
            model_fingerprint=h.model_fingerprint,
            reuse_chunks=h.reuse_chunks,
            on_abandon=lambda p: p.abort(),
        )
        res = await self._receive_and_commit(frames, pending, "PutPrefix")
        return pb.PutPrefixResponse(
            prefix_id=res.prefix_id,
            num_tokens=res.num_tokens,
            num_chunks=res.num_chunks,
            reused_chunks=res.reused_chunks,
            bytes_written=res.bytes_written,
            already_stored=res.already_stored,
        )

    async def _receive_and_commit(self, frames, pending, rpc: str):
        """Feed the stream's extent frames to ``pending``, then commit it."""
        svc = self.svc
        try:
            received = 0
            while (msg := await self._next(frames, svc.config.put_idle_seconds, rpc)) is not None:
                if msg.WhichOneof("kind") != "extent":
                    raise InvalidArgument("header", "only the first message may be a header")
                e = msg.extent
                received += len(e.data)
                if received > svc.config.max_put_bytes:
                    raise InvalidArgument("extent.data", f"stream exceeds max_put_bytes ({svc.config.max_put_bytes})")
                pending.put_extent_part(e.group, e.chunk, e.offset, e.data)
        except BaseException:
            pending.abort()  # drops the segment and the reservation of a cut stream
            raise
        # A commit runs to its end even if the client goes away meanwhile: it
        # either indexes the put or aborts it itself.
        return await asyncio.shield(svc.run(pending.commit))

    async def _next(self, frames, put_idle_s: float | None = None, rpc: str = "PutPrefix"):
        """The next message; ``put_idle_s``: a put holding a reservation may wait only this long."""
        idle_s = put_idle_s or self.svc.config.stream_idle_seconds
        try:
            return await asyncio.wait_for(anext(frames), idle_s)
        except StopAsyncIteration:
            return None
        except TimeoutError:
            if put_idle_s:
                raise PutStalled(f"{rpc}: no message for put_idle_seconds ({idle_s}s); the put is aborted") from None
            raise InvalidArgument("stream", f"no message for {idle_s}s") from None

    @unary
    async def Lookup(self, request, context):
        check_namespace(context, request.namespace)
        tokens = tokens_from_pb(request.tokens)
        res = await self.svc.run(
            self.svc.store.lookup,
            tokens,
            geometry_from_pb(request.geometry),
            namespace=request.namespace,
            model_fingerprint=request.model_fingerprint,
        )
        self.metrics.add(lookup_requested_tokens=len(tokens), lookup_hit_tokens=res.matched_tokens)
        return pb.LookupResponse(
            matched_chunks=res.matched_chunks,
            matched_tokens=res.matched_tokens,
            num_chunks=res.num_chunks,
            prefix_id=res.prefix_id or "",
        )

    @streaming
    async def ReadChunks(self, request, context):
        async for msg in serve_read_chunks(self.svc, request, context):
            yield msg

    @streaming
    async def Prefetch(self, request_iterator, context):
        if namespaces_of(context) is not None:
            request_iterator = _reached_open(self.svc, request_iterator, context)
        async for msg in serve_prefetch(self.svc, request_iterator, context, self.svc.config.max_periods_ahead):
            yield msg

    @unary
    async def DataChannel(self, request, context):
        """The port of the raw data connections (0 and why, when there are none)."""
        dc = self.svc.data_channels
        if dc is None:
            return pb.DataChannelResponse(port=0, reason=self.svc.data_channel_reason)
        return pb.DataChannelResponse(port=dc.port)

    @unary
    async def Release(self, request, context):
        """Free leases of the caller's shm session: all of them, or none (NOT_FOUND)."""
        svc = self.svc
        if svc.sessions is None:
            raise InvalidArgument("shm_session", "this daemon has no shared-memory arena")
        if not request.shm_session:
            raise InvalidArgument("shm_session", "required: the shared-memory session that holds the leases")
        svc.sessions.check(request.shm_session)
        n = svc.arena.release(request.shm_session, list(request.lease_ids), strict=True)
        return pb.ReleaseResponse(released=n)

    @streaming
    async def GetSummaries(self, request, context):
        pid = await self.svc.run(self.svc.reach, request.prefix_id, context)
        arr = await self.svc.run(self.svc.store.read_summaries, pid, request.layer_step or 1)
        for frame in array_frames(arr, self.svc.config.frame_bytes):
            yield pb.GetSummariesResponse(frame=frame)

    @streaming
    async def GetProbeKeys(self, request, context):
        pid = await self.svc.run(self.svc.reach, request.prefix_id, context)
        arr = await self.svc.run(self.svc.store.read_probe_keys, pid, request.group)
        for frame in array_frames(arr, self.svc.config.frame_bytes):
            yield pb.GetProbeKeysResponse(frame=frame)

    @unary
    async def ReportAttention(self, request, context):
        store = self.svc.store
        pid = self.svc.reach(request.prefix_id, context)
        n = store.scoring.report_attention(pid, request.group, list(request.chunks), list(request.attention))
        if self.svc.tiers is not None:
            self.svc.tiers.rescore(store.catalogue.units(pid, list(request.chunks), [request.group]))
        return pb.ReportAttentionResponse(units=n)

    @unary
    async def GetScores(self, request, context):
        store = self.svc.store
        pid = self.svc.reach(request.prefix_id, context)
        view = store.describe(pid)
        units = store.catalogue.units(pid, range(view.num_chunks), [request.group])
        scores = [store.scores.get(u) for u in units]
        return pb.GetScoresResponse(
            importance=[s.importance for s in scores],
            frequency=[s.frequency for s in scores],
            score=[s.score for s in scores],
        )

    @unary
    async def Describe(self, request, context):
        store = self.svc.store
        await fill_first(self.svc, request.prefix_id)  # a prefix only the remote tier has: filled off the event loop
        view = store.describe(self.svc.reach(request.prefix_id, context))
        return pb.DescribeResponse(
            prefix_id=view.prefix_id,
            namespace=view.namespace,
            model_fingerprint=view.model_fingerprint,
            geometry=geometry_to_pb(view.geometry),
            num_tokens=view.num_tokens,
            num_chunks=view.num_chunks,
            quarantined=store.state.prefix_quarantine(view) or "",
            kind=view.kind,
        )

    @unary
    async def Delete(self, request, context):
        pid = await self.svc.run(self.svc.reach, request.prefix_id, context)
        await self.svc.run(self.svc.store.delete, pid)  # freed segments leave the memory tiers (app.py)
        return pb.DeleteResponse(prefix_id=pid)

    @unary
    async def Stats(self, request, context):
        svc = self.svc
        snap = await svc.run(svc.snapshot)
        return pb.StatsResponse(
            **{k: v for k, v in snap.items() if k in STATS_FIELDS},
            latency=[pb.LatencySummary(**row) for row in svc.metrics.summary()],
        )

    @unary
    async def ListPrefixes(self, request, context):
        rows = await self.svc.run(self.svc.store.list_prefixes)
        allowed = namespaces_of(context)
        return pb.ListPrefixesResponse(
            prefixes=[
                pb.PrefixInfo(**{**r, "quarantined": r["quarantined"] or ""})
                for r in rows
                if (not request.namespace or r["namespace"] == request.namespace) and (allowed is None or r["namespace"] in allowed)
            ]
        )

    # ------------------------------------------------------------ pages
    @unary
    async def PagesExist(self, request, context):
        pages = self.svc.store.pages
        geo = geometry_from_pb(request.geometry)
        keys = list(request.keys)
        self.metrics.add(pages_requested_tokens=len(keys) * geo.chunk_tokens)
        if not may_read(context, request.namespace):  # as if none were stored: existence does not leak
            pages.hashes(keys, geo, request.namespace, request.model_fingerprint)
            return pb.PagesExistResponse(exists=[False] * len(keys), num_leading=0)
        res = await self.svc.run(pages.exists, keys, geo, namespace=request.namespace, model_fingerprint=request.model_fingerprint)
        self.metrics.add(pages_hit_tokens=res.num_leading * geo.chunk_tokens)
        return pb.PagesExistResponse(exists=res.exists, num_leading=res.num_leading)

    @unary
    async def PutPages(self, request_iterator, context):
        svc = self.svc
        frames = aiter(request_iterator)
        first = await self._next(frames)
        if first is None or first.WhichOneof("kind") != "header":
            raise InvalidArgument("header", "the first message of PutPages must be a PutPagesHeader")
        h = first.header
        check_namespace(context, h.namespace)
        pending = await svc.run_owned(
            svc.store.pages.begin_put,
            list(h.keys),
            geometry_from_pb(h.geometry, "header.geometry"),
            namespace=h.namespace,
            model_fingerprint=h.model_fingerprint,
            skip_pages=list(h.skip_pages),
            on_abandon=lambda p: p.abort(),
        )
        res = await self._receive_and_commit(frames, pending, "PutPages")
        return pb.PutPagesResponse(
            num_pages=res.num_pages,
            pages_written=res.pages_written,
            pages_already_stored=res.pages_already_stored,
            bytes_written=res.bytes_written,
            batch_id=res.batch_id,
        )

    @streaming
    async def GetPages(self, request, context):
        async for msg in serve_get_pages(self.svc, request, context):
            yield msg


async def _reached_open(svc: Service, requests, context):
    """Prefetch's requests, its PrefetchOpen's prefix checked against the caller's namespaces."""
    async for msg in requests:
        if msg.WhichOneof("kind") == "open":
            svc.reach(msg.open.prefix_id, context)
        yield msg


def _tier_stats(svc: Service) -> dict:
    t = svc.tiers
    if t is None:
        return {}
    return dict(
        cache_policy=t.policy_name,
        cpu_tier_bytes=t.capacity("cpu"),
        cpu_tier_used_bytes=t.used("cpu"),
        gpu_tier_bytes=t.capacity("gpu"),
        gpu_tier_used_bytes=t.used("gpu"),
        prefetch_reserve_bytes=svc.arena.lease_bytes if svc.arena else 0,
        tier_hit_units=t.hit_units,
        tier_miss_units=t.miss_units,
        tier_units=len(t),
        pinned_units=t.pinned_units(),
        pinned_bytes=t.pinned_bytes(),
    )


class AdminServicer(pb_grpc.KVStoreAdminServicer):
    def __init__(self, service: Service):
        self.svc = service
        self.metrics = service.metrics
        self.admitted = service.admitted

    @unary
    async def Inspect(self, request, context):
        pid = await self.svc.run(self.svc.reach, request.prefix_id, context)
        return pb.InspectResponse(json=json.dumps(await self.svc.run(self.svc.store.inspect, pid)))

    @unary
    async def Verify(self, request, context):
        if not request.prefix_id and namespaces_of(context) is not None:
            raise PermissionDenied("prefix_id: verifying every segment needs a token allowed every namespace")
        pid = await self.svc.run(self.svc.reach, request.prefix_id, context) if request.prefix_id else None
        reports = await self.svc.run(self.svc.store.verify, pid)
        return pb.VerifyResponse(
            segments=[
                pb.SegmentReport(
                    segment_id=r["segment_id"],
                    ok=r["ok"],
                    regions=r["regions"],
                    bad_regions=r["bad_regions"],
                    error=r["error"] or "",
                )
                for r in reports
            ]
        )

    @unary
    async def Evict(self, request, context):
        res = await self.svc.run(self.svc.store.capacity.evict_to, request.to_bytes)
        return pb.EvictResponse(evicted=res["evicted"], bytes_freed=res["bytes_freed"], disk_used_bytes=res["disk_used_bytes"])

    @unary
    async def Compact(self, request, context):
        res = await self.svc.run(self.svc.store.capacity.compact_and_merge)
        return pb.CompactResponse(**res)
