"""Byte layout of one segment file (pure functions, no I/O).

A **segment** is a run of consecutive chunks written in one data file::

    extents of group 0, chunk 0..k-1   (each padded to ALIGN_BYTES)
    extents of group 1, chunk 0..k-1
    ...
    key summaries  [chunk][layer][head][min|max][dim] float32  (padded)
    probe keys of group 0  [head][token][dim] in the KV dtype   (padded)
    probe keys of group 1  ...                                  (optional)

The probe keys are the keys of each group's first layer.  With ``probe_bits``
4 or 8 they are stored quantized instead, each (head, token) row packed as
``[codes (d*bits/8 bytes) | scale (float32)]`` (``kvstore.contract.probes``), so
a group's region is ``[head][token][row_bytes]`` uint8, still sliced by token.

Period-major order puts the chunks of one group next to each other, so chunks
selected together for a Period are adjacent on disk and coalesce into one
read.  Every region starts on a 4 KiB boundary, as O_DIRECT and GDS require.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .geometry import ALIGN_BYTES, StoreGeometry, align_up, check_int


@dataclass(frozen=True)
class SegmentLayout:
    """Byte offsets of every region of one segment file (see module doc)."""

    geometry: StoreGeometry
    num_tokens: int  # tokens of the chunks in this segment

    def __post_init__(self) -> None:
        check_int("num_tokens", self.num_tokens, 1, 1 << 40)

    @cached_property
    def num_chunks(self) -> int:
        return self.geometry.num_chunks(self.num_tokens)

    @cached_property
    def chunk_tokens(self) -> np.ndarray:
        return self.geometry.chunk_token_counts(self.num_tokens)

    @cached_property
    def token_offsets(self) -> np.ndarray:
        """First token of each chunk within the segment; ``[num_chunks + 1]``."""
        return np.concatenate([[0], np.cumsum(self.chunk_tokens)])

    @cached_property
    def extent_lengths(self) -> np.ndarray:
        """Unpadded extent bytes; ``[groups, chunks]``."""
        g = self.geometry
        if g.kv_quant or g.streaming_heads:  # per-channel key parameters make the size affine in tokens, not linear
            sizes = {int(t): [g.extent_bytes(i, int(t)) for i in range(g.num_groups)] for t in np.unique(self.chunk_tokens)}
            return np.array([sizes[int(t)] for t in self.chunk_tokens], dtype=np.int64).T.reshape(g.num_groups, self.num_chunks)
        per_token = np.array([g.layers_in_group(i) * g.model.token_layer_bytes for i in range(g.num_groups)], dtype=np.int64)
        return per_token[:, None] * self.chunk_tokens[None, :]

    @cached_property
    def extent_padded(self) -> np.ndarray:
        """Padded extent bytes (multiples of ALIGN_BYTES); ``[groups, chunks]``."""
        return (self.extent_lengths + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES

    @cached_property
    def extent_offsets(self) -> np.ndarray:
        """File offset of each extent, period-major; ``[groups, chunks]``."""
        flat = self.extent_padded.reshape(-1)
        starts = np.concatenate([[0], np.cumsum(flat)[:-1]])
        return starts.reshape(self.extent_padded.shape)

    @cached_property
    def extents_end(self) -> int:
        return int(self.extent_padded.sum())

    @cached_property
    def summaries_offset(self) -> int:
        return self.extents_end

    @cached_property
    def summaries_length(self) -> int:
        return self.num_chunks * self.geometry.summary_chunk_bytes()

    @cached_property
    def probe_offsets(self) -> list[int]:
        """File offset of each group's probe-key region (empty when disabled)."""
        if not self.geometry.probe_keys:
            return []
        start = self.summaries_offset + align_up(self.summaries_length)
        step = align_up(self.probe_length)
        return [start + i * step for i in range(self.geometry.num_groups)]

    @cached_property
    def probe_length(self) -> int:
        return self.geometry.probe_bytes(self.num_tokens)

    @cached_property
    def total_bytes(self) -> int:
        end = self.summaries_offset + align_up(self.summaries_length)
        if self.geometry.probe_keys:
            end += self.geometry.num_groups * align_up(self.probe_length)
        return end

    @cached_property
    def payload_bytes(self) -> int:
        """Bytes of data (without alignment padding)."""
        total = int(self.extent_lengths.sum()) + self.summaries_length
        if self.geometry.probe_keys:
            total += self.geometry.num_groups * self.probe_length
        return total

    @property
    def padding_bytes(self) -> int:
        return self.total_bytes - self.payload_bytes


def split_extents(geometry: StoreGeometry, kv: np.ndarray, first_chunk: int = 0):
    """Yield ``(group, chunk, extent_array)`` from a full KV array.

    ``kv``: ``[layers, 2, kv_heads, tokens, head_dim]``.  Chunks are numbered
    from ``first_chunk`` (relative to ``kv``'s token axis, which starts at the
    first token of that chunk); each extent is a C-contiguous copy.
    """
    c = geometry.chunk_tokens
    n = kv.shape[3]
    for g in range(geometry.num_groups):
        layers = geometry.group_layer_range(g)
        for j in range(geometry.num_chunks(n)):
            ext = kv[layers.start : layers.stop, :, :, j * c : (j + 1) * c, :]
            yield g, first_chunk + j, np.ascontiguousarray(ext)
