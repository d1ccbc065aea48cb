"""The page API on the client side: messages out, arrays back (no I/O).

A page batch travels as ``[pages, layers, 2, kv_heads, chunk_tokens,
head_dim]`` (numpy, bfloat16 as raw uint16); on the wire each page is one
extent per stored period group, ``[layer-in-group][K|V][head][token][dim]``,
so splitting a page into its extents is a slice of the layer axis.
"""

from __future__ import annotations

import numpy as np

from kvstore.contract import InvalidArgument, groups_for_layers, pb
from kvstore.contract.geometry import StoreGeometry

from .tensors import block_index, to_torch


def as_keys(keys) -> list[bytes]:
    """Keys as bytes: ``bytes`` as they are, ``str`` (SGLang's hex keys) UTF-8 encoded."""
    if isinstance(keys, (bytes, str)):
        raise TypeError("keys must be a sequence of keys, not one key")
    return [k.encode() if isinstance(k, str) else bytes(k) for k in keys]


def page_shape(geometry: StoreGeometry, num_pages: int, num_layers: int | None = None) -> tuple[int, ...]:
    """``[pages, layers, 2, kv_heads, chunk_tokens, head_dim]``: every layer, or ``num_layers`` of them."""
    m = geometry.model
    return (num_pages, m.num_layers if num_layers is None else num_layers, 2, m.num_kv_heads, geometry.chunk_tokens, m.head_dim)


def check_pages(kv_pages: np.ndarray, geometry: StoreGeometry, num_keys: int) -> None:
    """ValueError unless ``kv_pages`` holds one page per key in the geometry's shape and dtype."""
    expected = page_shape(geometry, num_keys)
    if kv_pages.shape != expected:
        raise ValueError(f"kv_pages: shape must be {expected} [pages, layers, 2, kv_heads, chunk_tokens, head_dim], got {kv_pages.shape}")
    if kv_pages.dtype != geometry.model.numpy_dtype():
        raise ValueError(f"kv_pages: dtype must be {geometry.model.numpy_dtype()} for {geometry.model.dtype}, got {kv_pages.dtype}")


def put_stream(header: pb.PutPagesHeader, kv_pages: np.ndarray, geometry: StoreGeometry, frame_bytes: int):
    """The PutPages messages: the header, then every page not skipped, group by group."""
    yield pb.PutPagesRequest(header=header)
    skip = set(header.skip_pages)
    for g in range(geometry.num_groups):
        layers = geometry.group_layer_range(g)
        for i in range(kv_pages.shape[0]):
            if i in skip:
                continue
            ext = memoryview(np.ascontiguousarray(kv_pages[i, layers.start : layers.stop])).cast("B")
            for off in range(0, len(ext), frame_bytes):
                frame = pb.ExtentFrame(group=g, chunk=i, offset=off, data=bytes(ext[off : off + frame_bytes]))
                yield pb.PutPagesRequest(extent=frame)


def requested_layers(geometry: StoreGeometry, layer_start: int, layer_end: int) -> range | None:
    """Layers ``[layer_start, layer_end)`` (``layer_end`` 0: through the last), or None for a range the daemon
    refuses (it names the field: an empty range, one past the model's layers)."""
    try:
        groups_for_layers(geometry, layer_start, layer_end)
    except (InvalidArgument, TypeError):
        return None
    return range(layer_start, layer_end or geometry.model.num_layers)


