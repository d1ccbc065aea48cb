"""Delivered rows on their way to a GPU: gathered into pinned host buffers, copied on a stream of their own.

A group's rows arrive as extents in the shared-memory arena (or in the
stream's messages) and are gathered into one ``[layers, 2, heads, rows, d]``
array.  Gathered into pageable memory, the copy to the device runs at the
driver's pageable rate (6-8 GB/s on an H200 host, against 55 GB/s pinned)
and the host waits for it.  Gathered into a pinned buffer of this ring
(``host``, the Prefetch stream's ``group_out``), the copy is queued on the
staging stream (``upload``) and the host goes on: the copy of one group
runs while the GPU computes the group before it, and the compute stream
waits for the copy's event, not the host.

Over shared memory, a group of full, unquantized chunks is not gathered by
rows: its extents are copied into the buffer as they are stored
(``host_chunks``), one copy per run of extents a coalesced read put side by
side in the arena, and ``upload`` puts the rows in order on the device (one
copy there).  On the H200 machine's host the gather by rows of a 3.3 MB
group took about 1.5 ms (docs/gpu.md).

A buffer is written again only after its last copy's event: ``host`` waits
for it, or takes another buffer while a gathered array has not been
uploaded yet (a Period gathered whole before its compute).  One ring per
runner, used by one request at a time, like the runner itself.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..client import to_torch

MIN_BUFFER_BYTES = 1 << 20


class _Slot:
    def __init__(self):
        self.buffer: torch.Tensor | None = None  # pinned uint8
        self.copied: torch.cuda.Event | None = None  # the last copy out of it
        self.array: np.ndarray | None = None  # gathered, not yet uploaded
        self.chunk_major = False  # the array holds extents as stored: [chunks, layers, 2, heads, tokens, d]


class PinnedStaging:
    """The ring of pinned buffers and the staging stream of one CUDA runner (module docstring)."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device)
        self.slots: list[_Slot] = [_Slot(), _Slot()]  # two at least: one gathered while the other is copied
        self._next = 0
        self.bytes_uploaded = 0

    def reset(self) -> None:
        """A new request: arrays gathered and never uploaded (a request cut short) free their buffers."""
        for slot in self.slots:
            slot.array = None

    def host(self, shape, dtype) -> np.ndarray:
        """A pinned array of ``shape``/``dtype`` to gather a group into; its buffer's last copy has finished."""
        return self._fill(shape, dtype, chunk_major=False)

    def host_chunks(self, shape, dtype) -> np.ndarray:
        """``host`` for extents copied as stored, ``[chunks, layers, 2, heads, tokens, d]`` (the Prefetch stream's
        ``group_out_chunks``: one copy per run of adjacent extents instead of a gather by rows); ``upload``
        puts the rows in order on the device."""
        return self._fill(shape, dtype, chunk_major=True)

    def _fill(self, shape, dtype, *, chunk_major: bool) -> np.ndarray:
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        slot = self._free_slot()
        if slot.copied is not None:
            slot.copied.synchronize()
            slot.copied = None
        if slot.buffer is None or slot.buffer.numel() < nbytes:
            size = max(MIN_BUFFER_BYTES, 1 << (max(nbytes, 1) - 1).bit_length())
            slot.buffer = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        slot.array = slot.buffer[:nbytes].numpy().view(dtype).reshape(shape)
        slot.chunk_major = chunk_major
        return slot.array

    def upload(self, arr: np.ndarray, dtype) -> torch.Tensor | None:
        """``arr`` on the device when ``host`` gave it (the copy queued on the staging stream, the current stream
        made to wait for it); None for any other array."""
        slot = next((s for s in self.slots if s.array is arr), None)
        if slot is None:
            return None
        slot.array = None
        src = to_torch(arr, dtype)
        main = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.stream):
            out = src.to(self.device, non_blocking=True)
            slot.copied = torch.cuda.Event()
            slot.copied.record(self.stream)
        main.wait_event(slot.copied)
        out.record_stream(main)  # made on the staging stream, read on the current one
        self.bytes_uploaded += arr.nbytes
        if slot.chunk_major:  # [chunks, layers, 2, heads, t, d] -> [layers, 2, heads, chunks * t, d], one copy on the device
            n, layers, two, heads, t, d = out.shape
            out = out.permute(1, 2, 3, 0, 4, 5).reshape(layers, two, heads, n * t, d)
        return out

    def _free_slot(self) -> _Slot:
        """The next slot round the ring that holds no gathered array (a new one when all do)."""
        for _ in range(len(self.slots)):
            slot = self.slots[self._next]
            self._next = (self._next + 1) % len(self.slots)
            if slot.array is None:
                return slot
        self.slots.append(_Slot())
        return self.slots[-1]
