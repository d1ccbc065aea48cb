"""Cache scores of the chunk store's units: what reads and clients report, and its persistence.

A unit is one extent (segment, segment-local chunk, stored period group:
``Catalogue.units``); ``scores.ScoreTable`` keeps ``I_j`` and ``F_j`` in
memory, and ``flush`` writes the changed entries to the index in one
transaction (periodically in the daemon, and when the store closes).
"""

from __future__ import annotations

import numpy as np

from .. import index_ops as ops
from ..contract.errors import InvalidArgument
from ..index import Index
from ..reader import validate_chunks
from ..scores import ScoreTable
from .catalogue import Catalogue


class Scoring:
    def __init__(self, catalogue: Catalogue, table: ScoreTable, index: Index):
        self._catalogue = catalogue
        self._table = table
        self._index = index

    def record_access(self, prefix_id: str, chunks, groups) -> None:
        """``F_j += 1`` for every unit read (in memory; see ``flush``)."""
        self._table.add_access(self._catalogue.units(prefix_id, chunks, groups))

    def report_attention(self, prefix_id: str, group: int, chunks, attention) -> int:
        """``I_j += A_j``: the attention mass the client measured for each chunk; units changed."""
        mass = np.asarray(attention, dtype=np.float64)
        if mass.ndim != 1 or mass.size != len(chunks):
            raise InvalidArgument("attention", f"needs one value per chunk ({len(chunks)}), got shape {mass.shape}")
        if not np.all(np.isfinite(mass)) or (mass < 0).any():
            raise InvalidArgument("attention", "values must be finite and non-negative")
        view = self._catalogue.describe(prefix_id)
        sel = validate_chunks(chunks, view.num_chunks)
        order = np.argsort(np.asarray(chunks, dtype=np.int64), kind="stable")
        units = self._catalogue.units(prefix_id, sel, [group])
        self._table.add_attention(units, mass[order].tolist())
        return len(units)

    def flush(self) -> int:
        """Persist changed scores to the index (one transaction); entries written."""
        dirty = self._table.take_dirty()
        if not dirty:
            return 0
        try:
            ops.write_scores(self._index, dirty)
        except BaseException:
            self._table.mark_dirty(u for u, _ in dirty)
            raise
        return len(dirty)
