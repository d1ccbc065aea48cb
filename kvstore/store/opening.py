"""Opening the chunk store: what is on disk checked against the index.

Runs once, after ``index.open_index`` proved the index whole and this
store's: segment files the index does not reference are removed (left by
a put or a compaction that was killed), records whose file is gone or short
are quarantined, and manifest files of uncommitted puts or committed deletes
are swept.  A record the index cannot decode is ``IndexDamaged``, and
nothing is touched.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import lmdb

from .. import index_ops as ops
from ..identity import STORE_ID_FILE, damaged
from ..manifest_files import ManifestFiles, is_manifest_file, parse_manifest_file_name
from ..segment_files import parse_segment_file_name

if TYPE_CHECKING:
    from .chunk_store import ChunkStore

log = logging.getLogger("kvstore.store")  # the store's log lines keep one logger name


def has_store_files(store: ChunkStore) -> bool:
    """Whether the data directory holds a store already (a new index is then refused)."""
    return (
        os.path.exists(os.path.join(store.data_dir, STORE_ID_FILE))
        or any(parse_segment_file_name(n) is not None for n in os.listdir(store.segment_dir))
        or any(is_manifest_file(n) for n in os.listdir(store.manifest_files.directory))
        or bool(store.conversation_files.names())
    )


def load_records(store: ChunkStore) -> tuple[dict[int, dict], set[str]]:
    """Segment records and prefix ids from the index; scores into ``store.scores``."""
    try:
        records, prefixes, scores = ops.read_all(store.index)
        store.scores.load(scores)
        for rec in records.values():
            int(rec["total_bytes"])
    except (lmdb.Error, ValueError, KeyError, TypeError) as exc:
        path = os.path.join(store.index.path, "data.mdb")
        raise damaged(store.data_dir, path, f"holds an undecodable record ({exc.__class__.__name__})") from None
    return records, prefixes


def startup_scan(store: ChunkStore, loaded: tuple[dict[int, dict], set[str]]) -> tuple[int, dict]:
    """Remove files the (cleanly opened) index does not reference; quarantine records whose file is gone.

    Returns the next segment id and what was reclaimed.
    """
    records, prefixes = loaded
    reclaimed_files = reclaimed_bytes = 0
    max_id = max(records, default=0)
    for name in os.listdir(store.segment_dir):
        seg_id = parse_segment_file_name(name)
        if seg_id is None:
            continue
        max_id = max(max_id, seg_id)
        if seg_id not in records:
            path = os.path.join(store.segment_dir, name)
            reclaimed_bytes += os.stat(path).st_blocks * 512
            os.unlink(path)
            reclaimed_files += 1
    for seg_id, rec in records.items():
        if rec.get("quarantined"):
            store.state.quarantined[seg_id] = rec["quarantined"]
            continue
        path = store.files.path(seg_id)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            store.state.quarantine(seg_id, "segment file missing")
            continue
        if size < rec["total_bytes"]:
            store.state.quarantine(seg_id, f"segment file truncated ({size} < {rec['total_bytes']} bytes)")
    if reclaimed_files:
        store.sync_segment_dir()
    _sweep_manifest_files(store.manifest_files, prefixes)
    log.info(
        "opened %s: %d segments, reclaimed %d orphaned files (%d bytes), %d quarantined",
        store.data_dir,
        len(records),
        reclaimed_files,
        reclaimed_bytes,
        len(store.state.quarantined),
    )
    return max_id + 1, {"segments": len(records), "reclaimed_files": reclaimed_files, "reclaimed_bytes": reclaimed_bytes}


def _sweep_manifest_files(manifest_files: ManifestFiles, prefixes: set[str]) -> None:
    """Remove manifest files of puts killed before their commit, deletes killed after theirs."""
    directory = manifest_files.directory
    for name in os.listdir(directory):
        if is_manifest_file(name) and parse_manifest_file_name(name) not in prefixes:
            os.unlink(os.path.join(directory, name))
