"""Client side of the daemon's Prefetch stream (one per Re-Prefill request).

    with client.prefetch(prefix_id, period_layers=8) as stream:
        for p in range(stream.num_periods):
            stream.send(p, chunks)                # this period's selection
            for group, kv in stream.groups(p):    # as each SubPeriod arrives
                ...                               # compute its layers
    stream.stats                                  # the daemon's figures (kvstore.contract.PrefetchStats)

Group KV arrays are copies (``[layers_in_group, 2, kv_heads, rows, d]``),
so they stay valid after the stream ends; the stream's pins and buffers in
the daemon are released when it closes (or is cancelled).  ``io_wait_s`` is
the time this process spent blocked waiting for groups.

``hints=True``: the daemon speculates only from ``stream.hint(p, chunks)``
(the caller's guess of period ``p``'s set, sent before the set).  Over
shared memory the daemon pushes speculative groups as they come into
memory; ``send`` serves a group from its push when the real set lies within
it (``covered``), so that group costs no round trip.

``PrefetchState`` is what the client end knows and does with no I/O: the
messages it sends (``open_request``, ``_period_request``, ``hint_request``)
and what it makes of those it receives (``_take``: extents, ready groups,
pushes; ``_group_array``).  ``PrefetchStream`` drives it with a reader on a
kept thread (``stream_readers``), ``aio_prefetch.AsyncPrefetchStream`` with
an asyncio task.
"""

from __future__ import annotations

import queue
import threading
import time

import grpc
import numpy as np

from kvstore.contract import PrefetchStats, geometry_from_pb, pb, prefetch_stats_from_pb

from .rpc import KVStoreRpcError
from .stream_readers import READERS

_CLOSE = object()
# what ``PrefetchState._start`` sets besides the header's fields
_STATE_FIELDS = frozenset(("_session", "_pending", "_extents", "_ready", "_pushed", "_sent", "_chunk_tokens", "_sets"))
STREAM_END = object()  # what the readers queue when the call has ended


def open_request(
    prefix_id: str, *, session_id: int, period_layers: int, speculate: bool, coalesce: bool, hints: bool, push: bool
) -> pb.PrefetchRequest:
    """The stream's first message; ``session_id`` 0: the extents travel in the stream."""
    return pb.PrefetchRequest(
        open=pb.PrefetchOpen(
            prefix_id=prefix_id,
            shm_session=session_id,
            period_layers=period_layers,
            speculation=speculate,
            coalesce=coalesce,
            # the older spellings, for a daemon that predates the positive fields
            no_speculation=not speculate,
            no_coalesce=not coalesce,
            hints=hints,
            push_speculation=push,
        )
    )


def hint_request(period: int, chunks) -> pb.PrefetchRequest:
    """A guess of ``period``'s set, for the daemon to read ahead (streams opened with ``hints``)."""
    return pb.PrefetchRequest(hint=pb.PeriodHint(period=period, chunks=np.asarray(chunks, dtype=np.int64).reshape(-1).tolist()))


def ended_early() -> KVStoreRpcError:
    return KVStoreRpcError(grpc.StatusCode.INTERNAL, "Prefetch stream ended early")


