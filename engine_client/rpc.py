"""How every call reaches the daemon: one error type, retries in the client, deadlines kept, fast reconnects.

Errors: every call raises ``KVStoreRpcError`` (never a raw ``grpc.RpcError``),
with ``code`` the ``grpc.StatusCode`` and ``message`` the daemon's text
(``except KVStoreRpcError as e: if e.code == grpc.StatusCode.NOT_FOUND``).

Retries: what the daemon says is worth retrying, ``UNAVAILABLE`` (it is
draining, or not reachable yet) and ``ABORTED`` (a concurrent delete or put
conflicted), is retried here, never by gRPC, up to ``MAX_ATTEMPTS`` with
exponential backoff (``backoff``: 0.05 s doubling to at most 2 s, full
jitter), each attempt with what is left of the call's deadline and none
begun that its backoff would push past it (the last failure is raised):

- unary calls by ``call``.  A retried ``ReportAttention`` whose first
  attempt did run counts twice (scores are advisory).
- server-streaming calls (``ReadChunks``, ``GetSummaries``, ``GetProbeKeys``,
  ``GetPages``: every ``returns (stream ...)`` RPC) by ``RetriedStream``,
  only until the first message arrives, so a read is never replayed half way.
- ``put_prefix`` restarts from scratch (a fresh Lookup, then the stream),
  up to ``PUT_ATTEMPTS`` times with the same backoff: a client stream that
  has sent data cannot be replayed; so does ``put_pages`` (a fresh
  PagesExist, then the stream).  ``call`` does not retry a client stream.
- ``Prefetch`` (a bidirectional stream that has sent its sets) is not retried.

gRPC's own retries are off (``grpc.enable_retries`` 0).  With its retry
policy on server streams, grpcio 1.85 left reads blocked in ``for msg in
call`` for minutes past their deadline in most runs where the daemon
stopped under them; with the policy off for streams but retries still on
for the channel, in about one stop in thirty (the call failed at connect:
its status was set, its receive operations never completed, so neither its
deadline nor a cancel woke the reader).  Without gRPC's retry machinery no
call has outlived its deadline (``tests/integration/test_client_recovery.py``).

Reconnecting: the channel (``CHANNEL_OPTIONS``) tries a lost daemon again
after 0.1 s, backing off to at most 0.5 s, so a restarted daemon is reached
within a second; each client has its own subchannels, so a new client does
not inherit a connection left in backoff by another.
"""

from __future__ import annotations

import math
import random
import threading
import time

import grpc

