"""``kvstore-bench restore``'s report: summaries from the rows, the plans on paper, the text tables."""

from __future__ import annotations

import os
import platform

import numpy as np

from .eval_common import wilson_interval


def make_report(args, pm, examples, rows, profile, seconds) -> dict:
    """The run's JSON report: per system its rows and their summary, ratios to ``krul-<q>`` recomputed from them."""
    q = args.kv_quant
    krul = f"krul-{q}"
    systems = {}
    for name, rs in rows.items():
        correct = sum(r["correct"] for r in rs)
        lo, hi = wilson_interval(correct, len(rs))
        s = {
            "examples": len(rs),
            "correct": correct,
            "accuracy": correct / len(rs),
            "wilson95": [lo, hi],
            "first_token_agreement": float(np.mean([r["first_token_agrees"] for r in rs])),
            "bytes_stored_mean": float(np.mean([r["bytes_stored"] for r in rs])),
            "rows": rs,
        }
        if "ttft_s" in rs[0]:
            ttft = np.array([r["ttft_s"] for r in rs])
            s.update(
                ttft_s_mean=float(ttft.mean()),
                ttft_s_p95=float(np.percentile(ttft, 95)),
                **{
                    f"{k}_mean": float(np.mean([r[k] for r in rs]))
                    for k in ("restore_s", "recompute_s", "load_s", "compute_wait_s", "load_idle_s", "bytes_loaded", "r_c")
                },
            )
        if "estimator_busy_s" in rs[0]:  # the sketch the record's statistics come from, fed by the history's prefill
            s.update(
                estimator_busy_s_mean=float(np.mean([r["estimator_busy_s"] for r in rs])),
                estimator_wait_s_mean=float(np.mean([r["estimator_wait_s"] for r in rs])),
                non_ir_mean=float(np.mean([r["non_ir"] for r in rs])),
            )
        systems[name] = s
    base = systems[krul]
    for s in systems.values():
        if "ttft_s_mean" in s:
            s["ttft_mean_vs_krul"] = s["ttft_s_mean"] / base["ttft_s_mean"]
            s["ttft_p95_vs_krul"] = s["ttft_s_p95"] / base["ttft_s_p95"]
        s["storage_vs_load"] = systems["load"]["bytes_stored_mean"] / s["bytes_stored_mean"]
    return {
        "model": args.model,
        "task": args.task,
        "tokens": args.tokens,
        "workload": args.workload,
        "history_tokens": [ex.num_prefix_tokens for ex in examples],
        "examples": len(examples),
        "stream": args.stream,
        "seeds": [examples[0].seed, examples[-1].seed] if examples else [],
        "kv_quant": q,
        "group_layers": args.group_layers,
        "gamma": args.gamma,
        "ratio": args.ratio,
        "num_layers": pm.decoder.num_layers,
        "threads": args.threads,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, CPU only",
        "load_average_1min_before": round(os.getloadavg()[0], 2),
        "profile": {"flops_per_s": profile.flops_per_s, "load_bytes_per_s": profile.load_bytes_per_s, "overlap": profile.overlap}
        if profile
        else None,
        "seconds": seconds,
        "systems": systems,
        "paper": _paper_plans(args, pm.decoder, examples),
    }


def _paper_plans(args, model, examples) -> dict:
    """The same restores planned for ``--paper-profile`` (compute) and ``--paper-load-gbps`` (storage): the
    cost model's times, nothing measured.  Stored bytes in 16 bits as a GPU keeps KV, quantized as stored."""
    from engine_client.krul import HardwareProfile, plan_restore, recompute_flops
    from engine_client.runner import model_geometry
    from kvstore.contract.geometry import ModelSpec, StoreGeometry

    n = int(np.mean([ex.num_prefix_tokens for ex in examples]))
    profile = HardwareProfile(args.paper.flops_per_s, args.paper_load_gbps * 1e9)
    f, f_att = recompute_flops(model.config)
    m = model_geometry(model).model
    half = StoreGeometry(ModelSpec(m.num_layers, m.num_kv_heads, m.head_dim, "bfloat16"), group_layers=args.group_layers)
    quant = StoreGeometry(half.model, group_layers=args.group_layers, kv_quant=args.kv_quant)
    out = {"profile": args.paper.name, "flops_per_s": profile.flops_per_s, "load_bytes_per_s": profile.load_bytes_per_s, "tokens": n}
    q = args.kv_quant
    for name, geo in (("load", half), (f"load-{q}", quant)):
        out[f"{name}_s"] = n * m.num_layers * (geo.kv_bytes(n) / (n * m.num_layers)) / profile.load_bytes_per_s
    plan = plan_restore(
        m.num_layers, n, recompute_flops_per_token_layer=f, attention_flops_per_token_pair=f_att,
        bytes_per_token_layer=quant.kv_bytes(n) / (n * m.num_layers), profile=profile, step_tokens=quant.chunk_tokens,
    )  # fmt: skip
    out["recompute_s"] = plan.costs.times([n] * m.num_layers)[0]
    out[f"krul-{q}"] = {"r_c": plan.r_c, "t_compute_s": plan.t_compute, "t_load_s": plan.t_load, "restore_s": plan.restore_s}
    return out


