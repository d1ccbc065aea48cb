"""``kvstore-bench estimator``: what Krul's similarity estimator costs a conversation's generation.

    kvstore-bench estimator --model smollm2-135m --task multiturn --tokens 2048 --examples 4 \\
        --new-tokens 64 [--threads 2] [--stream tune] [--json]

Each example is a conversation of a real-text task (history + the new user
turn).  Its turn is generated greedily, ``--new-tokens`` tokens (the end of
sequence does not stop it, so every run decodes as many), five ways in one
interleaved run, the order rotated per example:

* ``none``: ``dense_generate`` alone;
* ``estimator``: the same with ``krul.AttentionEstimator.observe`` fed by
  every layer of the prefill, the turn and each decoding step, the sketch
  computed in its background thread, decode rows sent every
  ``--decode-batch`` steps;
* ``estimator-b1``: the same with every decode row sent at once;
* ``estimator-deferred``: every input queued, the thread started only
  after the last token (``defer=True``);
* ``estimator-stride``: as ``estimator-deferred``, folding every
  ``--row-stride``-th row only (``row_stride``): its wait is its compute
  time, to compare with ``estimator-deferred``'s; its statistics are an
  estimate, and the report says whether they choose the same strategy as
  the exact ones.

Reported per system: time to the first token (the history's prefill and the
turn over it), mean time per output token, and for the estimator the
thread's busy time, the wait for it to finish after the last token (what a
worker marking the conversation inactive right then would wait), the
sketch's bytes and the peak bytes of queued inputs.  The generated tokens
must equal ``none``'s (the estimator only reads).  The statistics are then
what a record keeps: the edge mass per layer and the strategy they give at
``--gamma`` / ``--ratio``.
"""

from __future__ import annotations

import json
import os
import platform
import time

import numpy as np

from .eval_common import add_device_flag, bench_device, check_strategy_flags, load_pretrained
from .io_jobs import BenchError

SYSTEMS = ("none", "estimator", "estimator-b1", "estimator-deferred", "estimator-stride")


def add_estimator_parser(sub) -> None:
    p = sub.add_parser("estimator", help="Krul's attention estimator: its cost on generation (time per token, memory)")
    add_device_flag(p)
    p.add_argument("--model", default="smollm2-135m", help="a name from python -m kvstore_tools.models list")
    p.add_argument("--task", default="multiturn", help="a real-text task (kvstore_tools.tasks.text)")
    p.add_argument("--tokens", type=int, default=2048, help="tokens of each conversation (history + new turn)")
    p.add_argument("--examples", type=int, default=4)
    p.add_argument("--stream", choices=("eval", "tune"), default="tune", help="seed stream of the examples")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated per run")
    p.add_argument("--decode-batch", type=int, default=16, help="decode rows per job of the estimator's thread")
    p.add_argument("--grid", type=int, default=32, help="the sketch's grid (cells per side)")
    p.add_argument("--row-stride", type=int, default=4, help="estimator-stride folds every this many rows")
    p.add_argument("--gamma", type=float, default=0.6, help="the strategy's input-sensitivity threshold")
    p.add_argument("--ratio", type=float, default=0.5, help="the strategy's share of paired layers")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=command_estimator)


def command_estimator(args) -> int:
    if min(args.tokens, args.examples, args.threads, args.new_tokens, args.decode_batch, args.grid, args.row_stride) < 1:
        raise BenchError("--tokens, --examples, --threads, --new-tokens, --decode-batch, --grid and --row-stride must be positive")
    check_strategy_flags(args)
    report = run_estimator(args)
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else format_estimator(report))
    return 0