class PageFrames:
    """GetPages extents written into a ``Destination``: of each extent, exactly the layers asked for.

    An extent is ``[layer-in-group][K|V][head][token][dim]`` and a page of the
    result ``[layer][K|V][head][token][dim]``, so the asked-for layers of one
    group are one byte range of its extent and one byte range of the page:
    each frame is cut to that range and copied once, into the caller's memory.
    """

    def __init__(self, geometry: StoreGeometry, groups, layers: range, num_pages: int, dest):
        m = geometry.model
        layer_bytes = 2 * m.num_kv_heads * geometry.chunk_tokens * m.head_dim * m.itemsize
        self.dest = dest
        self.expected = num_pages * len(layers) * layer_bytes
        self.written = 0
        self.spans = {}  # group -> (first byte, end byte) in the extent, first byte in the page
        for g in groups:
            gl = geometry.group_layer_range(g)
            lo, hi = max(gl.start, layers.start), min(gl.stop, layers.stop)
            if lo < hi:
                self.spans[g] = ((lo - gl.start) * layer_bytes, (hi - gl.start) * layer_bytes, (lo - layers.start) * layer_bytes)

    def take(self, group: int, page: int, offset: int, data: np.ndarray) -> None:
        """Bytes ``[offset, offset + len(data))`` of the extent of ``page`` in ``group`` (uint8)."""
        span = self.spans.get(group)
        if span is None:
            return
        first, end, at = span
        lo, hi = max(first, offset), min(end, offset + data.size)
        if lo < hi:
            self.dest.write(page, at + lo - first, data[lo - offset : hi - offset])
            self.written += hi - lo

    def finish(self) -> None:
        self.dest.finish()
        if self.written != self.expected:
            raise ValueError(f"GetPages ended with {self.written} of the {self.expected} bytes asked for")


class PageCollector:
    """One GetPages call's responses written into the destination ``dest_for(num_pages, layers)`` makes once the
    header came (``dest_for`` returns ``(buffer, Destination)``): no I/O, the sync and asyncio clients feed it.

    ``session``: the ``ShmSession`` the call delivers into; each ``ShmGroup``'s leases hold that group's
    extents only and go back as soon as they are copied."""

    def __init__(self, geometry: StoreGeometry, layers: range | None, dest_for, session=None):
        self.geometry = geometry
        self.layers = layers
        self.dest_for = dest_for
        self.session = session
        self.frames: PageFrames | None = None
        self.out = None

    def take(self, msg) -> None:
        if msg.HasField("header"):
            h, geo = msg.header, self.geometry
            if self.layers is None:  # the daemon took the range: all of its groups' layers
                self.layers = range(geo.group_layer_range(h.groups[0]).start, geo.group_layer_range(h.groups[-1]).stop)
            self.out, dest = self.dest_for(h.num_pages, self.layers)
            self.frames = PageFrames(geo, list(h.groups), self.layers, h.num_pages, dest)
        if msg.HasField("extent"):
            e = msg.extent
            self.frames.take(e.group, e.chunk, e.offset, np.frombuffer(e.data, dtype=np.uint8))
        if msg.HasField("shm_group"):
            grp = msg.shm_group
            try:
                for page, ref in zip(grp.chunks, grp.refs):
                    self.frames.take(grp.group, page, 0, self.session.view(ref))
            finally:
                self.session.release({ref.lease_id for ref in grp.refs})

    def drop(self, msg) -> None:
        """A response of a call the caller stopped reading: only its leases go back."""
        if msg.HasField("shm_group") and self.session is not None:
            self.session.release({ref.lease_id for ref in msg.shm_group.refs})

    def finish(self):
        """The caller's buffer, once every byte asked for was written."""
        if self.frames is None:
            raise ValueError("GetPages ended without a header")
        self.frames.finish()
        return self.out


def collect_pages(responses, geometry: StoreGeometry, layers: range | None, dest_for, session=None) -> object:
    """Run a GetPages call (``responses``) through a ``PageCollector``; returns the destination's buffer.

    A caller that stops early reads the rest of the stream for its leases (the daemon gives back those of
    a call that did not complete)."""
    collector = PageCollector(geometry, layers, dest_for, session)
    done = False
    try:
        for msg in responses:
            collector.take(msg)
        done = True
    finally:
        if not done and session is not None:
            try:
                for msg in responses:
                    collector.drop(msg)
            except Exception:  # noqa: BLE001 - cancelled or failed: the daemon gave back what was not the client's
                pass
    return collector.finish()


# ------------------------------------------------------------ engine layouts
# vLLM's FlashAttention backend keeps one paged tensor per layer,
# [2 (K|V), num_blocks, block_size, kv_heads, head_dim]; a page of the store
# is [layers, 2, kv_heads, chunk_tokens, head_dim]: heads and tokens swap, so
# moving pages in or out is one gather (or scatter) plus one transposing copy
# per layer, over every page at once.


