"""``kvstore-bench reprefill``'s records, table and ratios (single workload): one request's figures (``Sample``),
every system's row, the per-request choice's paths, and each system against full load and full recompute."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Sample:
    ttft_s: float
    io_wait_s: float = 0.0
    compute_s: float = 0.0
    select_s: float = 0.0
    tokens_loaded: int = 0
    bytes_read: int = 0
    bytes_useful: int = 0
    num_reads: int = 0  # the daemon's disk reads (after coalescing), speculation included
    top1: bool | None = None
    kl: float | None = None
    recall: float | None = None


def reprefill_ratios(systems: dict) -> dict:
    out = {}
    best = [systems[b]["ttft_mean_s"] for b in ("full-load", "full-recompute") if b in systems]
    for name, row in systems.items():
        if name.startswith("choice@") and best:  # above 1: the choice beats the better of the two
            out[f"min(full-load, full-recompute)/{name}"] = min(best) / row["ttft_mean_s"]
        if not name.startswith("reprefill@"):
            continue
        for base in ("full-load", "full-recompute"):
            if base in systems:
                out[f"{base}/{name}"] = systems[base]["ttft_mean_s"] / row["ttft_mean_s"]
        if "full-load" in systems:
            out[f"bytes {name}/full-load"] = row["bytes_read"] / systems["full-load"]["bytes_read"]
    return out


def format_reprefill_report(report: dict) -> str:
    p = report["params"]
    pre = report["prefix"]
    stored = "stored before" if pre["cache_hit"] else "prefilled and stored in {:.1f}s".format(pre["prefill_s"])
    selection = f"system {p['system']}" if p.get("system") else f"selector {p['selector']}, period {p['period_layers']} layers"
    lines = [
        f"model {p['model']} ({p['dtype']}, {p['threads']} threads), prefix {p['prefix_tokens']} tokens ({stored}), "
        f"suffix {p['suffix_tokens']} tokens, {selection} (stored groups of {p['group_layers']}), {p['repeats']} suffixes",
        f"{'system':<18}{'TTFT ms':>9}{'P95 ms':>9}{'I/O ms':>8}{'comp ms':>9}{'sel ms':>8}{'tokens':>8}{'MB read':>9}"
        f"{'reads':>7}{'ampl':>6}{'top1':>6}{'KL':>9}{'recall':>8}",
    ]
    order = ["full-recompute", "full-load"] + sorted(
        (k for k in report["systems"] if k.startswith(("reprefill@", "choice@"))), key=lambda k: (float(k.split("@")[1]), k)
    )
    for name in order:
        r = report["systems"].get(name)
        if r is None:
            continue

        def fmt(v, spec):
            return format(v, spec) if v is not None else "-"

        lines.append(
            f"{name:<18}{r['ttft_mean_s'] * 1e3:>9.1f}{r['ttft_p95_s'] * 1e3:>9.1f}{r['io_wait_mean_s'] * 1e3:>8.1f}"
            f"{r['compute_mean_s'] * 1e3:>9.1f}{r['select_mean_s'] * 1e3:>8.1f}{r['tokens_loaded']:>8}"
            f"{r['bytes_read'] / 1e6:>9.1f}{r.get('num_reads', 0):>7.0f}{fmt(r['read_amplification'], '.2f'):>6}{fmt(r['top1'], '.2f'):>6}"
            f"{fmt(r['kl'], '.4f'):>9}{fmt(r['recall'], '.2f'):>8}"
        )
    for name, paths in report.get("choices", {}).items():
        warm = f" (warm-up: {paths['warm_up']['path']})" if paths.get("warm_up") else ""
        lines.append(f"{name} took " + ", ".join(f"{path} {n}x" for path, n in sorted(paths["chosen"].items())) + warm)
    for key, value in report["ratios"].items():
        lines.append(f"{key} = {value:.2f}")
    return "\n".join(lines)
