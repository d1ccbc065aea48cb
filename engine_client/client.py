"""Python client of the kvstore daemon.

Arrays go in and out as numpy (``torch`` tensors are accepted and can be
returned); bfloat16 travels as raw uint16.  On a unix socket the client
opens a shared-memory session by default (``shm.ShmSession``): extents then
arrive as zero-copy views into the daemon's arena, valid until the read is
released.  Every call has a deadline (``deadline_s``; a put's grows with
its payload, ``put_floor_bytes_s``); errors, retries and reconnecting are
``rpc``'s (``KVStoreRpcError``, ``call``, ``RetriedStream``,
``PUT_ATTEMPTS``, ``CHANNEL_OPTIONS``).  A read naming a shared-memory
session the daemon no longer knows (it restarted) opens a new session and
is sent again, once.

Every call answers with a value of ``kvstore.contract`` (``LookupResult``,
``PutResult``, ``PrefixDescription``, ``StoreStats``, ``ReadResult``,
``ConversationInfo`` (the conversation calls, ``conversations``), ...)
or a numpy array, never a protobuf message; the messages themselves are
built and read only here, in ``reads``, ``prefetch`` and ``pages``.

Why one file of ~400 lines: it is one method per RPC of ``KVStoreClient``,
each a few lines of request building, deadline and decoding; the readers,
the Prefetch stream, the pages and the conversation calls already live in
their own modules (and what a stale shm session looks like, in ``shm``).
"""

from __future__ import annotations

import json
import threading
import time

import grpc
import numpy as np

from kvstore.contract import (
    ChunkScores,
    CompactResult,
    EvictResult,
    LookupResult,
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
    pb,
    prefix_info_from_pb,
    put_from_pb,
    scores_from_pb,
    segment_report_from_pb,
    stats_from_pb,
)
from kvstore.contract.geometry import StoreGeometry
from kvstore.contract.rpc import KVStoreAdminStub, KVStoreStub

from .conversations import ConversationCalls
from .data_channel import DataPool, read_groups_data
from .page_calls import FRAME_BYTES, PageCalls, with_put_retries
from .prefetch import PrefetchStream
from .put_batching import PutQueue
from .reads import read_groups
from .routing import RouteCalls
from .rpc import KVStoreRpcError, RetriedStream, call, check_positive, open_channel, stream
from .shm import ShmSession, names_stale_session
from .tensors import as_numpy_kv, to_torch

__all__ = ["KVStoreClient", "KVStoreRpcError", "as_numpy_kv", "to_torch"]

PUT_FLOOR_BYTES_S = 8 * 1024 * 1024


