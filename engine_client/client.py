"""Python client of the kvstore daemon.

Arrays go in and out as numpy (``torch`` tensors are accepted and can be
returned); bfloat16 travels as raw uint16.  On a unix socket the client
opens a shared-memory session by default: extents then arrive as zero-copy
views into the daemon's arena, valid until the read is released.  Every
call has a deadline.

Errors: every call raises ``KVStoreRpcError`` (never a raw ``grpc.RpcError``),
with ``code`` the ``grpc.StatusCode`` and ``message`` the daemon's text
(``except KVStoreRpcError as e: if e.code == grpc.StatusCode.NOT_FOUND``).

Retries: what the daemon says is worth retrying, ``UNAVAILABLE`` (it is
draining, or not reachable yet) and ``ABORTED`` (a concurrent delete or put
conflicted), is retried with exponential backoff and jitter:

- unary and server-streaming calls (every call but ``PutPrefix`` and
  ``Prefetch``) by gRPC's own retry policy (``RETRY_POLICY``): up to 5
  attempts, backoff 0.05 s doubling to at most 2 s, randomized by gRPC.
  gRPC retries a server stream only until its first response arrives, so a
  read is never replayed half way.  A retried ``ReportAttention`` whose first
  attempt did run counts twice (scores are advisory).
- ``put_prefix`` restarts from scratch (a fresh Lookup, then the stream),
  up to ``PUT_ATTEMPTS`` times with the same backoff: a client stream that
  has sent data cannot be replayed by gRPC; so does ``put_pages`` (a fresh
  PagesExist, then the stream).
- ``Prefetch`` (a bidirectional stream that has sent its sets) is not retried.

Why one file of ~560 lines: every RPC's call, its retries and its reply's
conversion sit together so one error and deadline policy covers them all;
the shared-memory read path (``ChunkRead``, leases) and the page calls are
the bulk.  Returning domain objects instead of protobufs is where it would
split (reads / admin / pages), and that change is not made yet.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import socket
import struct
import time
from dataclasses import dataclass, field

import grpc
import numpy as np

from kvstore._proto import kvstore_pb2 as pb
from kvstore._proto import kvstore_pb2_grpc as pb_grpc
from kvstore.geometry import StoreGeometry
from kvstore.wire import MAX_MESSAGE_BYTES, geometry_from_pb, geometry_to_pb

from . import pages as page_wire

FRAME_BYTES = 2 * 1024 * 1024
RETRYABLE = ("UNAVAILABLE", "ABORTED")
RETRY_POLICY = {
    "maxAttempts": 5,
    "initialBackoff": "0.05s",
    "maxBackoff": "2s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": list(RETRYABLE),
}
PUT_ATTEMPTS = 5
SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {"name": [{"service": "kvstore.v1.KVStore"}, {"service": "kvstore.v1.KVStoreAdmin"}], "retryPolicy": RETRY_POLICY},
            # client streams: retried from scratch by put_prefix, or not at all
            {
                "name": [
                    {"service": "kvstore.v1.KVStore", "method": "PutPrefix"},
                    {"service": "kvstore.v1.KVStore", "method": "PutPages"},
                    {"service": "kvstore.v1.KVStore", "method": "Prefetch"},
                ]
            },
        ]
    }
)


class KVStoreRpcError(Exception):
    """A failed call: ``code`` is the grpc.StatusCode, ``message`` the daemon's text."""

    def __init__(self, code: grpc.StatusCode, message: str):
        self.code = code
        self.message = message
        super().__init__(f"{code.name}: {message}")


