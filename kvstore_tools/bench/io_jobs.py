"""fio-style raw I/O jobs through the store's ``IOBackend``.

A job keeps ``iodepth`` requests of ``block_bytes`` in flight on one file
through ``backend.pread`` / ``backend.pwrite`` for ``runtime_s`` seconds (fio's
``time_based``), resubmitting a slot as soon as its request completes, and
records each request's completion latency: from just before the submit call
to the moment the backend completed the future (stamped in its done-callback
on the backend's worker thread).  That is fio's ``lat`` more than its
``clat``: the backend's submit overhead is part of what is measured.

Offsets: ``randread`` visits every block once per pass in a seeded random
order (fio's default random map), ``read`` and ``write`` go sequentially and
wrap.  ``numjobs > 1`` runs each job in its own (spawned) process on the same
file, started together, and aggregates like fio's ``group_reporting``: bytes
and I/Os summed over jobs, runtime the longest job's, latency percentiles over
all requests.

CPU per I/O: the process's user and system CPU time (``os.times``: every
thread, and the kernel's io_uring workers, which are threads of the
process) over the timed loop, divided by the I/Os completed; fio's row takes
its ``usr_cpu``/``sys_cpu`` the same way.  ``busy_core()`` keeps one core
busy with a competing process (``--busy-core``), to see what the backends
cost when the CPU is contended.

The file is laid out once with real random data (never sparse: reading holes
or unwritten extents never touches the disk) and reused while it holds
``size_bytes``.

Why one file of ~520 lines: it is one fio job end to end (the file's layout,
the offsets, the submission loops, the job processes and their aggregation,
the report in fio's shape), each part read against fio's option of the same
name; fio itself (``fio``) and the machine description (``machine``) are
apart.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import multiprocessing
import os
import queue
import re
import subprocess
import sys
import threading
import time
from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np

from kvstore.contract.geometry import ALIGN_BYTES
from kvstore.io import aligned_buffer, make_backend

from .machine import machine_info

RW_MODES = ("read", "randread", "write")
LAYOUT_CHUNK_BYTES = 8 << 20  # one layout write
LAYOUT_IN_FLIGHT = 4
MAX_PERMUTED_BLOCKS = 1 << 22  # above this, random offsets are drawn with replacement
OFFSET_BATCH = 1 << 16  # offsets converted to Python ints at a time
COMPLETION_TIMEOUT_S = 60.0  # I/Os still in flight this long after the deadline: an error
CALLBACK_BACKENDS = ("posix", "uring")  # backends whose futures take add_done_callback
JOB_START_TIMEOUT_S = 120.0  # spawn + setup of a job process
PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p99.9", 99.9))
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


class BenchError(RuntimeError):
    """A benchmark could not run; the message says why and what to do."""


class UsageError(BenchError):
    """An argument argparse cannot check alone (a path to write to); exit status 2, like argparse's."""


@dataclass(frozen=True)
class JobSpec:
    """One fio-style job, as ``kvstore-bench io`` was asked to run it."""

    rw: str  # read | randread | write
    block_bytes: int
    iodepth: int
    numjobs: int
    size_bytes: int  # bytes of the file the job covers (per job; jobs share the file)
    runtime_s: float
    direct: bool
    backend: str  # auto | posix | uring | kvikio
    filename: str
    seed: int

    def check(self) -> None:
        """Raise ValueError naming the offending option."""
        if self.rw not in RW_MODES:
            raise ValueError(f"--rw must be one of {', '.join(RW_MODES)}, got {self.rw!r}")
        if self.block_bytes <= 0:
            raise ValueError(f"--bs must be positive, got {self.block_bytes}")
        if self.direct and self.block_bytes % ALIGN_BYTES:
            raise ValueError(f"--bs {self.block_bytes} is not a multiple of {ALIGN_BYTES} bytes, which --direct 1 needs")
        if self.direct and self.size_bytes % ALIGN_BYTES:
            raise ValueError(f"--size {self.size_bytes} is not a multiple of {ALIGN_BYTES} bytes, which --direct 1 needs")
        if self.size_bytes < self.block_bytes:
            raise ValueError(f"--size {self.size_bytes} is smaller than --bs {self.block_bytes}")
        if self.iodepth < 1 or self.numjobs < 1:
            raise ValueError("--iodepth and --numjobs must be >= 1")
        if self.runtime_s <= 0:
            raise ValueError(f"--runtime must be positive, got {self.runtime_s}")


