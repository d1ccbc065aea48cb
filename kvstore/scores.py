"""Cache scores of stored units: ``S_j = I_j * F_j`` (pure, no I/O).

A unit is one extent: (segment, segment-local chunk, stored period group).
``I_j`` accumulates the attention mass the client reports for the chunk
after each request that used it; ``F_j`` counts accesses (reads).  The
table covers every unit ever scored, resident or not; the store persists
the entries that changed (``take_dirty``) so a restart does not forget.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass

Unit = tuple[int, int, int]  # (segment_id, segment-local chunk, group)

_KEY = struct.Struct(">QII")
_VALUE = struct.Struct("<dQ")


@dataclass
class UnitScore:
    importance: float = 0.0  # I_j: cumulative reported attention
    frequency: int = 0  # F_j: accesses

    @property
    def score(self) -> float:
        return self.importance * self.frequency


class ScoreTable:
    def __init__(self):
        self._lock = threading.Lock()
        self._scores: dict[Unit, UnitScore] = {}
        self._dirty: set[Unit] = set()

    def __len__(self) -> int:
        with self._lock:
            return len(self._scores)

    def add_attention(self, units: list[Unit], masses: list[float]) -> None:
        with self._lock:
            for unit, mass in zip(units, masses):
                self._scores.setdefault(unit, UnitScore()).importance += float(mass)
                self._dirty.add(unit)

    def add_access(self, units: list[Unit]) -> None:
        with self._lock:
            for unit in units:
                self._scores.setdefault(unit, UnitScore()).frequency += 1
                self._dirty.add(unit)

    def get(self, unit: Unit) -> UnitScore:
        with self._lock:
            s = self._scores.get(unit)
            return UnitScore(s.importance, s.frequency) if s else UnitScore()

    def drop_segment(self, segment_id: int) -> None:
        with self._lock:
            for unit in [u for u in self._scores if u[0] == segment_id]:
                del self._scores[unit]
                self._dirty.add(unit)

    def segment_totals(self) -> dict[int, float]:
        """Sum of ``S_j`` over each segment's units."""
        out: dict[int, float] = {}
        with self._lock:
            for (seg, _, _), s in self._scores.items():
                out[seg] = out.get(seg, 0.0) + s.score
        return out

    def span_scores(self, segment_id: int, lo: int, hi: int, new_segment_id: int) -> list[tuple[Unit, UnitScore]]:
        """The scores of local chunks ``[lo, hi)``, keyed as chunks ``[0, hi-lo)`` of the new segment."""
        with self._lock:
            return [
                ((new_segment_id, c - lo, g), UnitScore(s.importance, s.frequency))
                for (seg, c, g), s in self._scores.items()
                if seg == segment_id and lo <= c < hi
            ]

    def replace_segment(self, segment_id: int, moved: list[tuple[Unit, UnitScore]]) -> None:
        """A compacted segment's scores now live under its copy (already persisted)."""
        self.drop_segment(segment_id)
        with self._lock:
            self._scores.update(moved)

    def merged_scores(self, offsets: dict[int, int], new_segment_id: int) -> list[tuple[Unit, UnitScore]]:
        """The scores of whole segments merged into one: local chunk ``c`` of segment ``s`` becomes ``offsets[s] + c``."""
        with self._lock:
            return [
                ((new_segment_id, offsets[seg] + c, g), UnitScore(s.importance, s.frequency))
                for (seg, c, g), s in self._scores.items()
                if seg in offsets
            ]

    def replace_segments(self, segment_ids, moved: list[tuple[Unit, UnitScore]]) -> None:
        """Merged segments' scores now live under the merged one (already persisted)."""
        for seg in segment_ids:
            self.drop_segment(seg)
        with self._lock:
            self._scores.update(moved)

    def take_dirty(self) -> list[tuple[Unit, UnitScore | None]]:
        """Changed entries since the last call (None: removed)."""
        with self._lock:
            out = [(u, self._scores.get(u)) for u in self._dirty]
            self._dirty.clear()
            return out

    def mark_dirty(self, units) -> None:
        """Put entries back after a failed persist."""
        with self._lock:
            self._dirty.update(units)

    def load(self, entries) -> None:
        with self._lock:
            for unit, score in entries:
                self._scores[unit] = score


def encode(unit: Unit, score: UnitScore) -> tuple[bytes, bytes]:
    return _KEY.pack(*unit), _VALUE.pack(score.importance, score.frequency)


def decode(key: bytes, value: bytes) -> tuple[Unit, UnitScore]:
    importance, frequency = _VALUE.unpack(bytes(value))
    return _KEY.unpack(bytes(key)), UnitScore(importance, frequency)


def unit_key(unit: Unit) -> bytes:
    return _KEY.pack(*unit)
