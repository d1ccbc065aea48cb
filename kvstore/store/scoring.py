"""Cache scores of the chunk store's units: what reads and clients report, and its persistence.

A unit is one extent (segment, segment-local chunk, stored period group);
``scores.ScoreTable`` keeps ``I_j`` and ``F_j`` in memory, and
``flush_scores`` writes the changed entries to the index in one
transaction (periodically in the daemon, and when the store closes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import index_ops as ops
from ..errors import InvalidArgument
from ..reader import validate_chunks, validate_groups
from ..scores import Unit

if TYPE_CHECKING:
    from .chunk_store import ChunkStore


def units(store: ChunkStore, prefix_id: str, chunks, groups) -> list[Unit]:
    """The stored units (segment, local chunk, group) of a prefix's chunks."""
    view = store.describe(prefix_id)
    sel = validate_chunks(chunks, view.num_chunks)
    grp = validate_groups(groups, view.geometry.num_groups)
    which, local = view.locate(sel)
    seg_ids = [view.pieces[p].segment_id for p in which.tolist()]
    return [(s, loc, g) for g in grp for s, loc in zip(seg_ids, local.tolist())]


def record_access(store: ChunkStore, prefix_id: str, chunks, groups) -> None:
    """``F_j += 1`` for every unit read (in memory; see ``flush_scores``)."""
    store.scores.add_access(store.units(prefix_id, chunks, groups))


def report_attention(store: ChunkStore, prefix_id: str, group: int, chunks, attention) -> int:
    """``I_j += A_j``: the attention mass the client measured for each chunk."""
    mass = np.asarray(attention, dtype=np.float64)
    if mass.ndim != 1 or mass.size != len(chunks):
        raise InvalidArgument("attention", f"needs one value per chunk ({len(chunks)}), got shape {mass.shape}")
    if not np.all(np.isfinite(mass)) or (mass < 0).any():
        raise InvalidArgument("attention", "values must be finite and non-negative")
    view = store.describe(prefix_id)
    sel = validate_chunks(chunks, view.num_chunks)
    order = np.argsort(np.asarray(chunks, dtype=np.int64), kind="stable")
    units = store.units(prefix_id, sel, [group])
    store.scores.add_attention(units, mass[order].tolist())
    return len(units)


def flush_scores(store: ChunkStore) -> int:
    """Persist changed scores to the index (one transaction); entries written."""
    dirty = store.scores.take_dirty()
    if not dirty:
        return 0
    try:
        ops.write_scores(store.index, dirty)
    except BaseException:
        store.scores.mark_dirty(u for u, _ in dirty)
        raise
    return len(dirty)