def run_estimator(args) -> dict:
    from engine_client.generation import dense_generate
    from engine_client.krul import AttentionEstimator, choose_strategy
    from kvstore.contract import InvalidArgument
    from kvstore.progress import progress
    from kvstore_tools.tasks import text

    pm = load_pretrained(args.model, args.threads, bench_device(args))
    try:
        examples = text.examples(args.task, pm.tokenizer, args.examples, args.tokens, stream=args.stream)
    except (KeyError, ValueError) as exc:
        raise BenchError(f"--task {args.task} --tokens {args.tokens}: {exc}") from None
    model = pm.decoder
    batches = {"estimator-b1": 1}
    strides = {"estimator-stride": args.row_stride}
    rows: dict[str, list[dict]] = {name: [] for name in SYSTEMS}
    strategies = []
    dense_generate(model, examples[0].prefix_tokens[:64], examples[0].suffix_tokens, 2)  # kernel warm-up, untimed
    for i, ex in enumerate(progress(examples, "conversations", total=len(examples), unit="conv")):
        order = SYSTEMS[i % len(SYSTEMS) :] + SYSTEMS[: i % len(SYSTEMS)]
        tokens, chosen = {}, {}
        for name in order:
            est = (
                AttentionEstimator(
                    model,
                    grid=args.grid,
                    decode_batch=batches.get(name, args.decode_batch),
                    defer=name in ("estimator-deferred", "estimator-stride"),
                    row_stride=strides.get(name, 1),
                )
                if name != "none"
                else None
            )
            try:
                gen = dense_generate(
                    model, ex.prefix_tokens, ex.suffix_tokens, args.new_tokens, eos_token_ids=(), observe=est and est.observe
                )
                row = {"seed": ex.seed, "ttft_s": gen.ttft_s, "per_token_s": float(np.mean(gen.step_s)), "tokens": len(gen.tokens)}
                if est is not None:
                    t0 = time.perf_counter()
                    stats = est.stats()
                    row.update(
                        finish_wait_s=time.perf_counter() - t0,
                        busy_s=est.busy_s,
                        sketch_bytes=est.nbytes,
                        queued_peak_bytes=est.queued_peak_bytes,
                    )
                    if name in ("estimator", "estimator-stride"):
                        try:
                            strategy = choose_strategy(stats, gamma=args.gamma, ratio=args.ratio)
                        except InvalidArgument as exc:
                            raise BenchError(str(exc)) from None
                        chosen[name] = (stats, strategy)
            finally:
                if est is not None:
                    est.close()
            tokens[name] = gen.tokens
            rows[name].append(row)
        for name in SYSTEMS:
            rows[name][-1]["same_tokens"] = tokens[name] == tokens["none"]
        (stats, strategy), (sampled, sampled_strategy) = chosen["estimator"], chosen["estimator-stride"]
        strategies.append(
            {
                "seed": ex.seed,
                "edge_mass": [round(float(e), 4) for e in stats.edge_mass],
                "non_ir": list(strategy.non_ir),
                "pairs": [list(p) for p in strategy.pairs],
                "stride_non_ir": list(sampled_strategy.non_ir),
                "stride_pairs": [list(p) for p in sampled_strategy.pairs],
                "stride_same_non_ir": set(sampled_strategy.non_ir) == set(strategy.non_ir),
                "stride_same_pairs": set(sampled_strategy.pairs) == set(strategy.pairs),
                "stride_edge_mass_max_error": float((sampled.edge_mass - stats.edge_mass).abs().max()),
                "stride_map_relative_error": float((sampled.maps - stats.maps).norm() / stats.maps.norm()),
            }
        )
    return _report(args, examples, rows, strategies)


def _report(args, examples, rows, strategies) -> dict:
    systems = {}
    for name, rs in rows.items():
        s = {k: float(np.mean([r[k] for r in rs])) for k in rs[0] if k not in ("seed", "same_tokens")}
        s["same_tokens"] = all(r["same_tokens"] for r in rs)
        s["rows"] = rs
        systems[name] = s
    base = systems["none"]
    for s in systems.values():
        s["per_token_vs_none"] = s["per_token_s"] / base["per_token_s"]
        s["ttft_vs_none"] = s["ttft_s"] / base["ttft_s"]
    return {
        "model": args.model,
        "task": args.task,
        "tokens": args.tokens,
        "examples": len(examples),
        "stream": args.stream,
        "new_tokens": args.new_tokens,
        "decode_batch": args.decode_batch,
        "grid": args.grid,
        "row_stride": args.row_stride,
        "gamma": args.gamma,
        "ratio": args.ratio,
        "threads": args.threads,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, CPU only",
        "load_average_1min_before": round(os.getloadavg()[0], 2),
        "systems": systems,
        "strategies": strategies,
    }


def format_estimator(r: dict) -> str:
    lines = [
        f"{r['model']} {r['task']} @ {r['tokens']} tokens, {r['examples']} conversations, {r['new_tokens']} new tokens each, "
        f"{r['threads']} threads, grid {r['grid']}",
        "",
        f"{'system':>18}  {'TTFT s':>7}  {'vs none':>7}  {'ms/token':>8}  {'vs none':>7}  {'busy s':>6}  {'wait s':>6}  "
        f"{'sketch MiB':>10}  {'queued MiB':>10}  same tokens",
    ]
    for name, s in r["systems"].items():
        line = (
            f"{name:>18}  {s['ttft_s']:>7.2f}  {s['ttft_vs_none']:>6.2f}x  {s['per_token_s'] * 1e3:>8.1f}  {s['per_token_vs_none']:>6.2f}x"
        )
        if "busy_s" in s:
            line += f"  {s['busy_s']:>6.2f}  {s['finish_wait_s']:>6.2f}  {s['sketch_bytes'] / 2**20:>10.1f}  {s['queued_peak_bytes'] / 2**20:>10.1f}"
        else:
            line += f"  {'-':>6}  {'-':>6}  {'-':>10}  {'-':>10}"
        lines.append(line + f"  {'yes' if s['same_tokens'] else 'NO'}")
    lines.append("")
    lines.append(f"strategy at gamma {r['gamma']}, ratio {r['ratio']} (what the record keeps):")
    for st in r["strategies"]:
        lines.append(f"  seed {st['seed']}: non-I-R {st['non_ir']}; pairs {st['pairs']}")
        same = [what for what, key in (("non-I-R", "stride_same_non_ir"), ("pairs", "stride_same_pairs")) if st[key]]
        lines.append(
            f"    every {r['row_stride']}th row: same {' and '.join(same) or 'nothing'}"
            + ("" if st["stride_same_pairs"] else f" (pairs {st['stride_pairs']})")
            + f"; edge mass off by at most {st['stride_edge_mass_max_error']:.3f}, maps by {st['stride_map_relative_error']:.1%}"
        )
    return "\n".join(lines)
