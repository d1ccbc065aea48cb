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
    # the storage path's own cost: what is neither disk wait, selection nor compute (resident-state
    # fetches, round trips, client and daemon work)
    out["storage_fixed_mean_s"] = out["fetch_mean_s"] + out["other_mean_s"]
    # the same on requests served wholly from memory (no disk byte, no state fetched): the path's floor
    resident = [r["fetch_s"] + r["other_s"] for r in timed if r["bytes_disk"] == 0 and r["state_bytes"] == 0]
    out["resident_requests"] = len(resident)
    out["storage_fixed_resident_mean_s"] = float(np.mean(resident)) if resident else None
    cpu = [r["cpu_ttft_s"] for r in timed if r.get("cpu_ttft_s") is not None]
    out["recorded_cpu_ttft_mean_s"] = float(np.mean(cpu)) if cpu else None
    return out


def summarize_replay(header: dict, systems: list[dict], records: dict, daemon_bytes: dict, profile, trace: str) -> dict:
    rows = {}
    for s in systems:
        if not any(not r["warmup"] for r in records[s["key"]]):
            continue
        rows[s["key"]] = _row(records[s["key"]]) | {
            "daemon_bytes_read": daemon_bytes[s["key"]],
            "budgeted": s["system"]["budgeted"],
            "kind": s.get("kind", "replayed"),
        }
        if s.get("kind") == "choice":
            timed = [r for r in records[s["key"]] if not r["warmup"]]
            rows[s["key"]]["chosen"] = {p: sum(r["chosen"] == p for r in timed) for p in ("recompute", "full-load", "sparse")}
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
    full = next((k for k, r in rows.items() if not r["budgeted"] and r.get("kind", "replayed") == "replayed"), None)
    by_budget: dict[str, list[str]] = {}
    for key, r in rows.items():
        if r["budgeted"]:
            by_budget.setdefault(key.split("@")[1], []).append(key)
    out = {}
    for budget, keys in by_budget.items():
        ref = f"{REFERENCE}@{budget}" if f"{REFERENCE}@{budget}" in keys else keys[0]
        extra = [k for k in (full, "recompute") if k in rows]
        for key in [k for k in keys if k != ref] + extra:
            out[f"ttft {key} / {ref}"] = rows[key]["ttft_mean_s"] / rows[ref]["ttft_mean_s"]
            if rows[ref]["bytes_disk_mean"] and rows[key]["bytes_disk_mean"]:
                out[f"disk bytes {key} / {ref}"] = rows[key]["bytes_disk_mean"] / rows[ref]["bytes_disk_mean"]
    plain = [k for k in (full, "recompute") if k in rows]
    for key in (k for k, r in rows.items() if r.get("kind") == "choice" and plain):
        best = min(plain, key=lambda k: rows[k]["ttft_mean_s"])
        out[f"ttft {key} / best of recompute and full load ({best})"] = rows[key]["ttft_mean_s"] / rows[best]["ttft_mean_s"]
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
        f"{'fetch':>7}{'other':>7}{'fixed':>7}{'(res)':>7}{'MB disk':>9}{'MB mem':>8}{'MB recv':>8}{'CPU TTFT':>10}",
    ]
    ms = 1e3
    for key, r in sorted(report["systems"].items()):
        cpu, res = r["recorded_cpu_ttft_mean_s"], r.get("storage_fixed_resident_mean_s")
        label = key if r["budgeted"] else key + {"recompute": " (modelled)", "choice": " (chosen)"}.get(r.get("kind"), " (full load)")
        lines.append(
            f"{label:<30}{r['ttft_mean_s'] * ms:>9.2f}{r['ttft_p50_s'] * ms:>8.2f}"
            f"{r['ttft_p95_s'] * ms:>8.2f}{r['select_mean_s'] * ms:>8.2f}{r['io_wait_mean_s'] * ms:>9.2f}{r['compute_mean_s'] * ms:>9.2f}"
            f"{r['h2d_mean_s'] * ms:>7.2f}{r['fetch_mean_s'] * ms:>7.2f}{r['other_mean_s'] * ms:>7.2f}{r['storage_fixed_mean_s'] * ms:>7.2f}"
            f"{(f'{res * ms:.2f}' if res is not None and r.get('kind', 'replayed') == 'replayed' else '-'):>7}"
            f"{r['bytes_disk_mean'] / 1e6:>9.3f}{r['bytes_memory_mean'] / 1e6:>8.3f}{r['bytes_received_mean'] / 1e6:>8.3f}"
            f"{(f'{cpu * ms:.0f}' if cpu is not None else '-'):>10}"
        )
    lines.append(
        "(ms per request, means over timed requests; fixed: the storage path's own cost, fetch + other; (res): the same "
        "over the requests that read no disk byte and fetched no state; MB per request; CPU TTFT: the recorded run's, on this CPU)"
    )
    for key, r in sorted(report["systems"].items()):
        if r.get("chosen"):
            lines.append(f"{key} chose: " + ", ".join(f"{path} {n}" for path, n in r["chosen"].items()))
    if report.get("choice_note"):
        lines.append(report["choice_note"])
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


