"""The asyncio client: ``KVStoreClient``'s calls over ``grpc.aio``, for engines that run an event loop.

``AsyncKVStoreClient`` has the synchronous client's methods for prefixes
(``lookup``, ``put_prefix``, ``describe``, ``delete``, ``list_prefixes``,
``stats``), reads (``read_chunks``, ``iter_groups``, ``get_summaries``,
``get_probe_keys``, ``prefetch``), scores (``report_attention``,
``get_scores``), pages (``pages_exist``, ``put_pages``, ``get_pages``,
``get_pages_into``), conversations (``append_turn``, ``mark_inactive``,
``get_conversation``, ``list_conversations``, ``delete_conversation``),
routing (``route``), ``data_channel_port`` and admin (``inspect``,
``verify``, ``evict``, ``compact``), each a coroutine with the same
arguments, the same answers (values of ``kvstore.contract``, numpy arrays,
the caller's buffer), the same errors (``KVStoreRpcError``), the same
deadlines (``deadline_s``; a put's grows with its payload) and the same
retries (``aio_rpc``: unary calls and streams until their first message;
puts restart whole; the Prefetch stream is not retried).  ``prefetch``
gives an ``aio_prefetch.AsyncPrefetchStream`` to ``await`` or enter with
``async with``.  Not here: reading over raw data connections (a TCP read
takes its extents in the stream; ``data_channel_port`` only says whether
the daemon offers them): their frames are read with blocking ``recv_into``
straight into the extents' buffers, which an event loop would have to move
to a thread per read.

On a unix socket the client opens a shared-memory session, as the
synchronous one does, on first use or on entering ``async with`` (the open
runs on a thread: it waits on a socket); a read naming a session the daemon
no longer knows reopens it and is sent again, once.  The messages are put
together by the same code as the synchronous client's (``reads.GroupReader``,
``pages.PageCollector``, ``prefetch.PrefetchState``, the request builders of
``conversations`` and ``kvstore.contract.routing``); copies into the caller's
memory run on the event loop, one frame or one group's extents at a time.

Why one file of ~490 lines: as ``client.py``, it is one short coroutine per
RPC (request, deadline, decoding); what the two clients share (message
assembly, retry rules, tensors) lives in ``reads``, ``pages``, ``prefetch``,
``conversations``, ``routing``, ``rpc`` and ``tensors``, and what is
asyncio's own (awaited retries, the Prefetch stream's reader task) in
``aio_rpc`` and ``aio_prefetch``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import grpc
import numpy as np

from kvstore.contract import (
    ChunkScores,
    CompactResult,
    EvictResult,
    LookupResult,
    PagesPresent,
    PagesPutResult,
    PrefixDescription,
    PrefixInfo,
    PutResult,
    ReadResult,
    SegmentReport,
    StoreStats,
    array_from_frames,
    compact_from_pb,
    description_from_pb,
    evict_from_pb,
    geometry_to_pb,
    lookup_from_pb,
    pages_present_from_pb,
    pages_put_from_pb,
    pb,
    prefix_info_from_pb,
    put_from_pb,
    scores_from_pb,
    segment_report_from_pb,
    stats_from_pb,
)
from kvstore.contract.geometry import StoreGeometry
from kvstore.contract.rpc import KVStoreAdminStub, KVStoreStub

from . import pages as page_wire
from .aio_prefetch import AsyncPrefetchStream
from .aio_rpc import acall, acall_once, astream, with_put_retries
from .client import PUT_FLOOR_BYTES_S, _ints, _put_stream
from .conversations import AsyncConversationCalls
from .page_calls import FRAME_BYTES
from .put_batching import AsyncPutQueue, MergedPages, PutEntry, merge, split, timeout_of
from .reads import GroupReader, leases_in, release
from .routing import AsyncRouteCalls
from .rpc import KVStoreRpcError, check_positive, open_channel
from .shm import ShmSession, names_stale_session
from .tensors import as_numpy_kv, destination

__all__ = ["AsyncKVStoreClient", "KVStoreRpcError"]


class AsyncKVStoreClient(AsyncConversationCalls, AsyncRouteCalls):
    def __init__(
        self,
        target: str,
        *,
        shm: bool | None = None,
        shm_socket: str | None = None,
        deadline_s: float = 60.0,
        put_floor_bytes_s: float = PUT_FLOOR_BYTES_S,
        token: str | None = None,
        root_certificates: bytes | None = None,
        client_cert: tuple[bytes, bytes] | None = None,
        put_coalesce: bool = True,
    ):
        """As ``KVStoreClient``'s (no ``data_channel``: a TCP read takes its extents in the stream).

        Make it inside the event loop that uses it (``grpc.aio`` binds the channel to that loop)."""
        check_positive(deadline_s=deadline_s, put_floor_bytes_s=put_floor_bytes_s)
        self.target = target
        self.deadline_s = float(deadline_s)
        self.put_floor_bytes_s = float(put_floor_bytes_s)
        self._metadata = [("authorization", f"Bearer {token}")] if token else None
        self.channel = open_channel(grpc.aio, target, root_certificates=root_certificates, client_cert=client_cert)
        self.stub = KVStoreStub(self.channel)
        self.admin = KVStoreAdminStub(self.channel)
        self.session: ShmSession | None = None
        self._session_lock = asyncio.Lock()
        self._puts = AsyncPutQueue(self._send_pages) if put_coalesce else None
        local = target.startswith("unix:")
        self._want_shm = bool(shm or (shm is None and local))
        self._shm_required = bool(shm)
        if self._want_shm:
            if not local:
                raise ValueError("the shared-memory path needs a unix-socket target")
            self._shm_path = shm_socket or target[len("unix:") :] + ".shm"

    @property
    def shm(self) -> bool:
        return self.session is not None

    @property
    def session_id(self) -> int:
        return self.session.session_id if self.session is not None else 0

    async def open(self) -> AsyncKVStoreClient:
        """Open the shared-memory session now (else at the first read that uses it)."""
        await self._session(None)
        return self

    async def close(self) -> None:
        await self.channel.close()
        if self.session is not None:
            self.session.close()  # the daemon releases this session's leases

    async def __aenter__(self) -> AsyncKVStoreClient:
        return await self.open()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _kw(self, timeout):
        return {"timeout": self.deadline_s if timeout is None else timeout, "metadata": self._metadata}

    def _put_kw(self, timeout, payload_bytes: int):
        return self._kw(self.deadline_s + payload_bytes / self.put_floor_bytes_s if timeout is None else timeout)

    async def _session(self, shm) -> ShmSession | None:
        """The session a read delivers into (opened on first use), None for the bytes path."""
        if shm and not self._want_shm:
            raise ValueError("no shared-memory session is open")
        if not (self._want_shm if shm is None else shm):
            return None
        async with self._session_lock:
            if self.session is None and self._want_shm:
                self.session = await asyncio.to_thread(
                    ShmSession.open, self._shm_path, required=self._shm_required, timeout_s=self.deadline_s
                )
                self._want_shm = self.session is not None  # shm=None and none offered: the bytes path from now on
            if shm and self.session is None:
                raise ValueError("no shared-memory session is open")
        return self.session

    async def _reopen_session(self, stale: ShmSession, deadline: float) -> ShmSession:
        async with self._session_lock:
            if self.session is stale:
                try:
                    self.session = await asyncio.to_thread(
                        ShmSession.open, self._shm_path, required=True, timeout_s=max(deadline - time.monotonic(), 0.001)
                    )
                except TimeoutError:
                    raise KVStoreRpcError(
                        grpc.StatusCode.DEADLINE_EXCEEDED, "reopening the shared-memory session took past the deadline"
                    ) from None
                except OSError as exc:
                    raise KVStoreRpcError(
                        grpc.StatusCode.UNAVAILABLE, f"the shared-memory session was lost and could not be reopened: {exc}"
                    ) from None
                stale.close()
            return self.session

    # ------------------------------------------------------------ prefixes
    async def lookup(self, tokens, geometry: StoreGeometry, *, namespace="", model_fingerprint="", timeout=None) -> LookupResult:
        req = pb.LookupRequest(
            namespace=namespace, model_fingerprint=model_fingerprint, geometry=geometry_to_pb(geometry), tokens=_ints(tokens)
        )
        return lookup_from_pb(await acall(self.stub.Lookup, req, **self._kw(timeout)))

    async def put_prefix(self, tokens, kv, geometry: StoreGeometry, *, namespace="", model_fingerprint="", timeout=None) -> PutResult:
        """Store ``kv`` ``[layers, 2, kv_heads, tokens, head_dim]``; sends only chunks not yet stored."""
        arr = as_numpy_kv(kv)
        toks = _ints(tokens)
        geometry.check_storable(arr)

        async def attempt():
            reuse = await self.lookup(toks, geometry, namespace=namespace, model_fingerprint=model_fingerprint, timeout=timeout)
            header = pb.PutHeader(
                namespace=namespace,
                model_fingerprint=model_fingerprint,
                geometry=geometry_to_pb(geometry),
                tokens=toks,
                reuse_chunks=reuse.matched_chunks,
            )
            frames = _put_stream(header, arr, geometry, reuse.matched_chunks)
            return put_from_pb(await acall_once(self.stub.PutPrefix, frames, **self._put_kw(timeout, arr.nbytes)))

        return await with_put_retries(attempt)

    async def describe(self, prefix_id: str, *, timeout=None) -> PrefixDescription:
        return description_from_pb(await acall(self.stub.Describe, pb.DescribeRequest(prefix_id=prefix_id), **self._kw(timeout)))

    async def delete(self, prefix_id: str, *, timeout=None) -> str:
        return (await acall(self.stub.Delete, pb.DeleteRequest(prefix_id=prefix_id), **self._kw(timeout))).prefix_id

    async def list_prefixes(self, namespace: str = "", *, timeout=None) -> list[PrefixInfo]:
        res = await acall(self.stub.ListPrefixes, pb.ListPrefixesRequest(namespace=namespace), **self._kw(timeout))
        return [prefix_info_from_pb(p) for p in res.prefixes]

    async def stats(self, *, timeout=None) -> StoreStats:
        return stats_from_pb(await acall(self.stub.Stats, pb.StatsRequest(), **self._kw(timeout)))

    # ------------------------------------------------------------ reads
    async def read_chunks(self, prefix_id: str, chunks, *, layer_start=0, layer_end=0, shm=None, coalesce=True, timeout=None) -> ReadResult:
        """Read the extents of ``chunks`` for the period groups covering the layer range (``to_kv()``: exactly that range)."""
        result = None
        groups = self.iter_groups(
            prefix_id, chunks, layer_start=layer_start, layer_end=layer_end, shm=shm, coalesce=coalesce, timeout=timeout
        )
        async with contextlib.aclosing(groups):
            async for result, _group in groups:
                pass
        return result

    async def iter_groups(self, prefix_id: str, chunks, *, layer_start=0, layer_end=0, shm=None, coalesce=True, timeout=None):
        """Yield ``(read, group)`` as each period group arrives (as ``KVStoreClient.iter_groups``); close the
        generator (``contextlib.aclosing``) to stop early: its leases go back."""
        session = await self._session(shm)
        req = pb.ReadChunksRequest(
            prefix_id=prefix_id,
            chunks=_ints(chunks),
            layer_start=layer_start,
            layer_end=layer_end,
            coalesce=coalesce,
            no_coalesce=not coalesce,
        )
        deadline = time.monotonic() + (self.deadline_s if timeout is None else timeout)
        for last_try in (False, True):
            req.shm_session = session.session_id if session is not None else 0
            responses = astream(self.stub.ReadChunks, req, **self._kw(max(deadline - time.monotonic(), 0.001)))
            reader = GroupReader(prefix_id, session)
            done = started = False
            try:
                async for msg in responses:
                    started = True
                    for group in reader.take(msg):
                        if reader.result.layers is None:
                            reader.result.layers = range(layer_start, layer_end or reader.result.geometry.model.num_layers)
                        yield reader.result, group
                done = True
                return
            except KVStoreRpcError as exc:
                if started or last_try or session is None or not names_stale_session(exc.code.name, exc.message):
                    raise
            finally:
                if not done:
                    await _abandon(responses, session, reader.leases)
            session = await self._reopen_session(session, deadline)

    def prefetch(
        self,
        prefix_id: str,
        *,
        period_layers: int,
        speculate: bool = True,
        shm=None,
        coalesce=True,
        hints: bool = False,
        push: bool | None = None,
        timeout=None,
    ) -> AsyncPrefetchStream:
        """A Prefetch stream for one Re-Prefill request, as ``KVStoreClient.prefetch``'s; ``await`` it or enter
        ``async with`` to open it (``engine_client.aio_prefetch``)."""
        return AsyncPrefetchStream(
            self,
            prefix_id,
            period_layers=period_layers,
            speculate=speculate,
            shm=shm,
            coalesce=coalesce,
            hints=hints,
            push=push,
            timeout=timeout,
        )

    async def data_channel_port(self, *, timeout=None) -> tuple[int, str]:
        """The daemon's data port (0 when it offers none) and why not; this client reads in the stream regardless."""
        res = await acall(self.stub.DataChannel, pb.DataChannelRequest(), **self._kw(timeout))
        return res.port, res.reason

    async def get_summaries(self, prefix_id: str, *, layer_step: int = 1, timeout=None) -> np.ndarray:
        """``[chunks, layers, kv_heads, 2 (min|max), head_dim]`` float32, of layers ``0, layer_step, ...``."""
        if isinstance(layer_step, bool) or not isinstance(layer_step, int) or layer_step < 1:
            raise ValueError(f"layer_step must be a positive integer, got {layer_step!r}")
        req = pb.GetSummariesRequest(prefix_id=prefix_id, layer_step=layer_step)
        return array_from_frames(r.frame for r in await _collect(astream(self.stub.GetSummaries, req, **self._kw(timeout))))

    async def get_probe_keys(self, prefix_id: str, group: int, *, timeout=None) -> np.ndarray:
        """Keys of the group's first layer, as the prefix's geometry stores them (``KVStoreClient.get_probe_keys``)."""
        req = pb.GetProbeKeysRequest(prefix_id=prefix_id, group=group)
        return array_from_frames(r.frame for r in await _collect(astream(self.stub.GetProbeKeys, req, **self._kw(timeout))))

    # ------------------------------------------------------------ scores
    async def report_attention(self, prefix_id: str, group: int, chunks, attention, *, timeout=None) -> int:
        req = pb.ReportAttentionRequest(
            prefix_id=prefix_id, group=group, chunks=_ints(chunks), attention=np.asarray(attention, dtype=np.float32).tolist()
        )
        return (await acall(self.stub.ReportAttention, req, **self._kw(timeout))).units

    async def get_scores(self, prefix_id: str, group: int, *, timeout=None) -> ChunkScores:
        req = pb.GetScoresRequest(prefix_id=prefix_id, group=group)
        return scores_from_pb(await acall(self.stub.GetScores, req, **self._kw(timeout)))

    # ------------------------------------------------------------ pages
    async def pages_exist(self, keys, geometry: StoreGeometry, *, namespace="", model_fingerprint="", timeout=None) -> PagesPresent:
        req = pb.PagesExistRequest(
            namespace=namespace, model_fingerprint=model_fingerprint, geometry=geometry_to_pb(geometry), keys=page_wire.as_keys(keys)
        )
        return pages_present_from_pb(await acall(self.stub.PagesExist, req, **self._kw(timeout)))

    async def put_pages(
        self, keys, kv_pages, geometry: StoreGeometry, *, namespace="", model_fingerprint="", timeout=None
    ) -> PagesPutResult:
        """Store ``kv_pages`` ``[pages, layers, 2, kv_heads, chunk_tokens, head_dim]`` under ``keys``; sends only pages not
        yet stored.  Calls of one scope made while a put of that scope is in flight go together in the next one."""
        arr = as_numpy_kv(kv_pages)
        keys = page_wire.as_keys(keys)
        page_wire.check_pages(arr, geometry, len(keys))
        entry = PutEntry(keys, arr, deadline=time.monotonic() + timeout if timeout is not None else float("inf"))
        scope = (namespace, model_fingerprint, geometry)
        if self._puts is None or arr.nbytes > self._puts.max_bytes // 4:
            return (await self._send_pages(scope, [entry]))[0]
        return await self._puts.put(scope, entry)

    async def _send_pages(self, scope, entries: list[PutEntry]) -> list[PagesPutResult]:
        namespace, model_fingerprint, geometry = scope
        keys, sources = merge(entries)
        pages = MergedPages(entries, sources)
        timeout = timeout_of(entries)

        async def attempt():
            present = await self.pages_exist(keys, geometry, namespace=namespace, model_fingerprint=model_fingerprint, timeout=timeout)
            header = pb.PutPagesHeader(
                namespace=namespace,
                model_fingerprint=model_fingerprint,
                geometry=geometry_to_pb(geometry),
                keys=keys,
                skip_pages=np.flatnonzero(present.exists).tolist(),
            )
            frames = page_wire.put_stream(header, pages, geometry, FRAME_BYTES)
            return present, pages_put_from_pb(await acall_once(self.stub.PutPages, frames, **self._put_kw(timeout, pages.nbytes)))

        present, res = await with_put_retries(attempt)
        return split(entries, sources, present.exists, res)

    async def get_pages(
        self, keys, geometry: StoreGeometry, *, namespace="", model_fingerprint="", layer_start=0, layer_end=0, shm=None, timeout=None
    ) -> np.ndarray:
        """As ``KVStoreClient.get_pages``: a new ``[pages, layers, 2, kv_heads, chunk_tokens, head_dim]`` array."""
        keys = page_wire.as_keys(keys)
        layers = page_wire.requested_layers(geometry, layer_start, layer_end)

        def new_array(num_pages, layers):
            out = np.empty(page_wire.page_shape(geometry, num_pages, len(layers)), dtype=geometry.model.numpy_dtype())
            return out, destination(out, out.shape, geometry.model.dtype)

        return await self._get_pages(
            keys, geometry, (namespace, model_fingerprint, layer_start, layer_end), layers, new_array, shm, timeout
        )

    async def get_pages_into(
        self, keys, out, geometry: StoreGeometry, *, namespace="", model_fingerprint="", layer_start=0, layer_end=0, shm=None, timeout=None
    ):
        """As ``KVStoreClient.get_pages_into``: the pages written into ``out`` (checked first), which is returned."""
        keys = page_wire.as_keys(keys)
        layers = page_wire.requested_layers(geometry, layer_start, layer_end)
        dest = None if layers is None else destination(out, page_wire.page_shape(geometry, len(keys), len(layers)), geometry.model.dtype)

        def given(num_pages, layers):
            if num_pages != len(keys) or dest is None:
                raise ValueError(f"GetPages answered {num_pages} pages for {len(keys)} keys")
            return out, dest

        return await self._get_pages(keys, geometry, (namespace, model_fingerprint, layer_start, layer_end), layers, given, shm, timeout)

    async def _get_pages(self, keys, geometry, scope, layers, dest_for, shm, timeout):
        session = await self._session(shm)
        namespace, model_fingerprint, layer_start, layer_end = scope
        req = pb.GetPagesRequest(
            namespace=namespace,
            model_fingerprint=model_fingerprint,
            geometry=geometry_to_pb(geometry),
            keys=keys,
            layer_start=layer_start,
            layer_end=layer_end,
        )
        deadline = time.monotonic() + (self.deadline_s if timeout is None else timeout)
        for last_try in (False, True):
            req.shm_session = session.session_id if session is not None else 0
            responses = astream(self.stub.GetPages, req, **self._kw(max(deadline - time.monotonic(), 0.001)))
            collector = page_wire.PageCollector(geometry, layers, dest_for, session)
            done = False
            try:
                async for msg in responses:
                    collector.take(msg)
                done = True
                return collector.finish()
            except KVStoreRpcError as exc:
                if collector.frames is not None or last_try or session is None or not names_stale_session(exc.code.name, exc.message):
                    raise
            finally:
                if not done:
                    await _drain(responses, collector.drop if session is not None else None)
            session = await self._reopen_session(session, deadline)

    # ------------------------------------------------------------ admin
    async def inspect(self, prefix_id: str, *, timeout=None) -> dict:
        return json.loads((await acall(self.admin.Inspect, pb.InspectRequest(prefix_id=prefix_id), **self._kw(timeout))).json)

    async def verify(self, prefix_id: str = "", *, timeout=None) -> list[SegmentReport]:
        res = await acall(self.admin.Verify, pb.VerifyRequest(prefix_id=prefix_id), **self._kw(timeout))
        return [segment_report_from_pb(r) for r in res.segments]

    async def evict(self, to_bytes: int, *, timeout=None) -> EvictResult:
        return evict_from_pb(await acall(self.admin.Evict, pb.EvictRequest(to_bytes=to_bytes), **self._kw(timeout)))

    async def compact(self, *, timeout=None) -> CompactResult:
        return compact_from_pb(await acall(self.admin.Compact, pb.CompactRequest(), **self._kw(timeout)))


async def _collect(responses) -> list:
    async with contextlib.aclosing(responses):
        return [msg async for msg in responses]


async def _drain(responses, drop) -> None:
    """End a stream the caller stopped reading: with ``drop`` (shared memory), read the rest for its leases."""
    try:
        if drop is not None:
            async for msg in responses:
                drop(msg)
    except Exception:  # noqa: BLE001 - cancelled or failed: the daemon gave back what was not the client's
        pass
    finally:
        await responses.aclose()


async def _abandon(responses, session: ShmSession | None, leases: set) -> None:
    """A read the caller stopped early: on shared memory the rest of the stream is read for its leases, then all go back."""
    await _drain(responses, (lambda msg: leases.update(leases_in(msg))) if session is not None else None)
    release(session, leases)
