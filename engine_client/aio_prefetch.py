"""The Prefetch stream on ``grpc.aio`` (``AsyncKVStoreClient.prefetch``): ``prefetch.PrefetchStream``'s operations, awaited.

    async with client.prefetch(prefix_id, period_layers=8) as stream:
        for p in range(stream.num_periods):
            await stream.send(p, chunks)               # this period's selection
            async for group, kv in stream.groups(p):   # as each SubPeriod arrives
                ...                                    # compute its layers
    stream.stats                                       # kvstore.contract.PrefetchStats

``st = await client.prefetch(...)`` opens it too (then ``await st.close()``
or ``st.cancel()``).  The messages and what is made of them are
``prefetch.PrefetchState``'s, as for the synchronous stream: the same open,
sets, hints and covered groups, the same group arrays (copies), pushed
speculation included (``pushed``, ``covered``), over shared memory or with
the extents in the stream.  Instead of a reader thread a task reads the
call into a queue, so ``send`` takes what has arrived (pushes) without
waiting, as the synchronous one does.  Errors are ``KVStoreRpcError``
(the daemon's status, raised by the next operation that reads), the stream
has the call's deadline (``timeout``, else the client's ``deadline_s``) and,
like every bidirectional stream, is not retried.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np

from kvstore.contract import PrefetchStats, pb, prefetch_stats_from_pb

from .aio_rpc import DaemonStatus
from .prefetch import STREAM_END, PrefetchState, ended_early, hint_request, open_request
from .rpc import KVStoreRpcError


class AsyncPrefetchStream(PrefetchState):
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
    ):
        """Not yet open: ``await`` it or enter ``async with`` (``AsyncKVStoreClient.prefetch`` makes it)."""
        self._client = client
        self._open_args = (prefix_id, period_layers, speculate, shm, coalesce, hints, push, timeout)
        self._call = None
        self._reader: asyncio.Task | None = None
        self._inbox: asyncio.Queue = asyncio.Queue()
        self._eof: BaseException | None = None
        self._opened = self._closed = False

    async def open(self) -> AsyncPrefetchStream:
        """Send the open and wait for the daemon's header (NOT_FOUND for an unknown prefix, ...)."""
        if self._opened:
            return self
        if self._closed:
            raise ValueError("the Prefetch stream is closed")
        self._opened = True
        prefix_id, period_layers, speculate, shm, coalesce, hints, push, timeout = self._open_args
        session = await self._client._session(shm)
        push = session is not None and speculate if push is None else push
        req = open_request(
            prefix_id,
            session_id=session.session_id if session is not None else 0,
            period_layers=period_layers,
            speculate=speculate,
            coalesce=coalesce,
            hints=hints,
            push=push,
        )
        try:
            self._call = self._client.stub.Prefetch(**self._client._kw(timeout))
            self._status = DaemonStatus(self._call)
            self._reader = asyncio.create_task(self._read(), name="kvstore-prefetch-reader")
            await self._write(req)
            self._start((await self._message()).header, session)
        except BaseException:
            self.cancel()
            raise
        return self

    def __await__(self):
        return self.open().__await__()

    # ------------------------------------------------------------ sending
    async def _write(self, req: pb.PrefetchRequest) -> None:
        if self._call is None:
            raise ValueError("the Prefetch stream is not open: await it or enter `async with`")
        if self._closed:
            raise ValueError("the Prefetch stream is closed")
        try:
            await self._call.write(req)
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass  # the call has ended: the reader has its status (aio_rpc.DaemonStatus), raised by the next read

    async def send(self, period: int, chunks) -> None:
        """This period's chunk set (any order; the daemon validates it).  Groups whose set lies within what
        the daemon pushed for them are ready at once and named in ``covered_groups``."""
        if self._call is None:
            raise ValueError("the Prefetch stream is not open: await it or enter `async with`")
        while True:  # what has arrived so far (pushes included), without waiting
            try:
                self._take(self._next_nowait())
            except asyncio.QueueEmpty:
                break
        await self._write(self._period_request(period, chunks))

    async def pushed(self, period: int, wait_s: float = 0.0) -> list[int]:
        """Groups of ``period`` pushed so far, waiting up to ``wait_s`` for all of them."""
        deadline = time.monotonic() + wait_s
        while True:
            have, complete = self._pushed_now(period)
            left = deadline - time.monotonic()
            if complete or left <= 0:
                return have
            try:
                self._take(await asyncio.wait_for(self._next(), left))
            except TimeoutError:
                pass

    async def hint(self, period: int, chunks) -> None:
        """A guess of ``period``'s set, for the daemon to read ahead (streams opened with ``hints``)."""
        await self._write(hint_request(period, chunks))

    # ------------------------------------------------------------ receiving
    async def _read(self) -> None:
        """Reader task: responses in arrival order, then the end (or the error)."""
        try:
            while (msg := await self._call.read()) is not grpc.aio.EOF:
                self._inbox.put_nowait(msg)
            self._inbox.put_nowait(STREAM_END)
        except grpc.RpcError as exc:
            self._inbox.put_nowait(await self._status.error(exc))
        except asyncio.CancelledError:  # the call was cancelled (``cancel``)
            self._inbox.put_nowait(KVStoreRpcError(grpc.StatusCode.CANCELLED, "the Prefetch stream was cancelled"))
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's task
            self._inbox.put_nowait(exc)

    def _got(self, item):
        if isinstance(item, BaseException):
            self._eof = item
            raise item
        return item

    def _next_nowait(self):
        """The next response if one has come (``STREAM_END`` at the end of the call), else asyncio.QueueEmpty."""
        if self._eof is not None:
            raise self._eof
        return self._got(self._inbox.get_nowait())

    async def _next(self):
        if self._eof is not None:
            raise self._eof
        return self._got(await self._inbox.get())

    async def _message(self) -> pb.PrefetchResponse:
        msg = await self._next()
        if msg is STREAM_END:
            self._eof = ended_early()
            raise self._eof
        return msg

    async def group_kv(self, group: int) -> np.ndarray:
        """Wait for ``group`` and return its selected rows: ``[layers, 2, kv_heads, rows, d]`` (a copy)."""
        if self._call is None:
            raise ValueError("the Prefetch stream is not open: await it or enter `async with`")
        t0 = time.perf_counter()
        while group not in self._ready:
            self._take(await self._message())
        self.io_wait_s += time.perf_counter() - t0
        return self._group_array(group)

    async def groups(self, period: int):
        """Yield ``(group, kv)`` for the period's groups, each as soon as it has arrived."""
        for g in self.period_groups(period):
            yield g, await self.group_kv(g)

    # ------------------------------------------------------------ end
    async def close(self) -> PrefetchStats | None:
        """Half-close; the daemon releases the stream's pins and buffers and sends its stats."""
        if self._closed or self._call is None:
            self._closed = True
            return self.stats
        self._closed = True
        try:
            await self._call.done_writing()
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass  # ended already: its status is read below
        while True:
            msg = await self._message()
            if msg.HasField("stats"):
                self.stats = prefetch_stats_from_pb(msg.stats)
                break
        while await self._next() is not STREAM_END:  # the end of the call
            pass
        await self._reader
        return self.stats

    def cancel(self) -> None:
        """End the stream now; the daemon releases its pins and buffers."""
        if not self._closed:
            self._closed = True
            if self._call is not None:
                self._call.cancel()

    async def __aenter__(self) -> AsyncPrefetchStream:
        return await self.open()

    async def __aexit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            await self.close()
        else:
            self.cancel()
