"""The ``kvstore-bench replay`` report: per system x budget rows, ratios, the table.

Every figure is computed from the timed requests' records (warm-up
excluded), which the ``--json`` report keeps (``requests``).  Ratios are
of means, each system against the reference at its budget (``contiguouskv``
when the trace has it, else the first budgeted system), and the full-load
row (``as-lru`` or the replay's ``full-load``) against each reference.
"""

from __future__ import annotations

import dataclasses

import numpy as np

REFERENCE = "contiguouskv"
_MEANS = ("ttft_s", "select_s", "io_wait_s", "compute_s", "h2d_s", "fetch_s", "other_s")
_BYTES = ("bytes_disk", "state_bytes", "bytes_memory", "bytes_received", "spec_used", "spec_wasted")


def _row(records: list[dict]) -> dict:
    timed = [r for r in records if not r["warmup"]]
    ttft = np.array([r["ttft_s"] for r in timed])
    out = {"runs": len(timed), "ttft_p50_s": float(np.median(ttft)), "ttft_p95_s": float(np.percentile(ttft, 95))}
    for key in _MEANS + _BYTES:
        out[key if key.endswith("_s") else f"{key}_mean"] = float(np.mean([r[key] for r in timed]))
    out["ttft_mean_s"] = out.pop("ttft_s")
    for key in _MEANS[1:]:
        out[key.replace("_s", "_mean_s")] = out.pop(key)
    cpu = [r["cpu_ttft_s"] for r in timed if r.get("cpu_ttft_s") is not None]
    out["recorded_cpu_ttft_mean_s"] = float(np.mean(cpu)) if cpu else None
    return out


def summarize_replay(header: dict, systems: list[dict], records: dict, daemon_bytes: dict, profile, trace: str) -> dict:
    rows = {}
    for s in systems:
        if not any(not r["warmup"] for r in records[s["key"]]):
            continue
        rows[s["key"]] = _row(records[s["key"]]) | {"daemon_bytes_read": daemon_bytes[s["key"]], "budgeted": s["system"]["budgeted"]}
    return {
        "trace": trace,
        "profile": dataclasses.asdict(profile),
        "model": {k: header["model"][k] for k in ("name", "dtype")},
        "run": header["run"],
        "systems": rows,
        "ratios": replay_ratios(rows),
        "requests": records,
    }


def concurrency_level(rows: list[dict], streams: int, wall_s: float, failures: list[str]) -> dict:
    """One concurrency level's figures: TTFT and its I/O wait per request, requests per second over the wall time."""
    ttft = np.array([r["ttft_s"] for r in rows]) if rows else np.zeros(1)
    return {
        "streams": streams,
        "requests": len(rows),
        "failed": len(failures),
        "failures": sorted(set(failures)),
        "wall_s": wall_s,
        "requests_per_s": len(rows) / wall_s if wall_s > 0 else 0.0,
        "ttft_mean_s": float(ttft.mean()),
        "ttft_p95_s": float(np.percentile(ttft, 95)),
        "io_wait_mean_s": float(np.mean([r["io_wait_s"] for r in rows])) if rows else 0.0,
        "bytes_disk_mean": float(np.mean([r["bytes_disk"] for r in rows])) if rows else 0.0,
    }


def replay_ratios(rows: dict) -> dict:
    """TTFT and disk-byte ratios of means: each system and the full load against the reference at each budget."""
    full = next((k for k, r in rows.items() if not r["budgeted"]), None)
    by_budget: dict[str, list[str]] = {}
    for key, r in rows.items():
        if r["budgeted"]:
            by_budget.setdefault(key.split("@")[1], []).append(key)
    out = {}
    for budget, keys in by_budget.items():
        ref = f"{REFERENCE}@{budget}" if f"{REFERENCE}@{budget}" in keys else keys[0]
        for key in [k for k in keys if k != ref] + ([full] if full else []):
            out[f"ttft {key} / {ref}"] = rows[key]["ttft_mean_s"] / rows[ref]["ttft_mean_s"]
            if rows[ref]["bytes_disk_mean"]:
                out[f"disk bytes {key} / {ref}"] = rows[key]["bytes_disk_mean"] / rows[ref]["bytes_disk_mean"]
    return out


def format_replay_report(report: dict) -> str:
    p, run = report["profile"], report["run"]
    lines = [
        f"replay of {report['trace']}: model {report['model']['name']} ({report['model']['dtype']}), {run['prefixes']} prefixes of "
        f"{run['prefix_tokens']} tokens, suffix {run['suffix_tokens']}, {run['requests']} timed requests after {run['warmup']} of warm-up, "
        f"Period {run['period_layers']} layers (groups of {run['group_layers']})",
        f"compute modelled as {p['name']}: {p['peak_flops'] / 1e12:.0f} TFLOP/s x {p['matmul_efficiency']:g}, "
        f"HBM {p['mem_bytes_per_s'] / 1e12:.2f} TB/s x {p['mem_efficiency']:g}, H2D {p['h2d_bytes_per_s'] / 1e9:.1f} GB/s, "
        f"{p['layer_overhead_s'] * 1e6:.0f} us per layer; I/O real (this machine's daemon and disk)",
        f"{'system @ budget':<30}{'TTFT ms':>9}{'p50':>8}{'p95':>8}{'select':>8}{'I/O wait':>9}{'compute':>9}{'(h2d)':>7}"
        f"{'fetch':>7}{'other':>7}{'MB disk':>9}{'MB mem':>8}{'MB recv':>8}{'CPU TTFT':>10}",
    ]
    ms = 1e3
    for key, r in sorted(report["systems"].items()):
        cpu = r["recorded_cpu_ttft_mean_s"]
        lines.append(
            f"{key + ('' if r['budgeted'] else ' (full load)'):<30}{r['ttft_mean_s'] * ms:>9.2f}{r['ttft_p50_s'] * ms:>8.2f}"
            f"{r['ttft_p95_s'] * ms:>8.2f}{r['select_mean_s'] * ms:>8.2f}{r['io_wait_mean_s'] * ms:>9.2f}{r['compute_mean_s'] * ms:>9.2f}"
            f"{r['h2d_mean_s'] * ms:>7.2f}{r['fetch_mean_s'] * ms:>7.2f}{r['other_mean_s'] * ms:>7.2f}"
            f"{r['bytes_disk_mean'] / 1e6:>9.3f}{r['bytes_memory_mean'] / 1e6:>8.3f}{r['bytes_received_mean'] / 1e6:>8.3f}"
            f"{(f'{cpu * ms:.0f}' if cpu is not None else '-'):>10}"
        )
    lines.append("(ms per request, means over timed requests; MB per request; CPU TTFT: the recorded run's, on this CPU)")
    for key, value in report["ratios"].items():
        lines.append(f"{key} = {value:.2f}")
    levels = report.get("concurrency") or {}
    if any(len(v) > 1 for v in levels.values()):
        lines.append("concurrent streams on one daemon (each replays every timed request): TTFT mean / p95 ms, I/O wait ms, requests/s")
        for key, by in sorted(levels.items()):
            cells = [
                f"{c}: {v['ttft_mean_s'] * ms:.1f} / {v['ttft_p95_s'] * ms:.1f}, {v['io_wait_mean_s'] * ms:.1f}, {v['requests_per_s']:.0f}/s"
                + (f" ({v['failed']} failed)" if v["failed"] else "")
                for c, v in levels[key].items()
            ]
            lines.append(f"  {key:<28}" + "; ".join(cells))
    return "\n".join(lines)
