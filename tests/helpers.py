"""Shared test helpers: synthetic KV, tokens and geometries."""

import contextlib
import ctypes
import os

import numpy as np

from kvstore.contract.geometry import ModelSpec, StoreGeometry


def make_kv(geometry: StoreGeometry, num_tokens: int, seed: int) -> np.ndarray:
    """Random KV ``[layers, 2, kv_heads, tokens, head_dim]`` in the stored dtype."""
    m = geometry.model
    rng = np.random.default_rng(seed)
    shape = (m.num_layers, 2, m.num_kv_heads, num_tokens, m.head_dim)
    if m.dtype == "bfloat16":
        # Real bf16 bit patterns of normal floats, so summaries are meaningful.
        f = rng.standard_normal(shape, dtype=np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16)
    return rng.standard_normal(shape).astype(m.dtype)


def make_tokens(num_tokens: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed + 10_000).integers(0, 50_000, num_tokens)


GEOMETRIES = [
    # odd sizes: n not a multiple of c, L not a multiple of p, one head, head dim 1
    StoreGeometry(ModelSpec(5, 1, 1, "bfloat16"), chunk_tokens=16, group_layers=2),
    StoreGeometry(ModelSpec(3, 2, 4, "float32"), chunk_tokens=7, group_layers=3, probe_keys=False),
    StoreGeometry(ModelSpec(4, 2, 64, "float16"), chunk_tokens=16, group_layers=8),
    StoreGeometry(ModelSpec(24, 2, 64, "bfloat16"), chunk_tokens=16, group_layers=8),
]


def ids(geo: StoreGeometry) -> str:
    m = geo.model
    return f"L{m.num_layers}H{m.num_kv_heads}d{m.head_dim}-{m.dtype}-c{geo.chunk_tokens}p{geo.group_layers}"


def assert_png(path) -> None:
    """``path`` is a PNG image of a drawn figure: the signature, and a size in pixels a figure has."""
    with open(path, "rb") as fh:
        head = fh.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", head
    width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")  # the IHDR chunk
    assert width >= 300 and height >= 200, (width, height)
    assert os.path.getsize(path) > 5000  # bars and text, not an empty canvas


def data_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_pythonpath() -> str:
    """The checkout first, then the PYTHONPATH this run was given (dependencies installed with ``pip --target``
    on a machine without network), so a child process imports this checkout and finds what the parent found."""
    return os.pathsep.join(p for p in (data_root(), os.environ.get("PYTHONPATH")) if p)


def run_bench(*argv, expect=0, timeout=240):
    """``kvstore-bench ARGV`` in a child process from the repository root; asserts its exit status."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "kvstore_tools.bench.cli", *argv],
        capture_output=True,
        text=True,
        cwd=data_root(),
        timeout=timeout,
        env={"PYTHONPATH": child_pythonpath(), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == expect, proc.stderr[-2000:]
    return proc


_EACH = """\
import contextlib, io, json, sys
from kvstore_tools.bench.cli import main
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = main(argv)
    print("@@" + json.dumps([status, err.getvalue()]), flush=True)
"""


def run_bench_each(argvs, *, timeout=240) -> list[tuple[int, str]]:
    """``kvstore-bench ARGV`` for each ``ARGV`` of ``argvs``, all in ONE child process (one interpreter
    start and one torch import, the bulk of a refusal's time): ``(exit status, stderr)`` of each, as the
    console script's ``main`` returns and prints them."""
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _EACH, json.dumps([list(a) for a in argvs])],
        capture_output=True,
        text=True,
        cwd=data_root(),
        timeout=timeout,
        env={"PYTHONPATH": child_pythonpath(), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = [tuple(json.loads(line[2:])) for line in proc.stdout.splitlines() if line.startswith("@@")]
    assert len(out) == len(argvs), proc.stdout[-2000:]
    return out


def _has_cuda() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


HAS_CUDA = _has_cuda()


def settled(client, timeout_s: float = 15.0):
    """Stats once the daemon has let go of every lease and pin (released
    leases travel on the shm connection, after the call that freed them)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        s = client.stats()
        if (s.shm_leased_bytes == 0 and s.pinned_units == 0) or time.monotonic() > deadline:
            return s
        time.sleep(0.02)


@contextlib.contextmanager
def calibrated_layers(runner, layers: tuple):
    """``runner`` with a calibration file of ``layers`` (what ``standin_layers``/``whole_layers="calibrated"`` read), then none again."""
    from engine_client.model.standins import StandinLayers

    gains = tuple(0.5 if i in layers else 0.05 for i in range(runner.model.num_layers))
    runner.standin_profile = StandinLayers(runner.model.fingerprint, tuple(layers), gains, 2, 0.2)
    try:
        yield
    finally:
        runner.standin_profile = None


def flat_config(**fields):
    """A ``ReprefillConfig`` spelled in flat fields (``budget=0.25, selector="exact", ...``) over the paper's
    selection, ``summary`` (8-layer Periods, scores summed over heads, nothing else): a field not named keeps
    that system's value, not ``ReprefillConfig()``'s."""
    from engine_client.reprefill import parse_system

    return parse_system("summary").replace(**fields)
