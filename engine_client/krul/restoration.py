"""Restoring a stored conversation's KV through the daemon: recompute each layer's first tokens while the rest loads.

``restore_kv`` carries out a ``pyramid.RestorePlan`` on a prefix the daemon
holds (the conversation's history, stored as it is or quantized,
``StoreGeometry.kv_quant``): a loader thread reads, stored group by stored
group, the chunks of tokens ``n_l .. N-1`` (``ReadChunks``, through shared
memory when the client has a session) and dequantizes them, while the
calling thread recomputes tokens ``0 .. n_l - 1`` of each layer from the
token ids (the hidden states of those tokens exist, since ``n_l`` never
grows with depth), then joins the two parts per layer.  A plan's counts
are whole chunks (``step_tokens`` = the geometry's chunk).

The timings say where the two streams waited: ``compute_wait_s`` is the
recompute stream idle for a layer still loading, ``load_idle_s`` the loader
finished before the recompute (the bubbles a balanced plan avoids).

``measure_profile`` times both paths on the prefix itself (a few layers'
recompute of a sample of tokens; a read of some chunks of every layer,
dequantization included) and then both at once, so a plan balances this
machine's rates and knows how much of one stream the other hides; a
profile for a GPU can be given instead (``HardwareProfile``).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from kvstore.contract.geometry import StoreGeometry

from ..client import to_torch
from .pyramid import HardwareProfile, RestorePlan, check_plan, recompute_flops


@dataclass(frozen=True)
class RestoreTimings:
    total_s: float  # wall time of the whole restore
    recompute_s: float  # the recompute stream's busy time
    load_s: float  # the loader's busy time (reads, dequantization, copies)
    compute_wait_s: float  # recompute stream idle, waiting for a layer's loaded rows
    load_idle_s: float  # loader done while the recompute went on
    bytes_read: int  # from the daemon, padding included
    bytes_useful: int  # the extents' own bytes (quantized when the prefix is)
    recompute_tokens: tuple[int, ...]


def _first_chunks(plan_counts, geometry: StoreGeometry) -> list[int]:
    """Per stored group, the first chunk its layers load: the smallest count of its layers (its last layer's)."""
    c = geometry.chunk_tokens
    return [-(-min(plan_counts[layer] for layer in geometry.group_layer_range(g)) // c) for g in range(geometry.num_groups)]


def _loader(client, prefix_id, geometry, plan_counts, num_tokens, out: queue.Queue, stats: dict, shm) -> None:
    """Put ``(layer, kv [2, H, rows, d] torch)`` of the loaded rows for every layer, in layer order, then None."""
    try:
        c = geometry.chunk_tokens
        num_chunks = geometry.num_chunks(num_tokens)
        for g, first in enumerate(_first_chunks(plan_counts, geometry)):
            layers = geometry.group_layer_range(g)
            t0 = time.perf_counter()
            if first < num_chunks:
                with client.read_chunks(
                    prefix_id, range(first, num_chunks), layer_start=layers.start, layer_end=layers.stop, shm=shm
                ) as read:
                    arr = np.ascontiguousarray(read.group_kv(g))  # [layers, 2, H, rows, d], dequantized, a copy
                    stats["bytes_read"] += read.bytes_read
                    stats["bytes_useful"] += read.bytes_useful
                kv = to_torch(arr, geometry.model.dtype)
            else:
                kv = None
            stats["load_s"] += time.perf_counter() - t0
            for i, layer in enumerate(layers):
                skip = plan_counts[layer] - first * c  # rows of the group's read this layer recomputes instead
                out.put((layer, None if kv is None else kv[i, :, :, skip:]))
        stats["load_end"] = time.perf_counter()
    except BaseException as exc:  # handed to the recompute stream, which raises it
        out.put(exc)
        return
    out.put(None)


@torch.inference_mode()
def restore_kv(model, client, prefix_id: str, tokens, geometry: StoreGeometry, plan: RestorePlan, *, shm=None):
    """The history's KV ``[L, 2, Hkv, N, d]`` in the model's dtype, and ``RestoreTimings``.

    ``tokens``: the history's ``N`` token ids (what the prefix was stored
    from); ``plan``: per layer how many leading tokens to recompute,
    non-increasing with depth and in whole chunks (the last chunk may be
    short).  Raises ``ValueError`` on a plan that does not fit.
    """
    check_plan(plan)
    tokens = torch.as_tensor(np.asarray(tokens), dtype=torch.long).reshape(-1)
    n, num_layers, c = tokens.numel(), model.num_layers, geometry.chunk_tokens
    counts = plan.recompute_tokens
    if plan.costs.num_tokens != n or len(counts) != num_layers:
        raise ValueError(f"the plan restores {plan.costs.num_tokens} tokens of {len(counts)} layers, not {n} of {num_layers}")
    if any(k % c and k != n for k in counts):
        raise ValueError(f"recompute counts must be whole chunks of {c} tokens (or all {n}): {counts}")
    cfg = model.config
    out = torch.empty(num_layers, 2, cfg.num_key_value_heads, n, cfg.head_dim, dtype=model.dtype)
    loaded: queue.Queue = queue.Queue()
    stats = {"bytes_read": 0, "bytes_useful": 0, "load_s": 0.0, "load_end": None}
    start = time.perf_counter()
    thread = threading.Thread(target=_loader, args=(client, prefix_id, geometry, counts, n, loaded, stats, shm), daemon=True)
    thread.start()
    recompute_s = wait_s = 0.0
    hidden = model.embed(tokens[: counts[0]]) if counts[0] else None
    positions = torch.arange(n)
    for layer in range(num_layers):
        k = counts[layer]
        t0 = time.perf_counter()
        if k:
            hidden, kv = model.layer_forward(layer, hidden[:k], positions[:k], None)
            out[layer, :, :, :k] = kv
        recompute_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        item = loaded.get()
        wait_s += time.perf_counter() - t0
        if isinstance(item, BaseException):
            raise item
        got_layer, rows = item
        assert got_layer == layer, (got_layer, layer)
        if rows is not None and k < n:
            out[layer, :, :, k:] = rows.to(model.dtype)
    end_item = loaded.get()
    if isinstance(end_item, BaseException):
        raise end_item
    thread.join()
    total = time.perf_counter() - start
    load_end = stats["load_end"] or (start + stats["load_s"])
    timings = RestoreTimings(
        total_s=total,
        recompute_s=recompute_s,
        load_s=stats["load_s"],
        compute_wait_s=wait_s,
        load_idle_s=max(0.0, start + total - load_end),
        bytes_read=stats["bytes_read"],
        bytes_useful=stats["bytes_useful"],
        recompute_tokens=tuple(counts),
    )
    return out, timings


@torch.inference_mode()
def measure_profile(
    model, client, prefix_id: str, tokens, geometry: StoreGeometry, *, sample_tokens: int = 1024, shm=None
) -> HardwareProfile:
    """This machine's recompute FLOP/s, load bytes/s and how far the two overlap, timed on the prefix itself.

    Recompute: the first ``sample_tokens`` tokens through the first two
    layers (projections, MLP and causal attention FLOPs as ``recompute_flops``
    counts them).  Load: the chunks of those tokens for every stored group,
    read and dequantized as ``restore_kv`` does, one call per group (a
    sample as large as the restores it plans for keeps the per-call cost in
    proportion); bytes are the stored (quantized) bytes, so the plan's
    ``bytes_per_token_layer`` must be too.  Overlap: both again at once, the
    load in a thread as in a restore; the share of the shorter one that the
    joint time hides (1: separate hardware; near 0 on a CPU whose cores both
    streams need).
    """
    tokens = torch.as_tensor(np.asarray(tokens), dtype=torch.long).reshape(-1)
    k = max(1, min(sample_tokens, tokens.numel()))
    f, f_att = recompute_flops(model.config)
    layers = min(2, model.num_layers)
    positions = torch.arange(k)
    chunks = range(geometry.num_chunks(k))

    def compute():
        hidden = model.embed(tokens[:k])
        for layer in range(layers):
            hidden, _ = model.layer_forward(layer, hidden, positions, None)

    def load() -> int:
        useful = 0
        for g in range(geometry.num_groups):
            span = geometry.group_layer_range(g)
            with client.read_chunks(prefix_id, chunks, layer_start=span.start, layer_end=span.stop, shm=shm) as read:
                np.ascontiguousarray(read.group_kv(g))
                useful += read.bytes_useful
        return useful

    compute()  # warm the kernels
    t0 = time.perf_counter()
    compute()
    compute_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    useful = load()
    load_s = time.perf_counter() - t0
    thread = threading.Thread(target=load, daemon=True)
    t0 = time.perf_counter()
    thread.start()
    compute()
    thread.join()
    both_s = time.perf_counter() - t0
    overlap = (compute_s + load_s - both_s) / max(min(compute_s, load_s), 1e-9)
    flops = layers * (k * f + f_att * k * (k + 1) / 2)
    return HardwareProfile(flops / max(compute_s, 1e-9), useful / max(load_s, 1e-9), min(1.0, max(0.0, overlap)))


def bytes_per_token_layer(geometry: StoreGeometry, num_tokens: int) -> float:
    """Stored bytes of one token of one layer, averaged over a ``num_tokens`` prefix (quantized when the prefix is)."""
    return geometry.kv_bytes(num_tokens) / (num_tokens * geometry.model.num_layers)
