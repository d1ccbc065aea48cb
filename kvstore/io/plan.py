"""Read planning: coalesce adjacent extents into few large reads (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ReadRun:
    """One contiguous read covering one or more extents."""

    offset: int
    length: int
    members: list[int] = field(default_factory=list)  # indices into the request list


def coalesce(extents: list[tuple[int, int]], *, max_run_bytes: int, enabled: bool = True) -> list[ReadRun]:
    """Group ``(offset, padded_length)`` extents into contiguous runs.

    Extents are taken in offset order; two join a run when the second starts
    exactly where the first ends and the run stays within ``max_run_bytes``
    (an extent larger than that is still read alone, whole).  With
    ``enabled=False`` every extent is its own run.  Overlapping or duplicate
    extents are not merged: callers pass distinct extents.
    """
    order = sorted(range(len(extents)), key=lambda i: extents[i][0])
    runs: list[ReadRun] = []
    for i in order:
        off, length = extents[i]
        last = runs[-1] if runs else None
        if enabled and last is not None and last.offset + last.length == off and last.length + length <= max_run_bytes:
            last.length += length
            last.members.append(i)
        else:
            runs.append(ReadRun(off, length, [i]))
    return runs