def _rpc(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except grpc.RpcError as exc:
        raise KVStoreRpcError(exc.code(), exc.details() or "") from None


def _stream(fn, *args, **kwargs):
    """The messages of a server-streaming call, its failure as KVStoreRpcError."""
    try:
        yield from fn(*args, **kwargs)
    except grpc.RpcError as exc:
        raise KVStoreRpcError(exc.code(), exc.details() or "") from None


def _backoff(attempt: int) -> float:
    """Seconds before retry ``attempt`` (1, 2, ...): RETRY_POLICY's schedule, full jitter."""
    return random.uniform(0, min(2.0, 0.05 * 2 ** (attempt - 1)))


@dataclass
class ChunkRead:
    """Extents of one ReadChunks call; ``release()`` returns shm slots."""

    prefix_id: str
    geometry: StoreGeometry
    chunks: np.ndarray
    chunk_tokens: np.ndarray
    groups: list[int]
    num_tokens: int
    bytes_read: int = 0
    bytes_useful: int = 0
    num_reads: int = 0
    zero_copy: bool = False
    _extents: dict = field(default_factory=dict, repr=False)  # (group, chunk) -> uint8 array
    _release: object = field(default=None, repr=False)

    @property
    def read_amplification(self) -> float:
        return self.bytes_read / self.bytes_useful if self.bytes_useful else 1.0

    def extent(self, group: int, chunk: int) -> np.ndarray:
        """``[layers_in_group, 2, kv_heads, tokens, head_dim]`` in the KV dtype."""
        tokens = int(self.chunk_tokens[np.searchsorted(self.chunks, chunk)])
        geo = self.geometry
        return self._extents[(group, chunk)].view(geo.model.numpy_dtype()).reshape(geo.extent_shape(group, tokens))

    def group_kv(self, group: int) -> np.ndarray:
        return np.concatenate([self.extent(group, int(j)) for j in self.chunks], axis=3)

    def to_kv(self) -> np.ndarray:
        """``[layers, 2, kv_heads, selected tokens, head_dim]`` (a copy)."""
        return np.concatenate([self.group_kv(g) for g in self.groups], axis=0)

    def release(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None
        self._extents.clear()

    def __enter__(self) -> ChunkRead:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class KVStoreClient:
    def __init__(
        self,
        target: str,
        *,
        shm: bool | None = None,
        shm_socket: str | None = None,
        deadline_s: float = 60.0,
        token: str | None = None,
        root_certificates: bytes | None = None,
        client_cert: tuple[bytes, bytes] | None = None,
    ):
        """``target``: ``unix:/path/kvstore.sock`` or ``host:port``.

        ``shm`` (default: on for unix sockets) opens a shared-memory session
        on ``shm_socket`` (default: the socket path + ``.shm``).
        """
        self.target = target
        self.deadline_s = deadline_s
        opts = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.enable_retries", 1),
            ("grpc.service_config", SERVICE_CONFIG),
        ]
        self._metadata = [("authorization", f"Bearer {token}")] if token else None
        if root_certificates is not None or client_cert is not None:
            key, chain = client_cert if client_cert else (None, None)
            creds = grpc.ssl_channel_credentials(root_certificates, key, chain)
            self.channel = grpc.secure_channel(target, creds, options=opts)
        else:
            self.channel = grpc.insecure_channel(target, options=opts)
        self.stub = pb_grpc.KVStoreStub(self.channel)
        self.admin = pb_grpc.KVStoreAdminStub(self.channel)
        self.session_id = 0
        self._shm_sock = None
        self._arena = None
        local = target.startswith("unix:")
        if shm or (shm is None and local):
            if not local:
                raise ValueError("the shared-memory path needs a unix-socket target")
            self._open_session(shm_socket or target[len("unix:") :] + ".shm", required=bool(shm))

    # ------------------------------------------------------------ session
    def _open_session(self, path: str, *, required: bool) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            msg, fds, _, _ = socket.recv_fds(sock, 4096, 1)
        except OSError:
            sock.close()
            if required:
                raise
            return
        try:
            hello = json.loads(msg.decode())
        except ValueError:
            hello = {"error": f"unreadable reply {msg[:80]!r}"}
        if not fds:
            sock.close()
            if required:  # e.g. this uid is not in the daemon's shm_allowed_uids
                raise ConnectionError(f"{path}: {hello.get('error') or 'no arena descriptor received'}")
            return  # shm=None: the bytes-in-the-stream path serves this client
        (fd,) = fds
        try:
            self._arena = mmap.mmap(fd, hello["arena_bytes"], prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self.session_id = hello["session"]
        self._shm_sock = sock

    @property
    def shm(self) -> bool:
        return self._arena is not None

    def close(self) -> None:
        self.channel.close()
        if self._shm_sock is not None:
            self._shm_sock.close()  # the daemon releases this session's leases
            self._shm_sock = None

    def __enter__(self) -> KVStoreClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _kw(self, timeout):
        return {"timeout": self.deadline_s if timeout is None else timeout, "metadata": self._metadata}

    # ------------------------------------------------------------ calls
    def lookup(self, tokens, geometry: StoreGeometry, *, namespace="", model_fingerprint="", timeout=None) -> pb.LookupResponse:
        req = pb.LookupRequest(
            namespace=namespace, model_fingerprint=model_fingerprint, geometry=geometry_to_pb(geometry), tokens=_ints(tokens)
        )
        return _rpc(self.stub.Lookup, req, **self._kw(timeout))

    def put_prefix(self, tokens, kv, geometry: StoreGeometry, *, namespace="", model_fingerprint="", timeout=None):
        """Store ``kv`` ``[layers, 2, kv_heads, tokens, head_dim]``; sends only chunks not yet stored."""
        arr = as_numpy_kv(kv)
        toks = _ints(tokens)
        for attempt in range(1, PUT_ATTEMPTS + 1):
            reuse = self.lookup(toks, geometry, namespace=namespace, model_fingerprint=model_fingerprint, timeout=timeout)
            header = pb.PutHeader(
                namespace=namespace,
                model_fingerprint=model_fingerprint,
                geometry=geometry_to_pb(geometry),
                tokens=toks,
                reuse_chunks=reuse.matched_chunks,
            )
            try:
                return _rpc(self.stub.PutPrefix, _put_stream(header, arr, geometry, reuse.matched_chunks), **self._kw(timeout))
            except KVStoreRpcError as exc:
                if exc.code.name not in RETRYABLE or attempt == PUT_ATTEMPTS:
                    raise
            time.sleep(_backoff(attempt))

    # ------------------------------------------------------------ pages
    def pages_exist(self, keys, geometry: StoreGeometry, *, namespace="", model_fingerprint="", timeout=None) -> page_wire.PagesPresent:
        """Which pages are stored, and how many leading ones (keys: bytes, or str as SGLang's)."""
        req = pb.PagesExistRequest(
            namespace=namespace, model_fingerprint=model_fingerprint, geometry=geometry_to_pb(geometry), keys=page_wire.as_keys(keys)
        )
        r = _rpc(self.stub.PagesExist, req, **self._kw(timeout))
        return page_wire.PagesPresent(np.array(r.exists, dtype=bool), r.num_leading)

    def put_pages(self, keys, kv_pages, geometry: StoreGeometry, *, namespace="", model_fingerprint="", timeout=None) -> page_wire.PagesPut:
        """Store ``kv_pages`` ``[pages, layers, 2, kv_heads, chunk_tokens, head_dim]`` under ``keys``;
        sends only pages not yet stored."""
        arr = as_numpy_kv(kv_pages)
        keys = page_wire.as_keys(keys)
        page_wire.check_pages(arr, geometry, len(keys))
        for attempt in range(1, PUT_ATTEMPTS + 1):
            present = self.pages_exist(keys, geometry, namespace=namespace, model_fingerprint=model_fingerprint, timeout=timeout)
            header = pb.PutPagesHeader(
                namespace=namespace,
                model_fingerprint=model_fingerprint,
                geometry=geometry_to_pb(geometry),
                keys=keys,
                skip_pages=np.flatnonzero(present.exists).tolist(),
            )
            try:
                r = _rpc(self.stub.PutPages, page_wire.put_stream(header, arr, geometry, FRAME_BYTES), **self._kw(timeout))
                return page_wire.PagesPut(r.num_pages, r.pages_written, r.pages_already_stored, r.bytes_written, r.batch_id)
            except KVStoreRpcError as exc:
                if exc.code.name not in RETRYABLE or attempt == PUT_ATTEMPTS:
                    raise
            time.sleep(_backoff(attempt))

    def get_pages(
        self, keys, geometry: StoreGeometry, *, namespace="", model_fingerprint="", layer_start=0, layer_end=0, timeout=None
    ) -> np.ndarray:
        """``[pages, layers, 2, kv_heads, chunk_tokens, head_dim]`` (the layers of the period groups
        covering ``[layer_start, layer_end)``); NOT_FOUND names the first key not stored."""
        req = pb.GetPagesRequest(
            namespace=namespace,
            model_fingerprint=model_fingerprint,
            geometry=geometry_to_pb(geometry),
            keys=page_wire.as_keys(keys),
            layer_start=layer_start,
            layer_end=layer_end,
        )
        return page_wire.collect_pages(_stream(self.stub.GetPages, req, **self._kw(timeout)))

    def read_chunks(self, prefix_id: str, chunks, *, layer_start=0, layer_end=0, shm=None, coalesce=True, timeout=None) -> ChunkRead:
        """Read the extents of ``chunks`` for the period groups covering the layer range."""
        result = None
        for result, _group in self.iter_groups(
            prefix_id, chunks, layer_start=layer_start, layer_end=layer_end, shm=shm, coalesce=coalesce, timeout=timeout
        ):
            pass
        return result

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
    ):
        """Open a Prefetch stream for one Re-Prefill request (see ``engine_client.prefetch``)."""
        from .prefetch import PrefetchStream

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
        )

    def iter_groups(self, prefix_id: str, chunks, *, layer_start=0, layer_end=0, shm=None, coalesce=True, timeout=None):
        """Yield ``(read, group)`` as each period group arrives, so a caller can
        compute on one group while the next is still loading.  ``read`` is the
        same ``ChunkRead`` each time, filled group by group (stats at the end);
        the caller releases it when done.  If the caller stops early, its
        leases are released."""
        use_shm = self.shm if shm is None else shm
        if use_shm and not self.shm:
            raise ValueError("no shared-memory session is open")
        req = pb.ReadChunksRequest(
            prefix_id=prefix_id,
            chunks=_ints(chunks),
            layer_start=layer_start,
            layer_end=layer_end,
            shm_session=self.session_id if use_shm else 0,
            no_coalesce=not coalesce,
        )
        result = None
        leases: set[int] = set()
        partial: dict = {}
        done_ok = False
        call = None
        try:
            call = _rpc(self.stub.ReadChunks, req, **self._kw(timeout))
            for msg in call:
                if msg.HasField("header"):
                    result = self._new_read(prefix_id, msg.header, use_shm)
                    result._release = lambda: self._release_leases(leases)
                    arrived = {g: 0 for g in result.groups}
                complete = []
                if msg.HasField("shm_group"):
                    self._take_shm_group(result, msg.shm_group, leases)
                    complete.append(msg.shm_group.group)
                if msg.HasField("extent") and self._take_extent(result, msg.extent, leases, partial):
                    arrived[msg.extent.group] += 1
                    if arrived[msg.extent.group] == len(result.chunks):
                        complete.append(msg.extent.group)
                if msg.HasField("stats"):
                    st = msg.stats
                    result.bytes_read, result.bytes_useful, result.num_reads = st.bytes_read, st.bytes_useful, st.num_reads
                for group in complete:
                    yield result, group
            done_ok = True
        except grpc.RpcError as exc:
            raise KVStoreRpcError(exc.code(), exc.details() or "") from None
        finally:
            if not done_ok:
                self._abandon(call, use_shm, leases)

    def _abandon(self, call, use_shm: bool, leases: set) -> None:
        """End a read the caller stopped early and return every lease it holds.

        On the shared-memory path the daemon may have finished the stream
        already, handing over leases in messages not read yet; draining the
        (descriptor-only) rest collects them.  The bytes path holds no lease:
        the call is just cancelled.
        """
        if call is not None:
            if use_shm:
                try:
                    for msg in call:
                        if msg.HasField("shm_group"):
                            leases.update(ref.lease_id for ref in msg.shm_group.refs)
                except grpc.RpcError:
                    pass  # cancelled or failed: the daemon released what it had not handed over
            else:
                call.cancel()
        self._release_leases(leases)

    def _new_read(self, prefix_id: str, h, zero_copy: bool) -> ChunkRead:
        return ChunkRead(
            prefix_id=prefix_id,
            geometry=geometry_from_pb(h.geometry),
            chunks=np.array(h.chunks, dtype=np.int64),
            chunk_tokens=np.array(h.chunk_tokens, dtype=np.int64),
            groups=list(h.groups),
            num_tokens=h.num_tokens,
            zero_copy=zero_copy,
        )

    def _take_shm_group(self, result: ChunkRead, grp, leases: set) -> None:
        for j, ref in zip(grp.chunks, grp.refs):
            leases.add(ref.lease_id)
            result._extents[(grp.group, j)] = np.frombuffer(self._arena, dtype=np.uint8, count=ref.length, offset=ref.offset)

    def _take_extent(self, result: ChunkRead, e, leases: set, partial: dict) -> bool:
        """Add one bytes frame; True when it completed its extent."""
        key = (e.group, e.chunk)
        buf = partial.get(key)
        if buf is None:
            buf = partial[key] = np.empty(e.extent_bytes, dtype=np.uint8)
        buf[e.offset : e.offset + len(e.data)] = np.frombuffer(e.data, dtype=np.uint8)
        if e.offset + len(e.data) == e.extent_bytes:
            result._extents[key] = partial.pop(key)
            return True
        return False

    def _release_leases(self, leases: set) -> None:
        """Hand leases back on the shm connection (one write, no RPC)."""
        if leases and self._shm_sock is not None:
            ids = sorted(leases)
            try:
                self._shm_sock.sendall(struct.pack(f"<{len(ids)}Q", *ids))
            except OSError:
                pass  # the session is gone: the daemon released them already
        leases.clear()

    def get_summaries(self, prefix_id: str, *, timeout=None) -> np.ndarray:
        """``[chunks, layers, kv_heads, 2 (min|max), head_dim]`` float32."""
        return _collect(_stream(self.stub.GetSummaries, pb.GetSummariesRequest(prefix_id=prefix_id), **self._kw(timeout)))

    def get_probe_keys(self, prefix_id: str, group: int, *, timeout=None) -> np.ndarray:
        """``[kv_heads, tokens, head_dim]`` keys of the group's first layer."""
        req = pb.GetProbeKeysRequest(prefix_id=prefix_id, group=group)
        return _collect(_stream(self.stub.GetProbeKeys, req, **self._kw(timeout)))

    def report_attention(self, prefix_id: str, group: int, chunks, attention, *, timeout=None) -> int:
        """Report each chunk's attention mass in a period group (feeds the cache score)."""
        req = pb.ReportAttentionRequest(
            prefix_id=prefix_id, group=group, chunks=_ints(chunks), attention=np.asarray(attention, dtype=np.float32).tolist()
        )
        return _rpc(self.stub.ReportAttention, req, **self._kw(timeout)).units

    def get_scores(self, prefix_id: str, group: int, *, timeout=None) -> dict:
        """``{"importance", "frequency", "score"}`` arrays over the prefix's chunks."""
        r = _rpc(self.stub.GetScores, pb.GetScoresRequest(prefix_id=prefix_id, group=group), **self._kw(timeout))
        return {"importance": np.array(r.importance), "frequency": np.array(r.frequency), "score": np.array(r.score)}

    def describe(self, prefix_id: str, *, timeout=None) -> pb.DescribeResponse:
        """Geometry, token count and model of a stored prefix (NOT_FOUND if unknown)."""
        return _rpc(self.stub.Describe, pb.PrefixRequest(prefix_id=prefix_id), **self._kw(timeout))

    def delete(self, prefix_id: str, *, timeout=None) -> str:
        return _rpc(self.stub.Delete, pb.PrefixRequest(prefix_id=prefix_id), **self._kw(timeout)).prefix_id

    def stats(self, *, timeout=None) -> pb.StatsResponse:
        return _rpc(self.stub.Stats, pb.StatsRequest(), **self._kw(timeout))

    def list_prefixes(self, namespace: str = "", *, timeout=None) -> list:
        return list(_rpc(self.stub.ListPrefixes, pb.ListPrefixesRequest(namespace=namespace), **self._kw(timeout)).prefixes)

    def inspect(self, prefix_id: str, *, timeout=None) -> dict:
        return json.loads(_rpc(self.admin.Inspect, pb.PrefixRequest(prefix_id=prefix_id), **self._kw(timeout)).json)

    def verify(self, prefix_id: str = "", *, timeout=None) -> list:
        return list(_rpc(self.admin.Verify, pb.VerifyRequest(prefix_id=prefix_id), **self._kw(timeout)).segments)

    def evict(self, to_bytes: int, *, timeout=None) -> pb.EvictResponse:
        """Evict prefixes until the daemon stores at most ``to_bytes`` of segment files."""
        return _rpc(self.admin.Evict, pb.EvictRequest(to_bytes=to_bytes), **self._kw(timeout))

    def compact(self, *, timeout=None) -> pb.CompactResponse:
        """Compact every mostly-dead segment now."""
        return _rpc(self.admin.Compact, pb.CompactRequest(), **self._kw(timeout))


