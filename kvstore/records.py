"""In-memory views of index records: manifests and segments (no I/O)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .contract.geometry import StoreGeometry
from .contract.layout import SegmentLayout


@dataclass(frozen=True)
class SegmentInfo:
    """The immutable part of a segment record."""

    segment_id: int
    layout: SegmentLayout
    first_chunk: int
    extent_xxh3: np.ndarray  # [groups, chunks] uint64
    summaries_xxh3: int
    probe_xxh3: tuple[int, ...]

    @classmethod
    def from_record(cls, rec: dict) -> SegmentInfo:
        geo = StoreGeometry.from_dict(rec["geometry"])
        return cls(
            segment_id=rec["segment_id"],
            layout=SegmentLayout(geo, rec["num_tokens"]),
            first_chunk=rec["first_chunk"],
            extent_xxh3=np.array(rec["extent_xxh3"], dtype=np.uint64),
            summaries_xxh3=rec["summaries_xxh3"],
            probe_xxh3=tuple(rec["probe_xxh3"]),
        )

    def regions(self) -> list[tuple[str, int, int, int]]:
        """Every checksummed region: ``(name, offset, length, xxh3)``."""
        lay = self.layout
        out = []
        for g in range(lay.geometry.num_groups):
            for j in range(lay.num_chunks):
                out.append(
                    (
                        f"extent[group={g},chunk={self.first_chunk + j}]",
                        int(lay.extent_offsets[g, j]),
                        int(lay.extent_lengths[g, j]),
                        int(self.extent_xxh3[g, j]),
                    )
                )
        out.append(("summaries", lay.summaries_offset, lay.summaries_length, self.summaries_xxh3))
        for g, (off, xx) in enumerate(zip(lay.probe_offsets, self.probe_xxh3)):
            out.append((f"probe[group={g}]", off, lay.probe_length, xx))
        return out


@dataclass(frozen=True)
class Piece:
    """Chunks ``[first_chunk, first_chunk + num_chunks)`` of a prefix, stored in
    segment ``segment_id`` from its local chunk ``segment_chunk`` on."""

    segment_id: int
    first_chunk: int
    num_chunks: int
    segment_chunk: int

    def to_dict(self) -> dict:
        return {
            "segment_id": self.segment_id,
            "first_chunk": self.first_chunk,
            "num_chunks": self.num_chunks,
            "segment_chunk": self.segment_chunk,
        }


PREFIX, PAGES = "prefix", "pages"  # manifest kinds: a token prefix, a batch of pages (pages.py)


@dataclass(frozen=True)
class PrefixView:
    prefix_id: str
    namespace: str
    model_fingerprint: str
    geometry: StoreGeometry
    num_tokens: int
    chunk_hashes: tuple[str, ...]
    pieces: tuple[Piece, ...]
    created: float
    kind: str = PREFIX
    _starts: np.ndarray = field(repr=False, compare=False, default=None)

    @classmethod
    def from_manifest(cls, m: dict) -> PrefixView:
        pieces = tuple(Piece(**p) for p in m["segments"])
        return cls(
            prefix_id=m["prefix_id"],
            namespace=m["namespace"],
            model_fingerprint=m["model_fingerprint"],
            geometry=StoreGeometry.from_dict(m["geometry"]),
            num_tokens=m["num_tokens"],
            chunk_hashes=tuple(m["chunk_hashes"]),
            pieces=pieces,
            created=m["created"],
            kind=m.get("kind", PREFIX),
            _starts=np.array([p.first_chunk for p in pieces], dtype=np.int64),
        )

    def to_manifest(self) -> dict:
        return {
            "prefix_id": self.prefix_id,
            "namespace": self.namespace,
            "model_fingerprint": self.model_fingerprint,
            "geometry": self.geometry.to_record(),
            "num_tokens": self.num_tokens,
            "chunk_hashes": list(self.chunk_hashes),
            "segments": [p.to_dict() for p in self.pieces],
            "created": self.created,
            "kind": self.kind,
        }

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_hashes)

    @property
    def kv_bytes(self) -> int:
        """Bytes of the prefix's KV as stored at its geometry (every layer, K and V, quantized when the
        geometry's ``kv_quant`` is; no padding, summaries or probe keys)."""
        return self.geometry.kv_bytes(self.num_tokens)

    @property
    def segment_ids(self) -> list[int]:
        return sorted({p.segment_id for p in self.pieces})

    @cached_property
    def chunk_positions(self) -> dict[str, int]:
        """Chunk index of each chunk hash (hex)."""
        return {h: j for j, h in enumerate(self.chunk_hashes)}

    def first_chunk_not_extended(self, later: PrefixView) -> int | None:
        """The first chunk of this prefix whose tokens ``later`` does not start with; None: none.

        Whole chunks compare by their chained hashes: equal hashes at chunk
        ``j`` mean equal tokens (and namespace, model, geometry) up to its
        end, so the first difference is found by bisection.  A last chunk
        shorter than ``chunk_tokens`` compares only when ``later`` ends at
        the same token (its hash covers exactly its tokens); otherwise it is
        not compared, as no tokens are stored.
        """
        same_end = later.num_tokens == self.num_tokens
        n = self.num_chunks if same_end else self.num_tokens // self.geometry.chunk_tokens
        mine, theirs = self.chunk_hashes, later.chunk_hashes
        if n == 0 or (len(theirs) >= n and mine[n - 1] == theirs[n - 1]):
            return None
        return bisect.bisect_left(range(min(n, len(theirs))), True, key=lambda j: mine[j] != theirs[j])

    def locate(self, chunks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Piece index and segment-local chunk of each prefix chunk index."""
        which = np.searchsorted(self._starts, chunks, side="right") - 1
        first = self._starts[which]
        seg_chunk = np.array([self.pieces[i].segment_chunk for i in range(len(self.pieces))], dtype=np.int64)[which]
        return which, seg_chunk + (chunks - first)

    def pieces_upto(self, num_chunks: int) -> list[Piece]:
        """The pieces covering chunks ``[0, num_chunks)``, the last one trimmed."""
        out = []
        for p in self.pieces:
            if p.first_chunk >= num_chunks:
                break
            n = min(p.num_chunks, num_chunks - p.first_chunk)
            out.append(Piece(p.segment_id, p.first_chunk, n, p.segment_chunk))
        return out
