"""What the device check reads from its steps' outputs and prints (``kvstore_tools.device_check``).

The test files with CUDA paths, pytest's junit counts, the environment
report (the ``env`` step's child), and the one-line results and tables of
the summary: pure functions of files and dicts, apart from the child that
probes the environment.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

OPTIONAL_MODULES = "grpc lmdb xxhash prometheus_client tqdm safetensors gguf tokenizers kvikio cupy pytest pytest_timeout".split()
CUDA_TEST_PATTERN = re.compile(r"cuda\.is_available|mark\.gpu")


class StepFailed(Exception):
    """A step ran but what it wrote is not what it should be (one line)."""


def cuda_test_files(tests: Path) -> list[str]:
    """Test files (relative to the checkout) that name ``cuda.is_available`` or ``mark.gpu``."""
    out = []
    for path in sorted(tests.rglob("test_*.py")) if tests.is_dir() else ():
        if CUDA_TEST_PATTERN.search(path.read_text(errors="replace")):
            out.append(path.relative_to(tests.parent).as_posix())
    return out


def junit_counts(path: Path) -> dict:
    """passed/failed/skipped and the failed tests' ids from pytest's ``--junitxml``."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        raise StepFailed(f"{path.name}: {exc}") from None
    counts = {"passed": 0, "failed": 0, "skipped": 0, "failed_ids": []}
    for case in root.iter("testcase"):
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            counts["failed"] += 1
            counts["failed_ids"].append(f"{case.get('classname', '')}::{case.get('name', '')}")
        elif "skipped" in kinds:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts


