"""Sparse reads of stored extents: plan, coalesce, read, verify, assemble."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np
import xxhash

from .contract.errors import InvalidArgument
from .contract.results import ReadResult as ReadResult  # what ChunkStore.read returns, the client's read type too
from .io import aligned_buffer
from .io.inflight import InFlight
from .io.plan import coalesce
from .records import PrefixView, SegmentInfo
from .segment_files import SegmentFiles


@dataclass
class ExtentRef:
    group: int
    chunk: int  # prefix chunk index
    segment_id: int
    offset: int
    length: int
    padded: int
    xxh3: int


@dataclass
class ChecksumMismatch:
    segment_id: int
    region: str


def validate_chunks(chunks, num_chunks: int) -> np.ndarray:
    try:
        arr = np.asarray(chunks)
    except Exception:
        raise InvalidArgument("chunks", "must be a sequence of integers") from None
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise InvalidArgument("chunks", "must be a one-dimensional sequence of integers")
    if arr.size == 0:
        raise InvalidArgument("chunks", "must not be empty")
    arr = arr.astype(np.int64)
    bad = arr[(arr < 0) | (arr >= num_chunks)]
    if bad.size:
        raise InvalidArgument("chunks", f"index {int(bad[0])} out of range [0, {num_chunks})")
    srt = np.sort(arr)
    dup = srt[1:][srt[1:] == srt[:-1]]
    if dup.size:
        raise InvalidArgument("chunks", f"duplicate index {int(dup[0])}")
    return srt


def validate_groups(groups, num_groups: int) -> list[int]:
    if groups is None:
        return list(range(num_groups))
    out = []
    for g in groups:
        if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or not 0 <= g < num_groups:
            raise InvalidArgument("groups", f"group {g!r} out of range [0, {num_groups})")
        if g in out:
            raise InvalidArgument("groups", f"duplicate group {g}")
        out.append(int(g))
    if not out:
        raise InvalidArgument("groups", "must not be empty")
    return out


def plan_extents(view: PrefixView, segments: dict[int, SegmentInfo], chunks: np.ndarray, groups: list[int]) -> list[ExtentRef]:
    which, local = view.locate(chunks)
    refs = []
    for g in groups:
        for j, p, loc in zip(chunks.tolist(), which.tolist(), local.tolist()):
            seg = segments[view.pieces[p].segment_id]
            lay = seg.layout
            refs.append(
                ExtentRef(
                    group=g,
                    chunk=j,
                    segment_id=seg.segment_id,
                    offset=int(lay.extent_offsets[g, loc]),
                    length=int(lay.extent_lengths[g, loc]),
                    padded=int(lay.extent_padded[g, loc]),
                    xxh3=int(seg.extent_xxh3[g, loc]),
                )
            )
    return refs


def execute_reads(
    refs: list[ExtentRef],
    files: SegmentFiles,
    *,
    coalesce_reads: bool,
    max_run_bytes: int,
    alloc: Callable[[int], memoryview] | None = None,
    in_flight: InFlight | None = None,
) -> tuple[dict, memoryview, int, list[ChecksumMismatch]]:
    """Read ``refs`` (one aligned buffer, one request per run) and verify them.

    ``alloc(nbytes)`` supplies the destination (4 KiB aligned, e.g. a slot of
    a shared-memory arena); by default fresh anonymous memory.  ``in_flight``
    counts each request while the backend has it (the read queue depth).  Returns
    ``(views by (group, chunk), buffer, num_reads, mismatches)``; each view
    is a uint8 slice of the buffer holding one extent's unpadded bytes.
    """
    by_segment: dict[int, list[int]] = {}
    for i, r in enumerate(refs):
        by_segment.setdefault(r.segment_id, []).append(i)
    plans = []
    total = 0
    for seg_id, idx in by_segment.items():
        runs = coalesce([(refs[i].offset, refs[i].padded) for i in idx], max_run_bytes=max_run_bytes, enabled=coalesce_reads)
        for run in runs:
            plans.append((seg_id, run, [idx[m] for m in run.members], total))
            total += run.length
    buf = (alloc or aligned_buffer)(total)
    arr = np.frombuffer(buf, dtype=np.uint8)[:total] if total else np.zeros(0, np.uint8)
    views: dict = {}
    mismatches: list[ChecksumMismatch] = []
    with ExitStack() as stack:
        handles = {}
        for seg_id in by_segment:
            try:
                handles[seg_id] = stack.enter_context(files.reading(seg_id))
            except OSError as exc:
                raise SegmentUnreadable(seg_id, exc) from exc
        track = in_flight.track if in_flight is not None else _untracked
        futures = [
            (seg_id, track(files.pread(handles[seg_id], buf[base : base + run.length], run.offset))) for seg_id, run, _, base in plans
        ]
        # wait for every request before the handles are released, even when one fails
        errors = [(seg_id, exc) for seg_id, f in futures if (exc := _exception(f)) is not None]
    if errors:
        seg_id, exc = errors[0]
        if isinstance(exc, (OSError, EOFError)):
            raise SegmentUnreadable(seg_id, exc) from exc
        raise exc
    for seg_id, run, members, base in plans:
        for i in members:
            r = refs[i]
            start = base + (r.offset - run.offset)
            view = arr[start : start + r.length]
            if xxhash.xxh3_64_intdigest(view) != r.xxh3:
                mismatches.append(ChecksumMismatch(seg_id, f"extent[group={r.group},chunk={r.chunk}]"))
            views[(r.group, r.chunk)] = view
    return views, buf, len(plans), mismatches


class SegmentUnreadable(Exception):
    """A segment file could not be opened, or read to its recorded size."""

    def __init__(self, segment_id: int, cause: BaseException):
        self.segment_id = segment_id
        self.cause = cause
        super().__init__(f"segment {segment_id} unreadable: {cause.__class__.__name__}: {cause}")


def _untracked(future):
    return future


def _exception(future) -> BaseException | None:
    try:
        future.result()
    except BaseException as exc:  # noqa: BLE001 - re-raised by the caller
        return exc
    return None
