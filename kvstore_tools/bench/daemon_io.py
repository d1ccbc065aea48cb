"""``kvstore-bench io --via-daemon``: the cost of the service layer.

The same random chunk reads, timed four ways on the same stored prefix:

* ``in-process``: ``ChunkStore.read`` called in this process (no daemon);
* ``daemon-shm``: ``ReadChunks`` to a real daemon process over its unix
  socket, extents delivered into the shared-memory arena (descriptors only);
* ``daemon-bytes``: the same, extents carried as bytes in the stream;
* with ``--transport tcp`` the daemon is reached on a loopback TCP port
  with a bearer token, as a remote worker reaches it: ``daemon-bytes``
  (in the stream) and ``daemon-data`` (the raw data connections,
  ``kvstore.server.data_channel``) instead of the unix socket's two paths;
* ``--page-cache``: the store and the daemon read through the page cache
  (``direct_io`` off) with the prefix's file read once before, so that the
  rows measure the service and transport paths, not the disk;
* ``fio``: fio random reads of the same block size and queue depth on the
  prefix's segment file (``--readonly``), the disk's own figure.

One request reads ``iodepth`` random distinct chunks of one random period
group; the geometry is chosen so that one extent is exactly ``--bs`` bytes,
so a request is ``iodepth`` reads of ``bs`` in flight, like fio's job.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

import numpy as np

from kvstore.config import StoreConfig
from kvstore.contract.geometry import ModelSpec, StoreGeometry
from kvstore.store import ChunkStore

from .fio import find_fio, fio_command, fio_version, parse_fio_json
from .io_jobs import BenchError, JobSpec, latency_summary_us
from .machine import machine_info

LAYERS = 32  # four period groups of 8
SEED = 1234


def geometry_for_extent(block_bytes: int) -> StoreGeometry:
    """bf16, 16-token chunks, 8-layer groups: one extent = 512 * heads * dim bytes."""
    if block_bytes % 8192:
        raise BenchError("--via-daemon needs --bs to be a multiple of 8k (one extent per block)")
    head_dim = min(128, block_bytes // 512)
    heads = block_bytes // (512 * head_dim)
    return StoreGeometry(ModelSpec(LAYERS, heads, head_dim, "bfloat16"), chunk_tokens=16, group_layers=8, probe_keys=False)


def ensure_prefix(data_dir: str, geo: StoreGeometry, size_bytes: int) -> tuple[str, int]:
    """Store the synthetic prefix (extent by extent) unless it is there; (id, chunks)."""
    per_chunk = LAYERS * geo.chunk_tokens * geo.model.token_layer_bytes
    num_chunks = max(8, size_bytes // per_chunk)
    tokens = np.random.default_rng(SEED).integers(0, 50_000, num_chunks * geo.chunk_tokens)
    rng = np.random.default_rng(SEED + 1)
    with ChunkStore(StoreConfig(data_dir=data_dir, min_free_bytes=0)) as store:
        pending = store.begin_put(tokens, geo, model_fingerprint="kvstore-bench")
        for g in range(geo.num_groups):
            for j in pending.needed_chunks:
                pending.put_extent(g, j, rng.integers(0, 1 << 16, geo.extent_bytes(g, 16) // 2, dtype=np.uint16))
        return pending.commit().prefix_id, num_chunks


def _requests(seed: int, num_chunks: int, num_groups: int, per_request: int):
    rng = np.random.default_rng(seed)
    while True:
        yield int(rng.integers(num_groups)), np.sort(rng.choice(num_chunks, size=per_request, replace=False))


def timed_loop(read_once, *, numjobs: int, runtime_s: float, num_chunks: int, num_groups: int, per_request: int) -> dict:
    """Run ``read_once(group, chunks) -> useful bytes`` from ``numjobs`` threads."""
    deadline = time.perf_counter() + runtime_s
    lat: list[list[int]] = [[] for _ in range(numjobs)]
    nbytes = [0] * numjobs
    stop = threading.Event()  # the caller is unwinding (SIGTERM): finish the read at hand, then return
    # waited on instead of Thread.join: a join a signal interrupts marks the thread stopped while it
    # still runs (CPython 3.11), and the next join would return at once
    finished = [threading.Event() for _ in range(numjobs)]

    def job(k: int):
        try:
            for group, chunks in _requests(SEED + k, num_chunks, num_groups, per_request):
                if stop.is_set():
                    return
                t0 = time.perf_counter_ns()
                nbytes[k] += read_once(group, chunks)
                lat[k].append(time.perf_counter_ns() - t0)
                if time.perf_counter() >= deadline:
                    return
        finally:
            finished[k].set()

    start = time.perf_counter()
    threads = [threading.Thread(target=job, args=(k,)) for k in range(numjobs)]
    for t in threads:
        t.start()
    try:
        for done in finished:
            done.wait()
    finally:  # before the caller closes the store or the clients the threads read through
        stop.set()
        for done in finished:
            done.wait()
    elapsed = time.perf_counter() - start
    latencies = np.array([x for per in lat for x in per], dtype=np.int64)
    total = sum(nbytes)
    return {
        "requests": int(latencies.size),
        "io_bytes": total,
        "runtime_ms": elapsed * 1e3,
        "bw_bytes_per_s": total / elapsed,
        "bw_mib_per_s": total / elapsed / (1 << 20),
        "bw_mb_per_s": total / elapsed / 1e6,
        "iops": latencies.size * per_request / elapsed,  # extents read per second
        "request_latency_us": latency_summary_us(latencies),
    }


def run_in_process(data_dir: str, prefix_id: str, args, num_chunks: int, geo: StoreGeometry) -> dict:
    cfg = StoreConfig(data_dir=data_dir, min_free_bytes=0, backend=args.backend, io_queue_depth=args.iodepth, direct_io=not args.page_cache)
    with ChunkStore(cfg) as store:

        def read_once(group, chunks):
            return store.read(prefix_id, chunks, [group], coalesce=False).bytes_useful

        return timed_loop(read_once, **_loop_args(args, num_chunks, geo))


def _loop_args(args, num_chunks: int, geo: StoreGeometry) -> dict:
    return dict(
        numjobs=args.numjobs,
        runtime_s=args.runtime,
        num_chunks=num_chunks,
        num_groups=geo.num_groups,
        per_request=min(args.iodepth, num_chunks),
    )


@dataclass(frozen=True)
class DaemonArgs:
    """What ``_Daemon`` reads from its args, for a benchmark that starts a daemon of its own."""

    backend: str = "auto"
    iodepth: int = 16
    numjobs: int = 1
    bs: int = 1 << 20
    transport: str = "unix"  # or "tcp" (loopback, with a token)
    page_cache: bool = False  # direct_io off


class _Daemon:
    """A daemon child process serving ``data_dir`` on a private socket."""

    def __init__(self, data_dir: str, args, extra=()):
        self.run_dir = tempfile.mkdtemp(prefix="kvbench", dir="/tmp")
        self.socket = os.path.join(self.run_dir, "kvstore.sock")
        ready = os.path.join(self.run_dir, "ready")
        self.token = "kvstore-bench-token-" + os.urandom(8).hex()
        token_file = os.path.join(self.run_dir, "token")
        with open(os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(self.token + "\n")
        tcp = ["--tcp-address", "127.0.0.1:0", "--auth-token-file", token_file] if getattr(args, "transport", "unix") == "tcp" else []
        cache = ["--direct-io", "false"] if getattr(args, "page_cache", False) else []
        cmd = [
            sys.executable,
            "-m",
            "kvstore.cli",
            "serve",
            "--data-dir",
            data_dir,
            "--socket-path",
            self.socket,
            "--ready-file",
            ready,
            "--min-free-bytes",
            "0",
            "--backend",
            args.backend,
            "--io-queue-depth",
            str(args.iodepth),
            "--shm-arena-bytes",
            str(max(64 << 20, 4 * args.numjobs * args.iodepth * args.bs)),
            *tcp,
            *cache,
            *extra,  # later flags win
        ]
        self.log = open(os.path.join(self.run_dir, "daemon.log"), "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready(ready, bool(tcp))
        except BaseException as exc:  # not started, or the bench interrupted (SIGTERM): no orphan daemon
            self.proc.kill()
            self.proc.wait(60)
            self.log.close()
            if not isinstance(exc, BenchError):  # a daemon that failed keeps its log for the message
                shutil.rmtree(self.run_dir, ignore_errors=True)
            raise

    def _wait_ready(self, ready: str, tcp: bool) -> None:
        deadline = time.monotonic() + 60
        while not os.path.exists(ready):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"the daemon did not start; see {self.log.name}")
            time.sleep(0.05)
        self.tcp_port = 0
        while not self.tcp_port and tcp:  # the ready file: "PID TCP_PORT METRICS_PORT"
            with open(ready) as f:
                fields = f.read().split()
            self.tcp_port = int(fields[1]) if len(fields) >= 2 else 0
            if not self.tcp_port and time.monotonic() > deadline:
                raise BenchError(f"the daemon did not say its TCP port; see {self.log.name}")
            time.sleep(0 if self.tcp_port else 0.05)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        self.log.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)


def private_daemon_client(directory: str, prefix: str, stack, extra=()):
    """A client of a fresh daemon on a private socket, its store in a new directory under ``directory``.

    ``stack`` (an ``ExitStack``) closes the client, stops the daemon and removes the store.
    ``extra``: daemon flags (later flags win).
    """
    from engine_client.client import KVStoreClient

    os.makedirs(directory, exist_ok=True)
    data_dir = tempfile.mkdtemp(prefix=prefix, dir=directory)
    stack.callback(shutil.rmtree, data_dir, ignore_errors=True)
    daemon = _Daemon(data_dir, DaemonArgs(), extra=extra)
    stack.callback(daemon.stop)
    return stack.enter_context(KVStoreClient(f"unix:{daemon.socket}"))


def run_via_daemon(target: str, prefix_id: str, args, num_chunks: int, geo: StoreGeometry, *, shm: bool, **client_kw) -> dict:
    from engine_client.client import KVStoreClient

    clients = [KVStoreClient(target, shm=shm, **client_kw) for _ in range(args.numjobs)]
    local = threading.local()
    ids = iter(range(args.numjobs))
    lock = threading.Lock()

    def read_once(group, chunks):
        if not hasattr(local, "client"):
            with lock:
                local.client = clients[next(ids)]
        layer = group * geo.group_layers
        with local.client.read_chunks(prefix_id, chunks, layer_start=layer, layer_end=layer + 1, coalesce=False) as got:
            return got.bytes_useful

    try:
        return timed_loop(read_once, **_loop_args(args, num_chunks, geo))
    finally:
        for c in clients:
            c.close()


def run_fio_on_segment(data_dir: str, args) -> tuple[dict, str]:
    fio = find_fio()
    seg_dir = os.path.join(data_dir, "segments")
    path = max((os.path.join(seg_dir, n) for n in os.listdir(seg_dir)), key=os.path.getsize)
    size = os.path.getsize(path) // args.bs * args.bs
    spec = JobSpec(
        rw="randread",
        block_bytes=args.bs,
        iodepth=args.iodepth,
        numjobs=args.numjobs,
        size_bytes=size,
        runtime_s=args.runtime,
        direct=True,
        backend="posix",
        filename=path,
        seed=SEED,
    )
    cmd = fio_command(fio, spec, args.fio_ioengine) + ["--readonly"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.runtime + 60)
    if proc.returncode != 0:
        raise BenchError(f"fio failed: {(proc.stderr or proc.stdout)[-400:]}")
    return parse_fio_json(proc.stdout, "randread", f"fio({args.fio_ioengine})"), " ".join(cmd)


def run_daemon_comparison(args) -> dict:
    geo = geometry_for_extent(args.bs)
    data_dir = os.path.join(args.directory, f"daemon-store-{args.bs // 1024}k")
    prefix_id, num_chunks = ensure_prefix(data_dir, geo, args.size)
    if args.page_cache:
        _read_through(data_dir)
    rows = {"in-process": run_in_process(data_dir, prefix_id, args, num_chunks, geo)}
    daemon = _Daemon(data_dir, args)
    try:
        if args.transport == "tcp":
            target = f"127.0.0.1:{daemon.tcp_port}"
            kw = {"token": daemon.token}
            rows["daemon-bytes"] = run_via_daemon(target, prefix_id, args, num_chunks, geo, shm=False, data_channel=False, **kw)
            rows["daemon-data"] = run_via_daemon(target, prefix_id, args, num_chunks, geo, shm=False, data_channel=True, **kw)
        else:
            target = f"unix:{daemon.socket}"
            rows["daemon-shm"] = run_via_daemon(target, prefix_id, args, num_chunks, geo, shm=True)
            rows["daemon-bytes"] = run_via_daemon(target, prefix_id, args, num_chunks, geo, shm=False)
    finally:
        daemon.stop()
    report = {
        "rows": rows,
        "params": {
            "bs": args.bs,
            "iodepth": args.iodepth,
            "numjobs": args.numjobs,
            "runtime_s": args.runtime,
            "extents_per_request": min(args.iodepth, num_chunks),
            "prefix_chunks": num_chunks,
            "geometry": geo.to_dict(),
            "data_dir": data_dir,
            "transport": args.transport,
            "page_cache": args.page_cache,
        },
        "machine": machine_info(data_dir),
    }
    if args.compare_fio:
        rows["fio"], report["params"]["fio_command"] = run_fio_on_segment(data_dir, args)
        report["machine"]["fio_version"] = fio_version(find_fio())
    base = rows["in-process"]["bw_bytes_per_s"]
    report["ratio"] = {name: row["bw_bytes_per_s"] / base for name, row in rows.items() if name != "in-process"}
    if "fio" in rows:
        report["ratio"]["in-process/fio"] = base / rows["fio"]["bw_bytes_per_s"]
        for name in ("daemon-shm", "daemon-data"):
            if name in rows:
                report["ratio"][f"{name}/fio"] = rows[name]["bw_bytes_per_s"] / rows["fio"]["bw_bytes_per_s"]
    if "daemon-data" in rows:
        report["ratio"]["daemon-data/daemon-bytes"] = rows["daemon-data"]["bw_bytes_per_s"] / rows["daemon-bytes"]["bw_bytes_per_s"]
    return report


def format_daemon_report(report: dict) -> str:
    p = report["params"]
    m = p["geometry"]["model"]
    lines = [
        f"random chunk reads: {p['extents_per_request']} extents of {p['bs'] // 1024} KiB per request "
        f"({m['num_layers']} layers x {m['num_kv_heads']} KV heads x {m['head_dim']} dim bf16, {p['prefix_chunks']} chunks), "
        f"numjobs={p['numjobs']}, {p['runtime_s']:g}s each, daemon over {p.get('transport', 'unix')}"
        + (", page cache (no O_DIRECT)" if p.get("page_cache") else ""),
        f"{'path':<14}{'MiB/s':>9}{'MB/s':>9}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'vs in-process':>15}",
    ]
    base = report["rows"]["in-process"]["bw_bytes_per_s"]
    for name, row in report["rows"].items():
        if name == "fio":
            reqs, p50, p99 = row["iops"], row["clat_us"]["p50"] / 1e3, row["clat_us"]["p99"] / 1e3
            label = "fio (per I/O)"
        else:
            reqs = row["requests"] / (row["runtime_ms"] / 1e3)
            p50, p99 = row["request_latency_us"]["p50"] / 1e3, row["request_latency_us"]["p99"] / 1e3
            label = name
        lines.append(
            f"{label:<14}{row['bw_mib_per_s']:>9.1f}{row['bw_mb_per_s']:>9.1f}{reqs:>9.1f}{p50:>9.2f}{p99:>9.2f}"
            f"{row['bw_bytes_per_s'] / base:>15.2f}"
        )
    ratios = "; ".join(f"{k.replace('/', ' / ')} = {v:.2f}" for k, v in report["ratio"].items() if "/" in k)
    if ratios:
        lines.append(ratios)
    return "\n".join(lines)


def _read_through(data_dir: str) -> None:
    """Read every segment file once, buffered, so that page-cache runs start warm."""
    seg_dir = os.path.join(data_dir, "segments")
    for name in os.listdir(seg_dir):
        with open(os.path.join(seg_dir, name), "rb", buffering=0) as f:
            while f.read(8 << 20):
                pass