def print_environment() -> None:
    """The ``env`` step's child: one JSON object on stdout."""
    import importlib
    import importlib.metadata
    import platform

    out = {"python": platform.python_version(), "executable": sys.executable, "platform": platform.platform(), "cpus": os.cpu_count()}
    modules = {}
    dists = importlib.metadata.packages_distributions()
    for name in OPTIONAL_MODULES:
        try:
            module = importlib.import_module(name)
            version = getattr(module, "__version__", None)
            modules[name] = str(version or next((importlib.metadata.version(d) for d in dists.get(name, ())), "present"))
        except Exception as exc:  # not installed, or installed but broken (a missing CUDA library): say which
            modules[name] = None
            out.setdefault("import_errors", {})[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    out["modules"] = modules
    import torch

    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["cuda_available"] = torch.cuda.is_available()
    out["devices"] = []
    for i in range(torch.cuda.device_count() if out["cuda_available"] else 0):
        props = torch.cuda.get_device_properties(i)
        out["devices"].append({"name": props.name, "memory_bytes": props.total_memory, "capability": f"{props.major}.{props.minor}"})
    try:
        from engine_client.model import zoo

        out["zoo_models"] = {name: zoo.installed(name) for name in sorted(zoo.MODELS)}
    except Exception as exc:  # the engine's model package does not import here: the model steps will say why
        out["zoo_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    print(json.dumps(out, indent=2, sort_keys=True))


def environment_line(env: dict) -> str:
    devices = env.get("devices") or []
    where = ", ".join(f"{d['name']} ({d['memory_bytes'] / 2**30:.0f} GiB)" for d in devices) or "no CUDA device"
    missing = [name for name, version in env.get("modules", {}).items() if version is None]
    line = f"Python {env.get('python')}, torch {env.get('torch')}, {where}"
    return line + (f"; missing: {', '.join(missing)}" if missing else "")


def profile_line(p) -> str:
    parts = [f"matmul {p.peak_flops / 1e12:.2f} TFLOP/s", f"layer fixed cost {p.layer_overhead_s * 1e6:.0f} us"]
    parts.append(f"h2d {p.h2d_bytes_per_s / 1e9:.1f} GB/s pinned")
    if p.disk_bytes_per_s:
        parts.append(f"disk {p.disk_bytes_per_s / 1e9:.2f} GB/s")
    if p.period_overhead_s:
        parts.append(f"{p.period_overhead_s * 1e3:.2f} ms per Period")
    return ", ".join(parts)


def ttft_row(model: str, tokens: int, report: dict) -> dict:
    systems = report.get("systems") or {}
    if "full-load" not in systems:
        raise StepFailed("the report has no full-load row")
    return {
        "model": model,
        "prefix_tokens": tokens,
        "dtype": report.get("params", {}).get("dtype"),
        "ttft_ms": {name: round(row["ttft_mean_s"] * 1e3, 2) for name, row in systems.items()},
        "ttft_p95_ms": {name: round(row["ttft_p95_s"] * 1e3, 2) for name, row in systems.items()},
        "runs": {name: row["runs"] for name, row in systems.items()},
        "top1": {name: row.get("top1") for name, row in systems.items()},
        "choices": {name: c["chosen"] for name, c in (report.get("choices") or {}).items()},  # paths the choice took
    }


def _system_order(names) -> list[str]:
    sparse = sorted((n for n in names if n.startswith(("reprefill@", "choice@"))), key=lambda n: (float(n.split("@")[1]), n))
    return [n for n in ("full-recompute", "full-load") if n in names] + sparse


def ttft_line(row: dict) -> str:
    ms = row["ttft_ms"]
    return f"{row['model']} at {row['prefix_tokens']} tokens, TTFT ms: " + ", ".join(f"{n} {ms[n]:.1f}" for n in _system_order(ms))


def format_steps(summary: dict) -> str:
    lines = [
        f"device check ({summary['device']}{', quick' if summary['quick'] else ''}): {summary['elapsed_s']:.0f} s of "
        f"--budget-s {summary['budget_s']:g}",
        f"{'step':<14}{'status':<9}{'time s':>7}{'limit s':>8}  result",
    ]
    for s in summary["steps"]:
        limit = "-" if s["limit_s"] is None else f"{s['limit_s']:g}"
        text = s["result"] if s["status"] == "passed" else s["reason"]
        lines.append(f"{s['name']:<14}{s['status']:<9}{s['seconds']:>7.1f}{limit:>8}  {text or ''}")
    return "\n".join(lines)


def format_ttft(rows: list[dict]) -> str:
    if not rows:
        return ""
    names = _system_order({n for r in rows for n in r["ttft_ms"]})
    head = f"{'TTFT ms (mean)':<34}" + "".join(f"{n:>16}" for n in names)
    lines = [head]
    for r in rows:
        label = f"{r['model']} {r['prefix_tokens']} ({r['dtype']})"
        lines.append(f"{label:<34}" + "".join(f"{r['ttft_ms'].get(n, float('nan')):>16.1f}" for n in names))
    return "\n".join(lines)


def zipf_row(report: dict, systems, budget: float) -> dict:
    """The Zipf step's figures: each system's mean TTFT, disk bytes and hit rate at ``budget`` (and recompute's), and
    each baseline's TTFT over ContiguousKV's (above 1: ContiguousKV is the faster)."""
    rows = report.get("systems") or {}
    names = [f"{s}@{budget:g}" for s in systems]
    missing = [n for n in names if n not in rows]
    if missing:
        raise StepFailed(f"the report has no {', '.join(missing)} row")
    names += ["recompute"] if "recompute" in rows else []  # the row without a store
    ref = rows[names[0]]["ttft_mean_s"]
    return {
        "prefix_tokens": report.get("workload", {}).get("prefix_tokens"),
        "ttft_ms": {n: round(rows[n]["ttft_mean_s"] * 1e3, 2) for n in names},
        "bytes_disk": {n: rows[n]["bytes_disk_mean"] for n in names},
        "hit_rate": {n: rows[n]["hit_rate"] for n in names},
        "over_reference": {n: rows[n]["ttft_mean_s"] / ref for n in names[1:]},
    }


def zipf_line(row: dict) -> str:
    ms = row["ttft_ms"]
    ratios = ", ".join(f"{n.split('@')[0]}/{next(iter(ms)).split('@')[0]} {v:.2f}" for n, v in row["over_reference"].items())
    return f"Zipf at {row['prefix_tokens']} tokens, TTFT ms: " + ", ".join(f"{n} {v:.1f}" for n, v in ms.items()) + f" ({ratios})"
