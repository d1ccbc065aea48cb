"""Disk eviction policy: which stored prefixes leave the disk (pure, no I/O).

A prefix's cost of eviction is the cache value it takes with it per byte it
gives back: the sum of ``S_j = I_j * F_j`` over the units of the segments
only it references, divided by those segments' bytes.  Per byte, because the
goal is bytes: a large cold prefix should go before a small warm one even
when their totals are equal.  Only unshared segments count, because only
they are freed; a prefix whose segments are all shared frees nothing now.

``choose_victims`` takes the cheapest prefixes first until the bytes asked
for are freed; the oldest goes first among equals (fresh data has no score
yet).  This minimises the highest score evicted: any set that frees enough
must reach at least the same score.  Prefixes in use are never chosen.

``segments_to_merge`` picks the small segments of page batches that go into
one new segment together (``store/merge.py``): only segments of the same
namespace, model and geometry, none in use.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(frozen=True)
class PrefixCost:
    prefix_id: str
    bytes_freed: int  # bytes of the segments only this prefix references
    score: float  # sum of S over those segments' units
    created: float
    in_use: bool

    @property
    def score_per_byte(self) -> float:
        return self.score / self.bytes_freed if self.bytes_freed else float("inf")

    def rank(self) -> tuple[float, float, str]:
        return (self.score_per_byte, self.created, self.prefix_id)


def choose_victims(candidates: list[PrefixCost], need_bytes: int) -> list[str]:
    """Prefix ids to evict, in order, to free ``need_bytes``.

    When the evictable prefixes cannot free enough, all of those that free
    something are returned; when none frees anything, the cheapest evictable
    one is (deleting it makes segments it shares unshared, so the caller
    plans again).  Never a prefix in use; no side effects.
    """
    if need_bytes <= 0:
        return []
    evictable = [c for c in candidates if not c.in_use]
    freeing = sorted((c for c in evictable if c.bytes_freed > 0), key=PrefixCost.rank)
    if not freeing:
        shared = min(evictable, key=lambda c: (c.score, c.created, c.prefix_id), default=None)
        return [shared.prefix_id] if shared else []
    out, freed = [], 0
    for c in freeing:
        if freed >= need_bytes:
            break
        out.append(c.prefix_id)
        freed += c.bytes_freed
    return out


@dataclass(frozen=True)
class SegmentUse:
    segment_id: int
    num_chunks: int
    spans: tuple[tuple[int, int], ...]  # referenced local chunks [start, stop), one per piece
    in_use: bool  # a referencing prefix is being read or written


def live_span(use: SegmentUse) -> tuple[int, int]:
    """The local chunks ``[lo, hi)`` a compacted copy keeps: min..max referenced."""
    return min(s for s, _ in use.spans), max(e for _, e in use.spans)


def segments_to_compact(uses: list[SegmentUse], live_fraction: float) -> list[SegmentUse]:
    """Segments whose live span covers less than ``live_fraction`` of them."""
    out = []
    for use in uses:
        if use.in_use or not use.spans:
            continue
        lo, hi = live_span(use)
        if hi - lo < live_fraction * use.num_chunks:
            out.append(use)
    return sorted(out, key=lambda u: u.segment_id)


@dataclass(frozen=True)
class MergeCandidate:
    segment_id: int
    group: Hashable  # (namespace, model fingerprint, geometry): only segments of one group merge
    total_bytes: int
    pages_only: bool  # referenced only by page batches, which cover every one of its chunks
    in_use: bool  # a referencing batch is being read or written


def segments_to_merge(candidates: list[MergeCandidate], *, small_bytes: int, min_segments: int, max_bytes: int) -> list[tuple[int, ...]]:
    """Runs of segment ids, each to become one segment.

    A segment may merge when it holds only page batches, is smaller than
    ``small_bytes`` and is not in use.  A group with at least
    ``min_segments`` of them (0: never) is cut, oldest segment first, into
    runs of at most ``max_bytes`` together; a run of one is left alone.
    """
    if min_segments <= 0:
        return []
    groups: dict[Hashable, list[MergeCandidate]] = defaultdict(list)
    for c in candidates:
        if c.pages_only and not c.in_use and c.total_bytes < small_bytes:
            groups[c.group].append(c)
    out = []
    for members in sorted(groups.values(), key=lambda m: min(c.segment_id for c in m)):
        if len(members) < min_segments:
            continue
        run: list[MergeCandidate] = []
        for c in sorted(members, key=lambda c: c.segment_id):
            if run and sum(r.total_bytes for r in run) + c.total_bytes > max_bytes:
                if len(run) > 1:
                    out.append(tuple(r.segment_id for r in run))
                run = []
            run.append(c)
        if len(run) > 1:
            out.append(tuple(r.segment_id for r in run))
    return out


def small_segments_by_group(candidates: list[MergeCandidate], small_bytes: int) -> dict[Hashable, int]:
    """How many segments of each group a merge could take (in use or not)."""
    out: dict[Hashable, int] = defaultdict(int)
    for c in candidates:
        if c.pages_only and c.total_bytes < small_bytes:
            out[c.group] += 1
    return dict(out)