class KVStoreClient(ConversationCalls, PageCalls, RouteCalls):
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
        data_channel: bool | None = None,
        put_coalesce: bool = True,
    ):
        """``target``: ``unix:/path/kvstore.sock`` or ``host:port``.

        ``shm`` (default: on for unix sockets) opens a shared-memory session
        on ``shm_socket`` (default: the socket path + ``.shm``).
        ``data_channel`` (default: on for TCP targets) reads extents on the
        daemon's raw data connections where it offers them
        (``engine_client.data_channel``), else in the stream.

        ``deadline_s`` bounds every call.  A put's stream is also allowed its
        payload at ``put_floor_bytes_s`` (default 8 MiB/s): an 8000-token
        float32 prefix of SmolLM2-135M (369 MB) gets 60 + 44 s, so a client on
        loaded cores is not cut off while it still sends.  A stream that stops
        sending is the daemon's to end (``--put-idle-seconds``).

        ``put_coalesce`` (default on): concurrent small ``put_pages`` calls of one scope share one PutPages
        (one segment, one sync, one batch; ``put_batching``).
        """
        check_positive(deadline_s=deadline_s, put_floor_bytes_s=put_floor_bytes_s)
        self.target = target
        self.deadline_s = float(deadline_s)
        self.put_floor_bytes_s = float(put_floor_bytes_s)
        self._metadata = [("authorization", f"Bearer {token}")] if token else None
        self.channel = open_channel(grpc, target, root_certificates=root_certificates, client_cert=client_cert)
        self.stub = KVStoreStub(self.channel)
        self.admin = KVStoreAdminStub(self.channel)
        self.session: ShmSession | None = None
        self._session_lock = threading.Lock()
        self._puts = PutQueue(self._send_pages) if put_coalesce else None
        local = target.startswith("unix:")
        if data_channel and local:
            raise ValueError("data connections are for TCP targets; a unix socket has the shared-memory path")
        # None: not asked yet (the DataChannel RPC, at the first bytes read); False: not used
        self._data_pool: DataPool | bool | None = None if (data_channel or data_channel is None) and not local else False
        if shm or (shm is None and local):
            if not local:
                raise ValueError("the shared-memory path needs a unix-socket target")
            self._shm_path = shm_socket or target[len("unix:") :] + ".shm"
            self.session = ShmSession.open(self._shm_path, required=bool(shm), timeout_s=self.deadline_s)

    @property
    def shm(self) -> bool:
        return self.session is not None

    @property
    def session_id(self) -> int:
        """The shm session's id (0: none), what a read names to be delivered into the arena."""
        return self.session.session_id if self.session is not None else 0

    def close(self) -> None:
        if isinstance(self._data_pool, DataPool):
            self._data_pool.close()
        self.channel.close()
        if self.session is not None:
            self.session.close()  # the daemon releases this session's leases

    def __enter__(self) -> KVStoreClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _kw(self, timeout):
        return {"timeout": self.deadline_s if timeout is None else timeout, "metadata": self._metadata}

    def _put_kw(self, timeout, payload_bytes: int):
        """A put stream's deadline: ``timeout`` if given, else ``deadline_s`` plus the payload at the floor rate."""
        return self._kw(self.deadline_s + payload_bytes / self.put_floor_bytes_s if timeout is None else timeout)

    # ------------------------------------------------------------ prefixes
    def lookup(self, tokens, geometry: StoreGeometry, *, namespace="", model_fingerprint="", timeout=None) -> LookupResult:
        req = pb.LookupRequest(
            namespace=namespace, model_fingerprint=model_fingerprint, geometry=geometry_to_pb(geometry), tokens=_ints(tokens)
        )
        return lookup_from_pb(call(self.stub.Lookup, req, **self._kw(timeout)))

    def put_prefix(self, tokens, kv, geometry: StoreGeometry, *, namespace="", model_fingerprint="", timeout=None) -> PutResult:
        """Store ``kv`` ``[layers, 2, kv_heads, tokens, head_dim]``; sends only chunks not yet stored."""
        arr = as_numpy_kv(kv)
        toks = _ints(tokens)
        geometry.check_storable(arr)  # a value kv_quant cannot hold fails here, not mid-stream

        def attempt():
            reuse = self.lookup(toks, geometry, namespace=namespace, model_fingerprint=model_fingerprint, timeout=timeout)
            header = pb.PutHeader(
                namespace=namespace,
                model_fingerprint=model_fingerprint,
                geometry=geometry_to_pb(geometry),
                tokens=toks,
                reuse_chunks=reuse.matched_chunks,
            )
            frames = _put_stream(header, arr, geometry, reuse.matched_chunks)
            return put_from_pb(call(self.stub.PutPrefix, frames, **self._put_kw(timeout, arr.nbytes)))

        return with_put_retries(attempt)

    def describe(self, prefix_id: str, *, timeout=None) -> PrefixDescription:
        """Geometry, token count and model of a stored prefix (NOT_FOUND if unknown)."""
        return description_from_pb(call(self.stub.Describe, pb.DescribeRequest(prefix_id=prefix_id), **self._kw(timeout)))

    def delete(self, prefix_id: str, *, timeout=None) -> str:
        return call(self.stub.Delete, pb.DeleteRequest(prefix_id=prefix_id), **self._kw(timeout)).prefix_id

    def list_prefixes(self, namespace: str = "", *, timeout=None) -> list[PrefixInfo]:
        res = call(self.stub.ListPrefixes, pb.ListPrefixesRequest(namespace=namespace), **self._kw(timeout))
        return [prefix_info_from_pb(p) for p in res.prefixes]

    def stats(self, *, timeout=None) -> StoreStats:
        return stats_from_pb(call(self.stub.Stats, pb.StatsRequest(), **self._kw(timeout)))

    # ------------------------------------------------------------ reads
    def read_chunks(self, prefix_id: str, chunks, *, layer_start=0, layer_end=0, shm=None, coalesce=True, timeout=None) -> ReadResult:
        """Read the extents of ``chunks`` for the period groups covering the layer range (``to_kv()``: exactly that range)."""
        result = None
        for result, _group in self.iter_groups(
            prefix_id, chunks, layer_start=layer_start, layer_end=layer_end, shm=shm, coalesce=coalesce, timeout=timeout
        ):
            pass
        return result

    def iter_groups(self, prefix_id: str, chunks, *, layer_start=0, layer_end=0, shm=None, coalesce=True, timeout=None):
        """Yield ``(read, group)`` as each period group arrives, so a caller can
        compute on one group while the next is still loading.  ``read`` is the
        same ``ReadResult`` each time, filled group by group (stats at the end);
        the caller releases it when done.  If the caller stops early, its
        leases are released.  Extents are whole stored groups; ``read.to_kv()``
        gives exactly the layers ``[layer_start, layer_end)``."""
        groups = self._groups(prefix_id, chunks, layer_start, layer_end, shm, coalesce, timeout)
        try:
            for read, group in groups:
                if read.layers is None:
                    read.layers = range(layer_start, layer_end or read.geometry.model.num_layers)
                yield read, group
        finally:
            groups.close()

    def _groups(self, prefix_id: str, chunks, layer_start, layer_end, shm, coalesce, timeout):
        use_shm = self.shm if shm is None else shm
        if use_shm and not self.shm:
            raise ValueError("no shared-memory session is open")
        req = pb.ReadChunksRequest(
            prefix_id=prefix_id,
            chunks=_ints(chunks),
            layer_start=layer_start,
            layer_end=layer_end,
            coalesce=coalesce,
            no_coalesce=not coalesce,  # the older spelling, for a daemon that predates `coalesce`
        )
        if use_shm:
            yield from self._shm_groups(req, prefix_id, timeout)
            return
        pool = self._data()
        if pool is None:
            yield from read_groups(RetriedStream(self.stub.ReadChunks, req, **self._kw(timeout)), prefix_id, None)
            return
        conn = pool.take()
        req.data_channel, req.data_secret = conn.conn_id, conn.secret
        yield from read_groups_data(RetriedStream(self.stub.ReadChunks, req, **self._kw(timeout)), prefix_id, conn, pool)

    def _shm_groups(self, req: pb.ReadChunksRequest, prefix_id: str, timeout):
        """``read_groups`` over the shm session; a session the daemon no longer knows is reopened, and the read sent again,
        once, all within the read's deadline."""
        deadline = time.monotonic() + (self.deadline_s if timeout is None else timeout)
        for last_try in (False, True):
            session = self.session
            req.shm_session = session.session_id
            responses = RetriedStream(self.stub.ReadChunks, req, **self._kw(max(deadline - time.monotonic(), 0.001)))
            groups = read_groups(responses, prefix_id, session)
            try:
                try:
                    first = next(groups)
                except StopIteration:
                    return
                except KVStoreRpcError as exc:
                    if last_try or not names_stale_session(exc.code.name, exc.message):
                        raise
                    self._reopen_session(session, deadline)
                    continue
                yield first
                yield from groups
                return
            finally:
                groups.close()

    def _reopen_session(self, stale: ShmSession, deadline: float) -> None:
        """A new shm session in place of ``stale`` (unless another thread did it already), by ``deadline``.

        Views of reads on ``stale`` stay valid: its arena stays mapped while they live."""
        with self._session_lock:
            if self.session is not stale:
                return
            try:
                self.session = ShmSession.open(self._shm_path, required=True, timeout_s=max(deadline - time.monotonic(), 0.001))
            except TimeoutError:
                raise KVStoreRpcError(
                    grpc.StatusCode.DEADLINE_EXCEEDED, "reopening the shared-memory session took past the deadline"
                ) from None
            except OSError as exc:
                raise KVStoreRpcError(
                    grpc.StatusCode.UNAVAILABLE, f"the shared-memory session was lost and could not be reopened: {exc}"
                ) from None
        stale.close()

    def data_channel_port(self, *, timeout=None) -> tuple[int, str]:
        """The daemon's data port (0 when it offers none) and why not."""
        res = call(self.stub.DataChannel, pb.DataChannelRequest(), **self._kw(timeout))
        return res.port, res.reason

    def _data(self) -> DataPool | None:
        """The pool of data connections, asking the daemon for its port at first use."""
        if self._data_pool is None:
            port, _ = self.data_channel_port()
            host = self.target.removeprefix("dns:///").removeprefix("ipv4:").rsplit(":", 1)[0].strip("[]")
            self._data_pool = DataPool(host, port, self.deadline_s) if port else False
        return self._data_pool or None

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
        wait_header: bool = True,
    ) -> PrefetchStream:
        """Open a Prefetch stream for one Re-Prefill request (see ``engine_client.prefetch``).

        ``wait_header=False`` returns before the daemon's header (a round trip): the caller's work up to its
        first set overlaps it, and an error opening the stream (an unknown prefix) is raised by the first
        call that needs the header (``send``, a header field) instead of here.
        """
        return PrefetchStream(
            self,
            prefix_id,
            period_layers=period_layers,
            speculate=speculate,
            shm=shm,
            coalesce=coalesce,
            hints=hints,
            push=push,
            timeout=timeout,
            wait_header=wait_header,
        )

    def get_summaries(self, prefix_id: str, *, layer_step: int = 1, timeout=None) -> np.ndarray:
        """``[chunks, layers, kv_heads, 2 (min|max), head_dim]`` float32, of layers ``0, layer_step, 2 * layer_step, ...``."""
        if isinstance(layer_step, bool) or not isinstance(layer_step, int) or layer_step < 1:
            raise ValueError(f"layer_step must be a positive integer, got {layer_step!r}")
        req = pb.GetSummariesRequest(prefix_id=prefix_id, layer_step=layer_step)
        return array_from_frames(r.frame for r in stream(self.stub.GetSummaries, req, **self._kw(timeout)))

    def get_probe_keys(self, prefix_id: str, group: int, *, timeout=None) -> np.ndarray:
        """Keys of the group's first layer, as the prefix's geometry stores them.

        ``probe_bits`` 0: ``[kv_heads, tokens, head_dim]`` in the KV dtype
        (bfloat16 as raw uint16).  4 or 8: packed quantized rows
        ``[kv_heads, tokens, head_dim * bits // 8 + 4]`` uint8, codes then a
        float32 scale (``kvstore.contract.probes``; ``QuantizedKeys.from_packed``).
        """
        req = pb.GetProbeKeysRequest(prefix_id=prefix_id, group=group)
        return array_from_frames(r.frame for r in stream(self.stub.GetProbeKeys, req, **self._kw(timeout)))

    # ------------------------------------------------------------ scores
    def report_attention(self, prefix_id: str, group: int, chunks, attention, *, timeout=None) -> int:
        """Report each chunk's attention mass in a period group (feeds the cache score)."""
        req = pb.ReportAttentionRequest(
            prefix_id=prefix_id, group=group, chunks=_ints(chunks), attention=np.asarray(attention, dtype=np.float32).tolist()
        )
        return call(self.stub.ReportAttention, req, **self._kw(timeout)).units

    def get_scores(self, prefix_id: str, group: int, *, timeout=None) -> ChunkScores:
        """Importance, frequency and score arrays over the prefix's chunks."""
        return scores_from_pb(call(self.stub.GetScores, pb.GetScoresRequest(prefix_id=prefix_id, group=group), **self._kw(timeout)))

    # ------------------------------------------------------------ admin
    def inspect(self, prefix_id: str, *, timeout=None) -> dict:
        return json.loads(call(self.admin.Inspect, pb.InspectRequest(prefix_id=prefix_id), **self._kw(timeout)).json)

    def verify(self, prefix_id: str = "", *, timeout=None) -> list[SegmentReport]:
        res = call(self.admin.Verify, pb.VerifyRequest(prefix_id=prefix_id), **self._kw(timeout))
        return [segment_report_from_pb(r) for r in res.segments]

    def evict(self, to_bytes: int, *, timeout=None) -> EvictResult:
        """Evict prefixes until the daemon stores at most ``to_bytes`` of segment files."""
        return evict_from_pb(call(self.admin.Evict, pb.EvictRequest(to_bytes=to_bytes), **self._kw(timeout)))

    def compact(self, *, timeout=None) -> CompactResult:
        """Compact every mostly-dead segment now."""
        return compact_from_pb(call(self.admin.Compact, pb.CompactRequest(), **self._kw(timeout)))


def _ints(values) -> list[int]:
    return np.asarray(values).astype(np.int64).ravel().tolist()


def _put_stream(header: pb.PutHeader, kv: np.ndarray, geo: StoreGeometry, first_chunk: int):
    yield pb.PutPrefixRequest(header=header)
    c = geo.chunk_tokens
    n = kv.shape[3] if kv.ndim == 5 else 0
    for g in range(geo.num_groups):
        layers = geo.group_layer_range(g)
        for j in range(first_chunk, geo.num_chunks(n)):
            payload = geo.extent_payload(np.ascontiguousarray(kv[layers.start : layers.stop, :, :, j * c : (j + 1) * c]), g)
            ext = memoryview(np.ascontiguousarray(payload)).cast("B")
            for off in range(0, len(ext), FRAME_BYTES):
                frame = pb.ExtentFrame(group=g, chunk=j, offset=off, data=bytes(ext[off : off + FRAME_BYTES]))
                yield pb.PutPrefixRequest(extent=frame)
