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

import lmdb

from .. import index_ops as ops
from ..conversation_files import ConversationFiles
from ..identity import STORE_ID_FILE, damaged, fsync_dir
from ..index import Index
from ..manifest_files import ManifestFiles, is_manifest_file, parse_manifest_file_name
from ..scores import ScoreTable
from ..segment_files import SegmentFiles, parse_segment_file_name
from .state import StoreState

log = logging.getLogger("kvstore.store")  # the store's log lines keep one logger name


def has_store_files(data_dir: str, segment_dir: str, manifest_files: ManifestFiles, conversation_files: ConversationFiles) -> bool:
    """Whether the data directory holds a store already (a new index is then refused)."""
    return (
        os.path.exists(os.path.join(data_dir, STORE_ID_FILE))
        or any(parse_segment_file_name(n) is not None for n in os.listdir(segment_dir))
        or any(is_manifest_file(n) for n in os.listdir(manifest_files.directory))
        or bool(conversation_files.names())
    )


def load_records(index: Index, scores: ScoreTable, data_dir: str) -> tuple[dict[int, dict], set[str]]:
    """Segment records and prefix ids from the index; scores into ``scores``."""
    try:
        records, prefixes, loaded_scores = ops.read_all(index)
        scores.load(loaded_scores)
        for rec in records.values():
            int(rec["total_bytes"])
    except (lmdb.Error, ValueError, KeyError, TypeError) as exc:
        path = os.path.join(index.path, "data.mdb")
        raise damaged(data_dir, path, f"holds an undecodable record ({exc.__class__.__name__})") from None
    return records, prefixes


def startup_scan(
    files: SegmentFiles, manifest_files: ManifestFiles, state: StoreState, loaded: tuple[dict[int, dict], set[str]], *, data_dir: str
) -> tuple[int, dict]:
    """Remove files the (cleanly opened) index does not reference; quarantine records whose file is gone.

    Returns the next segment id and what was reclaimed.
    """
    records, prefixes = loaded
    segment_dir = files.directory
    reclaimed_files = reclaimed_bytes = 0
    max_id = max(records, default=0)
    for name in os.listdir(segment_dir):
        seg_id = parse_segment_file_name(name)
        if seg_id is None:
            continue
        max_id = max(max_id, seg_id)
        if seg_id not in records:
            path = os.path.join(segment_dir, name)
            reclaimed_bytes += os.stat(path).st_blocks * 512
            os.unlink(path)
            reclaimed_files += 1
    for seg_id, rec in records.items():
        if rec.get("quarantined"):
            state.restore_quarantine(seg_id, rec["quarantined"])
            continue
        path = files.path(seg_id)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            state.quarantine(seg_id, "segment file missing")
            continue
        if size < rec["total_bytes"]:
            state.quarantine(seg_id, f"segment file truncated ({size} < {rec['total_bytes']} bytes)")
    if reclaimed_files:
        fsync_dir(segment_dir)
    _sweep_manifest_files(manifest_files, prefixes)
    log.info(
        "opened %s: %d segments, reclaimed %d orphaned files (%d bytes), %d quarantined",
        data_dir,
        len(records),
        reclaimed_files,
        reclaimed_bytes,
        len(state.quarantined),
    )
    return max_id + 1, {"segments": len(records), "reclaimed_files": reclaimed_files, "reclaimed_bytes": reclaimed_bytes}


def _sweep_manifest_files(manifest_files: ManifestFiles, prefixes: set[str]) -> None:
    """Remove manifest files of puts killed before their commit, deletes killed after theirs."""
    directory = manifest_files.directory
    for name in os.listdir(directory):
        if is_manifest_file(name) and parse_manifest_file_name(name) not in prefixes:
            os.unlink(os.path.join(directory, name))
