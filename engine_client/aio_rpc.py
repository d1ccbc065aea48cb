"""``rpc``'s rules on ``grpc.aio``: one error type, retries in the client within the deadline, no replayed stream.

The same rules as the synchronous client's (``engine_client.rpc``), awaited:
``acall`` retries a unary call that failed ``UNAVAILABLE`` or ``ABORTED`` up
to ``MAX_ATTEMPTS`` with ``backoff`` (each attempt with what is left of the
deadline, none begun that its backoff would push past it); ``acall_once``
sends a client stream once (a put restarts whole, ``with_put_retries``);
``astream`` starts a server stream again only while none of its messages
has arrived.  Every failure is ``KVStoreRpcError``; gRPC's own retries are
off (``CHANNEL_OPTIONS``).
"""

from __future__ import annotations

import asyncio
import time

import grpc

from .rpc import PUT_ATTEMPTS, KVStoreRpcError, backoff, retry_delay, retryable


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
    try:
        return await fn(requests, timeout=timeout, metadata=metadata)
    except grpc.RpcError as exc:
        raise KVStoreRpcError.of(exc) from None


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