class PrefetchState:
    """A Prefetch stream's client end without its I/O: the header's figures, the extents and groups received,
    the pushes not yet used.  ``_start`` takes the header; ``_take`` every later message."""

    stats: PrefetchStats | None = None
    # ``group_out(shape, dtype)``: a host array each group's rows are gathered into (``geometry.group_array``'s
    # ``out``; a runner on CUDA gives pinned buffers); None: a new array per group
    group_out = None
    # ``group_out_chunks(shape, dtype)``: a host array a group's extents are copied into as they are stored,
    # ``[chunks, layers, 2, heads, chunk_tokens, d]``, one copy per run of extents adjacent in the arena (the
    # caller puts the rows in order on its device: ``reprefill.staging``); used for shared-memory groups of
    # full chunks in the plain layout, else ``group_out``
    group_out_chunks = None

    def _start(self, header: pb.PrefetchHeader, session) -> None:
        """``session``: the shm session the stream was opened on (its refs are views into that arena), else None."""
        self._session = session
        self.io_wait_s = 0.0
        self._pending: dict = {}  # (group, chunk) -> partial bytes
        self._extents: dict = {}  # (group, chunk) -> uint8 array (this period's)
        self._ready: dict[int, tuple] = {}  # group -> (chunks, refs or None)
        self._pushed: dict[int, tuple] = {}  # group -> (period, chunks, refs) pushed by the daemon
        self._sent = -1  # last period whose set was sent
        self.covered = 0  # groups served from a push
        self.geometry = geometry_from_pb(header.geometry)
        self.num_tokens = header.num_tokens
        self.num_chunks = header.num_chunks
        self.num_periods = header.num_periods
        self.groups_per_period = header.groups_per_period
        self.lease_id = header.lease_id
        self.cache_policy = header.cache_policy
        self._chunk_tokens = self.geometry.chunk_token_counts(self.num_tokens)
        self._sets: dict[int, np.ndarray] = {}

    def _period_request(self, period: int, chunks) -> pb.PrefetchRequest:
        """The set's message, after what has arrived so far was taken: groups whose set lies within what the
        daemon pushed for them are ready at once and named in ``covered_groups``."""
        arr = np.asarray(chunks, dtype=np.int64).reshape(-1)
        self._sets[period] = np.sort(arr)
        covered = []
        want = self._sets[period].tolist()
        for g in self.period_groups(period):
            push = self._pushed.pop(g, None)
            if push is None or push[0] != period or len(set(want)) != len(want):
                continue
            where = {j: i for i, j in enumerate(push[1])}
            if all(j in where for j in want):
                covered.append(g)
                self._ready[g] = (want, [push[2][where[j]] for j in want])
        self.covered += len(covered)
        self._sent = period
        return pb.PrefetchRequest(period=pb.PeriodSet(period=period, chunks=arr.tolist(), covered_groups=covered))

    def _pushed_now(self, period: int) -> tuple[list[int], bool]:
        """Groups of ``period`` pushed so far, and whether that is all of them."""
        want = self.period_groups(period)
        have = [g for g in want if g in self._pushed and self._pushed[g][0] == period]
        return have, len(have) == len(want)

    def period_groups(self, period: int) -> list[int]:
        first = period * self.groups_per_period
        return list(range(first, min(first + self.groups_per_period, self.geometry.num_groups)))

    def _take(self, msg) -> None:
        """One response (``STREAM_END``: the call ended, too early)."""
        if msg is STREAM_END:
            raise ended_early()
        if msg.HasField("extent"):
            e = msg.extent
            key = (e.group, e.chunk)
            buf = self._pending.get(key)
            if buf is None:
                buf = self._pending[key] = np.empty(e.extent_bytes, dtype=np.uint8)
            buf[e.offset : e.offset + len(e.data)] = np.frombuffer(e.data, dtype=np.uint8)
            if e.offset + len(e.data) == e.extent_bytes:
                self._extents[key] = self._pending.pop(key)
        if msg.HasField("group"):
            g = msg.group
            self._ready[g.group] = (list(g.chunks), list(g.refs) if g.refs else None)
        if msg.HasField("speculative") and msg.period > self._sent:
            g = msg.speculative
            self._pushed[g.group] = (msg.period, list(g.chunks), list(g.refs))

    def _group_array(self, group: int) -> np.ndarray:
        """A ready group's selected rows: ``[layers, 2, kv_heads, rows, d]`` (a copy)."""
        chunks, refs = self._ready.pop(group)
        if refs is not None and self.group_out_chunks is not None:
            copied = self._copy_extents(group, refs)
            if copied is not None:
                return copied
        raws = [self._session.view(refs[i]) if refs is not None else self._extents.pop((group, j)) for i, j in enumerate(chunks)]
        tokens = [int(self._chunk_tokens[j]) for j in chunks]
        return self.geometry.group_array(raws, group, tokens, out=self.group_out)

    def _copy_extents(self, group: int, refs) -> np.ndarray | None:
        """``group_out_chunks``' array of the group's extents as stored, or None where its layout does not
        allow it (quantized or streaming-heads extents, a short last chunk)."""
        geo = self.geometry
        ct = geo.chunk_tokens
        shape = (len(refs), *geo.extent_shape(group, ct))
        dtype = geo.model.numpy_dtype()
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if geo.kv_quant or geo.streaming_heads or any(r.length * len(refs) != nbytes for r in refs):
            return None
        arr = self.group_out_chunks(shape, dtype)
        flat = arr.reshape(-1).view(np.uint8)
        at = i = 0
        while i < len(refs):  # a run of extents adjacent in the arena (one coalesced read): one copy
            start = end = refs[i].offset
            while i < len(refs) and refs[i].offset == end:
                end += refs[i].length
                i += 1
            flat[at : at + end - start] = self._session.span(start, end - start)
            at += end - start
        return arr

    def chunk_tokens(self, period: int) -> np.ndarray:
        """Tokens of each chunk of the period's set (ascending chunk order)."""
        return self._chunk_tokens[self._sets[period]]


