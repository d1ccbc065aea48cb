"""I/O backends and their selection.

``make_backend("auto")`` picks kvikio when a CUDA driver and kvikio are both
present, else the POSIX O_DIRECT backend, and logs which and why.
"""

from __future__ import annotations

import logging

from ..errors import BackendUnavailable, InvalidArgument
from .base import FileHandle, IOBackend, IOFuture, aligned_buffer, check_aligned
from .posix import PosixBackend

log = logging.getLogger(__name__)

BACKENDS = ("auto", "posix", "kvikio")

__all__ = [
    "BACKENDS",
    "FileHandle",
    "IOBackend",
    "IOFuture",
    "PosixBackend",
    "aligned_buffer",
    "check_aligned",
    "make_backend",
]


def make_backend(name: str = "auto", *, queue_depth: int = 16, direct: bool = True) -> IOBackend:
    """Build the named backend; ``auto`` falls back to posix with a log line."""
    if name not in BACKENDS:
        raise InvalidArgument("backend", f"must be one of {BACKENDS}, got {name!r}")
    if name in ("auto", "kvikio"):
        from .kvikio_backend import KvikioBackend, unavailable_reason

        reason = unavailable_reason()
        if reason is None:
            log.info("I/O backend: kvikio (CuFile), queue depth %d", queue_depth)
            return KvikioBackend(queue_depth=queue_depth, direct=direct)
        if name == "kvikio":
            raise BackendUnavailable(f"backend 'kvikio' was requested but cannot run: {reason}")
        log.info("I/O backend: posix (O_DIRECT preadv/pwritev, queue depth %d); kvikio skipped: %s", queue_depth, reason)
    else:
        log.info("I/O backend: posix (forced), queue depth %d", queue_depth)
    return PosixBackend(queue_depth=queue_depth, direct=direct)
