"""Assembly of one new segment image: extents in, summaries and probes derived.

``SegmentImage`` holds the whole segment file in aligned memory while a put
is in progress.  Each extent is validated against the geometry when it
arrives; key summaries and probe keys are computed from the extents
themselves, so they can never disagree with the stored KV.  Quantized probe
keys (``StoreGeometry.probe_bits``) are quantized chunk by chunk as each
group's extent completes: the format scales each (head, token) row on its
own, so a chunk's rows are those of the whole prefix.
"""

from __future__ import annotations

import numpy as np
import xxhash

from .contract.errors import InvalidArgument
from .contract.geometry import SUMMARY_DTYPE
from .contract.kv_values import key_summary, keys_as_float32
from .contract.layout import SegmentLayout
from .contract.probes import quantize_probe_rows
from .io import aligned_buffer


class SegmentImage:
    def __init__(self, layout: SegmentLayout, first_chunk: int, buffer: memoryview | None = None):
        """``buffer``: zero-filled aligned memory of ``layout.total_bytes`` (``KeptBuffers.take``); default a fresh one."""
        self.layout = layout
        self.first_chunk = first_chunk  # prefix chunk index of local chunk 0
        if buffer is not None and buffer.nbytes != layout.total_bytes:
            raise ValueError(f"a segment image of {layout.total_bytes} bytes got a buffer of {buffer.nbytes}")
        self.buffer = buffer if buffer is not None else aligned_buffer(layout.total_bytes)
        self._array = np.frombuffer(self.buffer, dtype=np.uint8)
        geo = layout.geometry
        m = geo.model
        self._written = np.zeros((geo.num_groups, layout.num_chunks), dtype=bool)
        self._received = np.zeros((geo.num_groups, layout.num_chunks), dtype=np.int64)  # bytes so far
        s_off, s_len = layout.summaries_offset, layout.summaries_length
        # [chunks, layers, heads, min|max, dim]
        self.summaries = (
            self._array[s_off : s_off + s_len].view(SUMMARY_DTYPE).reshape(layout.num_chunks, m.num_layers, m.num_kv_heads, 2, m.head_dim)
        )
        # per group: keys [heads, tokens, dim] in the KV dtype, or packed rows [heads, tokens, row_bytes] uint8
        self.probes = [geo.probe_array(self._array[off : off + layout.probe_length], layout.num_tokens) for off in layout.probe_offsets]

    @property
    def missing(self) -> int:
        return int((~self._written).sum())

    def first_missing(self) -> tuple[int, int] | None:
        idx = np.argwhere(~self._written)
        if idx.size == 0:
            return None
        g, j = idx[0]
        return int(g), int(j) + self.first_chunk

    def extent_length(self, group: int, chunk: int) -> int:
        """Unpadded bytes of extent (group, prefix chunk ``chunk``); validates both."""
        layout, geo = self.layout, self.layout.geometry
        if isinstance(group, bool) or not isinstance(group, (int, np.integer)) or not 0 <= group < geo.num_groups:
            raise InvalidArgument("extent.group", f"must be in [0, {geo.num_groups}), got {group}")
        local = chunk - self.first_chunk if isinstance(chunk, (int, np.integer)) else -1
        if not 0 <= local < layout.num_chunks:
            raise InvalidArgument(
                "extent.chunk",
                f"must be in [{self.first_chunk}, {self.first_chunk + layout.num_chunks}) for this put, got {chunk}",
            )
        return int(layout.extent_lengths[group, local])

    def put_extent(self, group: int, chunk: int, payload) -> None:
        """Copy one whole extent (prefix chunk index ``chunk``) into the image."""
        data = _payload_bytes(payload)
        expected = self.extent_length(group, chunk)
        if data.size != expected:
            geo = self.layout.geometry
            tokens = int(self.layout.chunk_tokens[chunk - self.first_chunk])
            raise InvalidArgument(
                "extent.payload",
                f"group {group} chunk {chunk} must be {expected} bytes "
                f"{geo.extent_shape(group, tokens)} x {geo.model.dtype}, got {data.size}",
            )
        self.put_extent_part(group, chunk, 0, data)

    def put_extent_part(self, group: int, chunk: int, offset: int, payload) -> None:
        """Copy bytes ``[offset, offset+len)`` of an extent; parts arrive in order."""
        expected = self.extent_length(group, chunk)
        local = chunk - self.first_chunk
        data = _payload_bytes(payload)
        have = int(self._received[group, local])
        if have == expected:
            raise InvalidArgument("extent", f"group {group} chunk {chunk} was already sent")
        if offset != have:
            raise InvalidArgument("extent.offset", f"group {group} chunk {chunk}: expected offset {have}, got {offset}")
        if data.size == 0 or offset + data.size > expected:
            raise InvalidArgument(
                "extent.payload", f"group {group} chunk {chunk}: {offset + data.size} bytes exceed the extent's {expected}"
            )
        start = int(self.layout.extent_offsets[group, local]) + offset
        self._array[start : start + data.size] = data
        self._received[group, local] = have + data.size
        if have + data.size == expected:
            base = int(self.layout.extent_offsets[group, local])
            self._derive(group, local, self._array[base : base + expected])
            self._written[group, local] = True

    def put_extents(self, group: int, chunks, payloads) -> None:
        """Whole extents of one group for consecutive prefix chunks ``chunks``, derived in one vectorized pass.

        The image ends up byte for byte as after ``put_extent`` of each (a fill moves a batch of chunks
        at once; per extent, numpy's call overheads cost more than the arithmetic).
        """
        chunks = self.copy_extents(group, chunks, payloads)
        self.derive_extents(group, chunks)

    def copy_extents(self, group: int, chunks, payloads) -> list[int]:
        """The copy half of ``put_extents``: validate and copy; the chunks, for ``derive_extents``.

        The two halves may run on different threads (a fill derives one batch while it copies the
        next); an extent copied and not yet derived counts as missing.
        """
        chunks = [int(j) for j in chunks]
        if len(chunks) != len(payloads):
            raise InvalidArgument("extents", f"{len(chunks)} chunks but {len(payloads)} payloads")
        if any(b != a + 1 for a, b in zip(chunks, chunks[1:])):
            raise InvalidArgument("extent.chunk", f"chunks must be consecutive, got {chunks}")
        datas = []
        for j, payload in zip(chunks, payloads):
            data = _payload_bytes(payload)
            expected = self.extent_length(group, j)
            local = j - self.first_chunk
            if data.size != expected:
                raise InvalidArgument("extent.payload", f"group {group} chunk {j} must be {expected} bytes, got {data.size}")
            if self._received[group, local]:
                raise InvalidArgument("extent", f"group {group} chunk {j} was already sent")
            datas.append(data)
        for j, data in zip(chunks, datas):
            local = j - self.first_chunk
            start = int(self.layout.extent_offsets[group, local])
            self._array[start : start + data.size] = data
            self._received[group, local] = data.size
        return chunks

    def extent_views(self, group: int, chunks) -> list[memoryview]:
        """Writable views of the extents of ``chunks`` in the image, for a fetch that receives them in place
        (``RemoteTier.get_extents_into``); ``received_in_place`` then takes them as ``copy_extents`` would."""
        views = []
        for j in chunks:
            length = self.extent_length(group, j)
            start = int(self.layout.extent_offsets[group, j - self.first_chunk])
            views.append(self.buffer[start : start + length])
        return views

    def received_in_place(self, group: int, chunks) -> list[int]:
        """``copy_extents`` of extents already written into their ``extent_views``; the chunks, for ``derive_extents``."""
        chunks = [int(j) for j in chunks]
        if any(b != a + 1 for a, b in zip(chunks, chunks[1:])):
            raise InvalidArgument("extent.chunk", f"chunks must be consecutive, got {chunks}")
        locals_ = [j - self.first_chunk for j in chunks]
        for j in chunks:
            self.extent_length(group, j)  # validates group and chunk
        if self._received[group, locals_].any():
            raise InvalidArgument("extent", f"group {group}: some of chunks {chunks} were already sent")
        self._received[group, locals_] = self.layout.extent_lengths[group, locals_]
        return chunks

    def derive_extents(self, group: int, chunks: list[int]) -> None:
        """The derive half of ``put_extents``: summaries and probe keys of extents ``copy_extents`` took."""
        layout = self.layout
        locals_ = [j - self.first_chunk for j in chunks]
        if (self._received[group, locals_] != layout.extent_lengths[group, locals_]).any():
            raise InvalidArgument("extents", f"group {group}: derive_extents of chunks {chunks} before copy_extents took them whole")
        full = [k for k in locals_ if int(layout.chunk_tokens[k]) == layout.geometry.chunk_tokens]
        n = len(full) if len(full) >= 2 else 0  # the run's full chunks come first: only the prefix's last can be shorter
        if n:
            self._derive_run(group, full[0], n)
        for k in locals_[n:]:
            start = int(layout.extent_offsets[group, k])
            self._derive(group, k, self._array[start : start + int(layout.extent_lengths[group, k])])
        for k in locals_:
            self._written[group, k] = True

    def _derive_run(self, group: int, first_local: int, n: int) -> None:
        """``_derive`` of ``n`` consecutive full chunks from ``first_local`` on, in one pass."""
        layout, geo = self.layout, self.layout.geometry
        tokens = geo.chunk_tokens
        ext = self._run_array(group, first_local, n)
        if ext is None:
            views = [
                self._array[o : o + size]
                for o, size in zip(
                    layout.extent_offsets[group, first_local : first_local + n].tolist(),
                    layout.extent_lengths[group, first_local : first_local + n].tolist(),
                )
            ]
            ext = np.stack([geo.extent_array(v, group, tokens) for v in views])  # [n, layers, 2, heads, tokens, dim]
        layers = geo.group_layer_range(group)
        nl = layers.stop - layers.start
        summary = key_summary(ext.reshape(n * nl, *ext.shape[2:]), geo.model.dtype)  # [n * layers, heads, 2, dim]
        self.summaries[first_local : first_local + n, layers.start : layers.stop] = summary.reshape(n, nl, *summary.shape[1:])
        if self.probes:
            t0 = int(layout.token_offsets[first_local])
            keys = ext[:, 0, 0]  # the group's first layer: [n, heads, tokens, dim]
            keys = keys.transpose(1, 0, 2, 3).reshape(keys.shape[1], n * tokens, keys.shape[3])
            if geo.probe_bits:
                keys = quantize_probe_rows(keys_as_float32(keys, geo.model.dtype), geo.probe_bits)
            self.probes[group][:, t0 : t0 + n * tokens, :] = keys

    def _run_array(self, group: int, first_local: int, n: int) -> np.ndarray | None:
        """The run's extents as one ``[n, layers, 2, heads, tokens, dim]`` view of the image, without a copy:
        None where a copy is needed (quantized or streaming-heads extents, uneven spacing)."""
        layout, geo = self.layout, self.layout.geometry
        if geo.kv_quant or geo.streaming_heads:
            return None
        offsets = layout.extent_offsets[group, first_local : first_local + n]
        steps = np.diff(offsets)
        if steps.size and (steps != steps[0]).any():
            return None
        dtype = geo.model.numpy_dtype()
        shape = geo.extent_shape(group, geo.chunk_tokens)
        inner = tuple(int(x) for x in np.cumprod((1, *shape[:0:-1]))[::-1] * dtype.itemsize)  # C-contiguous strides
        step = int(steps[0]) if steps.size else int(layout.extent_lengths[group, first_local])
        return np.ndarray((n, *shape), dtype=dtype, buffer=self._array, offset=int(offsets[0]), strides=(step, *inner))

    def _derive(self, group: int, local: int, data: np.ndarray) -> None:
        layout, geo = self.layout, self.layout.geometry
        tokens = int(layout.chunk_tokens[local])
        ext = geo.extent_array(data, group, tokens)  # dequantized when the geometry stores KV quantized
        layers = geo.group_layer_range(group)
        self.summaries[local, layers.start : layers.stop] = key_summary(ext, geo.model.dtype)
        if self.probes:
            t0 = int(layout.token_offsets[local])
            keys = ext[0, 0]  # the group's first layer: [heads, tokens, dim]
            if geo.probe_bits:
                keys = quantize_probe_rows(keys_as_float32(keys, geo.model.dtype), geo.probe_bits)
            self.probes[group][:, t0 : t0 + tokens, :] = keys

    def checksums(self, extent_xxh3: list[list[int]] | None = None) -> dict:
        """xxh3-64 of every region (unpadded bytes), for the segment record.

        ``extent_xxh3`` (``[groups][chunks]``): the extents' checksums, where every extent was checked
        against them on its way in (a fill from the remote tier); the rest is hashed here.
        """
        layout = self.layout
        arr = self._array
        ext = extent_xxh3 or [
            [xxhash.xxh3_64_intdigest(arr[o : o + n]) for o, n in zip(layout.extent_offsets[g].tolist(), layout.extent_lengths[g].tolist())]
            for g in range(layout.geometry.num_groups)
        ]
        s_off = layout.summaries_offset
        summaries = xxhash.xxh3_64_intdigest(arr[s_off : s_off + layout.summaries_length])
        probes = [xxhash.xxh3_64_intdigest(arr[o : o + layout.probe_length]) for o in layout.probe_offsets]
        return {"extent_xxh3": ext, "summaries_xxh3": summaries, "probe_xxh3": probes}


def _payload_bytes(payload) -> np.ndarray:
    """A flat uint8 view (a copy only when ``payload`` is not contiguous)."""
    if isinstance(payload, np.ndarray):
        return np.ascontiguousarray(payload).reshape(-1).view(np.uint8)
    try:
        view = memoryview(payload)
    except TypeError:
        raise InvalidArgument("extent.payload", f"must be bytes-like, got {type(payload).__name__}") from None
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    return np.frombuffer(view.cast("B"), dtype=np.uint8)
