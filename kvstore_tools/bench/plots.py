"""``--plot PATH``: the benchmarks' figures, drawn from their reports.

Each ``plot_*`` takes the dict a command prints with ``--json`` and draws
from the records it keeps (per-request records for Re-Prefill TTFT, the
measured rows for I/O, per-path results for accuracy), so a figure can be
redrawn from a saved report.  matplotlib runs on its Agg backend (no
display) and is imported only when a figure is drawn.

``check_plot_path`` runs before a benchmark starts: a path that cannot be
written, or an install without matplotlib (the engine extra brings it), is
refused at once, not after a run of many minutes.
"""

from __future__ import annotations

import os

import numpy as np

from .io_jobs import BenchError, UsageError

ENGINE_EXTRA = "pip install 'kvstore[engine]'"

# The parts of a request's TTFT, bottom to top (fields of its record), and their colours.
TTFT_PARTS = (("io_wait_s", "I/O wait", "#d62728"), ("select_s", "select", "#ff7f0e"), ("compute_s", "compute", "#1f77b4"))
OTHER_COLOUR = "#c7c7c7"
OFF_SCALE = 10.0  # a bar this many times the median is cut at the top of the axis, its value written on it


def add_plot_flag(parser, what: str) -> None:
    parser.add_argument("--plot", metavar="PATH", help=f"write a figure of {what} here (PNG; .pdf and .svg work too)")


def check_plot_path(path: str | None) -> None:
    """UsageError unless a figure can be written at ``path`` (None: no figure asked for)."""
    if path is None:
        return
    directory = os.path.dirname(os.path.abspath(path))
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if os.path.isdir(path):
        raise UsageError(f"--plot {path}: is a directory; give a file name such as {os.path.join(path, 'figure.png')}")
    if not os.path.isdir(directory):
        raise UsageError(f"--plot {path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK):
        raise UsageError(f"--plot {path}: directory {directory} is not writable")
    if ext not in ("png", "pdf", "svg"):
        raise UsageError(f"--plot {path}: the name must end in .png, .pdf or .svg")
    try:
        import matplotlib  # noqa: F401  (drawing imports it again, after the run)
    except ImportError:
        raise BenchError(f"--plot needs matplotlib, which this install lacks: {ENGINE_EXTRA}") from None


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: str) -> None:
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    finally:
        pyplot().close(fig)


# ---------------------------------------------------------------------------- Re-Prefill TTFT


def _budget(key: str) -> float:
    """The budget of a ``system@budget`` key; systems without one (full load, full recompute) load everything."""
    _, sep, budget = key.rpartition("@")
    return float(budget) if sep else 1.0


SINGLE_ORDER = ("reprefill", "full-load", "full-recompute")  # systems of --workload single, left to right


def ttft_bars(requests: dict[str, list[dict]], order=SINGLE_ORDER) -> list[dict]:
    """One bar per ``system@budget``, grouped by budget: the mean of each TTFT part and the P95 of TTFT.

    ``requests``: the report's per-request records by system; within a
    budget, systems go in ``order`` (others after them, by name).
    ``other`` is the TTFT the parts do not account for (the daemon's round
    trips, the first-token logits' framing), never below 0.
    """

    def rank(key: str) -> tuple:
        name = key.rpartition("@")[0] or key
        return (_budget(key), order.index(name) if name in order else len(order), key)

    keys = sorted((k for k, rows in requests.items() if rows), key=rank)
    bars = []
    for key in keys:
        rows = requests[key]
        ttft = np.array([r["ttft_s"] for r in rows], dtype=float)
        parts = {f: float(np.mean([r.get(f) or 0.0 for r in rows])) for f, _, _ in TTFT_PARTS if any(f in r for r in rows)}
        mean = float(ttft.mean())
        bars.append(
            {
                "key": key,
                "budget": _budget(key),
                "requests": len(rows),
                "mean_s": mean,
                "p95_s": float(np.percentile(ttft, 95)),
                "parts": parts,
                "other_s": max(0.0, mean - sum(parts.values())),
            }
        )
    return bars


