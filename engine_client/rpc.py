"""How every call reaches the daemon: one error type and one retry policy.

Errors: every call raises ``KVStoreRpcError`` (never a raw ``grpc.RpcError``),
with ``code`` the ``grpc.StatusCode`` and ``message`` the daemon's text
(``except KVStoreRpcError as e: if e.code == grpc.StatusCode.NOT_FOUND``).

Retries: what the daemon says is worth retrying, ``UNAVAILABLE`` (it is
draining, or not reachable yet) and ``ABORTED`` (a concurrent delete or put
conflicted), is retried with exponential backoff and jitter:

- unary and server-streaming calls (every call but ``PutPrefix``,
  ``PutPages`` and ``Prefetch``) by gRPC's own retry policy
  (``RETRY_POLICY``): up to 5 attempts, backoff 0.05 s doubling to at most
  2 s, randomized by gRPC.  gRPC retries a server stream only until its
  first response arrives, so a read is never replayed half way.  A retried
  ``ReportAttention`` whose first attempt did run counts twice (scores are
  advisory).
- ``put_prefix`` restarts from scratch (a fresh Lookup, then the stream),
  up to ``PUT_ATTEMPTS`` times with the same backoff: a client stream that
  has sent data cannot be replayed by gRPC; so does ``put_pages`` (a fresh
  PagesExist, then the stream).
- ``Prefetch`` (a bidirectional stream that has sent its sets) is not retried.
"""

from __future__ import annotations

import json
import random

import grpc

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

    @classmethod
    def of(cls, exc: grpc.RpcError) -> KVStoreRpcError:
        return cls(exc.code(), exc.details() or "")


def call(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, its failure as KVStoreRpcError."""
    try:
        return fn(*args, **kwargs)
    except grpc.RpcError as exc:
        raise KVStoreRpcError.of(exc) from None


def stream(fn, *args, **kwargs):
    """The messages of a server-streaming call, its failure as KVStoreRpcError."""
    try:
        yield from fn(*args, **kwargs)
    except grpc.RpcError as exc:
        raise KVStoreRpcError.of(exc) from None


def retryable(exc: KVStoreRpcError) -> bool:
    return exc.code.name in RETRYABLE


def backoff(attempt: int) -> float:
    """Seconds before retry ``attempt`` (1, 2, ...): RETRY_POLICY's schedule, full jitter."""
    return random.uniform(0, min(2.0, 0.05 * 2 ** (attempt - 1)))
