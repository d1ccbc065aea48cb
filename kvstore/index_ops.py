"""The chunk store's index operations: every transaction it runs, by name.

Keys and values are built here (with the schema of ``index.py``), so the
store says what it does (``commit_put``, ``unlist_prefix``,
``replace_segment``, ``merge_segments``, ``mark_quarantined``) and never how a record is laid out.  No I/O on data
files happens inside a transaction.  ``quarantined`` arguments are the
store's live map of quarantined segments: a segment quarantined meanwhile
counts as gone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection

from . import index as ix
from .contract.errors import Conflict, NotFound
from .index import Index
from .scores import Unit, UnitScore, unit_key
from .scores import decode as decode_score
from .scores import encode as encode_score


# ------------------------------------------------------------ reads
def read_all(index: Index) -> tuple[dict[int, dict], set[str], list[tuple[Unit, UnitScore]]]:
    """Every segment record, stored prefix id and score, in one read transaction."""
    with index.read() as txn:
        records = {ix.segment_id_of(k): ix.loads(v) for k, v in txn.cursor(db=index.segments)}
        prefixes = {bytes(k).hex() for k in txn.cursor(db=index.manifests).iternext(values=False)}
        scores = [decode_score(k, v) for k, v in txn.cursor(db=index.scores)]
    return records, prefixes, scores


def manifest(index: Index, prefix_id: str) -> dict | None:
    key = ix.prefix_key(prefix_id)
    with index.read() as txn:
        raw = txn.get(key, db=index.manifests)
    return None if raw is None else ix.loads(raw)


def manifests(index: Index) -> list[dict]:
    with index.read() as txn:
        return [ix.loads(v) for _, v in txn.cursor(db=index.manifests)]


def manifests_and_segments(index: Index) -> tuple[list[dict], dict[int, dict]]:
    """Every manifest and every segment record by id, in one read transaction."""
    with index.read() as txn:
        manifests = [ix.loads(v) for _, v in txn.cursor(db=index.manifests)]
        records = {ix.segment_id_of(k): ix.loads(v) for k, v in txn.cursor(db=index.segments)}
    return manifests, records


def is_stored(index: Index, prefix_id: str) -> bool:
    with index.read() as txn:
        return txn.get(ix.prefix_key(prefix_id), db=index.manifests) is not None


def prefix_ids_starting(index: Index, prefix: str) -> list[str]:
    """Stored prefix ids that start with the lowercase hex digits ``prefix``."""
    lo = bytes.fromhex(prefix[: len(prefix) // 2 * 2])
    found = []
    with index.read() as txn:
        cur = txn.cursor(db=index.manifests)
        if cur.set_range(lo):
            for k in cur.iternext(values=False):
                h = bytes(k).hex()
                if not h.startswith(prefix[: len(lo) * 2]):
                    break
                if h.startswith(prefix):
                    found.append(h)
    return found


def segment_record(index: Index, segment_id: int) -> dict | None:
    with index.read() as txn:
        raw = txn.get(ix.seg_key(segment_id), db=index.segments)
    return None if raw is None else ix.loads(raw)


def segment_records(index: Index, segment_ids: list[int]) -> dict[int, dict]:
    with index.read() as txn:
        return {s: ix.loads(txn.get(ix.seg_key(s), db=index.segments)) for s in segment_ids}


def segment_ids(index: Index) -> list[int]:
    with index.read() as txn:
        return [ix.segment_id_of(k) for k in txn.cursor(db=index.segments).iternext(values=False)]


def totals(index: Index) -> tuple[int, int, int]:
    """``(prefixes, segments, bytes of the segments)`` stored, in one read transaction."""
    with index.read() as txn:
        num_prefixes = txn.stat(index.manifests)["entries"]
        stored = sum(ix.loads(v)["total_bytes"] for _, v in txn.cursor(db=index.segments))
        num_segments = txn.stat(index.segments)["entries"]
    return num_prefixes, num_segments, stored


def chunk_holders(index: Index, chunk_hash: bytes) -> list[str]:
    """Ids of the prefixes whose manifest holds the chunk."""
    with index.read() as txn:
        cur = txn.cursor(db=index.chunk_refs)
        return [bytes(v).hex() for v in cur.iternext_dup(keys=False)] if cur.set_key(chunk_hash) else []


def held_in(index: Index, txn, chunk_hash: bytes, quarantined: Collection[int]) -> bool:
    """Whether a manifest in ``txn`` whose segments are all healthy holds the chunk."""
    cur = txn.cursor(db=index.chunk_refs)
    if not cur.set_key(chunk_hash):
        return False
    for key in cur.iternext_dup(keys=False):
        raw = txn.get(bytes(key), db=index.manifests)
        if raw is not None and not any(p["segment_id"] in quarantined for p in ix.loads(raw)["segments"]):
            return True
    return False


def all_held(index: Index, chunk_hashes: list[bytes], quarantined: Collection[int]) -> bool:
    """Whether every chunk has a healthy holder (one read transaction)."""
    with index.read() as txn:
        return all(held_in(index, txn, h, quarantined) for h in chunk_hashes)


def conversation(index: Index, key: bytes) -> dict | None:
    with index.read() as txn:
        raw = txn.get(key, db=index.conversations)
    return None if raw is None else ix.loads(raw)


def conversations(index: Index, namespace: str | None = None) -> dict[bytes, dict]:
    """Every conversation record (of one namespace, when given), by key, in key order."""
    start = b"" if namespace is None else namespace.encode() + b"\0"
    out = {}
    with index.read() as txn:
        cur = txn.cursor(db=index.conversations)
        if cur.set_range(start):
            for k, v in cur.iternext():
                k = bytes(k)
                if not k.startswith(start):
                    break
                out[k] = ix.loads(v)
    return out


def num_conversations(index: Index) -> int:
    with index.read() as txn:
        return txn.stat(index.conversations)["entries"]


# ------------------------------------------------------------ writes
def commit_put(
    index: Index,
    prefix_id: str,
    manifest: dict,
    segment_record: dict | None,
    *,
    reused_segments: Collection[int],
    requires: list[bytes],
    hashes: list[bytes],
    quarantined: Collection[int],
) -> bool:
    """List a prefix: its manifest, chunk references, new segment record and the
    refcounts of the segments it reuses; False when the prefix was stored meanwhile.

    Conflict when a reused segment, or a holder of a chunk in ``requires``,
    went away since the put began.
    """
    key = ix.prefix_key(prefix_id)
    new_id = segment_record["segment_id"] if segment_record else None

    def txn_fn(txn) -> bool:
        if txn.get(key, db=index.manifests) is not None:
            return False
        for seg_id in sorted(set(reused_segments)):
            raw = txn.get(ix.seg_key(seg_id), db=index.segments)
            if raw is None or seg_id in quarantined:
                raise Conflict(f"segment {seg_id} shared by this put was deleted concurrently; retry")
            rec = ix.loads(raw)
            rec["refcount"] += 1
            txn.put(ix.seg_key(seg_id), ix.dumps(rec), db=index.segments)
        for h in requires:
            if not held_in(index, txn, h, quarantined):
                raise Conflict("a chunk this put relies on was deleted concurrently; retry")
        if segment_record:
            txn.put(ix.seg_key(new_id), ix.dumps(segment_record), db=index.segments)
        txn.put(key, ix.dumps(manifest), db=index.manifests)
        for h in hashes:
            txn.put(h, key, db=index.chunk_refs, dupdata=True)
        return True

    return index.write(txn_fn)


def unlist_prefix(index: Index, prefix_id: str) -> tuple[list[int], int]:
    """Remove a prefix's manifest and chunk references and release its segments;
    ``(segments no prefix references any more, their bytes)``.  NotFound if not stored."""
    key = ix.prefix_key(prefix_id)

    def txn_fn(txn) -> tuple[list[int], int]:
        raw = txn.get(key, db=index.manifests)
        if raw is None:
            raise NotFound(f"prefix {prefix_id} is not stored")
        m = ix.loads(raw)
        txn.delete(key, db=index.manifests)
        for h in m["chunk_hashes"]:
            txn.delete(bytes.fromhex(h), key, db=index.chunk_refs)
        freed, freed_bytes = [], 0
        for seg_id in sorted({p["segment_id"] for p in m["segments"]}):
            sk = ix.seg_key(seg_id)
            rec = ix.loads(txn.get(sk, db=index.segments))
            rec["refcount"] -= 1
            if rec["refcount"] <= 0:
                txn.delete(sk, db=index.segments)
                freed.append(seg_id)
                freed_bytes += rec["total_bytes"]
            else:
                txn.put(sk, ix.dumps(rec), db=index.segments)
        return freed, freed_bytes

    return index.write(txn_fn)


def replace_segment(
    index: Index, old_id: int, record: dict, lo: int, moved: list[tuple[Unit, UnitScore]], prefix_ids: Collection[str]
) -> None:
    """Compaction's commit: every piece of ``prefix_ids`` in segment ``old_id`` points at the new
    segment ``record`` (local chunk ``lo`` becomes 0), which takes the old one's refcount and the
    ``moved`` scores; the old record and its scores go.  One transaction."""
    new_id = record["segment_id"]

    def txn_fn(txn) -> None:
        old_rec = ix.loads(txn.get(ix.seg_key(old_id), db=index.segments))
        for pid in prefix_ids:
            key = bytes.fromhex(pid)
            m = ix.loads(txn.get(key, db=index.manifests))
            for p in m["segments"]:
                if p["segment_id"] == old_id:
                    p["segment_id"], p["segment_chunk"] = new_id, p["segment_chunk"] - lo
            txn.put(key, ix.dumps(m), db=index.manifests)
        txn.put(ix.seg_key(new_id), ix.dumps({**record, "refcount": old_rec["refcount"]}), db=index.segments)
        txn.delete(ix.seg_key(old_id), db=index.segments)
        score_cur = txn.cursor(db=index.scores)
        prefix = ix.seg_key(old_id)
        if score_cur.set_range(prefix):
            while score_cur.key()[:8] == prefix:
                if not score_cur.delete():
                    break
        for unit, score in moved:
            txn.put(*encode_score(unit, score), db=index.scores)

    index.write(txn_fn)


def _drop_scores(index: Index, txn, segment_id: int) -> None:
    cur = txn.cursor(db=index.scores)
    prefix = ix.seg_key(segment_id)
    if cur.set_range(prefix):
        while cur.key()[:8] == prefix:
            if not cur.delete():
                break


def merge_segments(
    index: Index,
    offsets: dict[int, int],
    record: dict,
    moved: list[tuple[Unit, UnitScore]],
    prefix_ids: Collection[str],
    quarantined: Collection[int],
) -> None:
    """A merge's commit: every piece of ``prefix_ids`` in a segment of ``offsets`` points at the new
    segment ``record`` (local chunk ``c`` of segment ``s`` becomes ``offsets[s] + c``), whose refcount
    is the number of manifests that now reference it and which takes the ``moved`` scores; the old
    records and their scores go.  One transaction.

    Conflict (nothing changed) when an old segment is gone or quarantined, or is referenced by a
    manifest not in ``prefix_ids`` (a delete or put came between the plan and the commit).
    """
    new_id = record["segment_id"]

    def txn_fn(txn) -> None:
        olds = {}
        for seg_id in offsets:
            raw = txn.get(ix.seg_key(seg_id), db=index.segments)
            if raw is None or seg_id in quarantined:
                raise Conflict(f"segment {seg_id} was deleted or quarantined while being merged")
            olds[seg_id] = ix.loads(raw)
        users: Counter[int] = Counter()
        changed = []
        for pid in sorted(prefix_ids):
            key = bytes.fromhex(pid)
            raw = txn.get(key, db=index.manifests)
            if raw is None:
                continue  # deleted meanwhile: its refcounts went with it
            m = ix.loads(raw)
            segs = {p["segment_id"] for p in m["segments"] if p["segment_id"] in offsets}
            if not segs:
                continue
            users.update(segs)
            for p in m["segments"]:
                if p["segment_id"] in offsets:
                    p["segment_chunk"] += offsets[p["segment_id"]]
                    p["segment_id"] = new_id
            changed.append((key, m))
        for seg_id, rec in olds.items():
            if users[seg_id] != rec["refcount"]:
                raise Conflict(f"segment {seg_id} gained or lost a reference while being merged")
        for key, m in changed:
            txn.put(key, ix.dumps(m), db=index.manifests)
        txn.put(ix.seg_key(new_id), ix.dumps({**record, "refcount": len(changed)}), db=index.segments)
        for seg_id in olds:
            txn.delete(ix.seg_key(seg_id), db=index.segments)
            _drop_scores(index, txn, seg_id)
        for unit, score in moved:
            txn.put(*encode_score(unit, score), db=index.scores)

    index.write(txn_fn)


def mark_quarantined(index: Index, segment_id: int, reason: str) -> None:
    """Record the quarantine in the segment's record (if it still has one)."""

    def mark(txn):
        raw = txn.get(ix.seg_key(segment_id), db=index.segments)
        if raw is not None:
            rec = ix.loads(raw)
            rec["quarantined"] = reason
            txn.put(ix.seg_key(segment_id), ix.dumps(rec), db=index.segments)

    index.write(mark)


def write_scores(index: Index, entries: list[tuple[Unit, UnitScore | None]]) -> None:
    """Persist changed scores in one transaction (None: the entry is removed)."""

    def txn_fn(txn):
        for unit, score in entries:
            if score is None:
                txn.delete(unit_key(unit), db=index.scores)
            else:
                txn.put(*encode_score(unit, score), db=index.scores)

    index.write(txn_fn)


def put_conversation(index: Index, key: bytes, record: dict) -> None:
    index.write(lambda txn: txn.put(key, ix.dumps(record), db=index.conversations))


def delete_conversation(index: Index, key: bytes) -> bool:
    """Remove the record; False when there was none."""
    return index.write(lambda txn: txn.delete(key, db=index.conversations))
