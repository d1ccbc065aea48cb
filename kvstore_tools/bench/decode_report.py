"""``kvstore-bench decode``'s figures from its rows: per-system summaries, the paired difference from dense, the table and the figure.

Shared by ``decode`` (one run) and ``decode_merge`` (reports pooled over
disjoint seeds), so a pooled table is computed exactly as a single run's.
"""

from __future__ import annotations

import numpy as np

from .eval_common import paired_difference, wilson_interval

ROW_LABELS = ("seed", "depth", "correct", "text")  # a row's fields that are not averaged over a cell


def summarise_rows(rs: list[dict]) -> dict:
    """A system's figures over its rows: every measured field's mean, the answers right and their Wilson interval."""
    s = {k: float(np.mean([r[k] for r in rs])) for k in rs[0] if k not in ROW_LABELS}
    s["correct"] = sum(bool(r["correct"]) for r in rs)
    s["wilson95"] = list(wilson_interval(s["correct"], len(rs)))
    return s


def add_vs_dense(systems: dict[str, dict]) -> None:
    """Each system's ``vs_dense``: its answers against ``dense``'s on the same seeds (``paired_difference``)."""
    dense = systems.get("dense")
    if dense is None:
        return
    right = {row["seed"]: bool(row["correct"]) for row in dense["rows"]}
    for name, s in systems.items():
        if name != "dense" and all(row["seed"] in right for row in s["rows"]):
            seeds = [row["seed"] for row in s["rows"]]
            s["vs_dense"] = paired_difference([bool(row["correct"]) for row in s["rows"]], [right[x] for x in seeds])


def format_decode(r: dict) -> str:
    lines = [
        f"{r['model']}, {r['new_tokens']} tokens per answer, budget {r['budget_tokens']} tokens per layer and KV head, "
        f"{r['examples']} examples per cell ({r['stream']} seeds), {r['threads']} threads, {r['dtype']}"
        if isinstance(r["examples"], int)
        else f"{r['stream']} seeds, {r['threads']} threads, {r['dtype']}"
    ]
    if "merged_from" in r:  # kvstore-bench decode-merge
        lines.append(
            ("pooled from " if len(r["merged_from"]) > 1 else "from ")
            + ", ".join(f"{m['path']} ({m['examples']} from seed offset {m['start']})" for m in r["merged_from"])
        )
    for cell in r["cells"]:
        dense = cell["systems"].get("dense")
        lines += [
            "",
            f"{cell['task']} @ {cell['context']} tokens, {cell['examples']} examples (seeds "
            + ", ".join(f"{a}..{b}" for a, b in cell.get("seed_ranges", [cell["seeds"]]))
            + ")"
            + (
                f"; keeping only the sink + recent rows of every streaming head would make a prefix {cell['streaming_layout_fraction']:.1%}"
                " of the full KV (stored MB: what each system's copy keeps)"
                if "streaming_layout_fraction" in cell
                else ""
            ),
            f"{'system':>22}  {'correct':>7}  {'Wilson 95%':>13}  {'vs dense, points (95%)':>22}  {'TTFT s':>6}  {'prefill':>7}  {'ms/token':>8}  {'attn ms':>7}  {'memory KB/token':>15}  "
            f"{'vs dense':>8}  {'store KB/token':>14}  {'disk KB/token':>13}  {'select ms/token':>15}  {'fetch ms/token':>14}  {'stored MB':>9}",
        ]
        for name, s in cell["systems"].items():
            lo, hi = s["wilson95"]
            ratio = (
                f"{dense['memory_bytes_per_token'] / s['memory_bytes_per_token']:.1f}x" if dense and s["memory_bytes_per_token"] else "-"
            )
            lines.append(
                f"{name:>22}  {s['correct']:>3.0f}/{len(s['rows']):<3}  {lo:>5.0%}-{hi:<6.0%}  {_vs_dense(s):>22}  {s['ttft_s']:>6.2f}  "
                f"{s.get('prefill_density', 1.0):>7.1%}  {s['per_token_s'] * 1e3:>8.1f}  "
                f"{s['attention_per_token_s'] * 1e3:>7.2f}  {s['memory_bytes_per_token'] / 1e3:>15.0f}  {ratio:>8}  "
                f"{s['store_bytes_per_token'] / 1e3:>14.0f}  {s['disk_bytes_per_token'] / 1e3:>13.0f}  "
                f"{s['select_per_token_s'] * 1e3:>15.2f}  {s.get('fetch_per_token_s', 0.0) * 1e3:>14.2f}  {s['stored_bytes'] / 1e6:>9.1f}"
            )
    return "\n".join(lines)


def _vs_dense(s: dict) -> str:
    v = s.get("vs_dense")
    if v is None:
        return "-"
    lo, hi = v["interval"]
    return f"{v['difference'] * 100:+.1f} ({lo * 100:+.1f} to {hi * 100:+.1f})"


def plot_decode(r: dict, path: str) -> None:
    """Per cell: KV bytes each output token reads from memory (x, log) against accuracy (y), one point per system."""
    from .plots import pyplot, save

    plt = pyplot()
    cells = r["cells"]
    fig, axes = plt.subplots(1, len(cells), figsize=(4.2 * len(cells), 3.6), squeeze=False)
    for ax, cell in zip(axes[0], cells):
        points: dict[tuple[float, float], list[str]] = {}  # systems at the same spot share one label
        for name, sys_ in cell["systems"].items():
            x, acc = sys_["memory_bytes_per_token"] / 1e6, sys_["correct"] / len(sys_["rows"])
            lo, hi = sys_["wilson95"]
            ax.errorbar([x], [acc], yerr=[[acc - lo], [hi - acc]], fmt="o", ms=5, capsize=3)
            points.setdefault((round(x, 1), round(acc, 3)), []).append(name)
        for (x, acc), names in points.items():
            ax.annotate("\n".join(names), (x, acc), fontsize=7, xytext=(4, -3), textcoords="offset points", va="top")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
        # minor ticks: only 2x and 5x each decade, so 60-90 do not run into each other
        ax.xaxis.set_minor_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else ""))
        ax.set_ylim(-0.05, 1.08)
        ax.set_xlabel("KV read from memory per output token (MB)")
        ax.set_ylabel("accuracy (Wilson 95%)")
        ax.set_title(f"{cell['task']} @ {cell['context']} tokens, {cell['examples']} examples", fontsize=9)
    save(fig, path)