RETRYABLE = ("UNAVAILABLE", "ABORTED")
MAX_ATTEMPTS = 5
PUT_ATTEMPTS = 5
CHANNEL_OPTIONS = (
    ("grpc.enable_retries", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
    ("grpc.use_local_subchannel_pool", 1),
)


def open_channel(grpc_module, target: str, *, root_certificates=None, client_cert=None):
    """A channel to ``target`` for either client: ``grpc_module`` is ``grpc`` or ``grpc.aio``; messages up to
    the contract's limit, the reconnect and retry settings above, TLS when a CA or a client certificate is given."""
    from kvstore.contract import MAX_MESSAGE_BYTES

    opts = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.max_send_message_length", MAX_MESSAGE_BYTES), *CHANNEL_OPTIONS]
    if root_certificates is None and client_cert is None:
        return grpc_module.insecure_channel(target, options=opts)
    key, chain = client_cert if client_cert else (None, None)
    return grpc_module.secure_channel(target, grpc.ssl_channel_credentials(root_certificates, key, chain), options=opts)


def check_positive(**values) -> None:
    """ValueError naming the first value that is not a positive finite number."""
    for name, value in values.items():
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive number, got {value!r}")


class KVStoreRpcError(Exception):
    """A failed call: ``code`` is the grpc.StatusCode, ``message`` the daemon's text."""

    def __init__(self, code: grpc.StatusCode, message: str):
        self.code = code
        self.message = message
        super().__init__(f"{code.name}: {message}")

    @classmethod
    def of(cls, exc: grpc.RpcError) -> KVStoreRpcError:
        return cls(exc.code(), exc.details() or "")


def call(fn, request, *, timeout: float | None = None, metadata=None):
    """``fn(request)``, its failure as KVStoreRpcError; a unary call is retried (not a client stream)."""
    if isinstance(fn, grpc.StreamUnaryMultiCallable):
        return _once(fn, request, timeout, metadata)
    deadline = None if timeout is None else time.monotonic() + timeout
    attempt = 1
    while True:
        try:
            return _once(fn, request, None if deadline is None else max(deadline - time.monotonic(), 0.001), metadata)
        except KVStoreRpcError as exc:
            delay = retry_delay(exc.code, attempt, deadline)
            if delay is None:
                raise
        time.sleep(delay)
        attempt += 1


def _once(fn, request, timeout: float | None, metadata):
    try:
        return fn(request, timeout=timeout, metadata=metadata)
    except grpc.RpcError as exc:
        raise KVStoreRpcError.of(exc) from None


def stream(fn, request, *, timeout: float, metadata=None):
    """The messages of a server-streaming call (retried as ``RetriedStream``), its failure as KVStoreRpcError."""
    responses = RetriedStream(fn, request, timeout=timeout, metadata=metadata)
    try:
        yield from responses
    except grpc.RpcError as exc:
        raise KVStoreRpcError.of(exc) from None
    finally:
        responses.cancel()  # a no-op once it ended; else the caller stopped early


def retryable(exc: KVStoreRpcError) -> bool:
    return exc.code.name in RETRYABLE


def backoff(attempt: int) -> float:
    """Seconds before retry ``attempt`` (1, 2, ...): 0.05 s doubling to at most 2 s, full jitter."""
    return random.uniform(0, min(2.0, 0.05 * 2 ** (attempt - 1)))


def retry_delay(code: grpc.StatusCode, attempt: int, deadline: float | None) -> float | None:
    """The backoff before retrying a failure ``code`` after ``attempt`` attempts; None: no retry."""
    if code.name not in RETRYABLE or attempt >= MAX_ATTEMPTS:
        return None
    delay = backoff(attempt)
    if deadline is not None and time.monotonic() + delay >= deadline:
        return None
    return delay


class RetriedStream:
    """A server-streaming call, started again while none of its messages has arrived.

    An iterator over the messages, as the call gRPC returns (it raises
    ``grpc.RpcError``), with ``cancel()``.  An attempt that fails retryably
    before its first message is followed, after ``backoff``, by a fresh one
    with what is left of the deadline, as ``call`` retries.  Once a message,
    the end or an error has come out, the iterator only follows that attempt
    (iterating again after an error raises it again).
    """

    def __init__(self, fn, request, *, timeout: float, metadata=None):
        self._fn, self._request, self._metadata = fn, request, metadata
        self._deadline = time.monotonic() + timeout
        self._attempt = 0
        self._committed = False
        self._cancelled = threading.Event()
        self._call = self._start()

    def _start(self):
        self._attempt += 1
        return self._fn(self._request, timeout=max(self._deadline - time.monotonic(), 0.001), metadata=self._metadata)

    def __iter__(self):
        return self

    def __next__(self):
        while not self._committed:
            try:
                msg = next(self._call)
            except grpc.RpcError as exc:
                delay = None if self._cancelled.is_set() else retry_delay(exc.code(), self._attempt, self._deadline)
                if delay is not None and not self._cancelled.wait(delay):
                    self._call = self._start()
                    if self._cancelled.is_set():  # cancelled while it started
                        self._call.cancel()
                    continue
                self._committed = True
                raise
            except StopIteration:
                self._committed = True
                raise
            self._committed = True
            return msg
        return next(self._call)

    def cancel(self) -> None:
        """Cancel the attempt under way; no other is started."""
        self._cancelled.set()
        self._call.cancel()