class PrefetchStream(PrefetchState):
    def __init__(
        self,
        client,
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
    ):
        use_shm = client.shm if shm is None else shm
        if use_shm and not client.shm:
            raise ValueError("no shared-memory session is open")
        push = use_shm and speculate if push is None else push
        session = client.session if use_shm else None
        self._q: queue.Queue = queue.Queue()
        self._inbox: queue.Queue = queue.Queue()
        self._eof: BaseException | None = None
        self._q.put(
            open_request(
                prefix_id,
                session_id=session.session_id if session is not None else 0,
                period_layers=period_layers,
                speculate=speculate,
                coalesce=coalesce,
                hints=hints,
                push=push,
            )
        )
        self._closed = False
        try:
            self._call = client.stub.Prefetch(self._requests(), **client._kw(timeout))
            self._read_done = threading.Event()
            READERS.run(self._read)
            self._header_session = session
            if wait_header:
                self._take_header()
        except BaseException:
            self.cancel()
            raise

    # ------------------------------------------------------------ the header
    _HEADER_FIELDS = frozenset(
        ("io_wait_s", "covered", "geometry", "num_tokens", "num_chunks", "num_periods", "groups_per_period", "lease_id", "cache_policy")
    )

    def _take_header(self) -> None:
        """Wait for the stream's first response (its header, or the call's error) and take it, once."""
        if "_sets" not in self.__dict__:
            self._start(self._message().header, self._header_session)

    def __getattr__(self, name: str):
        """A header field asked for before the header was taken (``wait_header=False``): wait for it."""
        if name in PrefetchStream._HEADER_FIELDS or (name.startswith("_") and name in _STATE_FIELDS):
            self._take_header()
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ------------------------------------------------------------ sending
    def _requests(self):
        while (item := self._q.get()) is not _CLOSE:
            yield item

    def send(self, period: int, chunks) -> None:
        """This period's chunk set (any order; the daemon validates it).

        Groups whose set lies within what the daemon pushed for them are
        ready at once and named in ``covered_groups``.
        """
        self._take_header()
        while True:  # what has arrived so far (pushes included), without waiting
            try:
                self._take(self._next(block=False))
            except queue.Empty:
                break
        self._q.put(self._period_request(period, chunks))

    def pushed(self, period: int, wait_s: float = 0.0) -> list[int]:
        """Groups of ``period`` pushed so far, waiting up to ``wait_s`` for all of them."""
        self._take_header()
        deadline = time.monotonic() + wait_s
        while True:
            have, complete = self._pushed_now(period)
            left = deadline - time.monotonic()
            if complete or left <= 0:
                return have
            try:
                self._take(self._next(timeout=left))
            except queue.Empty:
                pass

    def hint(self, period: int, chunks) -> None:
        """A guess of ``period``'s set, for the daemon to read ahead (streams opened with ``hints``)."""
        self._q.put(hint_request(period, chunks))

    # ------------------------------------------------------------ receiving
    def _read(self) -> None:
        """Reader (a ``READERS`` thread): responses in arrival order, then the end (or the error)."""
        try:
            for msg in self._call:
                self._inbox.put(msg)
            self._inbox.put(STREAM_END)
        except grpc.RpcError as exc:
            self._inbox.put(KVStoreRpcError.of(exc))
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            self._inbox.put(exc)
        finally:
            self._read_done.set()

    def _next(self, block: bool = True, timeout: float | None = None):
        """The next response; ``STREAM_END`` at the end of the call.  Raises queue.Empty when
        nothing came (``block=False``, or within ``timeout``)."""
        if self._eof is not None:
            raise self._eof
        item = self._inbox.get(block, timeout)
        if isinstance(item, BaseException):
            self._eof = item
            raise item
        return item

    def _message(self) -> pb.PrefetchResponse:
        msg = self._next()
        if msg is STREAM_END:
            self._eof = ended_early()
            raise self._eof
        return msg

    def _wait_group(self, group: int) -> None:
        self._take_header()
        t0 = time.perf_counter()
        while group not in self._ready:
            self._take(self._message())
        self.io_wait_s += time.perf_counter() - t0

    def group_kv(self, group: int) -> np.ndarray:
        """Wait for ``group`` and return its selected rows: ``[layers, 2, kv_heads, rows, d]`` (a copy)."""
        self._wait_group(group)
        return self._group_array(group)

    def groups(self, period: int):
        """Yield ``(group, kv)`` for the period's groups, each as soon as it has arrived."""
        for g in self.period_groups(period):
            yield g, self.group_kv(g)

    # ------------------------------------------------------------ end
    def close(self) -> PrefetchStats:
        """Half-close; the daemon releases the stream's pins and buffers and sends its stats."""
        if not self._closed:
            self._closed = True
            self._q.put(_CLOSE)
            while True:
                msg = self._message()
                if msg.HasField("stats"):
                    self.stats = prefetch_stats_from_pb(msg.stats)
                    break
            while self._next() is not STREAM_END:  # the end of the call
                pass
            self._read_done.wait()
        return self.stats

    def cancel(self) -> None:
        if not self._closed:
            self._closed = True
            self._q.put(_CLOSE)
            call = getattr(self, "_call", None)
            if call is not None:
                call.cancel()

    def __enter__(self) -> PrefetchStream:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:
            self.cancel()
