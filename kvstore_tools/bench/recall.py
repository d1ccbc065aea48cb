"""``kvstore-bench recall``: is the needle's chunk among the chunks a selection keeps, layer by layer?

    kvstore-bench recall --model smollm2-135m --task passkey --tokens 2000 --examples N
                         [--budget 0.05 ...] [--seeds tune|eval] [--json] [--plot out.png]

For each example the prefix is prefilled once (full KV) and the question is
run over the full KV, keeping every layer's post-RoPE suffix queries.  Then,
per layer ``l`` and budget:

* ``attention``: the needle's chunks are in the top-k% of chunks by the exact
  attention mass of the question's queries at layer ``l`` (summed over heads)
  -- the reference;
* ``<scorer>-<agg>``: the same test with each selector's scores at layer ``l``
  (``exact``: probe-key softmax mass; ``summary``: the min/max bound; ``sum``
  or ``max`` over query heads, see ``engine_client.selection.heads``),
  selected as the runner does (sink and local chunks within the budget).

Per-Period recall: a variant ``<scorer>-<agg>/P<period_layers>`` selects once
per Period from the Period's first layer; the recall of each Period is that of
its first layer's selection, and each layer's "loaded" flag is the recall of
its Period's set.  The hidden states are those of the full KV (the runner's
are computed over its sparse selection), so these figures isolate the
selection rule from the drift a sparse Re-Prefill adds.

Recall of an example at a layer is the fraction of the needle's chunks (the
chunks holding the answer's tokens) in the set; figures are means over
examples.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from engine_client.rounding import fraction_count
from engine_client.selection import select_chunks
from engine_client.selection.heads import aggregate_heads, exact_head_chunk_scores, summary_head_chunk_scores

SCORERS = ("exact-sum", "exact-max", "summary-sum", "summary-max")
DEFAULT_PERIODS = (8, 4, 2, 1)
CHUNK_TOKENS = 16


def chunk_summaries(keys: torch.Tensor, chunk_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Channel-wise min/max of each chunk's keys: ``keys [Hkv, n, d]`` -> two ``[m, Hkv, d]`` (as the store keeps)."""
    hkv, n, d = keys.shape
    m = -(-n // chunk_tokens)
    pad = m * chunk_tokens - n
    if pad:  # repeat the last key: neither min nor max changes
        keys = torch.cat([keys, keys[:, -1:].expand(hkv, pad, d)], dim=1)
    blocks = keys.float().reshape(hkv, m, chunk_tokens, d)
    return blocks.amin(dim=2).transpose(0, 1), blocks.amax(dim=2).transpose(0, 1)


@torch.inference_mode()
def layer_queries_over_full_kv(model, kv: torch.Tensor, suffix: np.ndarray) -> list[torch.Tensor]:
    """The question's post-RoPE queries ``[Hq, s, d]`` at every layer, run over the full prefix KV."""
    toks = torch.as_tensor(suffix, dtype=torch.long)
    n = kv.shape[3]
    positions = torch.arange(n, n + toks.numel())
    hidden = model.embed(toks)
    queries = []
    for layer in range(model.num_layers):
        queries.append(model.layer_queries(layer, hidden, positions))
        hidden, _ = model.layer_forward(layer, hidden, positions, kv[layer])
    return queries


def needle_recall(chunks: torch.Tensor, needle: np.ndarray) -> float:
    return float(np.isin(needle, chunks.numpy()).mean())


@torch.inference_mode()
def example_recall(model, prefix: np.ndarray, suffix: np.ndarray, needle: np.ndarray, budgets) -> dict:
    """Per scorer and budget: ``[layers]`` recall of the layer's own selection, plus the attention reference."""
    from engine_client.prefill import chunked_prefill

    _, kv = chunked_prefill(model, torch.from_numpy(prefix))  # [L, 2, Hkv, n, d]
    queries = layer_queries_over_full_kv(model, kv, suffix)
    out: dict[str, dict[float, list[float]]] = {name: {b: [] for b in budgets} for name in ("attention", *SCORERS)}
    for layer, q in enumerate(queries):
        keys = kv[layer, 0]  # [Hkv, n, d]
        exact = exact_head_chunk_scores(q, keys, CHUNK_TOKENS)  # [Hq, m]
        kmin, kmax = chunk_summaries(keys, CHUNK_TOKENS)
        summary = summary_head_chunk_scores(q, kmin, kmax)  # [Hq, m]
        scores = {
            "exact-sum": aggregate_heads(exact, "sum"),
            "exact-max": aggregate_heads(exact, "max"),
            "summary-sum": aggregate_heads(summary, "sum"),
            "summary-max": aggregate_heads(summary, "max"),
        }
        for b in budgets:
            k = fraction_count(exact.shape[1], b)
            top = torch.topk(scores["exact-sum"], k).indices
            out["attention"][b].append(needle_recall(top, needle))
            for name, s in scores.items():
                out[name][b].append(needle_recall(select_chunks(s, b), needle))
    return out


def period_recall(per_layer: np.ndarray, period_layers: int) -> tuple[np.ndarray, np.ndarray]:
    """From ``[examples, layers]`` per-layer recall: (``[examples, periods]`` recall of each Period's set,
    ``[examples, layers]`` recall of the set each layer computes over)."""
    num_layers = per_layer.shape[1]
    firsts = list(range(0, num_layers, period_layers))
    periods = per_layer[:, firsts]
    loaded = per_layer[:, [l - l % period_layers for l in range(num_layers)]]
    return periods, loaded


# ---------------------------------------------------------------------------- examples


def task_examples(task: str, tokenizer, num_examples: int, num_tokens: int, stream: str = "tune", start: int = 0):
    """``(prefix, suffix, needle_chunks, depth)`` of the real-text task's examples from ``stream``."""
    from kvstore_tools.tasks import text

    out = []
    for ex in text.examples(task, tokenizer, num_examples, num_tokens, stream=stream, start=start):
        out.append((ex.prefix_tokens, ex.suffix_tokens, ex.needle_chunks(CHUNK_TOKENS), ex.depth))
    return out


# ---------------------------------------------------------------------------- report


def run_recall(model, examples, budgets, periods=DEFAULT_PERIODS) -> dict:
    per: dict[str, dict[float, list]] = {}
    t0 = time.perf_counter()
    for prefix, suffix, needle, _ in examples:
        rec = example_recall(model, prefix, suffix, needle, budgets)
        for name, by_budget in rec.items():
            for b, values in by_budget.items():
                per.setdefault(name, {}).setdefault(b, []).append(values)
    report = {
        "examples": len(examples),
        "budgets": list(budgets),
        "seconds": time.perf_counter() - t0,
        "depths": [float(d) for *_, d in examples],
        "per_layer": {},
        "per_period": {},
    }
    for name, by_budget in per.items():
        for b, rows in by_budget.items():
            arr = np.asarray(rows)  # [examples, layers]
            report["per_layer"][f"{name}@{b:g}"] = arr.mean(axis=0).round(3).tolist()
            if name == "attention":
                continue
            for p in periods:
                periods_recall, loaded = period_recall(arr, p)
                report["per_period"][f"{name}/P{p}@{b:g}"] = {
                    "period_recall": periods_recall.mean(axis=0).round(3).tolist(),
                    "loaded_per_layer": loaded.mean(axis=0).round(3).tolist(),
                    "mean_loaded": round(float(loaded.mean()), 3),
                }
    return report


def plot_recall(report: dict, path: str, budget: float) -> None:
    from .plots import pyplot, save

    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    for name in ("attention", *SCORERS):
        key = f"{name}@{budget:g}"
        if key in report["per_layer"]:
            vals = report["per_layer"][key]
            ax1.plot(
                range(len(vals)),
                vals,
                marker="o",
                ms=3,
                lw=2.5 if name == "attention" else 1.3,
                label="exact attention top-k (reference)" if name == "attention" else name,
            )
    ax1.set(title=f"Per-layer needle recall at {budget:.0%} (own layer's queries)", xlabel="layer", ylabel="needle chunks in set")
    ax1.legend(fontsize=8)
    for key, val in report["per_period"].items():
        name, b = key.rsplit("@", 1)
        if float(b) != budget or not any(name.endswith(f"/P{p}") for p in (8, 2)):
            continue
        ax2.plot(
            range(len(val["loaded_per_layer"])),
            val["loaded_per_layer"],
            marker=".",
            lw=1.2,
            label=f"{name} (mean {val['mean_loaded']:.2f})",
        )
    ax2.set(title="Needle loaded at each layer: one selection per Period", xlabel="layer")
    ax2.legend(fontsize=7)
    fig.suptitle(f"{report.get('task', '')} {report.get('tokens', '')} tokens, {report['examples']} examples")
    save(fig, path)


def add_recall_parser(sub) -> None:
    p = sub.add_parser("recall", help="per-layer and per-Period needle recall of the chunk selectors on a real model")
    from .eval_common import add_device_flag

    add_device_flag(p)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--task", default="passkey", help="a real-text task (kvstore_tools.tasks.text)")
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--examples", type=int, default=10)
    p.add_argument("--budget", type=float, action="append", help="fraction of chunks (repeatable; default 0.05 and 0.10)")
    p.add_argument("--seeds", choices=("tune", "eval"), default="tune", help="seed stream (tune the design on 'tune')")
    p.add_argument("--seed", type=int, default=0, help="first seed within the stream")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", action="store_true")
    from .plots import add_plot_flag

    add_plot_flag(p, "the per-layer and per-Period recall at the first budget")
    p.set_defaults(run=command_recall)


def command_recall(args: argparse.Namespace) -> int:
    from engine_client.model import zoo

    from .plots import check_plot_path

    check_plot_path(args.plot)
    torch.set_num_threads(args.threads)
    budgets = tuple(args.budget or (0.05, 0.10))
    from .eval_common import bench_device

    pm = zoo.load(args.model, dtype=torch.float32, device=bench_device(args))
    examples = task_examples(args.task, pm.tokenizer, args.examples, args.tokens, args.seeds, args.seed)
    report = run_recall(pm.decoder, examples, budgets)
    report.update(model=args.model, task=args.task, tokens=args.tokens, seeds=args.seeds)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for key, vals in report["per_layer"].items():
            print(f"{key:22s} " + " ".join(f"{v:.2f}" for v in vals))
        for key, val in report["per_period"].items():
            print(f"{key:26s} periods " + " ".join(f"{v:.2f}" for v in val["period_recall"]) + f"  mean loaded {val['mean_loaded']:.2f}")
    if args.plot:  # after the report: a figure that fails to draw loses no figures
        plot_recall(report, args.plot, budgets[0])
    return 0
