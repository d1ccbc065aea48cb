"""Open segment files, shared by readers, closed and removed only when idle.

A deleted segment's file is unlinked once its index entry is gone, but its
descriptor stays open until the last reader that acquired it releases it:
closing earlier could let the descriptor number be reused under a read in
flight.

A segment whose file is still being written can be read from memory
instead (``serve_from_memory``: a fill from the remote tier, shown to
reads while its write runs behind it, ``store/fill_behind.py``);
every read goes through ``pread`` so it finds either source.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass

from .io import FileHandle, IOBackend
from .io.future import Future


def segment_file_name(segment_id: int) -> str:
    return f"seg-{segment_id:016x}.kvs"


def parse_segment_file_name(name: str) -> int | None:
    if name.startswith("seg-") and name.endswith(".kvs") and len(name) == 24:
        try:
            return int(name[4:20], 16)
        except ValueError:
            return None
    return None


@dataclass(eq=False)
class MemorySegment:
    """A read handle on a segment image held in memory (its bytes from offset 0, as the file will hold them)."""

    segment_id: int
    buffer: memoryview
    readers: int = 0  # ``reading`` blocks holding it now


@dataclass
class _Entry:
    handle: FileHandle
    readers: int = 0
    doomed: bool = False


class SegmentFiles:
    def __init__(self, directory: str, backend: IOBackend, *, max_open: int = 512):
        self.directory = directory
        self.backend = backend
        self.max_open = max_open
        self._lock = threading.Lock()
        self._open: dict[int, _Entry] = {}
        self._memory: dict[int, MemorySegment] = {}

    def path(self, segment_id: int) -> str:
        return os.path.join(self.directory, segment_file_name(segment_id))

    def serve_from_memory(self, segment_id: int, buffer) -> MemorySegment:
        """Reads of ``segment_id`` come from ``buffer`` (the segment's image) until ``stop_serving_from_memory``."""
        memory = MemorySegment(segment_id, memoryview(buffer).cast("B"))
        with self._lock:
            self._memory[segment_id] = memory
        return memory

    def released(self, memory: MemorySegment) -> bool:
        """Whether no read can touch ``memory``'s buffer any more: no longer served, and no reader holds it."""
        with self._lock:
            return self._memory.get(memory.segment_id) is not memory and memory.readers == 0

    def stop_serving_from_memory(self, segment_id: int) -> None:
        """Reads of ``segment_id`` go to its file again (a reader that took the memory handle keeps it)."""
        with self._lock:
            self._memory.pop(segment_id, None)

    def pread(self, handle, buf, offset: int):
        """``backend.pread`` on a file handle; a copy, completed at once, from a segment served from memory."""
        if not isinstance(handle, MemorySegment):
            return self.backend.pread(handle, buf, offset)
        dst = memoryview(buf).cast("B")
        n = dst.nbytes
        if offset + n > handle.buffer.nbytes:
            return Future.finished(None, EOFError(f"segment {handle.segment_id}: read of {n} bytes at {offset} past its end"))
        dst[:] = handle.buffer[offset : offset + n]
        return Future.finished(n)

    @contextmanager
    def reading(self, segment_id: int):
        """Yield a read handle of the segment, held open for the block (``pread`` reads through it)."""
        with self._lock:
            memory = self._memory.get(segment_id)
            if memory is not None:
                memory.readers += 1
        if memory is not None:
            try:
                yield memory
            finally:
                with self._lock:
                    memory.readers -= 1
            return
        with self._lock:
            entry = self._open.get(segment_id)
            if entry is None:
                self._trim_locked()
                entry = self._open[segment_id] = _Entry(self.backend.open(self.path(segment_id)))
            entry.readers += 1
        try:
            yield entry.handle
        finally:
            with self._lock:
                entry.readers -= 1
                if entry.doomed and entry.readers == 0:
                    self._open.pop(segment_id, None)
                    self.backend.close(entry.handle)

    def remove(self, segment_id: int) -> None:
        """Unlink the file now; close its descriptor after the last reader."""
        with self._lock:
            entry = self._open.get(segment_id)
            if entry is not None:
                if entry.readers == 0:
                    del self._open[segment_id]
                    self.backend.close(entry.handle)
                else:
                    entry.doomed = True
        try:
            os.unlink(self.path(segment_id))
        except FileNotFoundError:
            pass

    def _trim_locked(self) -> None:
        if len(self._open) < self.max_open:
            return
        for seg_id, entry in list(self._open.items()):
            if entry.readers == 0:
                del self._open[seg_id]
                self.backend.close(entry.handle)
                if len(self._open) < self.max_open // 2:
                    return

    def close_all(self) -> None:
        with self._lock:
            for entry in self._open.values():
                self.backend.close(entry.handle)
            self._open.clear()
