"""Open segment files, shared by readers, closed and removed only when idle.

A deleted segment's file is unlinked once its index entry is gone, but its
descriptor stays open until the last reader that acquired it releases it:
closing earlier could let the descriptor number be reused under a read in
flight.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass

from .io import FileHandle, IOBackend


def segment_file_name(segment_id: int) -> str:
    return f"seg-{segment_id:016x}.kvs"


def parse_segment_file_name(name: str) -> int | None:
    if name.startswith("seg-") and name.endswith(".kvs") and len(name) == 24:
        try:
            return int(name[4:20], 16)
        except ValueError:
            return None
    return None


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

    def path(self, segment_id: int) -> str:
        return os.path.join(self.directory, segment_file_name(segment_id))

    @contextmanager
    def reading(self, segment_id: int):
        """Yield a read handle of the segment, held open for the block."""
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