def format_restore(r: dict) -> str:
    p = r["profile"]
    lines = [
        f"{r['model']} {r['task']} @ {r['tokens']} tokens, {r['examples']} conversations (seeds {r['seeds']}), "
        f"compressed form {r['kv_quant']}, {r['threads']} threads, {r['seconds']:.0f}s",
        f"measured profile: recompute {p['flops_per_s'] / 1e9:.1f} GFLOP/s, load {p['load_bytes_per_s'] / 1e6:.0f} MB/s "
        f"(stored bytes, dequantization included), overlap {p.get('overlap', 1.0):.2f} (share of the shorter stream hidden)",
        "",
        f"{'system':>18}  {'correct':>8}  {'Wilson 95%':>13}  {'agree':>5}  {'TTFT s':>7}  {'P95 s':>6}  {'vs krul':>7}  "
        f"{'r_c':>5}  {'recomp s':>8}  {'load s':>6}  {'idle C/L s':>11}  {'loaded MB':>9}  {'stored MB':>9}  {'smaller':>7}",
    ]
    for name, s in r["systems"].items():
        lo, hi = s["wilson95"]
        acc = f"{s['correct']}/{s['examples']}"
        head = f"{name:>18}  {acc:>8}  {lo:>5.1%}-{hi:>6.1%}  {s['first_token_agreement']:>5.0%}"
        if "ttft_s_mean" in s:
            idle = f"{s['compute_wait_s_mean']:.2f}/{s['load_idle_s_mean']:.2f}"
            head += (
                f"  {s['ttft_s_mean']:>7.2f}  {s['ttft_s_p95']:>6.2f}  {s['ttft_mean_vs_krul']:>6.2f}x  {s['r_c_mean']:>5.2f}  "
                f"{s['recompute_s_mean']:>8.2f}  {s['load_s_mean']:>6.2f}  {idle:>11}  {s['bytes_loaded_mean'] / 1e6:>9.1f}"
            )
        else:
            head += f"  {'-':>7}  {'-':>6}  {'-':>7}  {'-':>5}  {'-':>8}  {'-':>6}  {'-':>11}  {'-':>9}"
        head += f"  {s['bytes_stored_mean'] / 1e6:>9.1f}  {s['storage_vs_load']:>6.2f}x"
        lines.append(head)
    if r.get("workload") == "sharegpt":
        lines += ["", _by_length(r)]
    est = r["systems"].get(f"krul-{r['kv_quant']}", {})
    if "estimator_busy_s_mean" in est:
        lines += [
            "",
            f"recorded statistics (gamma {r.get('gamma')}, ratio {r.get('ratio')}): the estimator's thread busy "
            f"{est['estimator_busy_s_mean']:.2f} s per history, {est['estimator_wait_s_mean']:.2f} s waited for after its prefill; "
            f"{est['non_ir_mean']:.1f} input-sensitive layers of {r.get('num_layers')} on average",
        ]
    pp = r.get("paper")
    if pp:
        krul = next(k for k in pp if k.startswith("krul-"))
        lines += [
            "",
            f"on paper, {pp['profile']} ({pp['flops_per_s'] / 1e12:.0f} TFLOP/s) with storage at {pp['load_bytes_per_s'] / 1e9:.1f} GB/s, "
            f"{pp['tokens']} tokens: recompute {pp['recompute_s'] * 1e3:.2f} ms, load (16-bit) {pp['load_s'] * 1e3:.2f} ms, "
            f"load-{krul[5:]} {pp['load-' + krul[5:] + '_s'] * 1e3:.2f} ms, {krul} r_c {pp[krul]['r_c']:.2f} -> "
            f"{pp[krul]['restore_s'] * 1e3:.2f} ms (the cost model's times, not measured)",
        ]
    return "\n".join(lines)


LENGTH_BINS = ((0, 1024), (1024, 2048), (2048, 4096), (4096, 1 << 30))


def _by_length(r: dict) -> str:
    """Mean TTFT per system in bins of history length (a ShareGPT run's histories vary), and each bin's ratio to krul."""
    krul = f"krul-{r['kv_quant']}"
    timed = {name: s["rows"] for name, s in r["systems"].items() if "ttft_s_mean" in s}
    bins = [(lo, hi) for lo, hi in LENGTH_BINS if any(lo <= n < hi for n in r["history_tokens"])]
    lines = [f"TTFT s by history length (history tokens: {min(r['history_tokens'])}-{max(r['history_tokens'])})"]
    lines.append(f"{'system':>18}" + "".join(f"  {f'{lo}-{hi - 1}' if hi < 1 << 30 else f'{lo}+':>16}" for lo, hi in bins))
    for name, rows in timed.items():
        cells = []
        for lo, hi in bins:
            mine = [row["ttft_s"] for row in rows if lo <= row["history_tokens"] < hi]
            base = [row["ttft_s"] for row in timed[krul] if lo <= row["history_tokens"] < hi]
            cell = f"{np.mean(mine):.2f} ({np.mean(mine) / np.mean(base):.2f}x) n={len(mine)}"
            cells.append(f"  {cell:>16}")
        lines.append(f"{name:>18}" + "".join(cells))
    return "\n".join(lines)
