"""LMDB index of the chunk store: manifests, segments and chunk references.

Databases (keys are raw bytes, values JSON):

* ``manifests``: prefix id (32 bytes) -> manifest of one stored prefix
* ``segments``: segment id (8 bytes, big-endian) -> segment record
* ``chunk_refs`` (dupsort): chunk hash -> prefix ids whose manifest holds it
* ``meta``: store-wide values (format version)
* ``scores``: (segment, chunk, group) -> cache score inputs ``I_j``, ``F_j``

LMDB is opened with ``sync=True`` and ``writemap=False``: a committed write
transaction is on disk when ``commit`` returns.  When the map fills up, the
transaction is retried after growing the map, so no put is lost to
``MapFullError``.  One lock serialises every transaction of this process;
transactions here are short (no I/O on data files happens inside one), and
resizing the map needs every transaction of the process to be closed.
"""

from __future__ import annotations

import json
import logging
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

import lmdb

from .errors import StoreFull

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
T = TypeVar("T")


def seg_key(segment_id: int) -> bytes:
    return segment_id.to_bytes(8, "big")


def dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def loads(raw: bytes):
    return json.loads(bytes(raw))


class Index:
    def __init__(self, path: str, *, map_bytes: int, max_map_bytes: int):
        self.path = path
        self.max_map_bytes = max_map_bytes
        self._lock = threading.RLock()
        self.env = lmdb.open(
            path,
            map_size=map_bytes,
            subdir=True,
            max_dbs=8,
            sync=True,
            metasync=True,
            writemap=False,
            lock=True,
            max_readers=512,
        )
        stale = self.env.reader_check()
        if stale:
            log.info("cleared %d stale LMDB reader slots", stale)
        self.manifests = self.env.open_db(b"manifests")
        self.segments = self.env.open_db(b"segments")
        self.chunk_refs = self.env.open_db(b"chunk_refs", dupsort=True)
        self.meta = self.env.open_db(b"meta")
        self.scores = self.env.open_db(b"scores")
        self.resizes = 0

        def init(txn):
            version = txn.get(b"format_version", db=self.meta)
            if version is None:
                txn.put(b"format_version", str(FORMAT_VERSION).encode(), db=self.meta)
            elif int(version) != FORMAT_VERSION:
                raise RuntimeError(f"index format {int(version)} is not supported (expected {FORMAT_VERSION})")

        self.write(init)

    @property
    def map_bytes(self) -> int:
        return self.env.info()["map_size"]

    def write(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """Run ``fn`` in one write transaction, growing the map when it fills.

        ``fn`` may be run more than once (after a MapFullError the aborted
        transaction is replayed), so it must not have effects outside ``txn``.
        """
        with self._lock:
            while True:
                try:
                    with self.env.begin(write=True) as txn:
                        return fn(txn)
                except lmdb.MapFullError:
                    self._grow()

    @contextmanager
    def read(self) -> Iterator[lmdb.Transaction]:
        with self._lock:
            with self.env.begin(write=False, buffers=False) as txn:
                yield txn

    def _grow(self) -> None:
        current = self.map_bytes
        new = min(current * 2, self.max_map_bytes)
        if new <= current:
            raise StoreFull(f"index map is at its limit of {self.max_map_bytes} bytes (index_max_map_bytes)")
        self.env.set_mapsize(new)
        self.resizes += 1
        log.info("index map grown from %d to %d bytes", current, new)

    def close(self) -> None:
        with self._lock:
            self.env.close()
