"""kvikio backend: ``CuFile`` pread/pwrite into host or device buffers.

kvikio uses GPUDirect Storage when the system has it and its POSIX
compatibility mode otherwise; either way it loads the CUDA driver
(``libcuda.so.1``), even for host buffers.  ``unavailable_reason()`` tells
the backend selector whether it can run here.

In compatibility mode kvikio's POSIX reads go through the page cache, so a
host-buffer read through it is not direct, whatever was asked.  There this
backend reads and writes host buffers itself with O_DIRECT (the posix
backend, on a second descriptor of the same file) and leaves kvikio the
device buffers; a handle's ``direct`` says what its host reads really do.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from ..file_modes import FILE_MODE
from .base import FileHandle, IOBackend, check_aligned
from .posix import PosixBackend


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


def compat_mode(kvikio, cufile=None) -> bool:
    """Whether kvikio does (or, for ``cufile``, will do) its I/O through POSIX rather than cuFile.

    Asks the file first, then the library's defaults, across kvikio releases
    (``is_compat_mode_preferred``, ``compat_mode`` as a bool or a
    ``CompatMode``); when none answers, POSIX is assumed (the honest guess).
    """
    for owner, name in (
        (cufile, "is_compat_mode_preferred"),
        (kvikio.defaults, "is_compat_mode_preferred"),
        (kvikio.defaults, "compat_mode"),
    ):
        fn = getattr(owner, name, None) if owner is not None else None
        if not callable(fn):
            continue
        try:
            value = fn()
        except Exception:  # noqa: BLE001 - a release without this query: ask the next one
            continue
        if isinstance(value, bool):
            return value
        return str(getattr(value, "name", value)).rsplit(".", 1)[-1].upper() != "OFF"  # ON, or AUTO not resolved
    return True


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
        self.compat = compat_mode(kvikio)
        # compatibility mode: host buffers by O_DIRECT of our own, not kvikio's buffered POSIX
        self._host = PosixBackend(queue_depth=queue_depth, direct=direct) if self.compat else None
        # kvikio's own thread pool carries the parallelism of one pread.
        try:
            kvikio.defaults.set({"num_threads": queue_depth})
        except (AttributeError, TypeError):  # older kvikio releases
            kvikio.defaults.num_threads_reset(queue_depth)

    def open(self, path: str, *, write: bool = False) -> FileHandle:
        if write and not os.path.exists(path):  # created FILE_MODE here: kvikio's "w" would make it 0644
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, FILE_MODE))
        f = self._kvikio.CuFile(path, "r+" if write else "r")
        host = self._host.open(path, write=write) if self._host is not None else None
        direct = host.direct if host is not None else self.direct
        return FileHandle(path=path, writable=write, direct=direct, raw=(f, host))

    def pread(self, fh: FileHandle, buf, offset: int):
        f, host = fh.raw
        if host is not None and not hasattr(buf, "__cuda_array_interface__"):
            return self._host.pread(host, buf, offset)
        if fh.direct and not hasattr(buf, "__cuda_array_interface__"):
            check_aligned(buf, offset)
        n = _nbytes(buf)
        return _Future(f.pread(_as_array(buf), n, offset), n)

    def pwrite(self, fh: FileHandle, buf, offset: int):
        if not fh.writable:
            raise ValueError(f"{fh.path} is not open for writing")
        f, host = fh.raw
        if host is not None and not hasattr(buf, "__cuda_array_interface__"):
            return self._host.pwrite(host, buf, offset)
        if fh.direct and not hasattr(buf, "__cuda_array_interface__"):
            check_aligned(buf, offset)
        n = _nbytes(buf)
        return _Future(f.pwrite(_as_array(buf), n, offset), n)

    def fdatasync(self, fh: FileHandle) -> None:
        f, host = fh.raw
        if host is not None:
            self._host.fdatasync(host)
        os.fdatasync(f.fileno())

    def allocate(self, fh: FileHandle, nbytes: int) -> None:
        if nbytes > 0:
            os.posix_fallocate(fh.raw[0].fileno(), 0, nbytes)

    def close(self, fh: FileHandle) -> None:
        f, host = fh.raw
        f.close()
        if host is not None:
            self._host.close(host)

    def shutdown(self) -> None:
        if self._host is not None:
            self._host.shutdown()
