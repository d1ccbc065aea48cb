"""The storage path of one-layer Periods alone: what the default system's reads cost with no model.

    python -m kvstore_tools.period_probe DIR [--tokens 16384] [--fraction 0.05] [--requests 6] [--page-cache] [--json]

A real daemon on ``DIR`` holds one prefix of random bytes in a Llama-3-8B
KV shape (32 layers, 8 KV heads of 128, bfloat16, 16-token chunks, stored in
groups of one layer, as the default system stores them).  Each request opens
a Prefetch stream of one-layer Periods, as a Re-Prefill on that shape does,
and sends each Period a set like the default selection's: ``fraction`` of the
chunks as pairs (a chunk and the one after it), drawn at random, speculation
off.  Per request it prints the wall time, the mean and median wait per
Period from its set sent to its rows gathered, the bytes and reads, and the
time the daemon waited on its reads.  With ``--page-cache`` the daemon reads
through the page cache and the file is read once before, so that the figures
are the round trips and copies without the disk; ``--fraction 0.001`` leaves
one pair a Period, the round trip alone.  The store is made once per ``DIR`` and
shape, and kept (2.4 GB at 16,384 tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from kvstore.cli_flags import positive_int
from kvstore.contract.geometry import ModelSpec, StoreGeometry

LAYERS, KV_HEADS, HEAD_DIM = 32, 8, 128
SEED = 7


def geometry(layers: int = LAYERS) -> StoreGeometry:
    return StoreGeometry(ModelSpec(layers, KV_HEADS, HEAD_DIM, "bfloat16"), chunk_tokens=16, group_layers=1, probe_keys=False)


def ensure_prefix(data_dir: str, geo: StoreGeometry, tokens: int) -> str:
    """The probe's prefix in ``data_dir`` (stored once): its id."""
    from kvstore.config import StoreConfig
    from kvstore.store import ChunkStore

    id_file = os.path.join(data_dir, f"period-probe-{geo.model.num_layers}x{tokens}")  # one prefix per shape
    if os.path.exists(id_file):
        with open(id_file) as f:
            return f.read().strip()
    os.makedirs(data_dir, exist_ok=True)
    rng = np.random.default_rng(SEED)
    with ChunkStore(StoreConfig(data_dir=data_dir, min_free_bytes=0)) as store:
        pending = store.begin_put(rng.integers(0, 50_000, tokens), geo, model_fingerprint="period-probe")
        blob = rng.integers(0, 1 << 16, geo.extent_bytes(0, geo.chunk_tokens) // 2, dtype=np.uint16)
        for g in range(geo.num_groups):
            for j in pending.needed_chunks:
                pending.put_extent(g, j, blob)  # whole chunks only (``--tokens``: a multiple of 16)
        prefix_id = pending.commit().prefix_id
    with open(id_file, "w") as f:
        f.write(prefix_id)
    return prefix_id


def pair_set(rng, num_chunks: int, fraction: float) -> np.ndarray:
    """``fraction`` of ``num_chunks`` as random pairs (a chunk and the next), ascending, at least one pair."""
    pairs = max(1, int(num_chunks * fraction) // 2)
    starts = rng.choice(num_chunks - 1, size=min(pairs, num_chunks - 1), replace=False)
    return np.unique(np.concatenate([starts, starts + 1]))


def probe(target: str, prefix_id: str, geo: StoreGeometry, num_chunks: int, *, fraction: float, requests: int) -> list[dict]:
    from engine_client.client import KVStoreClient

    rng = np.random.default_rng(SEED)
    rows = []
    with KVStoreClient(target) as client:
        for _ in range(requests):
            waits, nbytes = [], 0
            t_req = time.perf_counter()
            with client.prefetch(prefix_id, period_layers=1, speculate=False) as stream:
                for p in range(geo.num_groups):
                    chunks = pair_set(rng, num_chunks, fraction)
                    t0 = time.perf_counter()
                    stream.send(p, chunks)
                    for _, kv in stream.groups(p):
                        nbytes += kv.nbytes
                    waits.append(time.perf_counter() - t0)
            st = stream.stats
            w = np.array(waits) * 1e3
            rows.append(
                {
                    "request_ms": (time.perf_counter() - t_req) * 1e3,
                    "period_wait_mean_ms": float(w.mean()),
                    "period_wait_median_ms": float(np.median(w)),
                    "mb": nbytes / 1e6,
                    "reads": int(st.num_reads),
                    "mb_disk": st.bytes_disk / 1e6,
                    "daemon_wait_ms": st.daemon_wait_s * 1e3,
                }
            )
    return rows


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 0.5], got {text!r}") from None
    if not 0 < value <= 0.5:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 0.5], got {text!r}")
    return value


def _tokens(text: str) -> int:
    value = positive_int(text)
    if value < 64 or value % 16:
        raise argparse.ArgumentTypeError(f"must be a multiple of 16 (whole chunks), 64 at least, got {text!r}")
    return value


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvstore_tools.period_probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("directory", metavar="DIR", help="the store (made once, kept)")
    ap.add_argument("--tokens", type=_tokens, default=16384, help="prefix tokens, a multiple of 16 (default 16384)")
    ap.add_argument("--layers", type=positive_int, default=LAYERS, help="layers, one Period each (default 32)")
    ap.add_argument("--fraction", type=_fraction, default=0.05, help="chunks a Period reads, as pairs (default 0.05)")
    ap.add_argument("--requests", type=positive_int, default=6)
    ap.add_argument("--iodepth", type=positive_int, default=16, help="the daemon's --io-queue-depth")
    ap.add_argument("--page-cache", action="store_true", help="read through the page cache, the file read once before")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from kvstore_tools.bench.daemon_io import DaemonArgs, _Daemon, _read_through

    geo = geometry(args.layers)
    prefix_id = ensure_prefix(args.directory, geo, args.tokens)
    if args.page_cache:
        _read_through(args.directory)
    daemon = _Daemon(
        args.directory,
        DaemonArgs(iodepth=args.iodepth, page_cache=args.page_cache),
        extra=["--prefetch-reserve-fraction", "1", "--shm-arena-bytes", str(256 << 20)],
    )
    try:
        rows = probe(f"unix:{daemon.socket}", prefix_id, geo, geo.num_chunks(args.tokens), fraction=args.fraction, requests=args.requests)
    finally:
        daemon.stop()
    if args.json:
        print(json.dumps({"params": {k: v for k, v in vars(args).items() if k != "json"}, "requests": rows}, indent=1))
    else:
        for i, r in enumerate(rows):
            print(
                f"request {i}: {r['request_ms']:.1f} ms; per Period wait mean {r['period_wait_mean_ms']:.2f} ms, "
                f"median {r['period_wait_median_ms']:.2f} ms; {r['mb']:.1f} MB in {r['reads']} reads "
                f"({r['mb_disk']:.1f} MB read by the daemon); it waited {r['daemon_wait_ms']:.1f} ms on reads"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