def plot_ttft(report: dict, path: str) -> None:
    """TTFT of every system at every budget: stacked mean parts, a P95 whisker (both workloads)."""
    bars = ttft_bars(report["requests"], tuple(report.get("params", {}).get("systems") or SINGLE_ORDER))
    if not bars:
        raise ValueError("the report has no timed requests to plot")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.75 * len(bars) + 2.5), 4.8))
    xs, x, last_budget = [], 0.0, None
    for bar in bars:  # a gap between budgets
        if last_budget is not None and bar["budget"] != last_budget:
            x += 0.6
        xs.append(x)
        x, last_budget = x + 1.0, bar["budget"]
    median = float(np.median([b["mean_s"] for b in bars]))
    top = max(b["p95_s"] for b in bars if b["mean_s"] <= OFF_SCALE * median) * 1.15
    drawn = set()
    for xpos, bar in zip(xs, bars):
        bottom = 0.0
        for field, label, colour in TTFT_PARTS:
            if field in bar["parts"]:
                ax.bar(xpos, bar["parts"][field], 0.7, bottom=bottom, color=colour, label=None if label in drawn else label)
                drawn.add(label)
                bottom += bar["parts"][field]
        ax.bar(xpos, bar["other_s"], 0.7, bottom=bottom, color=OTHER_COLOUR, label=None if "other" in drawn else "other")
        drawn.add("other")
        ax.errorbar(
            xpos,
            bar["mean_s"],
            yerr=[[0.0], [bar["p95_s"] - bar["mean_s"]]],
            fmt="none",
            ecolor="black",
            capsize=4,
            label=None if "P95" in drawn else "P95",
        )
        drawn.add("P95")
        if bar["mean_s"] > top:
            ax.text(xpos, top * 0.97, f"{bar['mean_s']:.3g} s\n(off scale)", ha="center", va="top", fontsize=7)
    ax.set_ylim(0, top)
    ax.set_xticks(xs, [b["key"] for b in bars], fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("TTFT (s): mean, whisker to P95")
    ax.legend(fontsize=8, loc="best")
    ax.set_title(_ttft_title(report), fontsize=9)
    save(fig, path)


def _ttft_title(report: dict) -> str:
    p = report.get("params", {})
    if "workload" in report:
        w = report["workload"]
        return (
            f"Zipf workload: {w['prefixes']} prefixes x {w['prefix_tokens']} tokens, {w['requests']} timed requests "
            f"per system (after {w['warmup']} warm-up), model {p.get('model', '?')} {p.get('dtype', '')}"
        )
    return (
        f"Re-Prefill: prefix {p.get('prefix_tokens', '?')} tokens, suffix {p.get('suffix_tokens', '?')}, "
        f"{p.get('repeats', '?')} suffixes per system, model {p.get('model', '?')} {p.get('dtype', '')}"
    )


# ---------------------------------------------------------------------------- I/O


def io_rows(report: dict) -> tuple[list[tuple[str, float, float | None, float | None]], str, str]:
    """``([(label, MiB/s, p50 ms, p99 ms)], latency meaning, title)`` of any ``kvstore-bench io`` report."""
    if "cases" in report:  # --chunked: no fio row, useful bandwidth per case
        rows = [
            (
                f"{c['selection']} {c['budget']:.0%}\ncoalesce {'on' if c['coalesce'] else 'off'}",
                c["useful_mib_per_s"],
                c["latency_ms_p50"],
                c["latency_ms_p99"],
            )
            for c in report["cases"]
        ]
        g = report["geometry"]
        return rows, "per read of every group", f"chunked reads: {g['num_chunks']} chunks x {g['num_groups']} groups, useful bytes"
    if "rows" in report:  # --via-daemon
        rows = []
        for name, r in report["rows"].items():
            lat, label = (r["clat_us"], f"{name}\n(per I/O)") if "clat_us" in r else (r["request_latency_us"], name)
            rows.append((label, r["bw_mib_per_s"], lat["p50"] / 1e3, lat["p99"] / 1e3))
        p = report["params"]
        return (
            rows,
            "per request",
            f"random chunk reads, bs {p['bs'] // 1024} KiB, {p['extents_per_request']} per request, numjobs {p['numjobs']}",
        )
    rows = []
    for name in ("ours", "fio"):
        if name in report:
            r = report[name]
            rows.append((r.get("engine", name), r["bw_mib_per_s"], r["clat_us"]["p50"] / 1e3, r["clat_us"]["p99"] / 1e3))
    p = report["params"]
    title = f"{p['rw']}, bs {p['block_bytes'] // 1024} KiB, iodepth {p['iodepth']}, numjobs {p['numjobs']}, direct {int(p['direct'])}"
    if (report.get("ratio") or {}).get("bw"):
        title += f"; bandwidth ours / fio {report['ratio']['bw']:.2f}"
    return rows, "per I/O (clat)", title


def plot_io(report: dict, path: str) -> None:
    """Bandwidth side by side (the store's reads, fio's when the report has them), and p50/p99 latency."""
    rows, latency_meaning, title = io_rows(report)
    plt = pyplot()
    fig, (bw_ax, lat_ax) = plt.subplots(1, 2, figsize=(max(8.0, 1.6 * len(rows) + 4), 4.2))
    xs = np.arange(len(rows))
    labels = [r[0] for r in rows]
    colours = ["#7f7f7f" if label.startswith("fio") else "#1f77b4" for label in labels]
    bw_ax.bar(xs, [r[1] for r in rows], 0.6, color=colours)
    for x, r in zip(xs, rows):
        bw_ax.text(x, r[1], f"{r[1]:.0f}", ha="center", va="bottom", fontsize=8)
    bw_ax.set_xticks(xs, labels, fontsize=7)
    bw_ax.set_ylabel("MiB/s")
    bw_ax.set_title("throughput", fontsize=9)
    lat_ax.bar(xs - 0.18, [r[2] or 0 for r in rows], 0.36, label="p50", color="#2ca02c")
    lat_ax.bar(xs + 0.18, [r[3] or 0 for r in rows], 0.36, label="p99", color="#98df8a")
    lat_ax.set_xticks(xs, labels, fontsize=7)
    lat_ax.set_ylabel(f"latency (ms), {latency_meaning}")
    lat_ax.legend(fontsize=8)
    lat_ax.set_title("latency", fontsize=9)
    fig.suptitle(title, fontsize=10)
    save(fig, path)


# ---------------------------------------------------------------------------- accuracy


def accuracy_paths(report: dict) -> dict[str, dict]:
    """Path name -> ``{accuracy, wilson95, examples}``: the ``--model`` report's ``paths``, or the one path of a toy report."""
    if "paths" in report:
        return report["paths"]
    return {report["path"]: {k: report[k] for k in ("accuracy", "wilson95", "examples", "correct")}}


def plot_accuracy(report: dict, path: str) -> None:
    """Accuracy against budget, a line per selector (Wilson 95% whiskers); full / drop paths and chance as levels."""
    paths = accuracy_paths(report)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    by_selector: dict[str, list[tuple[float, dict]]] = {}
    levels = []
    for name, p in paths.items():
        selector, sep, budget = name.partition("@")
        if sep:
            by_selector.setdefault(selector, []).append((float(budget), p))
        else:
            levels.append((name, p))
    for selector, points in by_selector.items():
        points.sort(key=lambda bp: bp[0])
        b = [bp[0] for bp in points]
        acc = np.array([bp[1]["accuracy"] for bp in points])
        lo = acc - np.array([bp[1]["wilson95"][0] for bp in points])
        hi = np.array([bp[1]["wilson95"][1] for bp in points]) - acc
        ax.errorbar(b, acc, yerr=[lo, hi], marker="o", capsize=4, label=selector)
    styles = {"full": ("black", "-"), "drop-needle": ("#d62728", ":"), "drop-answer": ("#d62728", ":")}
    for name, p in levels:
        colour, style = styles.get(name, ("grey", "--"))
        ax.axhline(p["accuracy"], color=colour, ls=style, lw=1.2, label=f"{name} ({p['correct']}/{p['examples']})")
    if "chance" in report:
        ax.axhline(report["chance"], color="grey", ls="--", lw=1, label="chance")
    budgets = sorted({b for points in by_selector.values() for b, _ in points})
    if budgets:
        ax.set_xscale("log")
        ax.set_xticks(budgets, [f"{b:.0%}" for b in budgets])
        ax.minorticks_off()
    ax.set(xlabel="budget (share of the prefix's chunks)", ylabel="accuracy (Wilson 95% whiskers)", ylim=(-0.03, 1.03))
    ax.legend(fontsize=8)
    model = report.get("model") or os.path.basename(report.get("checkpoint", ""))
    ax.set_title(f"{report['task']} @ {report['tokens']} tokens, {report['examples']} examples, {model}", fontsize=9)
    save(fig, path)


def plot_concurrency(report: dict, path: str) -> None:
    """Replay: mean TTFT (P95 dashed) against concurrent streams, one line per system x budget."""
    levels = report.get("concurrency") or {}
    if not any(len(v) > 1 for v in levels.values()):
        raise ValueError("the report has no concurrency levels to plot")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for key, by in sorted(levels.items()):
        xs = [int(c) for c in by]
        (line,) = ax.plot(xs, [v["ttft_mean_s"] * 1e3 for v in by.values()], marker="o", label=key)
        ax.plot(xs, [v["ttft_p95_s"] * 1e3 for v in by.values()], linestyle="--", color=line.get_color(), linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent Re-Prefill streams on one daemon")
    ax.set_ylabel("TTFT, ms (mean; P95 dashed)")
    ax.set_title(
        f"replay at {report['profile']['name']} compute: {report['model']['name']}, {report['run']['prefix_tokens']}-token prefixes"
    )
    ax.legend(fontsize=7)
    save(fig, path)


def plot_scaling(report: dict, path: str) -> None:
    """Replay of several traces: TTFT against prefix length per system, under the profile and as recorded on the CPU."""
    rows = report["scaling"]
    if not rows:
        raise ValueError("the traces have no system in common to plot")
    plt = pyplot()
    fig, (gpu, cpu) = plt.subplots(1, 2, figsize=(11, 4.6))
    for key, by in sorted(rows.items()):
        items = sorted(by.items(), key=lambda kv: int(kv[0]))
        xs = [int(t) for t, _ in items]
        (line,) = gpu.plot(xs, [v["ttft_mean_s"] * 1e3 for _, v in items], marker="o", label=key)
        gpu.plot(xs, [v["io_wait_mean_s"] * 1e3 for _, v in items], linestyle=":", color=line.get_color(), linewidth=0.9)
        cpu_ttft = [v["cpu"]["ttft_s"] for _, v in items]
        if all(t is not None for t in cpu_ttft):
            cpu.plot(xs, [t * 1e3 for t in cpu_ttft], marker="o", color=line.get_color(), label=key)
    name = report["traces"][0]["profile"]["name"]
    for ax, title in ((gpu, f"replayed at {name} compute (dotted: I/O wait)"), (cpu, "recorded on this CPU")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("prefix tokens")
        ax.set_ylabel("TTFT, ms (mean)")
        ax.set_title(title, fontsize=10)
    gpu.legend(fontsize=7)
    save(fig, path)