def gather_pages(layer_caches, block_ids, out=None):
    """Pages ``[pages, layers, 2, kv_heads, block_size, head_dim]`` from per-layer paged caches.

    ``layer_caches``: per layer ``[2, num_blocks, block_size, kv_heads, head_dim]`` (torch, one dtype and device);
    ``block_ids``: the blocks to save, in page order (a list, range, numpy array or tensor of ints);
    ``out``: where to write them (a tensor of that shape and the caches' dtype), else a new tensor.
    """
    import torch

    first = _check_caches(layer_caches)
    two, num_blocks, block_size, heads, dim = first.shape
    ids = block_index(block_ids, num_blocks, first.device)
    shape = (len(ids), len(layer_caches), two, heads, block_size, dim)
    if out is None:
        out = torch.empty(shape, dtype=first.dtype, device=first.device)
    elif not isinstance(out, torch.Tensor) or tuple(out.shape) != shape or out.dtype != first.dtype:
        got = (tuple(out.shape), out.dtype) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"out: must be a {first.dtype} tensor of shape {shape}, got {got}")
    for layer, cache in enumerate(layer_caches):
        out[:, layer].copy_(cache.index_select(1, ids).permute(1, 0, 3, 2, 4))
    return out


def scatter_pages(pages, layer_caches, block_ids) -> None:
    """Write pages ``[pages, layers, 2, kv_heads, block_size, head_dim]`` into the caches' ``block_ids``.

    ``pages``: a tensor in the caches' dtype, or a numpy array as ``get_pages`` returns it (bfloat16 as
    raw uint16); ``block_ids`` as ``gather_pages`` takes them, each block at most once.  Every argument is
    checked before the first write: a refused call changes no cache.
    """
    import torch

    first = _check_caches(layer_caches)
    two, num_blocks, block_size, heads, dim = first.shape
    if isinstance(pages, np.ndarray):
        pages = to_torch(pages, first.dtype)
    if not isinstance(pages, torch.Tensor):
        raise ValueError(f"pages: must be a torch tensor or numpy array, got {type(pages).__name__}")
    ids = block_index(block_ids, num_blocks, first.device, unique=True)
    shape = (len(ids), len(layer_caches), two, heads, block_size, dim)
    if tuple(pages.shape) != shape:
        raise ValueError(f"pages: shape must be {shape} [pages, layers, 2, kv_heads, block_size, head_dim], got {tuple(pages.shape)}")
    if pages.dtype != first.dtype:
        raise ValueError(f"pages: dtype must be the caches' {first.dtype}, got {pages.dtype}")
    pages = pages.to(first.device)
    for layer, cache in enumerate(layer_caches):
        cache[:, ids] = pages[:, layer].permute(1, 0, 3, 2, 4)


def _check_caches(layer_caches):
    """The first cache, once every cache is a 5-D tensor of one shape, dtype and device (ValueError otherwise)."""
    import torch

    if not layer_caches or not all(isinstance(c, torch.Tensor) for c in layer_caches):
        raise ValueError("layer_caches: must be one tensor [2, num_blocks, block_size, kv_heads, head_dim] per layer")
    first = layer_caches[0]
    if first.dim() != 5 or first.shape[0] != 2:
        raise ValueError(f"layer_caches: each must be [2, num_blocks, block_size, kv_heads, head_dim], got {tuple(first.shape)}")
    for i, c in enumerate(layer_caches):
        if c.shape != first.shape or c.dtype != first.dtype or c.device != first.device:
            raise ValueError(f"layer_caches[{i}]: must match layer 0's shape, dtype and device")
    return first


# ------------------------------------------------------------ tensor parallelism
def rank_fingerprint(model_fingerprint: str, tp_rank: int, tp_size: int) -> str:
    """The model fingerprint one tensor-parallel rank stores and loads its own KV heads under.

    Each rank holds ``kv_heads / tp_size`` heads (its geometry's ``num_kv_heads``) and uses the engine's
    page keys unchanged: the page hash covers the fingerprint, so the ranks' pages of one key never meet,
    and every rank gets back exactly the heads it stored.  ``tp_size`` 1 is the fingerprint itself.
    """
    for name, value in (("tp_rank", tp_rank), ("tp_size", tp_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name}: must be an integer, got {type(value).__name__}")
    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank: must be in [0, {tp_size}) for tp_size {tp_size}, got {tp_rank}")
    return model_fingerprint if tp_size == 1 else f"{model_fingerprint}#tp{int(tp_size)}.{int(tp_rank)}"