def scaling_rows(reports: list[dict]) -> dict:
    """Per system in every report: its figures at each prefix length, replayed and as recorded on the CPU.

    ``bound`` says which wait is larger per request under the profile (the
    I/O wait or the modelled compute), and ``cpu_bound`` the same of the
    recorded run on this CPU.
    """
    keys = set.intersection(*(set(r["systems"]) for r in reports))
    out: dict[str, dict[str, dict]] = {}
    for key in sorted(keys):
        for r in reports:
            row, tokens = r["systems"][key], r["run"]["prefix_tokens"]
            timed = [x for x in r["requests"][key] if not x["warmup"]]
            cpu = {f: _mean([x.get(f"cpu_{f}") for x in timed]) for f in ("ttft_s", "io_wait_s", "compute_s", "select_s")}
            out.setdefault(key, {})[str(tokens)] = {
                "ttft_mean_s": row["ttft_mean_s"],
                "ttft_p95_s": row["ttft_p95_s"],
                "select_mean_s": row["select_mean_s"],
                "io_wait_mean_s": row["io_wait_mean_s"],
                "compute_mean_s": row["compute_mean_s"],
                "bytes_disk_mean": row["bytes_disk_mean"],
                "bytes_received_mean": row["bytes_received_mean"],
                "bound": "I/O" if row["io_wait_mean_s"] > row["compute_mean_s"] else "compute",
                "cpu": cpu,
                "cpu_bound": None if cpu["io_wait_s"] is None else ("I/O" if cpu["io_wait_s"] > cpu["compute_s"] else "compute"),
            }
    return out


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def format_scaling(report: dict) -> str:
    name = report["traces"][0]["profile"]["name"]
    lines = [
        f"against prefix length ({name} profile; CPU: the recorded run): TTFT ms, select ms, I/O wait ms, compute ms, "
        "MB from disk, bound | CPU TTFT ms, CPU I/O wait ms, bound"
    ]
    for key, by in report["scaling"].items():
        lines.append(f"  {key}")
        for tokens, v in sorted(by.items(), key=lambda kv: int(kv[0])):
            cpu = v["cpu"]
            cpu_text = "-" if cpu["ttft_s"] is None else f"{cpu['ttft_s'] * 1e3:.0f}, {cpu['io_wait_s'] * 1e3:.1f}, {v['cpu_bound']}"
            lines.append(
                f"    {tokens:>6} tokens: {v['ttft_mean_s'] * 1e3:.1f}, {v['select_mean_s'] * 1e3:.2f}, {v['io_wait_mean_s'] * 1e3:.1f}, "
                f"{v['compute_mean_s'] * 1e3:.2f}, {v['bytes_disk_mean'] / 1e6:.2f}, {v['bound']} | {cpu_text}"
            )
    return "\n".join(lines)
