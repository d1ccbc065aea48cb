"""Chunked-read benchmark: sparse chunk subsets of one stored prefix.

``run_chunked(args)`` stores one synthetic prefix (reused when the data dir
already holds it), then for each selection, budget and coalesce on/off reads
seeded chunk subsets of it for ``args.runtime`` seconds, one read after the
other: the backend's queue depth already parallelises the runs of one read.
A read fetches every period group of the chosen chunks, as Re-Prefill does
(``groups="all"``: one ``store.read``; ``"period"``: one read per group).

Defaults (``DEFAULTS``; kvstore-bench passes its own): a Qwen2.5-7B-shaped
KV scaled to the disk: 28 layers, 4 KV heads, head dim 128, bfloat16,
32768 tokens, chunk 16, period 8 -> 2048 chunks x 4 groups, 1.75 GiB,
stored under ``.kvstore/bench/store``.

Read amplification (bytes off the disk / extent bytes) comes from the 4 KiB
padding of each extent only; every case reports it next to the ratio the
layout predicts for the same extents.  With ``direct`` on, reads bypass the
page cache; without it, repeated reads of a prefix that fits in memory are
served from the page cache, not the disk.
"""

from __future__ import annotations

import time

import numpy as np

from engine_client.rounding import fraction_count
from kvstore.config import StoreConfig
from kvstore.contract.errors import InvalidArgument
from kvstore.contract.geometry import ModelSpec, StoreGeometry, align_up
from kvstore.contract.layout import SegmentLayout
from kvstore.store import ChunkStore

from ..fmt import format_table, human_bytes
from ..synthetic import clustered_chunks, synthetic_kv

MB = 1e6
MiB = float(1 << 20)
SELECTIONS = ("random", "runs")
VOCAB_SIZE = 151_936

DEFAULTS = {
    "budget": [0.05, 0.25],
    "layers": 28,
    "kv_heads": 4,
    "head_dim": 128,
    "dtype": "bfloat16",
    "tokens": 32768,
    "chunk_tokens": 16,
    "group_layers": 8,
    "kv_quant": "",
    "selection": "runs",
    "groups": "all",
    "data_dir": ".kvstore/bench/store",
    "runtime": 10.0,
    "seed": 0,
    "json": False,
    "backend": "auto",
    "iodepth": 16,
    "direct": True,
    "max_read_run": None,  # StoreConfig's max_read_run_bytes
}


def _arg(args, name: str):
    value = getattr(args, name, None)
    return DEFAULTS[name] if value is None else value


