"""The page API on the client side: messages out, arrays back (no I/O).

A page batch travels as ``[pages, layers, 2, kv_heads, chunk_tokens,
head_dim]`` (numpy, bfloat16 as raw uint16); on the wire each page is one
extent per stored period group, ``[layer-in-group][K|V][head][token][dim]``,
so splitting a page into its extents is a slice of the layer axis.
"""

from __future__ import annotations

import numpy as np

from kvstore.geometry import StoreGeometry
from kvstore.wire import geometry_from_pb, pb


def as_keys(keys) -> list[bytes]:
    """Keys as bytes: ``bytes`` as they are, ``str`` (SGLang's hex keys) UTF-8 encoded."""
    if isinstance(keys, (bytes, str)):
        raise TypeError("keys must be a sequence of keys, not one key")
    return [k.encode() if isinstance(k, str) else bytes(k) for k in keys]


def page_shape(geometry: StoreGeometry, num_pages: int) -> tuple[int, ...]:
    m = geometry.model
    return (num_pages, m.num_layers, 2, m.num_kv_heads, geometry.chunk_tokens, m.head_dim)


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


def collect_pages(responses) -> np.ndarray:
    """``[pages, layers of the groups sent, 2, kv_heads, chunk_tokens, head_dim]`` from GetPages responses."""
    out = geo = groups = None
    first_layer = {}
    for msg in responses:
        if msg.HasField("header"):
            geo = geometry_from_pb(msg.header.geometry)
            groups = list(msg.header.groups)
            m = geo.model
            layers = sum(geo.layers_in_group(g) for g in groups)
            out = np.empty((msg.header.num_pages, layers, 2, m.num_kv_heads, geo.chunk_tokens, m.head_dim), dtype=m.numpy_dtype())
            at = 0
            for g in groups:
                first_layer[g] = at
                at += geo.layers_in_group(g)
        if msg.HasField("extent"):
            e = msg.extent
            lo = first_layer[e.group]
            dest = out[e.chunk, lo : lo + geo.layers_in_group(e.group)].reshape(-1).view(np.uint8)
            dest[e.offset : e.offset + len(e.data)] = np.frombuffer(e.data, dtype=np.uint8)
    if out is None:
        raise ValueError("GetPages ended without a header")
    return out


# ------------------------------------------------------------ engine layouts
# vLLM's FlashAttention backend keeps one paged tensor per layer,
# [2 (K|V), num_blocks, block_size, kv_heads, head_dim]; a page of the store
# is [layers, 2, kv_heads, chunk_tokens, head_dim]: heads and tokens swap, so
# moving pages in or out is one gather (or scatter) plus one transposing copy
# per layer, over every page at once.


def gather_pages(layer_caches, block_ids, out=None):
    """Pages ``[pages, layers, 2, kv_heads, block_size, head_dim]`` from per-layer paged caches.

    ``layer_caches``: per layer ``[2, num_blocks, block_size, kv_heads, head_dim]`` (torch);
    ``block_ids``: the blocks to save, in page order (a 1-D int64 tensor).
    """
    import torch

    two, _, block_size, heads, dim = layer_caches[0].shape
    if out is None:
        out = torch.empty((len(block_ids), len(layer_caches), two, heads, block_size, dim), dtype=layer_caches[0].dtype)
    for layer, cache in enumerate(layer_caches):
        out[:, layer].copy_(cache.index_select(1, block_ids).permute(1, 0, 3, 2, 4))
    return out


def scatter_pages(pages, layer_caches, block_ids) -> None:
    """Write pages ``[pages, layers, 2, kv_heads, block_size, head_dim]`` into the caches' ``block_ids``."""
    for layer, cache in enumerate(layer_caches):
        cache[:, block_ids] = pages[:, layer].permute(1, 0, 3, 2, 4)
