"""kvikio backend: ``CuFile`` pread/pwrite into host or device buffers.

kvikio uses GPUDirect Storage when the system has it and its POSIX
compatibility mode otherwise; either way it loads the CUDA driver
(``libcuda.so.1``), even for host buffers.  ``unavailable_reason()`` tells
the backend selector whether it can run here.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from ..file_modes import FILE_MODE
from .base import FileHandle, IOBackend, check_aligned


def unavailable_reason() -> str | None:
    """None when kvikio can run on this machine, else why not."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no CUDA driver (libcuda.so.1 not found)"
    try:
        import kvikio  # noqa: F401
    except Exception as exc:  # ImportError, or a driver/runtime mismatch at import
        return f"kvikio is not importable ({exc.__class__.__name__}: {exc}); install the [gds] extra"
    return None


class _Future:
    """Adapts kvikio's ``IOFuture`` (``get``/``done``) to ``result``/``done``."""

    __slots__ = ("_fut", "_expected")

    def __init__(self, fut, expected: int):
        self._fut = fut
        self._expected = expected

    def result(self, timeout: float | None = None) -> int:
        n = self._fut.get()
        if n != self._expected:
            raise EOFError(f"kvikio moved {n} of {self._expected} bytes")
        return n

    def done(self) -> bool:
        return self._fut.done()


def _as_array(buf):
    """kvikio takes array-likes: numpy or any __cuda_array_interface__ object."""
    if hasattr(buf, "__cuda_array_interface__") or isinstance(buf, np.ndarray):
        return buf
    return np.frombuffer(buf, dtype=np.uint8)


def _nbytes(buf) -> int:
    if hasattr(buf, "nbytes"):
        return int(buf.nbytes)
    return memoryview(buf).nbytes


class KvikioBackend(IOBackend):
    name = "kvikio"

    def __init__(self, *, queue_depth: int = 16, direct: bool = True):
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"kvikio backend unavailable: {reason}")
        import kvikio
        import kvikio.defaults

        self._kvikio = kvikio
        self.queue_depth = queue_depth
        self.direct = direct
        # kvikio's own thread pool carries the parallelism of one pread.
        try:
            kvikio.defaults.set({"num_threads": queue_depth})
        except (AttributeError, TypeError):  # older kvikio releases
            kvikio.defaults.num_threads_reset(queue_depth)

    def open(self, path: str, *, write: bool = False) -> FileHandle:
        if write and not os.path.exists(path):  # created FILE_MODE here: kvikio's "w" would make it 0644
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, FILE_MODE))
        f = self._kvikio.CuFile(path, "r+" if write else "r")
        return FileHandle(path=path, writable=write, direct=self.direct, raw=f)

    def pread(self, fh: FileHandle, buf, offset: int) -> _Future:
        if fh.direct and not hasattr(buf, "__cuda_array_interface__"):
            check_aligned(buf, offset)
        n = _nbytes(buf)
        return _Future(fh.raw.pread(_as_array(buf), n, offset), n)

    def pwrite(self, fh: FileHandle, buf, offset: int) -> _Future:
        if not fh.writable:
            raise ValueError(f"{fh.path} is not open for writing")
        if fh.direct and not hasattr(buf, "__cuda_array_interface__"):
            check_aligned(buf, offset)
        n = _nbytes(buf)
        return _Future(fh.raw.pwrite(_as_array(buf), n, offset), n)

    def fdatasync(self, fh: FileHandle) -> None:
        os.fdatasync(fh.raw.fileno())

    def allocate(self, fh: FileHandle, nbytes: int) -> None:
        if nbytes > 0:
            os.posix_fallocate(fh.raw.fileno(), 0, nbytes)

    def close(self, fh: FileHandle) -> None:
        fh.raw.close()
