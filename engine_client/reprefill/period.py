"""A Period's compute: its layers over the rows the daemon delivers, group by group.

The rows of each delivered group are copied to the model's device once;
each layer attends to them (stored post-RoPE) and causally to the suffix.
What changes a layer's view of the rows is decided per Period, on the host,
from the set the daemon was sent, and copied over once: the row positions
(stand-ins, sparse prefill, the streaming layout's tail) and each KV head's
row mask (streaming heads, per-head sets).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from kvstore.contract.geometry import StoreGeometry

from ..sparse_prefill import pattern
from ..standin import standin_kv
from ..stream_tail import fill_tail
from .device import to_device


def row_positions(chunks, num_tokens: int, chunk_tokens: int) -> torch.Tensor:
    """The prefix positions of the rows ``chunks`` (ids, host) deliver, in their order: ``[rows]`` on the host."""
    ids = torch.as_tensor(np.asarray(chunks), dtype=torch.long)
    rows = (ids[:, None] * chunk_tokens + torch.arange(chunk_tokens)).reshape(-1)
    return rows[rows < num_tokens]  # the last chunk may be short


def layer_mask(layer: int, rows: torch.Tensor, num_tokens: int, chunk_tokens: int, streaming_heads, head_sets=()) -> torch.Tensor | None:
    """``[Hkv, rows]`` (host): streaming heads see the sink and recent rows, with ``head_sets`` (host) each head its own chunks."""
    mask = streaming_heads.row_mask(layer, rows, num_tokens) if streaming_heads is not None else None
    if head_sets:
        mine = torch.stack([torch.isin(rows // chunk_tokens, hs) for hs in head_sets])  # [Hkv, rows]
        mask = mine if mask is None else mask & mine
    return mask


@dataclass
class PeriodRows:
    """What a Period's layers see of the prefix, decided once per Period (module docstring)."""

    positions: torch.Tensor | None = None  # [rows] on the host: the loaded rows' prefix positions
    positions_dev: torch.Tensor | None = None  # the same on the model's device
    masks: dict | None = None  # layer -> [Hkv, rows] on the device (None: every head sees every row)
    standin: tuple | None = None  # (probe keys [Hkv, n, d], value sum [Hkv, d]) at a stand-in layer
    tail: tuple | None = None  # the streaming layout's (positions, rows) and its pair index
    windowed: bool = False  # sliding-window layers: they read the rows' positions (``positions_dev``)


def run_period(
    model,
    geo: StoreGeometry,
    groups,
    l0: int,
    hidden,
    positions,
    rows: PeriodRows,
    out,
    *,
    prefill_alpha: float,
    staging=None,
    layers_of=None,
):
    """Compute the Period's layers, each group as it arrives (``groups``: ``(group, array)`` pairs; an array
    already a tensor is on the device).

    ``staging``: the runner's pinned staging (CUDA), which uploads the arrays it gathered; others are copied
    by ``to_device``.  ``layers_of(group)``: the model layers of a group (``geo.group_layer_range`` by
    default; the window-tail layout stores the global layers only).

    Returns the new hidden state and the Period's first layer's keys (loaded rows, suffix) for its
    attention mass.
    """
    device = hidden.device
    first_keys = None
    layers_of = layers_of or geo.group_layer_range
    for group, raw in groups:
        t0 = time.perf_counter()
        if isinstance(raw, torch.Tensor):
            kv = raw
        else:
            kv = staging.upload(raw, geo.model.dtype) if staging is not None else None
            if kv is None:
                kv = to_device(raw, geo.model.dtype, device)  # [group layers, 2, kv_heads, rows, head_dim]
        if rows.tail is not None:
            kv = fill_tail(kv, geo, group, rows.positions, *rows.tail)
        for i, layer in enumerate(layers_of(group)):
            t1 = time.perf_counter()
            lines = None
            if prefill_alpha:
                keys = torch.cat([kv[i, 0], model.layer_keys(layer, hidden, positions)], dim=1)
                q = model.layer_queries(layer, hidden, positions)
                lines, density = pattern(q, keys, positions.tensor, torch.cat([rows.positions_dev, positions.tensor]), prefill_alpha)
                out.prefill_densities.append(density)
            layer_rows = kv[i]
            if rows.standin is not None:  # 1-layer Periods: this is the stand-in layer
                layer_rows = standin_kv(kv[i], rows.positions, *rows.standin)
                out.standin_rows += layer_rows.shape[2] - kv[i].shape[2]
            at = rows.positions_dev if rows.windowed else None
            hidden, suffix_kv = model.layer_forward(layer, hidden, positions, layer_rows, (rows.masks or {}).get(layer), lines, at)
            out.layer_compute_s[layer] += time.perf_counter() - t1
            if out.layer_kv:
                out.layer_kv[layer] = torch.cat([layer_rows, suffix_kv], dim=2)  # [2, Hkv, rows + s, d]
            if layer == l0:
                first_keys = (kv[i, 0].clone(), suffix_kv[0])
        out.compute_s += time.perf_counter() - t0
    return hidden, first_keys


def chunk_mass(model, q, first_keys, chunk_tokens: list[int], layer: int | None = None) -> torch.Tensor:
    """Attention mass of each selected chunk at the Period's first layer ``layer``: ``[selected]`` on the device."""
    prefix_k, suffix_k = first_keys
    rows = model.attention_mass(q, prefix_k, suffix_k, layer if model.config.sliding_layers else None)  # [selected rows]
    return torch.stack([part.sum() for part in torch.split(rows, chunk_tokens)])