def as_numpy_kv(kv) -> np.ndarray:
    """numpy view of a KV array or torch tensor (bfloat16 as raw uint16)."""
    if isinstance(kv, np.ndarray):
        return kv
    try:
        import torch
    except ImportError:  # pragma: no cover
        raise TypeError(f"kv must be a numpy array or torch tensor, got {type(kv).__name__}") from None
    if isinstance(kv, torch.Tensor):
        t = kv.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16)
        return t.numpy()
    raise TypeError(f"kv must be a numpy array or torch tensor, got {type(kv).__name__}")


def to_torch(arr: np.ndarray, dtype: str):
    """A torch tensor over ``arr`` (no copy); bfloat16 reinterprets the uint16 bits."""
    import torch

    if dtype == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def _ints(values) -> list[int]:
    return np.asarray(values).astype(np.int64).ravel().tolist()


def _put_stream(header: pb.PutHeader, kv: np.ndarray, geo: StoreGeometry, first_chunk: int):
    yield pb.PutPrefixRequest(header=header)
    c = geo.chunk_tokens
    n = kv.shape[3] if kv.ndim == 5 else 0
    for g in range(geo.num_groups):
        layers = geo.group_layer_range(g)
        for j in range(first_chunk, geo.num_chunks(n)):
            ext = memoryview(np.ascontiguousarray(kv[layers.start : layers.stop, :, :, j * c : (j + 1) * c])).cast("B")
            for off in range(0, len(ext), FRAME_BYTES):
                frame = pb.ExtentFrame(group=g, chunk=j, offset=off, data=bytes(ext[off : off + FRAME_BYTES]))
                yield pb.PutPrefixRequest(extent=frame)


def _collect(frames) -> np.ndarray:
    out = None
    for f in frames:
        if out is None:
            shape = tuple(f.shape)
            out = np.empty(int(np.prod(shape)) * np.dtype(f.dtype).itemsize, dtype=np.uint8)
            dtype = np.dtype(f.dtype)
        out[f.offset : f.offset + len(f.data)] = np.frombuffer(f.data, dtype=np.uint8)
    return out.view(dtype).reshape(shape)
