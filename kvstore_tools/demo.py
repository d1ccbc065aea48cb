"""``kvstore-demo``: the store end to end, through a daemon or in this process.

It stores a synthetic prefix, then a second one sharing its first 3/4 (only
the tail is written), reads chunk subsets back at 5%, 25% and 100% budgets
with a clustered selection, checks them bit for bit and verifies every
checksum.  By default it starts ``kvstore serve`` on the configured socket
and is that daemon's client (``KVStoreClient``, both data paths);
``--socket-path`` uses a daemon already listening there, ``--in-process``
the store library itself.  Store flags come from ``StoreConfig`` (TOML
table ``[store]`` of ``--config FILE``, overridden by flags).
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time

import numpy as np

from engine_client.client import KVStoreClient
from engine_client.rounding import fraction_count
from kvstore import cli_flags
from kvstore.cli_flags import fractions_arg, one_fraction_arg, positive_int
from kvstore.config import OneLineErrorParser, StoreConfig, add_config_args, load_config
from kvstore.contract.errors import KVStoreError
from kvstore.contract.geometry import DTYPE_BYTES, ModelSpec, StoreGeometry
from kvstore.server import sockets
from kvstore.server.config import ServerConfig
from kvstore.store import ChunkStore

from .fmt import format_table, human_bytes
from .synthetic import clustered_chunks, synthetic_kv, token_indices

DEMO_BUDGETS = (0.05, 0.25, 1.0)
SHARED_FRACTION = 0.75
VOCAB_SIZE = 151_936  # Qwen2.5 vocabulary; token ids only need to be plausible


def _geometry(args) -> StoreGeometry:
    model = ModelSpec(args.layers, args.kv_heads, args.head_dim, args.dtype)
    return StoreGeometry(model, chunk_tokens=args.chunk_tokens, group_layers=args.group_layers)


def _mb_per_s(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e6 if seconds > 0 else float("inf")


def _put(target, name: str, tokens, kv, geo) -> str:
    t0 = time.perf_counter()
    res = target.put(tokens, kv, geo)
    dt = time.perf_counter() - t0
    c = geo.chunk_tokens
    reused_bytes = min(res.reused_chunks * c, res.num_tokens) * geo.model.num_layers * geo.model.token_layer_bytes
    if res.already_stored:
        what = "already stored, nothing written"
    else:
        what = f"wrote {human_bytes(res.bytes_written)} in {dt * 1e3:.1f} ms ({_mb_per_s(res.bytes_written, dt):.0f} MB/s)"
    print(
        f"put {name}: {res.num_tokens} tokens, {res.num_chunks} chunks, reused {res.reused_chunks} chunks "
        f"({human_bytes(reused_bytes)}), {what}  id {res.prefix_id[:16]}"
    )
    return res.prefix_id


def _read_row(target, prefix_id, kv, geo, chunks, label, repeats: int) -> tuple[list, bool]:
    n = kv.shape[3]
    times = []
    res = None
    for _ in range(repeats):
        if res is not None:
            target.release(res)
        t0 = time.perf_counter()
        res = target.read(prefix_id, chunks)
        times.append(time.perf_counter() - t0)
    exact = np.array_equal(res.to_kv(), kv[:, :, :, token_indices(chunks, geo.chunk_tokens, n), :])
    target.release(res)
    dt = statistics.median(times)
    row = [
        label,
        chunks.size,
        int(res.chunk_tokens.sum()),
        res.num_reads,
        human_bytes(res.bytes_useful),
        f"{dt * 1e3:.2f}",
        f"{_mb_per_s(res.bytes_useful, dt):.0f}",
        f"{res.bytes_read / res.bytes_useful:.2f}",
        "yes" if exact else "NO",
    ]
    return row, exact


def _verify(target) -> bool:
    results = target.verify()
    bad = [r for r in results if not r["ok"]]
    regions = sum(r["regions"] for r in results)
    if bad:
        print(f"verify: {len(bad)} of {len(results)} segments FAILED: " + "; ".join(str(r["bad_regions"]) for r in bad))
    else:
        print(f"verify: {len(results)} segments, {regions} checksummed regions, all ok")
    return not bad


class _LocalTarget:
    """The demo against the library, in this process."""

    paths = ("in-process",)

    def __init__(self, store):
        self.store = store
        self.path = "in-process"

    def describe(self) -> str:
        return f"store: {self.store.data_dir} (in-process, backend {self.store.backend.name})"

    def put(self, tokens, kv, geo):
        return self.store.put(tokens, kv, geo, namespace="demo")

    def read(self, prefix_id, chunks):
        return self.store.read(prefix_id, chunks)

    def release(self, res) -> None:
        pass

    def verify(self) -> list[dict]:
        return self.store.verify()


class _DaemonTarget:
    """The demo through a daemon, this process being its client."""

    paths = ("shm", "bytes")

    def __init__(self, client, where: str):
        self.client = client
        self.where = where
        self.path = "shm"

    def describe(self) -> str:
        st = self.client.stats()
        return f"daemon: {self.where} (backend {st.backend}, shared-memory arena {human_bytes(st.shm_arena_bytes)})"

    def put(self, tokens, kv, geo):
        return self.client.put_prefix(tokens, kv, geo, namespace="demo")

    def read(self, prefix_id, chunks):
        return self.client.read_chunks(prefix_id, chunks, shm=self.path == "shm")

    def release(self, res) -> None:
        res.release()

    def verify(self) -> list[dict]:
        return [{"ok": r.ok, "regions": r.regions, "bad_regions": list(r.bad_regions)} for r in self.client.verify()]


@contextlib.contextmanager
def _demo_target(args, cfg):
    """The library in-process, a running daemon (--target), or a daemon started here."""
    if args.in_process:
        with ChunkStore(cfg) as store:
            yield _LocalTarget(store)
        return
    target = args.target
    if not target and args.socket_path and sockets._probe(args.socket_path)[0]:
        target = f"unix:{os.path.abspath(args.socket_path)}"  # a daemon already listens there: use it
    if target:
        with KVStoreClient(target) as client:
            yield _DaemonTarget(client, target)
        return

    server_cfg = load_config(ServerConfig, args.config, "server", enable_admin=True, socket_path=args.socket_path)
    with _spawn_daemon(args.config, cfg, server_cfg) as (socket_path, pid):
        with KVStoreClient(f"unix:{os.path.abspath(socket_path)}") as client:
            yield _DaemonTarget(client, f"unix:{socket_path}, pid {pid}")


@contextlib.contextmanager
def _spawn_daemon(config_path, cfg, server_cfg):
    """``kvstore serve`` as a child process on the configured socket; SIGTERM at the end."""
    ready = os.path.join(os.path.dirname(os.path.abspath(server_cfg.socket_path)), "demo.ready")
    os.makedirs(os.path.dirname(ready), exist_ok=True)
    if os.path.exists(ready):
        os.unlink(ready)
    cmd = [
        sys.executable,
        "-m",
        "kvstore.cli",
        "serve",
        "--data-dir",
        cfg.data_dir,
        "--socket-path",
        server_cfg.socket_path,
        "--enable-admin",
        "--ready-file",
        ready,
        "--min-free-bytes",
        str(cfg.min_free_bytes),
        "--backend",
        cfg.backend,
    ]
    if config_path:
        cmd += ["--config", config_path]
    proc = subprocess.Popen(cmd)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(ready):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise KVStoreError(f"the daemon did not start (exit status {proc.poll()})")
            time.sleep(0.05)
        yield server_cfg.socket_path, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        if os.path.exists(ready):
            os.unlink(ready)


def run_demo(args) -> int:
    cfg = load_config(StoreConfig, args.config, "store", args=args)
    geo = _geometry(args)
    n = args.tokens
    rng = np.random.default_rng(args.seed)
    shape = (geo.model.num_layers, 2, geo.model.num_kv_heads, n, geo.model.head_dim)
    tokens_a = rng.integers(0, VOCAB_SIZE, n)
    kv_a = synthetic_kv(rng, shape, geo.model.dtype)  # [layers, 2, kv_heads, tokens, head_dim]
    shared = int(n * SHARED_FRACTION) // geo.chunk_tokens * geo.chunk_tokens
    tokens_b = np.concatenate([tokens_a[:shared], rng.integers(0, VOCAB_SIZE, n - shared)])
    kv_b = np.concatenate([kv_a[:, :, :, :shared], synthetic_kv(rng, shape[:3] + (n - shared,) + shape[4:], geo.model.dtype)], axis=3)
    m = geo.model
    print(
        f"geometry: {m.num_layers} layers x {m.num_kv_heads} KV heads x {m.head_dim} dim {m.dtype}, "
        f"chunk {geo.chunk_tokens} tokens, groups of {geo.group_layers} layers; "
        f"{n} tokens = {geo.num_chunks(n)} chunks x {geo.num_groups} groups, {human_bytes(kv_a.nbytes)} of KV"
    )
    with _demo_target(args, cfg) as target:
        print(target.describe())
        _put(target, "A", tokens_a, kv_a, geo)
        prefix_b = _put(target, "B", tokens_b, kv_b, geo)
        rows, all_exact = [], True
        num_chunks = geo.num_chunks(n)
        for budget in args.budgets:
            chunks = clustered_chunks(rng, num_chunks, fraction_count(num_chunks, budget))
            for path in target.paths:
                target.path = path
                row, exact = _read_row(target, prefix_b, kv_b, geo, chunks, f"{budget:.0%} {path}", args.repeats)
                rows.append(row)
                all_exact &= exact
        print(f"read B back (clustered selection, coalesced, median of {args.repeats}):")
        headers = ["budget path", "chunks", "tokens", "I/Os", "useful", "ms", "MB/s", "ampl", "exact"]
        print(format_table(headers, rows, right=set(range(1, 8))))
        ok = _verify(target)
    return 0 if ok and all_exact else 1


def build_parser() -> OneLineErrorParser:
    p = OneLineErrorParser(prog="kvstore-demo", description="Store, share, read back and verify a synthetic prefix.")
    cli_flags.add_version(p)
    p.add_argument("--config", metavar="FILE.toml", help="TOML file; its [store] table sets StoreConfig fields")
    g = p.add_argument_group("synthetic prefix (default: Qwen2.5-0.5B-shaped)")
    g.add_argument("--layers", type=positive_int, default=24)
    g.add_argument("--kv-heads", type=positive_int, default=2)
    g.add_argument("--head-dim", type=positive_int, default=64)
    g.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_BYTES))
    g.add_argument("--tokens", type=positive_int, default=4096)
    g.add_argument("--chunk-tokens", type=positive_int, default=16)
    g.add_argument("--group-layers", type=positive_int, default=8, help="layers per stored group (the SubPeriod)")
    cli_flags.add_alias(g, "--period-layers", "group_layers", type=positive_int)  # its older name
    g.add_argument("--seed", type=int, default=0)
    w = p.add_argument_group("where (default: start a daemon on the default socket and use it from this process)")
    w.add_argument("--in-process", action="store_true", help="use the store library in this process, no daemon")
    w.add_argument(
        "--socket-path",
        help="the daemon's socket: used when a daemon listens there, else one is started on it (default: the [server] socket_path)",
    )
    cli_flags.add_alias(w, "--target", "target", type=cli_flags.unix_target)  # older: --target unix:PATH, a running daemon
    p.set_defaults(target=None)
    g.add_argument("--budgets", type=fractions_arg, default=list(DEMO_BUDGETS), help="comma-separated fractions (default: 0.05,0.25,1)")
    cli_flags.add_alias(g, "--budget", "budgets", type=one_fraction_arg, action=cli_flags.AppendAlias)
    g.add_argument("--repeats", type=positive_int, default=3, help="timed reads per budget (median is shown)")
    cli_flags.add_log_level(p, "info")
    add_config_args(p, StoreConfig)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cli_flags.setup_logging(args.log_level)
    try:
        return run_demo(args)
    except (KVStoreError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
