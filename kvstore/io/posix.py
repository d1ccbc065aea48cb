"""POSIX backend: O_DIRECT ``preadv``/``pwritev`` on a thread pool.

``os.preadv`` releases the GIL, so ``queue_depth`` worker threads keep that
many requests in flight at the device, like fio's ``psync`` engine with as
many jobs.  Short reads and writes are continued until done.
"""

from __future__ import annotations

import errno
import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor

from .base import FileHandle, IOBackend, check_aligned

log = logging.getLogger(__name__)


def _direct_supported(path: str) -> bool:
    directory = os.path.dirname(os.path.abspath(path)) or "."
    probe = os.path.join(directory, f".odirect-probe-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o600)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    os.close(fd)
    os.unlink(probe)
    return True


class PosixBackend(IOBackend):
    name = "posix"

    def __init__(self, *, queue_depth: int = 16, direct: bool = True):
        if queue_depth < 1:
            raise ValueError("queue_depth must be >= 1")
        self.queue_depth = queue_depth
        self.direct = direct
        self._pool = ThreadPoolExecutor(max_workers=queue_depth, thread_name_prefix="kvstore-io")
        self._direct_checked: dict[str, bool] = {}

    def _use_direct(self, path: str) -> bool:
        if not self.direct:
            return False
        directory = os.path.dirname(os.path.abspath(path))
        ok = self._direct_checked.get(directory)
        if ok is None:
            ok = self._direct_checked[directory] = _direct_supported(path)
            if not ok:
                log.warning("file system under %s refuses O_DIRECT; using buffered I/O there", directory)
        return ok

    def open(self, path: str, *, write: bool = False) -> FileHandle:
        direct = self._use_direct(path)
        flags = (os.O_RDWR | os.O_CREAT) if write else os.O_RDONLY
        if direct:
            flags |= os.O_DIRECT
        fd = os.open(path, flags | os.O_CLOEXEC, 0o640)
        return FileHandle(path=path, writable=write, direct=direct, raw=fd)

    def pread(self, fh: FileHandle, buf, offset: int) -> Future:
        if fh.direct:
            check_aligned(buf, offset)
        return self._pool.submit(_pread_full, fh.raw, buf, offset)

    def pwrite(self, fh: FileHandle, buf, offset: int) -> Future:
        if not fh.writable:
            raise ValueError(f"{fh.path} is not open for writing")
        if fh.direct:
            check_aligned(buf, offset)
        return self._pool.submit(_pwrite_full, fh.raw, buf, offset)

    def fdatasync(self, fh: FileHandle) -> None:
        os.fdatasync(fh.raw)

    def allocate(self, fh: FileHandle, nbytes: int) -> None:
        if nbytes > 0:
            os.posix_fallocate(fh.raw, 0, nbytes)

    def close(self, fh: FileHandle) -> None:
        os.close(fh.raw)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


def _pread_full(fd: int, buf, offset: int) -> int:
    view = memoryview(buf).cast("B")
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise EOFError(f"read past end of file at offset {offset + done}")
        done += n
    return done


def _pwrite_full(fd: int, buf, offset: int) -> int:
    view = memoryview(buf).cast("B")
    done = 0
    while done < len(view):
        n = os.pwritev(fd, [view[done:]], offset + done)
        if n == 0:  # pragma: no cover - the kernel reports ENOSPC instead
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        done += n
    return done
