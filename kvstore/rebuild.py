"""Rebuild a store's index from its segment trailers and manifest files.

Run with the daemon stopped (the data directory's lock is taken).  The old
index directory is moved aside (``index.damaged-<time>``), never deleted.
Every segment's trailer is read and every region verified against it; a
prefix is restored when it has a manifest file (it was committed and not
deleted) and every one of its pieces lies in a verified segment of this
store with its geometry.  Refcounts and chunk references are recomputed from
the restored manifests.  Conversation records are restored from their
record files (``conversation_files.py``), each as it was acknowledged; a
turn whose prefix was not restored shows as not stored.  Cache scores are
not in the segments and start from zero.  Segment files no restored prefix references are left in place; the
next open of the store removes them as orphans.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import xxhash

from . import index as ix
from .contract.errors import IndexDamaged
from .conversation_files import DIRECTORY as CONVERSATIONS_DIR
from .conversation_files import SUFFIX, ConversationFiles, file_name
from .conversation_rules import check_record
from .identity import StoreIdentity, lock_data_dir, read_store_id_file, write_store_id_file
from .manifest_files import ManifestFiles
from .records import SegmentInfo
from .segment_files import parse_segment_file_name
from .segment_trailer import decode_trailer, trailer_offset


@dataclass
class RebuildReport:
    store_id: str
    moved_aside: str | None
    restored: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # prefix id -> why
    bad_segments: dict[int, str] = field(default_factory=dict)  # segment id -> why
    conversations: list[str] = field(default_factory=list)  # "namespace/conversation id" of the records restored
    skipped_conversations: dict[str, str] = field(default_factory=dict)  # record file -> why


def read_segment(path: str) -> tuple[str, dict, dict]:
    """``(store id, segment record, writer's manifest)`` of a segment file whose
    regions all verify; ValueError if not."""
    with open(path, "rb") as fh:
        data = fh.read()
    offset = trailer_offset(data[-16:])
    trailer = decode_trailer(data[offset:])
    record = trailer["segment"]
    info = SegmentInfo.from_record(record)
    if info.layout.total_bytes != offset:
        raise ValueError("trailer does not match the segment's layout")
    arr = np.frombuffer(data, dtype=np.uint8)
    for name, off, length, xxh3 in info.regions():
        if xxhash.xxh3_64_intdigest(arr[off : off + length]) != xxh3:
            raise ValueError(f"checksum mismatch in {name}")
    return trailer["store_id"], record, trailer["manifest"]


def rebuild_index(data_dir: str, *, map_bytes: int = 1 << 24, max_map_bytes: int = 1 << 40, progress=None) -> RebuildReport:
    """``progress(iterable, desc)`` wraps the pass over segment files (a bar, see kvstore.progress)."""
    data_dir = os.path.abspath(data_dir)
    lock_fd = lock_data_dir(data_dir)
    try:
        segments, bad = _read_segments(os.path.join(data_dir, "segments"), progress)
        store_id = _store_id(data_dir, segments)
        report = RebuildReport(store_id, _move_index_aside(data_dir), bad_segments=bad)
        records = {s: rec for s, (sid, rec, _) in segments.items() if sid == store_id}
        for s in set(segments) - set(records):
            report.bad_segments[s] = f"belongs to store {segments[s][0]}"
        chunks = _chunks_by_hash({s: segments[s] for s in records})
        manifests = _restorable(ManifestFiles(os.path.join(data_dir, "manifests")), records, chunks, report)
        conversations = _conversations(ConversationFiles(os.path.join(data_dir, CONVERSATIONS_DIR)), report)
        _write_index(data_dir, store_id, records, manifests, conversations, map_bytes, max_map_bytes)
        report.restored = sorted(m["prefix_id"] for m in manifests)
        report.conversations = sorted(f"{r['namespace']}/{r['conversation_id']}" for r in conversations.values())
        return report
    finally:
        os.close(lock_fd)


def _read_segments(segment_dir: str, progress=None) -> tuple[dict[int, tuple[str, dict, dict]], dict[int, str]]:
    good, bad = {}, {}
    names = sorted(os.listdir(segment_dir))
    for name in progress(names, "rebuild-index", total=len(names), unit="file") if progress else names:
        seg_id = parse_segment_file_name(name)
        if seg_id is None:
            continue
        try:
            store_id, record, manifest = read_segment(os.path.join(segment_dir, name))
            if record["segment_id"] != seg_id:
                raise ValueError(f"trailer names segment {record['segment_id']}")
            good[seg_id] = (store_id, record, manifest)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            bad[seg_id] = f"{exc.__class__.__name__}: {exc}"
    return good, bad


def _store_id(data_dir: str, segments: dict[int, tuple[str, dict]]) -> str:
    """The store's id: STORE_ID's, else the one every segment carries."""
    file_id = read_store_id_file(data_dir)
    if file_id is not None:
        return file_id
    ids = Counter(sid for sid, _, _ in segments.values())
    if len(ids) != 1:
        found = "no segment" if not ids else f"segments of {len(ids)} stores"
        raise IndexDamaged(f"{data_dir}: STORE_ID is missing and {found} name the store; cannot tell which store to rebuild")
    return next(iter(ids))


def _move_index_aside(data_dir: str) -> str | None:
    index_dir = os.path.join(data_dir, "index")
    if not os.path.exists(index_dir):
        return None
    aside = os.path.join(data_dir, f"index.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    os.rename(index_dir, aside)
    return aside


def _chunks_by_hash(segments: dict[int, tuple[str, dict, dict]]) -> dict[str, tuple[int, int]]:
    """Chunk hash -> (segment, local chunk) for every chunk of the verified segments.

    A segment's trailer carries the hashes of a prefix holding all of its
    chunks (its writer's, or for a compacted copy a prefix reaching its last
    chunk), so a chunk can be found wherever a compaction moved it.
    """
    out = {}
    for seg_id, (_, record, manifest) in sorted(segments.items()):
        first = record["first_chunk"]
        num_chunks = SegmentInfo.from_record(record).layout.num_chunks
        for local, h in enumerate(manifest["chunk_hashes"][first : first + num_chunks]):
            out[h] = (seg_id, local)
    return out


def _pieces_by_hash(m: dict, chunks: dict[str, tuple[int, int]]) -> list[dict] | None:
    """The prefix's pieces found by its chunk hashes, or None if a chunk is in no segment."""
    pieces: list[dict] = []
    for j, h in enumerate(m["chunk_hashes"]):
        if h not in chunks:
            return None
        seg_id, local = chunks[h]
        last = pieces[-1] if pieces else None
        if last and last["segment_id"] == seg_id and last["segment_chunk"] + last["num_chunks"] == local:
            last["num_chunks"] += 1
        else:
            pieces.append({"segment_id": seg_id, "first_chunk": j, "num_chunks": 1, "segment_chunk": local})
    return pieces


def _restorable(files: ManifestFiles, records: dict[int, dict], chunks: dict, report: RebuildReport) -> list[dict]:
    out = []
    for pid, path in sorted(files.scan().items()):
        try:
            m = files.read(path)
            why = _why_not_restorable(pid, m, records, report.bad_segments)
            if why is not None and (pieces := _pieces_by_hash(m, chunks)) is not None:
                m = {**m, "segments": pieces}  # its chunks moved (compaction): found by hash
                why = _why_not_restorable(pid, m, records, report.bad_segments)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            why = f"manifest file unreadable ({exc.__class__.__name__}: {exc})"
        if why:
            report.skipped[pid] = why
        else:
            out.append(m)
    return out


def _why_not_restorable(pid: str, m: dict, records: dict[int, dict], bad: dict[int, str]) -> str | None:
    if m["prefix_id"] != pid:
        return f"manifest file names prefix {m['prefix_id']}"
    covered = 0
    for p in m["segments"]:
        seg_id = p["segment_id"]
        rec = records.get(seg_id)
        if rec is None:
            return f"segment {seg_id} " + (bad[seg_id] if seg_id in bad else "is missing")
        if rec["geometry"] != m["geometry"] or p["first_chunk"] != covered:
            return f"segment {seg_id} does not match the manifest"
        if p["segment_chunk"] + p["num_chunks"] > SegmentInfo.from_record(rec).layout.num_chunks:
            return f"segment {seg_id} holds fewer chunks than the manifest uses"
        covered += p["num_chunks"]
    if covered != len(m["chunk_hashes"]):
        return f"pieces cover {covered} of {len(m['chunk_hashes'])} chunks"
    return None


def _conversations(files: ConversationFiles, report: RebuildReport) -> dict[bytes, dict]:
    """The records of the record files that decode and are named as their key says."""
    out = {}
    for name in files.names():
        if not name.endswith(SUFFIX):
            continue  # a record file being written when the daemon stopped: never acknowledged
        try:
            record = files.read(name)
            key = check_record(record)
            if file_name(key) != name:
                raise ValueError(f"names conversation {record['namespace']!r}/{record['conversation_id']!r}, not this file's")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            report.skipped_conversations[name] = f"record file unreadable ({exc.__class__.__name__}: {exc})"
            continue
        out[key] = record
    return out


def _write_index(data_dir, store_id, records, manifests, conversations, map_bytes, max_map_bytes) -> None:
    refcounts = Counter(s for m in manifests for s in {p["segment_id"] for p in m["segments"]})
    index = ix.Index(os.path.join(data_dir, "index"), map_bytes=map_bytes, max_map_bytes=max_map_bytes)

    def fill(txn):
        for seg_id, n in refcounts.items():
            rec = {**records[seg_id], "refcount": n, "quarantined": None}
            txn.put(ix.seg_key(seg_id), ix.dumps(rec), db=index.segments)
        for m in manifests:
            key = bytes.fromhex(m["prefix_id"])
            txn.put(key, ix.dumps(m), db=index.manifests)
            for h in m["chunk_hashes"]:
                txn.put(bytes.fromhex(h), key, db=index.chunk_refs, dupdata=True)
        for key, record in conversations.items():
            txn.put(key, ix.dumps(record), db=index.conversations)

    try:
        index.write(fill)
        ident = StoreIdentity(store_id, ix.FORMAT_VERSION, time.time())
        index.write_identity(ident)
    finally:
        index.close()
    if read_store_id_file(data_dir) is None:
        write_store_id_file(data_dir, ident)
