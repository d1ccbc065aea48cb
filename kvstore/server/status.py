"""Domain errors to gRPC status codes, in one place.

Servicer methods are wrapped with ``unary`` or ``streaming``; a known domain
error becomes its status code with the store's message (which names the
field for INVALID_ARGUMENT); anything else is INTERNAL with a log line.

A request body that does not parse never reaches grpc as an exception (grpc
would answer UNKNOWN, or INTERNAL with a traceback from inside a stream):
services are registered with ``add_service``, whose deserializers turn it
into a ``BadBody`` marker that the wrappers answer with INVALID_ARGUMENT.
"""

from __future__ import annotations

import asyncio
import functools
import logging

import grpc

from ..contract import errors

log = logging.getLogger(__name__)


class Draining(errors.KVStoreError):
    code = "UNAVAILABLE"


class ArenaExhausted(errors.KVStoreError):
    code = "RESOURCE_EXHAUSTED"


class PutStalled(errors.KVStoreError):
    """A put sent nothing for put_idle_seconds: its reservation goes back."""

    code = "DEADLINE_EXCEEDED"


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
    PutStalled: grpc.StatusCode.DEADLINE_EXCEEDED,
}


class BadBody:
    """Stands in for a request message whose bytes did not parse."""

    def __init__(self, message_name: str, nbytes: int, reason: str):
        self.error = errors.InvalidArgument("request", f"body of {nbytes} bytes does not parse as {message_name}: {reason}")


def _lenient(method: str, from_string):
    message_name = from_string.__self__.DESCRIPTOR.full_name  # FromString is the message class's

    def parse(data: bytes):
        try:
            return from_string(data)
        except Exception as exc:  # noqa: BLE001 - DecodeError, or whatever else the parser raises: never to grpc
            return BadBody(message_name, len(data), exc.__class__.__name__)  # refused (and logged) by the wrapper

    return parse


class _Registrar:
    """Stands in for the server while a generated ``add_*_to_server`` runs."""

    def __init__(self, server):
        self.server = server
        self.registered = False

    def add_generic_rpc_handlers(self, handlers) -> None:
        pass  # the same handlers arrive by name in add_registered_method_handlers

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        handlers = {
            name: h._replace(request_deserializer=_lenient(f"{service}/{name}", h.request_deserializer)) for name, h in handlers.items()
        }
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
        self.server.add_registered_method_handlers(service, handlers)
        self.registered = True


def add_service(add_to_server, servicer, server) -> None:
    """``add_to_server(servicer, server)`` (generated), with request bodies that fail to parse kept as ``BadBody``."""
    registrar = _Registrar(server)
    add_to_server(servicer, registrar)
    if not registrar.registered:
        raise RuntimeError(f"{add_to_server.__name__} registered no method handlers")


def _checked(request):
    """The request, or its messages one by one; a ``BadBody`` raises INVALID_ARGUMENT."""
    if isinstance(request, BadBody):
        raise request.error
    if not hasattr(request, "__aiter__"):
        return request

    async def messages():
        async for msg in request:
            if isinstance(msg, BadBody):
                raise msg.error
            yield msg

    return messages()


def status_of(exc: BaseException) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in CODES:
            return CODES[cls]
    return grpc.StatusCode.INTERNAL


async def _abort(context, exc: Exception, name: str, call) -> None:
    """Answer ``exc`` with its status code; one log line per refused call."""
    code = status_of(exc)
    call.code = code.name
    if code is grpc.StatusCode.INTERNAL:
        log.exception("%s failed", name, exc_info=exc)
        await context.abort(code, f"internal error in {name}: {exc.__class__.__name__}")
    field = getattr(exc, "field", None) or "-"
    log.warning("refused %s: code=%s field=%s: %s", name, code.name, field, exc)
    await context.abort(code, str(exc))


def _ended(call, context, exc: BaseException) -> None:
    """The code of a call that ended by cancellation or by an abort from inside the method."""
    if isinstance(exc, asyncio.CancelledError):
        call.code = "CANCELLED"
    elif call.code == "OK":
        code = context.code() if hasattr(context, "code") else None
        call.code = getattr(code, "name", None) or "UNKNOWN"


def unary(fn):
    """Wrap an async unary (or client-streaming) servicer method."""

    @functools.wraps(fn)
    async def wrapper(self, request, context):
        with self.metrics.timed(fn.__name__) as call:
            try:
                with self.admitted():
                    return await fn(self, _checked(request), context)
            except (asyncio.CancelledError, grpc.aio.AbortError) as exc:
                _ended(call, context, exc)
                raise
            except Exception as exc:
                await _abort(context, exc, fn.__name__, call)

    return wrapper


def streaming(fn):
    """Wrap an async-generator (server-streaming) servicer method."""

    @functools.wraps(fn)
    async def wrapper(self, request, context):
        with self.metrics.timed(fn.__name__) as call:
            try:
                with self.admitted():
                    async for msg in fn(self, _checked(request), context):
                        yield msg
            except (asyncio.CancelledError, grpc.aio.AbortError) as exc:
                _ended(call, context, exc)
                raise
            except Exception as exc:
                await _abort(context, exc, fn.__name__, call)

    return wrapper
