"""``kvstore-bench contention``: concurrent readers on one daemon's shared-memory arena.

Each of N clients (its own shared-memory session, one thread each) reads a
stored prefix again and again, holds what it read for ``--hold-ms`` (as a
worker computes on it), then releases it.  Per level (N concurrent streams
x a load: every chunk, or a fraction of them chosen at random) the report
gives requests/s, latency p50/p99 and the failed requests; after each
level it checks that no lease was left behind.  The target: no failure
while each request fits the arena, however many run at once (reads that
are held together are admitted together, in arrival order: ``kvstore/
server/admission.py``).

The default prefix is 600 tokens of a 24-layer, 2-KV-head, bfloat16 shape
in 8-layer groups (7.5 MB read whole) on a 64 MiB arena (16 MiB of it for
stream buffers): each full read fits alone, two fit together, three do not.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from contextlib import ExitStack

import numpy as np

from kvstore.cli_flags import fractions_arg
from kvstore.contract.geometry import ModelSpec, StoreGeometry

from .io_jobs import BenchError
from .replay_cli import streams_arg

GEOMETRY = StoreGeometry(ModelSpec(24, 2, 64, "bfloat16"), chunk_tokens=16, group_layers=8)


def _loads(text: str) -> list[float]:
    """``--loads``: the shared fractions parser, its refusal worded for this flag."""
    try:
        return fractions_arg(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"each load must be a fraction of the chunks in (0, 1], got {text!r}") from None


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return value

    return parse


def add_contention_parser(sub) -> None:
    from kvstore.cli_flags import add_alias

    from .plots import add_plot_flag

    p = sub.add_parser("contention", help="concurrent readers on the shared-memory arena: requests/s, p50/p99, failures")
    p.add_argument("--streams", type=streams_arg, default=[1, 2, 4, 8, 16], help="comma-separated numbers of concurrent clients")
    p.add_argument("--loads", type=_loads, default=[1.0, 0.05], help="comma-separated fractions of the chunks each request reads")
    p.add_argument("--requests", type=_positive(int), default=8, help="requests per client per level")
    p.add_argument("--call", choices=("read", "prefetch"), default="read", help="ReadChunks, or a Prefetch stream over every period")
    p.add_argument("--tokens", type=_positive(int), default=600, help="prefix length (tokens)")
    p.add_argument("--arena-bytes", type=_positive(int), default=64 << 20, help="the daemon's shm_arena_bytes")
    p.add_argument("--hold-ms", type=float, default=20.0, help="how long a client holds a read before releasing it")
    p.add_argument("--deadline-s", type=_positive(float), default=60.0, help="each request's deadline")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", dest="directory", default=".kvstore/bench")
    add_alias(p, "--directory", "directory")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    add_plot_flag(p, "requests/s against concurrent streams, one line per load")
    p.set_defaults(run=command_contention)


def command_contention(args) -> int:
    from .plots import check_plot_path

    check_plot_path(args.plot)
    if args.hold_ms < 0:
        raise BenchError(f"--hold-ms: must be >= 0, got {args.hold_ms}")
    report = run_contention(args)
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else format_contention(report))
    if args.plot:
        plot_contention(report, args.plot)
    return 0


def run_contention(args) -> dict:
    from engine_client.client import KVStoreClient
    from kvstore.progress import bar

    from .daemon_io import private_daemon_client
    from .machine import machine_info

    geo = GEOMETRY
    n = args.tokens
    rng = np.random.default_rng(args.seed)
    kv = rng.standard_normal((geo.model.num_layers, 2, geo.model.num_kv_heads, n, geo.model.head_dim), dtype=np.float32)
    kv = (kv.view(np.uint32) >> 16).astype(np.uint16)  # bfloat16 bits
    tokens = rng.integers(0, 32000, n)
    levels = []
    with ExitStack() as stack:
        admin = private_daemon_client(args.directory, "contention-", stack, extra=("--shm-arena-bytes", str(args.arena_bytes)))
        pid = admin.put_prefix(tokens, kv, geo).prefix_id
        arena_bytes = admin.stats().shm_arena_bytes
        target = admin.target
        progress = bar(len(args.streams) * len(args.loads), "contention levels", unit="level")
        stack.callback(progress.close)
        for load in args.loads:
            for streams in args.streams:
                levels.append(_level(KVStoreClient, target, pid, geo, n, streams, load, args))
                progress.update()
    return {
        "bench": "contention",
        "call": args.call,
        "geometry": {"layers": geo.model.num_layers, "kv_heads": geo.model.num_kv_heads, "head_dim": geo.model.head_dim},
        "tokens": n,
        "read_bytes_full": sum(geo.num_chunks(n) * geo.extent_padded_bytes(g) for g in range(geo.num_groups)),
        "arena_bytes": arena_bytes,
        "hold_ms": args.hold_ms,
        "requests_per_stream": args.requests,
        "levels": levels,
        "machine": machine_info(args.directory),
    }


def _level(client_cls, target: str, pid: str, geo: StoreGeometry, n: int, streams: int, load: float, args) -> dict:
    num_chunks = geo.num_chunks(n)
    per_request = max(1, round(load * num_chunks))
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(streams)

    def client(k: int):
        rng = np.random.default_rng((args.seed, streams, k))
        with client_cls(target, deadline_s=args.deadline_s) as c:
            start.wait()
            for _ in range(args.requests):
                chunks = np.sort(rng.choice(num_chunks, per_request, replace=False))
                t0 = time.perf_counter()
                try:
                    _request(c, pid, geo, chunks, args)
                    with lock:
                        latencies.append(time.perf_counter() - t0)
                except Exception as exc:  # noqa: BLE001 - a failed request is a figure of the bench
                    with lock:
                        failures.append(f"{type(exc).__name__}: {exc}"[:200])

    threads = [threading.Thread(target=client, args=(k,), name=f"contention-{k}") for k in range(streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    with client_cls(target) as c:
        deadline = time.monotonic() + 10
        while (leased := c.stats().shm_leased_bytes) and time.monotonic() < deadline:
            time.sleep(0.05)
    lat = np.asarray(latencies) * 1e3
    return {
        "streams": streams,
        "load": load,
        "chunks_per_request": per_request,
        "requests": streams * args.requests,
        "completed": len(latencies),
        "failures": len(failures),
        "failure_examples": sorted(set(failures))[:3],
        "requests_per_s": len(latencies) / wall if wall > 0 else 0.0,
        "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
        "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
        "wall_s": wall,
        "leased_bytes_after": leased,
    }


def _request(client, pid: str, geo: StoreGeometry, chunks: np.ndarray, args) -> None:
    hold = args.hold_ms / 1e3
    if args.call == "read":
        with client.read_chunks(pid, chunks, shm=True):
            time.sleep(hold)
        return
    periods = geo.num_groups  # one stored group per period
    with client.prefetch(pid, period_layers=geo.group_layers, shm=True, speculate=False) as st:
        for p in range(periods):
            st.send(p, chunks)
            for _g, _kv in st.groups(p):
                pass
            time.sleep(hold / periods)


def format_contention(report: dict) -> str:
    mb = report["read_bytes_full"] / 1e6
    lines = [
        f"contention: {report['call']} of a {report['tokens']}-token prefix ({mb:.1f} MB whole) on a "
        f"{report['arena_bytes'] / 2**20:.0f} MiB arena, hold {report['hold_ms']:g} ms, {report['requests_per_stream']} requests per stream",
        f"{'load':>6} {'streams':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'failed':>7} {'leased after':>12}",
    ]
    for lv in report["levels"]:
        p50 = f"{lv['p50_ms']:.1f}" if lv["p50_ms"] is not None else "-"
        p99 = f"{lv['p99_ms']:.1f}" if lv["p99_ms"] is not None else "-"
        lines.append(
            f"{lv['load']:>6.0%} {lv['streams']:>7} {lv['requests_per_s']:>8.1f} {p50:>8} {p99:>8} "
            f"{lv['failures']:>3}/{lv['requests']:<3} {lv['leased_bytes_after']:>12}"
        )
        lines += [f"        {example}" for example in lv["failure_examples"]]
    m = report["machine"]
    lines.append(f"machine: {m.get('cpu_model')}, {m.get('num_cpus')} CPUs")
    return "\n".join(lines)


def plot_contention(report: dict, path: str) -> None:
    from .plots import pyplot, save

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for load in sorted({lv["load"] for lv in report["levels"]}, reverse=True):
        rows = [lv for lv in report["levels"] if lv["load"] == load]
        ax.plot([lv["streams"] for lv in rows], [lv["requests_per_s"] for lv in rows], marker="o", label=f"{load:.0%} of the chunks")
        for lv in rows:
            if lv["failures"]:
                ax.annotate(f"{lv['failures']} failed", (lv["streams"], lv["requests_per_s"]), fontsize=7, color="#d62728")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent clients on one daemon")
    ax.set_ylabel("requests/s")
    ax.set_title(f"{report['call']} of a {report['tokens']}-token prefix, {report['arena_bytes'] / 2**20:.0f} MiB arena")
    ax.legend()
    save(fig, path)