@dataclass
class JobResult:
    """What one job did; ``latencies_ns`` holds one entry per completed I/O."""

    num_ios: int
    io_bytes: int
    elapsed_ns: int
    latencies_ns: np.ndarray  # [num_ios] int64
    backend: str
    direct: bool  # O_DIRECT really used (a file system may refuse it)
    cpu_user_s: float = 0.0  # process CPU over the timed loop
    cpu_sys_s: float = 0.0


# ------------------------------------------------------------------ sizes


def parse_size(text: str) -> int:
    """fio-style size: ``4k``, ``256KiB``, ``1m``, ``2g``, ``4096``; k = 1024."""
    match = _SIZE_RE.match(str(text))
    if match is None:
        raise ValueError(f"not a size: {text!r} (use e.g. 4k, 256k, 1m, 2g)")
    nbytes = float(match[1]) * _SIZE_UNITS[match[2].lower()]
    if nbytes != int(nbytes):
        raise ValueError(f"not a whole number of bytes: {text!r}")
    return int(nbytes)


def format_bytes(nbytes: float, base: int = 1024) -> str:
    """fio's style: at most four digits, then the next unit (2466MiB, 19.0GiB)."""
    units = ("B", "KiB", "MiB", "GiB", "TiB") if base == 1024 else ("B", "kB", "MB", "GB", "TB")
    unit = units[0]
    for unit in units:
        if nbytes < 10000 or unit == units[-1]:
            break
        nbytes /= base
    return f"{nbytes:.0f}{unit}" if nbytes >= 100 or unit == "B" else f"{nbytes:.1f}{unit}"


# ------------------------------------------------------------------ layout


