"""``kvstore-bench calibrate``: measure this machine's rates into a profile file (``--profile file:PATH``).

The named profiles (``h100``, ...) are datasheet peaks times assumed
efficiencies.  This measures instead, on ``--device``:

* ``peak_flops``: a GEMM of the model shape's MLP (``--tokens`` x hidden by
  hidden x intermediate, in the compute dtype), achieved FLOP/s, efficiency 1;
* ``mem_bytes_per_s``: a device-to-device copy, bytes read + written per
  second, efficiency 1;
* ``layer_overhead_s``: the project's own decoder layer on a Re-Prefill shape
  (64 suffix tokens over 5% of ``--context`` rows) minus the roofline of that
  shape under the two rates above: the fixed cost per layer (Python, masks,
  launches, synchronisation);
* ``h2d_bytes_per_s`` / ``pageable_h2d_bytes_per_s``: host-to-device copies
  from pinned and from pageable host memory (on a CPU: a host copy, both);
* ``disk_bytes_per_s``: O_DIRECT reads of 1 MiB at depth 16 through the
  store's I/O backend, on a file in ``--data-dir`` (the disk the daemon uses);
* ``period_overhead_s``: a real daemon on a private socket, the median time
  of a Re-Prefill-shaped request that reads one chunk per period (describe,
  Prefetch open, one set per period, its group, close), per period: the
  storage path's fixed cost of one Period, one chunk's read included.

The file records where and how it was measured (``source``).
"""

from __future__ import annotations

import datetime
import os
import shlex
import sys
import time
from contextlib import ExitStack

from .io_jobs import BenchError
from .layer_shapes import SHAPES, random_decoder


def add_calibrate_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this machine's compute, copy, disk and request rates into a profile file")
    p.add_argument("--out", required=True, help="the profile file to write (use it as --profile file:PATH)")
    p.add_argument("--device", choices=("cpu", "cuda"), help="where the model runs (default: cuda when present, else cpu)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b", help="the decoder shape timed")
    p.add_argument("--tokens", type=int, default=None, help="GEMM rows (default: 4096 on cuda, 512 on cpu)")
    p.add_argument("--context", type=int, default=None, help="context of the Re-Prefill layer (default: 16384 on cuda, 2048 on cpu)")
    p.add_argument("--disk-bytes", type=int, default=256 << 20, help="size of the file the disk rate is read from")
    p.add_argument("--data-dir", dest="directory", default=".kvstore/bench")
    p.add_argument("--no-disk", dest="disk", action="store_false", help="skip the disk and daemon measurements")
    p.set_defaults(run=command_calibrate)


def command_calibrate(args) -> int:
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise BenchError("--device cuda: no CUDA device is visible to torch")
    for flag, value in (("--tokens", args.tokens), ("--context", args.context), ("--disk-bytes", args.disk_bytes)):
        if value is not None and value < 1:
            raise BenchError(f"{flag}: must be positive, got {value}")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        raise BenchError(f"--out {args.out}: directory {out_dir} does not exist")
    profile = calibrate(args, device)
    from engine_client.compute_model import profile_to_json
    from engine_client.model.profile_file import write_text_atomic

    write_text_atomic(args.out, profile_to_json(profile))
    print(format_profile(profile))
    print(f"written: {args.out} (use --profile file:{args.out})")
    return 0


