"""``kvstore-bench decode-merge``: several ``kvstore-bench decode --json`` reports pooled into one.

    kvstore-bench decode-merge run-a.json run-b.json [...] [--json] [--plot PATH]

A 100-example cell at 8000 tokens takes hours on a CPU, so it is run as
several reports over disjoint seeds of one stream (``--start``), side by
side or one after another.  This pools them: per context and task, each
system's rows are joined and its figures computed again from them (means,
answers right, the Wilson interval, the paired difference from ``dense``)
exactly as one run computes them (``decode_report``), so a pooled table is
never added up by hand.

Refused, naming the file and the field: a file that is not a decode
report; reports whose settings differ (model, budget, new tokens, seed
stream, dtype, quantized scheme, streaming heads); a cell whose systems
differ between reports; a seed that two reports both ran.  The thread
count and the machine's load may differ (a greedy answer can change with
the thread count only through a close logit's summation order): the pooled
report lists each input's.  Given one report, it computes that report's
figures again from its rows, adding any a newer version reports.
"""

from __future__ import annotations

import json

from .decode_report import ROW_LABELS, add_vs_dense, format_decode, plot_decode, summarise_rows
from .io_jobs import UsageError
from .plots import add_plot_flag, check_plot_path

# a report's settings that every pooled report must share
SHARED = ("model", "new_tokens", "budget_tokens", "stream", "dtype", "kv_quant", "streaming_heads", "standin_layers")
# a system's fields that come from its stored copy, not from its rows
# (and a NAME@TOKENS system's own budget)
STORED = ("stored_bytes", "stored_tail_bytes", "stored_vs_bf16", "stored_layout", "kv_quant", "budget_tokens")


def add_decode_merge_parser(sub) -> None:
    p = sub.add_parser("decode-merge", help="pool kvstore-bench decode --json reports over disjoint seeds into one table")
    p.add_argument("reports", nargs="+", metavar="REPORT", help="kvstore-bench decode --json output files")
    p.add_argument("--json", action="store_true")
    add_plot_flag(p, "bytes read per output token against accuracy")
    p.set_defaults(run=command_decode_merge)


def command_decode_merge(args) -> int:
    check_plot_path(args.plot)
    reports = []
    for path in args.reports:
        try:
            with open(path) as f:
                reports.append((path, json.load(f)))
        except OSError as exc:
            raise UsageError(f"{path}: cannot read it ({exc.strerror or exc})") from None
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    merged = merge_reports(reports)
    print(json.dumps(merged, indent=2, sort_keys=True) if args.json else format_decode(merged))
    if args.plot:
        plot_decode(merged, args.plot)
    return 0


def _check_report(path: str, r) -> None:
    if not isinstance(r, dict) or not isinstance(r.get("cells"), list) or "budget_tokens" not in r:
        raise UsageError(f"{path}: not a kvstore-bench decode --json report")
    for i, cell in enumerate(r["cells"]):
        systems = cell.get("systems") if isinstance(cell, dict) else None
        if not isinstance(systems, dict) or not systems or "task" not in cell or "context" not in cell:
            raise UsageError(f"{path}: cells[{i}] is not a decode cell")
        for name, s in systems.items():
            rows = s.get("rows") if isinstance(s, dict) else None
            if not isinstance(rows, list) or not rows or not all(isinstance(row, dict) and "seed" in row for row in rows):
                raise UsageError(f"{path}: cells[{i}] system {name!r} has no rows")


def merge_reports(reports: list[tuple[str, dict]]) -> dict:
    """One decode report from ``(path, report)`` pairs over disjoint seeds; UsageError names what does not fit.

    One report alone is summarised again (a report written before a figure, such as ``vs_dense``, existed).
    """
    for path, r in reports:
        _check_report(path, r)
    first_path, first = reports[0]
    for path, r in reports[1:]:
        for key in SHARED:
            if r.get(key) != first.get(key):
                raise UsageError(f"{path}: {key} is {r.get(key)!r}, {first_path} has {first.get(key)!r}; only like runs pool")
    cells: dict[tuple[int, str], list[tuple[str, dict]]] = {}
    for path, r in reports:
        for cell in r["cells"]:
            parts = cells.setdefault((cell["context"], cell["task"]), [])
            if parts and set(cell["systems"]) != set(parts[0][1]["systems"]):
                raise UsageError(
                    f"{path}: {cell['task']} @ {cell['context']} runs systems {', '.join(sorted(cell['systems']))}, "
                    f"{parts[0][0]} runs {', '.join(sorted(parts[0][1]['systems']))}"
                )
            parts.append((path, cell))
    out_cells = [_merge_cell(ctx, task, parts) for (ctx, task), parts in cells.items()]
    counts = {c["examples"] for c in out_cells}
    threads = sorted({r.get("threads") for _, r in reports})
    return {
        **{key: first.get(key) for key in SHARED if key in first},
        "contexts": sorted({c["context"] for c in out_cells}),
        "tasks": list(dict.fromkeys(c["task"] for c in out_cells)),
        "examples": counts.pop() if len(counts) == 1 else "per cell",
        "threads": threads[0] if len(threads) == 1 else " and ".join(map(str, threads)),
        "machine": first.get("machine"),
        "merged_from": [entry for path, r in reports for entry in _sources(path, r)],
        "cells": out_cells,
    }