def _as_bool(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _selections(value) -> list[str]:
    names = [value] if isinstance(value, str) else list(value)
    if names in (["both"], ["all"]):
        names = list(SELECTIONS)
    for name in names:
        if name not in SELECTIONS:
            raise InvalidArgument("selection", f"must be one of {SELECTIONS} (or 'both'), got {name!r}")
    return names


def _budgets(value) -> list[float]:
    values = [float(value)] if isinstance(value, (int, float, str)) else [float(v) for v in value]
    bad = [v for v in values if not 0 < v <= 1]
    if not values or bad:
        raise InvalidArgument("budget", f"fractions must be in (0, 1], got {value!r}")
    return values


def select_chunks(rng: np.random.Generator, num_chunks: int, budget: float, selection: str) -> np.ndarray:
    """Seeded chunk subset: ``random`` (uniform) or ``runs`` (clustered)."""
    k = fraction_count(num_chunks, budget)
    if selection == "random":
        return np.sort(rng.choice(num_chunks, size=k, replace=False))
    return clustered_chunks(rng, num_chunks, k)


# ------------------------------------------------------------ setup
def bench_geometry(args) -> StoreGeometry:
    model = ModelSpec(int(_arg(args, "layers")), int(_arg(args, "kv_heads")), int(_arg(args, "head_dim")), _arg(args, "dtype"))
    return StoreGeometry(
        model, chunk_tokens=int(_arg(args, "chunk_tokens")), group_layers=int(_arg(args, "group_layers")), kv_quant=_arg(args, "kv_quant")
    )


def ensure_prefix(store: ChunkStore, geo: StoreGeometry, num_tokens: int, seed: int) -> dict:
    """Store the seeded synthetic prefix unless it is already there."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB_SIZE, num_tokens)
    fingerprint = f"synthetic-seed{seed}"
    found = store.lookup(tokens, geo, namespace="bench", model_fingerprint=fingerprint)
    if found.matched_chunks == found.num_chunks:
        return {"prefix_id": found.prefix_id, "stored_now": False, "put_seconds": 0.0, "bytes_written": 0}
    m = geo.model
    kv = synthetic_kv(rng, (m.num_layers, 2, m.num_kv_heads, num_tokens, m.head_dim), m.dtype)
    t0 = time.perf_counter()
    res = store.put(tokens, kv, geo, namespace="bench", model_fingerprint=fingerprint)
    put_s = time.perf_counter() - t0
    return {"prefix_id": res.prefix_id, "stored_now": True, "put_seconds": put_s, "bytes_written": res.bytes_written}


def _group_with(geo: StoreGeometry, layers: int) -> int:
    """The first stored group of ``layers`` layers."""
    return next(g for g in range(geo.num_groups) if geo.layers_in_group(g) == layers)


def padding_table(geo: StoreGeometry, num_tokens: int) -> list[dict]:
    """Extent bytes unpadded vs padded, per kind of extent in the prefix."""
    counts = geo.chunk_token_counts(num_tokens)
    kinds = sorted({int(t) for t in counts}, reverse=True)
    out = []
    for layers in sorted({geo.layers_in_group(g) for g in range(geo.num_groups)}, reverse=True):
        num_groups = sum(geo.layers_in_group(g) == layers for g in range(geo.num_groups))
        for tokens in kinds:
            nbytes = geo.extent_bytes(_group_with(geo, layers), tokens)
            padded = align_up(nbytes)
            out.append(
                {
                    "chunk": "full" if tokens == geo.chunk_tokens else "last (partial)",
                    "group_layers": layers,
                    "tokens": tokens,
                    "num_extents": num_groups * int((counts == tokens).sum()),
                    "extent_bytes": nbytes,
                    "padded_bytes": padded,
                    "ratio": padded / nbytes,
                }
            )
    return out


# ------------------------------------------------------------ measurement
def _one_request(store: ChunkStore, prefix_id: str, chunks: np.ndarray, num_groups: int, per_group: bool, coalesce: bool):
    """Read every group of ``chunks``; ``(seconds, bytes_read, bytes_useful, num_reads)``."""
    calls = [[g] for g in range(num_groups)] if per_group else [None]
    t0 = time.perf_counter()
    results = [store.read(prefix_id, chunks, groups, coalesce=coalesce) for groups in calls]
    dt = time.perf_counter() - t0
    return dt, sum(r.bytes_read for r in results), sum(r.bytes_useful for r in results), sum(r.num_reads for r in results)


def run_case(store, prefix_id, layout: SegmentLayout, *, selection, budget, coalesce, per_group, runtime_s, seed) -> dict:
    """Seeded reads for ``runtime_s`` seconds; the same subsets for coalesce on and off."""
    rng = np.random.default_rng([seed, SELECTIONS.index(selection), int(round(budget * 1e6))])
    num_groups = layout.geometry.num_groups
    warm = select_chunks(np.random.default_rng(seed), layout.num_chunks, budget, selection)
    _one_request(store, prefix_id, warm, num_groups, per_group, coalesce)  # opens files, starts threads
    lat_s, disk, useful, ios, pad_read, pad_useful = [], 0, 0, 0, 0, 0
    deadline = time.perf_counter() + runtime_s
    while not lat_s or time.perf_counter() < deadline:
        chunks = select_chunks(rng, layout.num_chunks, budget, selection)
        dt, nread, nuseful, nios = _one_request(store, prefix_id, chunks, num_groups, per_group, coalesce)
        lat_s.append(dt)
        disk, useful, ios = disk + nread, useful + nuseful, ios + nios
        pad_read += int(layout.extent_padded[:, chunks].sum())
        pad_useful += int(layout.extent_lengths[:, chunks].sum())
    busy_s = float(sum(lat_s))
    lat_ms = np.array(lat_s) * 1e3
    return {
        "selection": selection,
        "budget": budget,
        "coalesce": coalesce,
        "chunks_per_read": fraction_count(layout.num_chunks, budget),
        "reads": len(lat_s),
        "seconds": busy_s,
        "useful_mb_per_s": useful / busy_s / MB,
        "useful_mib_per_s": useful / busy_s / MiB,
        "disk_mb_per_s": disk / busy_s / MB,
        "disk_mib_per_s": disk / busy_s / MiB,
        "useful_bytes_per_read": useful / len(lat_s),
        "read_amplification": disk / useful,
        "padding_amplification": pad_read / pad_useful,
        "io_requests_per_read": ios / len(lat_s),
        "latency_ms_mean": float(lat_ms.mean()),
        "latency_ms_p50": float(np.percentile(lat_ms, 50)),
        "latency_ms_p99": float(np.percentile(lat_ms, 99)),
    }


def store_config(args) -> StoreConfig:
    max_run = _arg(args, "max_read_run")
    return StoreConfig(
        data_dir=_arg(args, "data_dir"),
        backend=_arg(args, "backend"),
        io_queue_depth=int(_arg(args, "iodepth")),
        direct_io=_as_bool(_arg(args, "direct")),
        **({} if max_run is None else {"max_read_run_bytes": int(max_run)}),
    )


def run_chunked(args) -> dict:
    """Run the chunked-read benchmark (see module doc).

    Prints the human report unless ``args.json`` (then the caller prints the
    returned dict); missing or None attributes of ``args`` take ``DEFAULTS``.
    """
    geo = bench_geometry(args)
    num_tokens, seed = int(_arg(args, "tokens")), int(_arg(args, "seed"))
    layout = SegmentLayout(geo, num_tokens)
    cfg = store_config(args)
    case_args = {
        "per_group": _arg(args, "groups") == "period",
        "runtime_s": float(_arg(args, "runtime")),
        "seed": seed,
    }
    cases = []
    with ChunkStore(cfg) as store:
        stored = ensure_prefix(store, geo, num_tokens, seed)
        for selection in _selections(_arg(args, "selection")):
            for budget in _budgets(_arg(args, "budget")):
                for coalesce in (True, False):
                    case = run_case(store, stored["prefix_id"], layout, selection=selection, budget=budget, coalesce=coalesce, **case_args)
                    cases.append(case)
        store_info = {"data_dir": store.data_dir, "backend": store.backend.name}
    report = {
        "geometry": {
            **geo.to_dict(),
            "num_tokens": num_tokens,
            "num_chunks": layout.num_chunks,
            "num_groups": geo.num_groups,
            "kv_bytes": int(layout.extent_lengths.sum()),
        },
        "padding": padding_table(geo, num_tokens),
        "store": {
            **store_info,
            "direct_io": cfg.direct_io,
            "io_queue_depth": cfg.io_queue_depth,
            "max_read_run_bytes": cfg.max_read_run_bytes,
            "read_calls_per_request": geo.num_groups if case_args["per_group"] else 1,
            **stored,
        },
        "cases": cases,
    }
    if not _as_bool(_arg(args, "json")):
        print(format_report(report))
    return report


# ------------------------------------------------------------ report
def format_report(report: dict) -> str:
    """The human form of ``run_chunked``'s result."""
    g, s = report["geometry"], report["store"]
    m = g["model"]
    lines = [
        f"chunked read: {m['num_layers']} layers x {m['num_kv_heads']} KV heads x {m['head_dim']} dim {m['dtype']}, "
        f"{g['num_tokens']} tokens = {g['num_chunks']} chunks of {g['chunk_tokens']} x {g['num_groups']} groups of "
        f"{g['group_layers']} layers, {human_bytes(g['kv_bytes'])} of KV",
        f"store: {s['data_dir']}  backend {s['backend']}  O_DIRECT {'on' if s['direct_io'] else 'off (page cache)'}  "
        f"queue depth {s['io_queue_depth']}  max run {human_bytes(s['max_read_run_bytes'])}  prefix {s['prefix_id'][:16]} "
        + (f"(stored now in {s['put_seconds']:.1f} s)" if s["stored_now"] else "(already stored)"),
        "",
        "extent padding (read amplification comes from this only):",
        format_table(
            ["chunk", "layers", "tokens", "extents", "bytes", "padded", "ratio"],
            [
                [p["chunk"], p["group_layers"], p["tokens"], p["num_extents"], p["extent_bytes"], p["padded_bytes"], f"{p['ratio']:.3f}"]
                for p in report["padding"]
            ],
            right=set(range(1, 7)),
        ),
        "",
        format_table(
            [
                "selection",
                "budget",
                "coalesce",
                "chunks",
                "reads",
                "useful MB/s",
                "MiB/s",
                "disk MB/s",
                "ampl",
                "layout ampl",
                "I/Os/read",
                "mean ms",
                "p50 ms",
                "p99 ms",
            ],
            [_case_row(c) for c in report["cases"]],
            right=set(range(1, 14)),
        ),
    ]
    return "\n".join(lines)


def _case_row(c: dict) -> list:
    return [
        c["selection"],
        f"{c['budget']:.0%}",
        "on" if c["coalesce"] else "off",
        c["chunks_per_read"],
        c["reads"],
        f"{c['useful_mb_per_s']:.0f}",
        f"{c['useful_mib_per_s']:.0f}",
        f"{c['disk_mb_per_s']:.0f}",
        f"{c['read_amplification']:.3f}",
        f"{c['padding_amplification']:.3f}",
        f"{c['io_requests_per_read']:.1f}",
        f"{c['latency_ms_mean']:.2f}",
        f"{c['latency_ms_p50']:.2f}",
        f"{c['latency_ms_p99']:.2f}",
    ]