def calibrate(args, device: str):
    import torch

    from engine_client.compute_model import AcceleratorProfile, layer_seconds

    gpu = device == "cuda"
    dtype = torch.bfloat16 if gpu else torch.float32
    tokens = args.tokens or (4096 if gpu else 512)
    context = args.context or (16384 if gpu else 2048)
    cfg, dec = random_decoder(args.shape, device, dtype)
    with torch.inference_mode():
        flops = _gemm_flops(cfg, tokens, device, dtype)
        mem = _copy_rate(device, (512 << 20) if gpu else (64 << 20))
        pinned, pageable = _h2d_rates(device, (256 << 20) if gpu else (64 << 20))
        rows = max(1, context // 20)
        layer_s = _layer_time(dec, cfg, 64, rows, device, dtype)
    dtype_bytes = 2 if dtype == torch.bfloat16 else 4
    rates = AcceleratorProfile(
        "probe", flops, mem, pinned, matmul_efficiency=1.0, mem_efficiency=1.0, layer_overhead_s=1e-9, dtype_bytes=dtype_bytes
    )
    roofline = layer_seconds(cfg, 64, rows, rates).total
    disk = request = None
    if args.disk:
        disk = _disk_rate(args)
        request = _request_overhead(args)
    name = torch.cuda.get_device_name(0) if gpu else _cpu_name()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    command = "kvstore-bench " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    return AcceleratorProfile(
        f"calibrated-{device}",
        flops,
        mem,
        pinned,
        matmul_efficiency=1.0,
        mem_efficiency=1.0,
        layer_overhead_s=max(1e-6, layer_s - roofline),
        dtype_bytes=dtype_bytes,
        pageable_h2d_bytes_per_s=pageable,
        disk_bytes_per_s=disk,
        period_overhead_s=request,
        source=f"measured {when} on {name} ({device}, torch {torch.__version__}, {args.shape} shape): {command}",
    )


def _cpu_name() -> str:
    from .machine import machine_info

    info = machine_info(".")
    return f"{info.get('cpu_model')} x{info.get('num_cpus')}"


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _median_seconds(fn, device: str, reps: int = 7) -> float:
    fn()
    _sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _gemm_flops(cfg, tokens: int, device: str, dtype) -> float:
    import torch

    a = torch.randn(tokens, cfg.hidden_size, device=device, dtype=dtype)
    b = torch.randn(cfg.hidden_size, cfg.intermediate_size, device=device, dtype=dtype)
    t = _median_seconds(lambda: a @ b, device)
    return 2.0 * tokens * cfg.hidden_size * cfg.intermediate_size / t


def _copy_rate(device: str, nbytes: int) -> float:
    import torch

    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2.0 * nbytes / _median_seconds(lambda: dst.copy_(src), device)


def _h2d_rates(device: str, nbytes: int) -> tuple[float, float]:
    """Pinned and pageable host-to-device copy rates (a host copy on a CPU, pinned or not)."""
    import torch

    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    rates = []
    for pinned in (True, False):
        src = torch.ones(nbytes, dtype=torch.uint8, pin_memory=pinned and device == "cuda")
        rates.append(nbytes / _median_seconds(lambda s=src, p=pinned: dst.copy_(s, non_blocking=p), device))
    return rates[0], rates[1]


def _layer_time(dec, cfg, suffix: int, rows: int, device: str, dtype) -> float:
    import torch

    hidden = torch.randn(suffix, cfg.hidden_size, device=device, dtype=dtype)
    positions = dec.position_range(rows, suffix)  # as the runner calls a layer (on CUDA: its graphed parts)
    prefix_kv = torch.randn(2, cfg.num_key_value_heads, rows, cfg.head_dim, device=device, dtype=dtype)
    return _median_seconds(lambda: dec.layer_forward(0, hidden, positions, prefix_kv), device, reps=15)


def _disk_rate(args) -> float:
    from .io_jobs import JobSpec, run_io

    os.makedirs(args.directory, exist_ok=True)
    spec = JobSpec(
        rw="randread",
        block_bytes=1 << 20,
        iodepth=16,
        numjobs=1,
        size_bytes=args.disk_bytes,
        runtime_s=3.0,
        direct=True,
        backend="auto",
        filename=os.path.join(args.directory, "calibrate.dat"),
        seed=0,
    )
    report = run_io(spec)
    if not report["params"]["direct_effective"]:
        raise BenchError(f"--data-dir {args.directory}: O_DIRECT reads are not possible there; the disk rate would be the page cache's")
    return float(report["ours"]["bw_bytes_per_s"])


def _request_overhead(args) -> float:
    import numpy as np

    from kvstore.contract.geometry import ModelSpec, StoreGeometry

    from .daemon_io import private_daemon_client

    geo = StoreGeometry(ModelSpec(8, 2, 64, "bfloat16"), chunk_tokens=16, group_layers=1)
    n = 512
    kv = np.zeros((8, 2, 2, n, 64), np.uint16)
    with ExitStack() as stack:
        client = private_daemon_client(args.directory, "calibrate-", stack)
        pid = client.put_prefix(np.arange(n), kv, geo).prefix_id
        one = np.asarray([0])

        def request():
            client.describe(pid)
            with client.prefetch(pid, period_layers=1) as st:
                for p in range(geo.num_groups):
                    st.send(p, one)
                    for _ in st.groups(p):
                        pass

        return _median_seconds(request, "cpu", reps=21) / geo.num_groups


def format_profile(p) -> str:
    def rate(v, unit="B/s"):
        return "-" if v is None else f"{v / 1e9:.2f} G{unit}"

    lines = [
        f"profile {p.name}: {p.source}",
        f"  matmul            {p.peak_flops / 1e12:.3f} TFLOP/s achieved",
        f"  device memory     {rate(p.mem_bytes_per_s)}",
        f"  layer fixed cost  {p.layer_overhead_s * 1e6:.0f} us",
        f"  h2d pinned        {rate(p.h2d_bytes_per_s)}",
        f"  h2d pageable      {rate(p.pageable_h2d_bytes_per_s)}",
        f"  disk (O_DIRECT)   {rate(p.disk_bytes_per_s)}",
        "  per-Period cost   " + ("-" if p.period_overhead_s is None else f"{p.period_overhead_s * 1e3:.2f} ms (storage path)"),
    ]
    return "\n".join(lines)
