"""Domain errors to gRPC status codes, in one place.

Servicer methods are wrapped with ``unary`` or ``streaming``; a known domain
error becomes its status code with the store's message (which names the
field for INVALID_ARGUMENT); anything else is INTERNAL with a log line.
"""

from __future__ import annotations

import asyncio
import functools
import logging

import grpc

from .. import errors

log = logging.getLogger(__name__)


class Draining(errors.KVStoreError):
    code = "UNAVAILABLE"


class ArenaExhausted(errors.KVStoreError):
    code = "RESOURCE_EXHAUSTED"


class Backpressure(errors.KVStoreError):
    """A stream's peer sends faster than the daemon is allowed to queue."""

    code = "RESOURCE_EXHAUSTED"


CODES: dict[type, grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.StoreFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ArenaExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Backpressure: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ReadOnly: grpc.StatusCode.FAILED_PRECONDITION,
    errors.StoreLocked: grpc.StatusCode.FAILED_PRECONDITION,
    errors.DataLoss: grpc.StatusCode.DATA_LOSS,
    errors.Conflict: grpc.StatusCode.ABORTED,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    Draining: grpc.StatusCode.UNAVAILABLE,
}


def status_of(exc: BaseException) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in CODES:
            return CODES[cls]
    return grpc.StatusCode.INTERNAL


async def _abort(context, exc: Exception, name: str):
    code = status_of(exc)
    if code is grpc.StatusCode.INTERNAL:
        log.exception("%s failed", name, exc_info=exc)
        await context.abort(code, f"internal error in {name}: {exc.__class__.__name__}")
    await context.abort(code, str(exc))


def unary(fn):
    """Wrap an async unary (or client-streaming) servicer method."""

    @functools.wraps(fn)
    async def wrapper(self, request, context):
        with self.metrics.timed(fn.__name__):
            try:
                with self.admitted():
                    return await fn(self, request, context)
            except (asyncio.CancelledError, grpc.aio.AbortError):
                raise
            except Exception as exc:
                await _abort(context, exc, fn.__name__)

    return wrapper


def streaming(fn):
    """Wrap an async-generator (server-streaming) servicer method."""

    @functools.wraps(fn)
    async def wrapper(self, request, context):
        with self.metrics.timed(fn.__name__):
            try:
                with self.admitted():
                    async for msg in fn(self, request, context):
                        yield msg
            except (asyncio.CancelledError, grpc.aio.AbortError):
                raise
            except Exception as exc:
                await _abort(context, exc, fn.__name__)

    return wrapper
