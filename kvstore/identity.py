"""Which store a data directory, its index and its segments belong to.

A store gets a random 128-bit id when it is created.  The id is written in
the index's ``meta`` database (with the format version and creation time),
in ``STORE_ID`` in the data directory, and in every segment's trailer, so a
missing, emptied or foreign index is recognised instead of being taken for an
empty store.  Before LMDB maps ``index/data.mdb`` the file is checked against
its own meta pages: a file shorter than its last page would crash the
process with SIGBUS on first touch.

Every refusal is ``IndexDamaged``: one line naming the file, what is wrong,
and the command that rebuilds the index from the segments.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import struct
import time
from dataclasses import asdict, dataclass

from .contract.errors import IndexDamaged, StoreLocked
from .file_modes import FILE_MODE

FORMAT_VERSION = 2
STORE_ID_FILE = "STORE_ID"
LMDB_MAGIC = 0xBEEFC0DE
_PAGE_HEADER = 16  # MDB_page: pgno (8), pad (2), flags (2), lower/upper (4)
_PSIZE_AT = _PAGE_HEADER + 24  # after magic, version, address, mapsize: mm_dbs[FREE_DBI].md_pad holds the page size
_LAST_PG_AT = _PSIZE_AT + 2 * 48  # after the two MDB_db records: mm_last_pg, mm_txnid
_MIN_PAGE = 512


@dataclass(frozen=True)
class StoreIdentity:
    store_id: str  # 32 hex digits
    format_version: int
    created: float

    @classmethod
    def new(cls) -> StoreIdentity:
        return cls(secrets.token_hex(16), FORMAT_VERSION, time.time())

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> StoreIdentity:
        d = json.loads(bytes(raw))
        return cls(str(d["store_id"]), int(d["format_version"]), float(d["created"]))


def damaged(data_dir: str, path: str, what: str) -> IndexDamaged:
    return IndexDamaged(
        f"{path}: {what}; the segments are untouched: stop the daemon and run `kvstore-admin rebuild-index --data-dir {data_dir}`"
    )


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` durably: temp file, fsync, rename, directory fsync."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


def read_store_id_file(data_dir: str) -> str | None:
    """The store id in ``STORE_ID``, or None when the file does not exist."""
    path = os.path.join(data_dir, STORE_ID_FILE)
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return None
    try:
        return StoreIdentity.from_bytes(raw).store_id
    except (ValueError, KeyError, TypeError):
        raise IndexDamaged(f"{path}: not a store identity file; restore it or remove it to adopt the index's identity") from None


def write_store_id_file(data_dir: str, ident: StoreIdentity) -> None:
    write_atomic(os.path.join(data_dir, STORE_ID_FILE), ident.to_bytes())


def lmdb_required_bytes(head: bytes) -> int | None:
    """Bytes an LMDB data file must have, from its newer meta page (None: no valid meta)."""
    best = None  # (txnid, required bytes)
    psize = struct.unpack_from("<I", head, _PSIZE_AT)[0] if len(head) >= _LAST_PG_AT + 16 else 0
    for off in (0, psize):
        if psize < _MIN_PAGE or len(head) < off + _LAST_PG_AT + 16:
            continue
        magic, _version = struct.unpack_from("<II", head, off + _PAGE_HEADER)
        if magic != LMDB_MAGIC:
            continue
        last_pg, txnid = struct.unpack_from("<QQ", head, off + _LAST_PG_AT)
        if best is None or txnid > best[0]:
            best = (txnid, (last_pg + 1) * psize)
    return None if best is None else best[1]


def check_index_file(data_dir: str, index_dir: str, has_store_files: bool) -> bool:
    """Check ``data.mdb`` before it is mapped; True when the store is new (no index yet)."""
    path = os.path.join(index_dir, "data.mdb")
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        size = -1
    if size <= 0:
        if has_store_files:
            what = "is missing" if size < 0 else "is empty"
            raise damaged(data_dir, path, f"{what} but the data directory holds a store")
        return True
    with open(path, "rb") as fh:
        head = fh.read(2 * 65536)
    required = lmdb_required_bytes(head)
    if required is None:
        raise damaged(data_dir, path, "has no valid LMDB meta page")
    if size < required:
        raise damaged(data_dir, path, f"is truncated ({size} bytes, its last page ends at {required})")
    return False


def lock_data_dir(data_dir: str) -> int:
    """Take the data directory's exclusive lock (held by one process: daemon, admin or rebuild)."""
    fd = os.open(os.path.join(data_dir, "LOCK"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLocked(f"{data_dir} is in use by another kvstore process") from None
    return fd
