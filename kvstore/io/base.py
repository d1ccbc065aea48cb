"""The I/O backend interface: positional reads and writes that return futures.

Alignment: with ``direct=True`` every buffer address, file offset and length
passed to ``pread``/``pwrite`` must be a multiple of ``ALIGN_BYTES`` (4 KiB);
backends check it and raise ``ValueError`` rather than let the kernel fail
with EINVAL.  ``aligned_buffer`` returns memory that satisfies it.
"""

from __future__ import annotations

import abc
import ctypes
import mmap
import threading
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..contract.geometry import ALIGN_BYTES


class IOFuture(Protocol):
    """What a backend returns: ``result()`` blocks and returns bytes moved."""

    def result(self, timeout: float | None = None) -> int: ...

    def done(self) -> bool: ...


@dataclass
class FileHandle:
    path: str
    writable: bool
    direct: bool
    raw: object  # backend-specific (an fd, a kvikio CuFile)


_POPULATE = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)


def aligned_buffer(nbytes: int) -> memoryview:
    """Writable, zero-filled, page-aligned host memory of ``nbytes`` bytes.

    Its pages are populated up front (``MAP_POPULATE``): every caller fills the
    whole buffer, and one bulk fault costs about half of a fault per 4 KiB page
    (12 MiB copied into it: 4.6-6.6 ms against 11.5 ms on the development VM).
    """
    if nbytes <= 0:
        return memoryview(bytearray(0))
    return memoryview(mmap.mmap(-1, nbytes, flags=_POPULATE))


class KeptBuffers:
    """``aligned_buffer``s kept for reuse, by size, up to ``max_bytes`` in all.

    A fresh 12 MiB buffer costs about 4.4 ms to populate on the development VM;
    a kept one is zeroed in about 0.2 ms.  ``take`` returns one as
    ``aligned_buffer`` would (zero-filled); ``give`` hands back a buffer no one
    reads or writes any more.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._kept: dict[int, list[memoryview]] = {}
        self._bytes = 0

    @property
    def kept_bytes(self) -> int:
        return self._bytes

    def take(self, nbytes: int) -> memoryview:
        with self._lock:
            stack = self._kept.get(nbytes)
            buf = stack.pop() if stack else None
            if buf is not None:
                self._bytes -= nbytes
        if buf is None:
            return aligned_buffer(nbytes)
        np.frombuffer(buf, dtype=np.uint8).fill(0)
        return buf

    def give(self, buf: memoryview) -> bool:
        """Keep ``buf`` for a later ``take`` of its size (False: over ``max_bytes``, left to be freed)."""
        n = buf.nbytes
        with self._lock:
            if n == 0 or self._bytes + n > self.max_bytes:
                return False
            self._kept.setdefault(n, []).append(buf)
            self._bytes += n
        return True


_c_char_from_buffer = ctypes.c_char.from_buffer
_addressof = ctypes.addressof


def buffer_address(buf) -> int:
    """Address of the first byte of ``buf`` (0 when empty).

    ctypes reads it from the buffer protocol in ~0.3 us for writable buffers
    (numpy's ``.ctypes.data`` takes ~3 us); read-only ones go through numpy.
    """
    try:
        return _addressof(_c_char_from_buffer(buf))
    except (TypeError, ValueError):  # read-only, empty, or not one contiguous block
        pass
    if not memoryview(buf).nbytes:
        return 0
    return np.frombuffer(buf, dtype=np.uint8).ctypes.data


def aligned_nbytes(buf, offset: int) -> int:
    """``check_aligned``, returning the byte length of ``buf``."""
    nbytes = memoryview(buf).nbytes
    if offset % ALIGN_BYTES or nbytes % ALIGN_BYTES or (nbytes and buffer_address(buf) % ALIGN_BYTES):
        raise ValueError(
            f"direct I/O needs {ALIGN_BYTES}-byte aligned offset, length and buffer "
            f"(offset={offset}, length={nbytes}, address%{ALIGN_BYTES}={buffer_address(buf) % ALIGN_BYTES})"
        )
    return nbytes


def check_aligned(buf, offset: int) -> None:
    """Raise ValueError unless ``buf`` and ``offset`` meet the O_DIRECT rules."""
    aligned_nbytes(buf, offset)


class IOBackend(abc.ABC):
    """Positional file I/O with a bounded number of requests in flight."""

    name: str

    @abc.abstractmethod
    def open(self, path: str, *, write: bool = False) -> FileHandle:
        """Open ``path`` (created if ``write``); direct I/O when configured."""

    @abc.abstractmethod
    def pread(self, fh: FileHandle, buf, offset: int) -> IOFuture:
        """Fill all of ``buf`` from ``offset``; a short file raises EOFError."""

    @abc.abstractmethod
    def pwrite(self, fh: FileHandle, buf, offset: int) -> IOFuture:
        """Write all of ``buf`` at ``offset``."""

    @abc.abstractmethod
    def fdatasync(self, fh: FileHandle) -> None:
        """Make written data durable; raises OSError when the device failed."""

    @abc.abstractmethod
    def close(self, fh: FileHandle) -> None: ...

    def allocate(self, fh: FileHandle, nbytes: int) -> None:
        """Reserve ``nbytes`` of space for ``fh`` up front (ENOSPC early)."""

    def shutdown(self) -> None:
        """Release threads and driver resources."""

    def pread_sync(self, fh: FileHandle, buf, offset: int) -> int:
        return self.pread(fh, buf, offset).result()

    def pwrite_sync(self, fh: FileHandle, buf, offset: int) -> int:
        return self.pwrite(fh, buf, offset).result()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
