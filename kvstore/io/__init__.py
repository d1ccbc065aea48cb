"""I/O backends and their selection.

``make_backend("auto")`` picks kvikio when a CUDA driver and kvikio are both
present, else the POSIX O_DIRECT thread pool, and logs which and why.
``uring`` (batched io_uring submission) is chosen by name; where the kernel
refuses it (a ring is set up and does a tiny read, once per process) asking
for it is an error naming why.
"""

from __future__ import annotations

import logging

from ..contract.errors import BackendUnavailable, InvalidArgument
from .base import FileHandle, IOBackend, IOFuture, KeptBuffers, aligned_buffer, check_aligned
from .posix import PosixBackend

log = logging.getLogger(__name__)

BACKENDS = ("auto", "posix", "uring", "kvikio")

__all__ = [
    "BACKENDS",
    "FileHandle",
    "IOBackend",
    "IOFuture",
    "PosixBackend",
    "KeptBuffers",
    "aligned_buffer",
    "check_aligned",
    "make_backend",
    "resolve_backend",
]


def resolve_backend(name: str = "auto") -> tuple[str, list[str]]:
    """The backend ``make_backend(name)`` builds, and why the ones before it were skipped.

    Raises InvalidArgument for an unknown name, BackendUnavailable when the
    named backend (not ``auto``) cannot run here.
    """
    if name not in BACKENDS:
        raise InvalidArgument("backend", f"must be one of {BACKENDS}, got {name!r}")
    if name == "posix":
        return "posix", []
    if name == "uring":
        # Chosen by name only: measured against fio it saves CPU per small
        # read but, with a core busy, its one ring thread falls to 0.36-0.52
        # of fio at 32 KiB where posix's threads hold 0.95-1.22 (README).
        from .uring import unavailable_reason

        reason = unavailable_reason()
        if reason is not None:
            raise BackendUnavailable(f"backend 'uring' was requested but cannot run: {reason}")
        return "uring", []
    from .kvikio_backend import unavailable_reason

    reason = unavailable_reason()
    if reason is None:
        return "kvikio", []
    if name == "kvikio":
        raise BackendUnavailable(f"backend 'kvikio' was requested but cannot run: {reason}")
    return "posix", [f"kvikio skipped: {reason}"]


def make_backend(name: str = "auto", *, queue_depth: int = 16, direct: bool = True) -> IOBackend:
    """Build the named backend; ``auto`` takes the first that runs here, with a log line."""
    chosen, skipped = resolve_backend(name)
    why = "forced" if name != "auto" else "; ".join(skipped) or "first choice"
    if chosen == "kvikio":
        from .kvikio_backend import KvikioBackend

        log.info("I/O backend: kvikio (CuFile), queue depth %d; %s", queue_depth, why)
        return KvikioBackend(queue_depth=queue_depth, direct=direct)
    if chosen == "uring":
        from .uring import UringBackend

        log.info("I/O backend: uring (io_uring, batched submission, queue depth %d); %s", queue_depth, why)
        return UringBackend(queue_depth=queue_depth, direct=direct)
    log.info("I/O backend: posix (O_DIRECT preadv/pwritev, queue depth %d); %s", queue_depth, why)
    return PosixBackend(queue_depth=queue_depth, direct=direct)