def file_is_laid_out(path: str, size_bytes: int) -> bool:
    """True when ``path`` holds at least ``size_bytes`` of allocated data."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    return st.st_size >= size_bytes and st.st_blocks * 512 >= size_bytes


def prepare_file(spec: JobSpec) -> str:
    """Lay ``spec.filename`` out to ``size_bytes`` of random data once.

    Returns ``"reused"``, ``"extended"`` (written from the old end) or
    ``"created"`` (written from 0: new, or sparse).
    """
    path, size_bytes = spec.filename, spec.size_bytes
    if file_is_laid_out(path, size_bytes):
        return "reused"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    start = 0
    if os.path.exists(path):
        st = os.stat(path)
        if st.st_blocks * 512 >= st.st_size:  # not sparse: keep what is there
            start = st.st_size // ALIGN_BYTES * ALIGN_BYTES
    backend = make_backend(spec.backend, queue_depth=LAYOUT_IN_FLIGHT, direct=spec.direct)
    try:
        fh = backend.open(path, write=True)
        try:
            _write_random(backend, fh, start, size_bytes, spec.seed)
            backend.fdatasync(fh)
        finally:
            backend.close(fh)
    finally:
        backend.shutdown()
    return "extended" if start else "created"


def _write_random(backend, fh, start: int, end: int, seed: int) -> None:
    """Write bytes ``[start, end)``: a random pattern XORed with each offset (no two chunks alike)."""
    rng = np.random.default_rng(seed)
    pattern = rng.integers(0, 1 << 63, LAYOUT_CHUNK_BYTES // 8, dtype=np.uint64)
    buffers = [aligned_buffer(LAYOUT_CHUNK_BYTES) for _ in range(LAYOUT_IN_FLIGHT)]
    pending: deque = deque()
    try:
        for i, offset in enumerate(range(start, end, LAYOUT_CHUNK_BYTES)):
            if len(pending) == LAYOUT_IN_FLIGHT:
                pending.popleft().result()  # frees buffers[i % LAYOUT_IN_FLIGHT]
            buf = buffers[i % LAYOUT_IN_FLIGHT]
            np.bitwise_xor(pattern, np.uint64(offset), out=np.frombuffer(buf, dtype=np.uint64))
            pending.append(backend.pwrite(fh, buf[: min(LAYOUT_CHUNK_BYTES, end - offset)], offset))
    finally:
        _wait_all(pending)


def _wait_all(futures) -> None:
    """Wait for every future, raising the first error once all have ended."""
    error = None
    for future in futures:
        try:
            future.result()
        except Exception as exc:
            error = error or exc
    if error is not None:
        raise error


# ------------------------------------------------------------------ offsets


def iter_offsets(rw: str, block_bytes: int, size_bytes: int, seed: int) -> Iterator[int]:
    """Endless byte offsets of whole blocks inside ``size_bytes``."""
    num_blocks = size_bytes // block_bytes
    if rw != "randread":
        while True:
            yield from range(0, num_blocks * block_bytes, block_bytes)
    rng = np.random.default_rng(seed)
    while True:
        if num_blocks <= MAX_PERMUTED_BLOCKS:
            order = rng.permutation(num_blocks)  # one pass: every block once
        else:
            order = rng.integers(0, num_blocks, OFFSET_BATCH)
        for first in range(0, len(order), OFFSET_BATCH):
            yield from (order[first : first + OFFSET_BATCH] * block_bytes).tolist()


# ------------------------------------------------------------------ one job


class _CallbackChain:
    """Each slot resubmits itself from the completion callback of its last I/O.

    For futures with ``add_done_callback`` (the posix backend's
    concurrent.futures): the callback runs on the backend's worker thread right
    after the I/O, so a completion wakes no other thread.  Measured on a
    2-core VM at 32 KiB QD16: a reaper thread draining a completion queue costs
    ~1.5 more context switches per I/O and 10-40 % of the IOPS; one thread
    per slot blocking on ``result()`` costs more still.  Callbacks of
    different slots run concurrently: offsets are drawn under a lock; errors
    are kept for the caller, never raised in a callback.
    """

    def __init__(self, submit_io, fh, buffers: list, offsets: Iterator[int], deadline_ns: int):
        self._submit_io, self._fh, self._buffers, self._offsets = submit_io, fh, buffers, offsets
        self._deadline_ns = deadline_ns
        self._submit_ns = [0] * len(buffers)
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._in_flight = 0
        self.error: BaseException | None = None
        self.latencies_ns = array("q")

    def run(self, timeout_s: float) -> array:
        """Start every slot, wait until all have stopped; latencies in ns."""
        self._in_flight = len(self._buffers)
        for slot in range(len(self._buffers)):
            try:
                self._submit(slot)
            except BaseException as exc:
                self.error = exc
                for _ in range(slot, len(self._buffers)):
                    self._retire()
                break
        if not self._finished.wait(timeout_s):
            raise BenchError(f"I/Os still in flight {timeout_s:.0f} s after the job started")
        if self.error is not None:
            raise self.error
        return self.latencies_ns

    def _submit(self, slot: int) -> None:
        with self._lock:
            offset = next(self._offsets)
        self._submit_ns[slot] = time.perf_counter_ns()
        future = self._submit_io(self._fh, self._buffers[slot], offset)
        future.add_done_callback(functools.partial(self._on_done, slot))

    def _on_done(self, slot: int, future) -> None:
        done_ns = time.perf_counter_ns()
        try:
            future.result()
            self.latencies_ns.append(done_ns - self._submit_ns[slot])
            if done_ns < self._deadline_ns and self.error is None:
                self._submit(slot)
                return
        except BaseException as exc:  # a callback must not raise: hand it to run()
            if self.error is None:
                self.error = exc
        self._retire()

    def _retire(self) -> None:
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._finished.set()


def _run_in_order(submit_io, fh, buffers: list, offsets: Iterator[int], deadline_ns: int) -> array:
    """For futures without callbacks (kvikio's): wait on the oldest, resubmit its slot.

    A slow oldest request delays noticing the others, so latencies are upper
    bounds and the queue runs a little below ``iodepth``.
    """
    pending: deque = deque()
    latencies_ns = array("q")

    def submit(slot: int) -> None:
        offset = next(offsets)
        pending.append((slot, time.perf_counter_ns(), submit_io(fh, buffers[slot], offset)))

    try:
        for slot in range(len(buffers)):
            submit(slot)
        while pending:
            slot, submit_ns, future = pending.popleft()
            future.result()
            done_ns = time.perf_counter_ns()
            latencies_ns.append(done_ns - submit_ns)
            if done_ns < deadline_ns:
                submit(slot)
    except BaseException:
        with contextlib.suppress(Exception):  # buffers and fd stay in use until these end
            _wait_all(future for _, _, future in pending)
        raise
    return latencies_ns


def _run_loop(spec: JobSpec, backend, fh, buffers: list, offsets: Iterator[int]) -> tuple[array, int]:
    """Keep one request per buffer in flight until the deadline; ``(latencies_ns, elapsed_ns)``."""
    submit_io = backend.pwrite if spec.rw == "write" else backend.pread
    start_ns = time.perf_counter_ns()
    deadline_ns = start_ns + int(spec.runtime_s * 1e9)
    if backend.name in CALLBACK_BACKENDS:
        chain = _CallbackChain(submit_io, fh, buffers, offsets, deadline_ns)
        latencies_ns = chain.run(timeout_s=spec.runtime_s + COMPLETION_TIMEOUT_S)
    else:
        latencies_ns = _run_in_order(submit_io, fh, buffers, offsets, deadline_ns)
    return latencies_ns, time.perf_counter_ns() - start_ns


def _job_buffers(spec: JobSpec, seed: int) -> list:
    """``iodepth`` aligned buffers of ``block_bytes``; random content for writes."""
    buffers = [aligned_buffer(spec.block_bytes) for _ in range(spec.iodepth)]
    if spec.rw == "write":
        rng = np.random.default_rng(seed)
        for buf in buffers:
            np.frombuffer(buf, dtype=np.uint8)[:] = rng.integers(0, 256, spec.block_bytes, dtype=np.uint8)
    return buffers


@contextlib.contextmanager
def _gc_paused():
    """No cyclic GC passes during the timed loop (as timeit does): the loop makes
    no cycles, and a pass over a full heap stalls every slot at once."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def run_job(spec: JobSpec, job_index: int = 0, barrier=None) -> JobResult:
    """Run job ``job_index`` in this process; waits on ``barrier`` (if any) before the clock starts."""
    seed = spec.seed + job_index
    backend = make_backend(spec.backend, queue_depth=spec.iodepth, direct=spec.direct)
    try:
        fh = backend.open(spec.filename, write=spec.rw == "write")
        try:
            buffers = _job_buffers(spec, seed)
            offsets = iter_offsets(spec.rw, spec.block_bytes, spec.size_bytes, seed)
            if barrier is not None:
                barrier.wait(timeout=JOB_START_TIMEOUT_S)
            with _gc_paused():
                cpu0 = os.times()
                latencies_ns, elapsed_ns = _run_loop(spec, backend, fh, buffers, offsets)
                cpu1 = os.times()
            direct = fh.direct
        finally:
            backend.close(fh)
    finally:
        backend.shutdown()
    return JobResult(
        num_ios=len(latencies_ns),
        io_bytes=len(latencies_ns) * spec.block_bytes,
        elapsed_ns=elapsed_ns,
        latencies_ns=np.frombuffer(latencies_ns, dtype=np.int64).copy(),
        backend=backend.name,
        direct=direct,
        cpu_user_s=cpu1.user - cpu0.user,
        cpu_sys_s=cpu1.system - cpu0.system,
    )


# ------------------------------------------------------------------ many jobs


def _job_process(spec: JobSpec, job_index: int, barrier, results) -> None:
    """Body of a spawned job process: puts a JobResult, or an error string."""
    try:
        results.put(run_job(spec, job_index, barrier))
    except BaseException as exc:  # report anything, then let the parent decide
        barrier.abort()
        results.put(f"job {job_index}: {exc.__class__.__name__}: {exc}")


def run_jobs_in_processes(spec: JobSpec) -> list[JobResult]:
    """``spec.numjobs`` jobs, one spawned process each, started together."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(spec.numjobs)
    results = ctx.Queue()
    procs = [ctx.Process(target=_job_process, args=(spec, i, barrier, results), name=f"kvstore-bench-job{i}") for i in range(spec.numjobs)]
    for proc in procs:
        proc.start()
    outcomes = []
    try:
        for _ in procs:
            outcomes.append(results.get(timeout=JOB_START_TIMEOUT_S + spec.runtime_s + COMPLETION_TIMEOUT_S))
    except queue.Empty:
        raise BenchError(f"{spec.numjobs - len(outcomes)} job process(es) did not report back") from None
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join()
        results.close()
        results.join_thread()
    errors = [o for o in outcomes if isinstance(o, str)]
    if errors:
        raise BenchError("; ".join(errors))
    return outcomes


def summarize(results: list[JobResult]) -> dict:
    """Group report over jobs: summed bytes and I/Os over the longest runtime."""
    latencies_ns = np.concatenate([r.latencies_ns for r in results])
    io_bytes = sum(r.io_bytes for r in results)
    num_ios = sum(r.num_ios for r in results)
    elapsed_s = max(r.elapsed_ns for r in results) / 1e9
    cpu_user_s = sum(r.cpu_user_s for r in results)
    cpu_sys_s = sum(r.cpu_sys_s for r in results)
    return {
        "engine": f"kvstore({results[0].backend})",
        "io_bytes": io_bytes,
        "num_ios": num_ios,
        "runtime_ms": round(elapsed_s * 1e3, 3),
        "bw_bytes_per_s": io_bytes / elapsed_s,
        "bw_mib_per_s": io_bytes / elapsed_s / (1 << 20),
        "bw_mb_per_s": io_bytes / elapsed_s / 1e6,
        "iops": num_ios / elapsed_s,
        "clat_us": latency_summary_us(latencies_ns),
        **cpu_fields(cpu_user_s, cpu_sys_s, num_ios),
        "per_job": [{"io_bytes": r.io_bytes, "num_ios": r.num_ios, "runtime_ms": round(r.elapsed_ns / 1e6, 3)} for r in results],
    }


def cpu_fields(user_s: float, sys_s: float, num_ios: int) -> dict:
    """CPU seconds (user, system) and microseconds of CPU per I/O."""
    return {
        "cpu_user_s": user_s,
        "cpu_sys_s": sys_s,
        "cpu_us_per_io": (user_s + sys_s) / num_ios * 1e6 if num_ios else 0.0,
    }


def latency_summary_us(latencies_ns: np.ndarray) -> dict:
    """p50/p90/p99/p99.9, mean, min and max in microseconds."""
    if len(latencies_ns) == 0:
        return {name: 0.0 for name in ("p50", "p90", "p99", "p99.9", "mean", "min", "max")}
    values = np.percentile(latencies_ns, [q for _, q in PERCENTILES]) / 1e3
    summary = {name: float(v) for (name, _), v in zip(PERCENTILES, values)}
    summary["mean"] = float(latencies_ns.mean() / 1e3)
    summary["min"] = float(latencies_ns.min() / 1e3)
    summary["max"] = float(latencies_ns.max() / 1e3)
    return summary


def run_io(spec: JobSpec) -> dict:
    """Lay the file out, run the job(s); ``{"ours", "params", "machine"}``."""
    spec.check()
    layout = prepare_file(spec)
    load_before = os.getloadavg()
    if spec.numjobs == 1:
        results = [run_job(spec)]
    else:
        results = run_jobs_in_processes(spec)
    params = asdict(spec)
    params.update(layout=layout, direct_effective=results[0].direct, page_cache=not results[0].direct)
    machine = machine_info(spec.filename)
    machine.update(loadavg_before=list(load_before), loadavg_after=list(os.getloadavg()))
    return {"ours": summarize(results), "params": params, "machine": machine}


BUSY_LOOP = "while True: pass"


@contextlib.contextmanager
def busy_core(enabled: bool = True):
    """A competing process spinning on one core while the block runs (``--busy-core``)."""
    if not enabled:
        yield None
        return
    proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP], stdin=subprocess.DEVNULL)
    try:
        time.sleep(0.2)  # running before the first I/O
        yield proc
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------ report


def _num(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def format_iops(iops: float) -> str:
    if iops < 10000:
        return f"{iops:.0f}"
    return f"{iops / 1000:.1f}k" if iops < 100_000 else f"{iops / 1000:.0f}k"


def format_header(engine: str, params: dict) -> str:
    return (
        f"{engine}: rw={params['rw']}, bs={format_bytes(params['block_bytes'])}, iodepth={params['iodepth']}, numjobs={params['numjobs']}"
    )


def format_result(result: dict, params: dict) -> str:
    """fio's three lines: header, bandwidth, completion latency."""
    direction = "write" if params["rw"] == "write" else "read"
    clat = result["clat_us"]
    return "\n".join(
        [
            format_header(result["engine"], params),
            f"  {direction}: IOPS={format_iops(result['iops'])}, "
            f"BW={format_bytes(result['bw_bytes_per_s'])}/s ({format_bytes(result['bw_bytes_per_s'], base=1000)}/s)"
            f"({format_bytes(result['io_bytes'])}/{result['runtime_ms']:.0f}msec)",
            "    clat (usec): " + ", ".join(f"{name}={_num(clat[name])}" for name in ("p50", "p90", "p99", "p99.9", "mean")),
            f"  cpu: {result['cpu_us_per_io']:.1f} us per I/O (user {result['cpu_user_s']:.2f} s, sys {result['cpu_sys_s']:.2f} s)",
        ]
    )


def format_file_line(params: dict) -> str:
    return (
        f"file: {params['filename']} ({format_bytes(params['size_bytes'])}, {params['layout']}), "
        f"direct={int(params['direct_effective'])}, runtime={params['runtime_s']:g}s, seed={params['seed']}"
        + (", one core busy" if params.get("busy_core") else "")
    )


def format_load_line(machine: dict) -> str:
    before, after = machine["loadavg_before"], machine["loadavg_after"]
    return f"load average (1, 5, 15 min): {before[0]:.2f} {before[1]:.2f} {before[2]:.2f} before, {after[0]:.2f} {after[1]:.2f} {after[2]:.2f} after"


def format_run(report: dict) -> str:
    """The human report of ``run_io``: file line, result, page-cache note."""
    params = report["params"]
    lines = [format_file_line(params), format_result(report["ours"], params), format_load_line(report["machine"])]
    if params["page_cache"]:
        lines.append(PAGE_CACHE_NOTE)
    return "\n".join(lines)


PAGE_CACHE_NOTE = "note: direct=0: I/O goes through the page cache; figures measure memory copies as much as the disk"
