"""LMDB index of the chunk store: manifests, segments and chunk references.

Databases (keys are raw bytes, values JSON):

* ``manifests``: prefix id (32 bytes) -> manifest of one stored prefix
* ``segments``: segment id (8 bytes, big-endian) -> segment record
* ``chunk_refs`` (dupsort): chunk hash -> prefix ids whose manifest holds it
* ``meta``: store-wide values: ``format_version`` and ``identity`` (see
  ``identity.py``)
* ``scores``: (segment, chunk, group) -> cache score inputs ``I_j``, ``F_j``
* ``conversations``: namespace, NUL, conversation id -> conversation record
  (``conversations.py``)

LMDB is opened with ``sync=True`` and ``writemap=False``: a committed write
transaction is on disk when ``commit`` returns.  When the map fills up, the
transaction is retried after growing the map, so no put is lost to
``MapFullError``.  One lock serialises every transaction of this process;
transactions here are short (no I/O on data files happens inside one), and
resizing the map needs every transaction of the process to be closed.

This module owns the schema (key formats, value encoding) and the
environment; the transactions the chunk store runs are named operations in
``index_ops.py``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import lmdb

from .contract.errors import IndexDamaged, InvalidArgument, StoreFull
from .file_modes import FILE_MODE, make_dirs
from .identity import (
    FORMAT_VERSION,
    STORE_ID_FILE,
    StoreIdentity,
    check_index_file,
    damaged,
    read_store_id_file,
    write_store_id_file,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


def seg_key(segment_id: int) -> bytes:
    return segment_id.to_bytes(8, "big")


def segment_id_of(key: bytes) -> int:
    return int.from_bytes(key, "big")


def prefix_key(prefix_id: str) -> bytes:
    """The manifest key of a prefix id; InvalidArgument unless 64 hex digits."""
    try:
        key = bytes.fromhex(prefix_id)
    except (ValueError, TypeError):
        raise InvalidArgument("prefix_id", "must be 64 hex digits") from None
    if len(key) != 32:
        raise InvalidArgument("prefix_id", "must be 64 hex digits")
    return key


def conversation_key(namespace: str, conversation_id: str) -> bytes:
    """The record key of a conversation: its namespace (no NUL in it), NUL, its id."""
    return namespace.encode() + b"\0" + conversation_id.encode()


def dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def loads(raw: bytes):
    return json.loads(bytes(raw))


class Index:
    def __init__(self, path: str, *, map_bytes: int, max_map_bytes: int):
        self.path = path
        self.max_map_bytes = max_map_bytes
        self._lock = threading.RLock()
        make_dirs(path)  # LMDB would make it 0755
        self.env = lmdb.open(
            path,
            mode=FILE_MODE,  # data.mdb and lock.mdb (LMDB's default: 0644)
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
        self.conversations = self.env.open_db(b"conversations")
        self.resizes = 0

    def read_identity(self) -> tuple[int | None, StoreIdentity | None]:
        """``(format_version, identity)`` as stored; both None in a new index."""
        with self.read() as txn:
            version = txn.get(b"format_version", db=self.meta)
            ident = txn.get(b"identity", db=self.meta)
        return (
            None if version is None else int(version),
            None if ident is None else StoreIdentity.from_bytes(ident),
        )

    def write_identity(self, ident: StoreIdentity) -> None:
        def init(txn):
            txn.put(b"format_version", str(FORMAT_VERSION).encode(), db=self.meta)
            txn.put(b"identity", ident.to_bytes(), db=self.meta)

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


def open_index(data_dir: str, *, map_bytes: int, max_map_bytes: int, has_store_files: bool) -> tuple[Index, StoreIdentity]:
    """Open ``data_dir``'s index after checking it is whole and this store's; IndexDamaged if not."""
    index_dir = os.path.join(data_dir, "index")
    path = os.path.join(index_dir, "data.mdb")
    check_index_file(data_dir, index_dir, has_store_files)
    try:
        index = Index(index_dir, map_bytes=map_bytes, max_map_bytes=max_map_bytes)
    except lmdb.Error as exc:
        raise damaged(data_dir, path, f"does not open ({_one_line(exc)})") from None
    try:
        return index, _check_identity(index, data_dir, path, has_store_files)
    except BaseException:
        index.close()
        raise


def _check_identity(index: Index, data_dir: str, path: str, has_store_files: bool) -> StoreIdentity:
    try:
        version, ident = index.read_identity()
    except (lmdb.Error, ValueError, KeyError, TypeError) as exc:
        raise damaged(data_dir, path, f"has an unreadable identity record ({_one_line(exc)})") from None
    file_id = read_store_id_file(data_dir)
    if version is None:
        if has_store_files or file_id is not None:
            raise damaged(data_dir, path, "holds no store identity but the data directory holds a store (a new or replaced index)")
        ident = StoreIdentity.new()
        index.write_identity(ident)
        write_store_id_file(data_dir, ident)
        return ident
    if version != FORMAT_VERSION or ident is None:
        raise IndexDamaged(
            f"{path}: index format {version} is not supported (this kvstore reads format {FORMAT_VERSION}, "
            "which records the store's identity); open it with the kvstore that wrote it, or start a new store"
        )
    if file_id is None:  # created, then stopped before STORE_ID was written
        write_store_id_file(data_dir, ident)
    elif file_id != ident.store_id:
        raise damaged(data_dir, path, f"belongs to store {ident.store_id} but {STORE_ID_FILE} says {file_id}")
    return ident


def _one_line(exc: BaseException) -> str:
    return f"{exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
