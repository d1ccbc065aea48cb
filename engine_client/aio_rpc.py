"""``rpc``'s rules on ``grpc.aio``: one error type, retries in the client within the deadline, no replayed stream.

The same rules as the synchronous client's (``engine_client.rpc``), awaited:
``acall`` retries a unary call that failed ``UNAVAILABLE`` or ``ABORTED`` up
to ``MAX_ATTEMPTS`` with ``backoff`` (each attempt with what is left of the
deadline, none begun that its backoff would push past it); ``acall_once``
sends a client stream once (a put restarts whole, ``with_put_retries``);
``astream`` starts a server stream again only while none of its messages
has arrived.  Every failure is ``KVStoreRpcError``; gRPC's own retries are
off (``CHANNEL_OPTIONS``).

A write that meets a call the daemon has just ended makes ``grpc.aio`` mark
the call ``INTERNAL`` ("Internal error from Core"), and the daemon's own
status, which may have come first, is lost to it; ``DaemonStatus`` keeps
the daemon's, so a client stream that wrote after a refusal raises the
refusal.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from .rpc import PUT_ATTEMPTS, KVStoreRpcError, backoff, retry_delay, retryable

CORE_WRITE_ERROR = (grpc.StatusCode.INTERNAL, "Internal error from Core")
STATUS_WAIT_S = 2.0  # bounds the wait for a status that comes after a failed write's (it comes at once)


def _finished(coro):
    """The value of a coroutine that returns without waiting (a finished call's ``code()``, ``details()``)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    return None


class DaemonStatus:
    """The daemon's status for ``call``, kept as it is set.

    A write that fails because the daemon has just ended the call makes
    ``grpc.aio`` set the call's status to INTERNAL ("Internal error from
    Core"), before or after the daemon's own status arrives; the call keeps
    whichever came last.  Every status set runs the call's done callbacks,
    so this one sees both and keeps the daemon's."""

    def __init__(self, call):
        self.status: tuple[grpc.StatusCode, str] | None = None
        call.add_done_callback(self._set)

    def _set(self, call) -> None:
        status = (_finished(call.code()), _finished(call.details()) or "")
        if self.status is None and status[0] is not None and status != CORE_WRITE_ERROR:
            self.status = status

    async def error(self, exc: grpc.RpcError) -> KVStoreRpcError:
        """``exc`` as KVStoreRpcError, with the daemon's status in place of a failed write's."""
        if (exc.code(), exc.details()) == CORE_WRITE_ERROR:
            deadline = time.monotonic() + STATUS_WAIT_S
            while self.status is None and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            if self.status is not None:
                return KVStoreRpcError(*self.status)
        return KVStoreRpcError.of(exc)


async def acall(fn, request, *, timeout: float | None = None, metadata=None):
    """``await fn(request)``, retried as ``rpc.call`` retries a unary call; its failure as KVStoreRpcError."""
    deadline = None if timeout is None else time.monotonic() + timeout
    attempt = 1
    while True:
        try:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            return await fn(request, timeout=left, metadata=metadata)
        except grpc.RpcError as exc:
            delay = retry_delay(exc.code(), attempt, deadline)
            if delay is None:
                raise KVStoreRpcError.of(exc) from None
        await asyncio.sleep(delay)
        attempt += 1


async def acall_once(fn, requests, *, timeout: float | None = None, metadata=None):
    """A client-streaming call, sent once (it cannot be replayed); its failure as KVStoreRpcError."""
    call = fn(requests, timeout=timeout, metadata=metadata)
    status = DaemonStatus(call)
    try:
        return await call
    except grpc.RpcError as exc:
        raise await status.error(exc) from None


async def astream(fn, request, *, timeout: float, metadata=None):
    """The messages of a server-streaming call, started again (as ``rpc.RetriedStream``) until its first message.

    The call is cancelled when the caller stops early (close the generator: ``contextlib.aclosing``)."""
    deadline = time.monotonic() + timeout
    attempt = 1
    while True:
        call = fn(request, timeout=max(deadline - time.monotonic(), 0.001), metadata=metadata)
        try:
            first = await call.read()
            break
        except grpc.RpcError as exc:
            delay = retry_delay(exc.code(), attempt, deadline)
            if delay is None:
                raise KVStoreRpcError.of(exc) from None
        except BaseException:  # the caller was cancelled while it waited
            call.cancel()
            raise
        await asyncio.sleep(delay)
        attempt += 1
    try:
        msg = first
        while msg is not grpc.aio.EOF:
            yield msg
            msg = await call.read()
    except grpc.RpcError as exc:
        raise KVStoreRpcError.of(exc) from None
    finally:
        call.cancel()  # a no-op once it ended; else the caller stopped early


async def with_put_retries(attempt):
    """``await attempt()`` up to ``PUT_ATTEMPTS`` times, as the synchronous ``put_prefix``/``put_pages`` retry."""
    for n in range(1, PUT_ATTEMPTS + 1):
        try:
            return await attempt()
        except KVStoreRpcError as exc:
            if not retryable(exc) or n == PUT_ATTEMPTS:
                raise
        await asyncio.sleep(backoff(n))