def _sources(path: str, r: dict) -> list[dict]:
    """The runs behind report ``r``: its own settings, or, for a pooled report, the runs it lists."""
    if "merged_from" in r:
        return list(r["merged_from"])
    keys = ("start", "examples", "threads", "load_average_1min_before")
    return [{"path": path, **{key: r.get(key) for key in keys}}]


def _merge_cell(context: int, task: str, parts: list[tuple[str, dict]]) -> dict:
    """One cell from the same (context, task) cell of several reports."""
    out = {"task": task, "context": context, "systems": {}}
    seeds = None
    for name in parts[0][1]["systems"]:
        rows, owner = [], {}
        for path, cell in parts:
            for row in cell["systems"][name]["rows"]:
                if row["seed"] in owner:
                    raise UsageError(f"{path}: seed {row['seed']} of {task} @ {context} is also in {owner[row['seed']]}")
                owner[row["seed"]] = path
                rows.append(row)
        rows.sort(key=lambda row: row["seed"])
        fields = {k for row in rows for k in row if k not in ROW_LABELS}
        missing = [k for k in sorted(fields) if any(k not in row for row in rows)]
        if missing:
            raise UsageError(f"{task} @ {context} system {name!r}: some rows lack {missing[0]!r}; the reports come from different versions")
        s = summarise_rows(rows)
        s.update(_pooled([(path, cell["systems"][name]) for path, cell in parts], STORED, f"{task} @ {context} system {name!r}"))
        s["rows"] = rows
        out["systems"][name] = s
        if seeds is None:
            seeds = [row["seed"] for row in rows]
        elif seeds != [row["seed"] for row in rows]:
            raise UsageError(f"{task} @ {context}: system {name!r} ran other seeds than the others")
    add_vs_dense(out["systems"])
    out.update(_pooled(parts, ("streaming_layout_fraction",), f"{task} @ {context}"))
    out["examples"] = len(seeds)
    out["seeds"] = [seeds[0], seeds[-1]]
    out["seed_ranges"] = _ranges(seeds)
    return out


def _pooled(parts: list[tuple[str, dict]], keys, what: str) -> dict:
    """``keys`` of several reports' same object: a number's mean weighted by each one's rows, anything else only when equal.

    These come from the stored copy's geometry at the prefixes' mean length, so they differ between reports only as
    the mean length does (or not at all); an absent key stays absent.
    """
    weights = [len(obj["rows"]) if "rows" in obj else obj.get("examples", 1) for _, obj in parts]
    out = {}
    for key in keys:
        values = [obj.get(key) for _, obj in parts]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) and v == values[0] for v in values):
            out[key] = values[0]
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[key] = sum(v * w for v, w in zip(values, weights)) / sum(weights)
        elif all(repr(v) == repr(values[0]) for v in values):
            if any(key in obj for _, obj in parts):
                out[key] = values[0]
        else:
            i = next(i for i, v in enumerate(values) if repr(v) != repr(values[0]))
            raise UsageError(f"{parts[i][0]}: {what} has {key} {values[i]!r}, {parts[0][0]} has {values[0]!r}")
    return out


def _ranges(seeds: list[int]) -> list[list[int]]:
    """Sorted seeds as [first, last] runs of consecutive seeds."""
    runs: list[list[int]] = []
    for seed in seeds:
        if runs and seed == runs[-1][1] + 1:
            runs[-1][1] = seed
        else:
            runs.append([seed, seed])
    return runs
