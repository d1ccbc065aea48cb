"""``kvstore-bench io --compare-fio``: the same job run by fio, on the same file.

Ours runs first (laying the file out if needed), fio right after with the same
parameters, so both see the same data and nearly the same device state.  The
report holds both rows in one shape (``io_jobs.summarize``'s keys) and the
ratios ours/fio: bandwidth and IOPS (1.0 = as fast as fio), clat p50 and p99
(above 1.0 = ours slower).

Latency is not measured at quite the same points: fio's ``clat`` starts when
the request reached the kernel, ours just before the backend's submit call, so
ours includes the backend's submission overhead (fio's ``slat``).  fio's
percentiles come from its log-linear histogram (within a few percent), ours
from every sample.  Nothing here drops caches: with ``direct=1`` neither run
uses the page cache; with ``direct=0`` both do, and the report says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from .io_jobs import (
    PAGE_CACHE_NOTE,
    BenchError,
    JobSpec,
    cpu_fields,
    format_file_line,
    format_load_line,
    format_result,
    run_io,
)

FIO_INSTALL_HINT = "fio is not on PATH; install it (Debian/Ubuntu: apt-get install -y fio) or drop --compare-fio"
FIO_TIMEOUT_EXTRA_S = 120.0  # fio's layout check and teardown beyond --runtime
RATIO_KEYS = (("bw", "bw_bytes_per_s"), ("iops", "iops"), ("cpu_per_io", "cpu_us_per_io"))
LATENCY_RATIO_KEYS = (("clat_p50", "p50"), ("clat_p99", "p99"))


def find_fio() -> str:
    """Path of the fio binary, or BenchError telling how to install it."""
    path = shutil.which("fio")
    if path is None:
        raise BenchError(FIO_INSTALL_HINT)
    return path


def fio_version(fio: str) -> str:
    return subprocess.run([fio, "--version"], capture_output=True, text=True, check=False).stdout.strip()


def fio_command(fio: str, spec: JobSpec, ioengine: str) -> list[str]:
    """fio's command line for ``spec`` (fio wants ``:`` in file names escaped)."""
    return [
        fio,
        "--name=kvstore-cmp",
        "--filename=" + spec.filename.replace(":", "\\:"),
        f"--rw={spec.rw}",
        f"--bs={spec.block_bytes}",
        f"--iodepth={spec.iodepth}",
        f"--numjobs={spec.numjobs}",
        f"--size={spec.size_bytes}",
        f"--runtime={round(spec.runtime_s * 1000)}ms",
        "--time_based",
        f"--direct={int(spec.direct)}",
        f"--ioengine={ioengine}",
        f"--randseed={spec.seed}",
        "--group_reporting",
        "--output-format=json",
    ]


def parse_fio_json(text: str, rw: str, engine: str) -> dict:
    """fio's JSON (one group-reported job) in ``io_jobs.summarize``'s shape."""
    try:
        data = json.loads(text[text.index("{") :])  # fio may print warnings first
        job = data["jobs"][0]
        section = job["write" if rw == "write" else "read"]
        cpu_s = job.get("job_runtime", section["runtime"]) / 1e3 / 100
        cpu = cpu_fields(job.get("usr_cpu", 0.0) * cpu_s, job.get("sys_cpu", 0.0) * cpu_s, section.get("total_ios", 0))
    except (ValueError, KeyError, IndexError) as exc:
        raise BenchError(f"cannot read fio's JSON output ({exc.__class__.__name__}: {exc}): {text[:300]!r}") from None
    clat_ns = section["clat_ns"]
    percentile = clat_ns.get("percentile", {})
    clat_us = {name: percentile.get(f"{q:.6f}", 0.0) / 1e3 for name, q in (("p50", 50), ("p90", 90), ("p99", 99), ("p99.9", 99.9))}
    clat_us.update(mean=clat_ns["mean"] / 1e3, min=clat_ns["min"] / 1e3, max=clat_ns["max"] / 1e3)
    bw_bytes_per_s = float(section["bw_bytes"])
    return {
        "engine": engine,
        "io_bytes": section["io_bytes"],
        "num_ios": section.get("total_ios", 0),
        "runtime_ms": section["runtime"],
        "bw_bytes_per_s": bw_bytes_per_s,
        "bw_mib_per_s": bw_bytes_per_s / (1 << 20),
        "bw_mb_per_s": bw_bytes_per_s / 1e6,
        "iops": float(section["iops"]),
        "clat_us": clat_us,
        **cpu,
    }


def run_fio(fio: str, spec: JobSpec, ioengine: str) -> dict:
    """Run fio for ``spec``; its row, as ``parse_fio_json`` returns it."""
    cmd = fio_command(fio, spec, ioengine)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=spec.runtime_s + FIO_TIMEOUT_EXTRA_S)
    except subprocess.TimeoutExpired:
        raise BenchError(f"fio did not finish within {spec.runtime_s + FIO_TIMEOUT_EXTRA_S:.0f} s") from None
    if proc.returncode != 0:
        raise BenchError(f"fio failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-500:]}")
    return parse_fio_json(proc.stdout, spec.rw, f"fio({ioengine})")


def ratios(ours: dict, fio: dict) -> dict:
    """ours/fio for bandwidth, IOPS, clat p50 and p99 (None where fio shows 0)."""

    def ratio(a: float, b: float) -> float | None:
        return a / b if b else None

    out = {name: ratio(ours[key], fio[key]) for name, key in RATIO_KEYS}
    out.update({name: ratio(ours["clat_us"][key], fio["clat_us"][key]) for name, key in LATENCY_RATIO_KEYS})
    return out


def compare_with_fio(spec: JobSpec, ioengine: str = "libaio") -> dict:
    """Ours, then fio, back to back on the same file: ``{"ours", "fio", "ratio", "params", "machine"}``."""
    fio = find_fio()
    report = run_io(spec)
    fio_row = run_fio(fio, spec, ioengine)
    report["machine"]["loadavg_after"] = list(os.getloadavg())
    report["fio"] = fio_row
    report["ratio"] = ratios(report["ours"], fio_row)
    report["params"].update(fio_ioengine=ioengine, fio_command=" ".join(fio_command(fio, spec, ioengine)))
    report["machine"]["fio_version"] = fio_version(fio)
    return report


def format_comparison(report: dict) -> str:
    """Both runs in fio's style, then one table with the ratios."""
    params, ours, fio, ratio = report["params"], report["ours"], report["fio"], report["ratio"]
    lines = [
        format_file_line(params),
        format_result(ours, params),
        format_result(fio, params),
        format_load_line(report["machine"]),
        "",
        f"{'':16}{'BW MiB/s':>10}{'IOPS':>10}{'p50 us':>10}{'p99 us':>10}{'CPU us/IO':>10}",
    ]
    for row in (ours, fio):
        clat = row["clat_us"]
        lines.append(
            f"{row['engine']:16}{row['bw_mib_per_s']:>10.1f}{row['iops']:>10.0f}{clat['p50']:>10.0f}{clat['p99']:>10.0f}"
            f"{row['cpu_us_per_io']:>10.1f}"
        )
    cells = [ratio[name] for name in ("bw", "iops", "clat_p50", "clat_p99", "cpu_per_io")]
    lines.append(f"{'ours/fio':16}" + "".join(f"{c:>10.2f}" if c is not None else f"{'-':>10}" for c in cells))
    lines.append("(latency ratios above 1: ours slower; ours includes the submit call, fio's clat does not)")
    if params["page_cache"]:
        lines.append(PAGE_CACHE_NOTE)
    return "\n".join(lines)
