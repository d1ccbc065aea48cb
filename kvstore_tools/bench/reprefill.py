"""``kvstore-bench reprefill``: Re-Prefill TTFT against full recompute and full load.

One run, one model, one daemon: the prefix is prefilled and stored once
(or found stored), then for several suffixes each system produces the first
token's logits:

* ``full-recompute``: prefix + suffix from scratch (chunked prefill, no store);
* ``full-load``: every chunk of every layer loaded from the daemon
  (AttentionStore-like), then the suffix computed;
* ``reprefill@B``: per Period, select B of the chunks (sink + local + top
  scored), stream only those, compute.

Reported per system: TTFT mean and P95, the time waiting on I/O and
computing, tokens and bytes loaded, read amplification, and fidelity
against full load at 100% (top-1 agreement, KL of the next-token
distribution, recall of the chunks carrying the true top attention mass).
The ``--json`` report keeps every timed request's record (``requests``),
the figures' raw data; ``--plot`` draws TTFT from them (``plots.plot_ttft``).
"""

from __future__ import annotations

import os
from dataclasses import asdict

import numpy as np
import torch

from kvstore.contract.errors import InvalidArgument
from kvstore.progress import progress

from .io_jobs import BenchError
from .layer_shapes import IN_MEMORY_MODELS, seeded_model
from .machine import machine_info
from .reprefill_report import Sample, format_reprefill_report, reprefill_ratios

SYSTEMS_DOC = "full-recompute, full-load, reprefill at each budget"


def summarize(samples: list[Sample]) -> dict:
    ttft = np.array([s.ttft_s for s in samples])
    out = {
        "runs": len(samples),
        "ttft_mean_s": float(ttft.mean()),
        "ttft_p95_s": float(np.percentile(ttft, 95)),
        "io_wait_mean_s": float(np.mean([s.io_wait_s for s in samples])),
        "compute_mean_s": float(np.mean([s.compute_s for s in samples])),
        "select_mean_s": float(np.mean([s.select_s for s in samples])),
        "tokens_loaded": int(np.mean([s.tokens_loaded for s in samples])),
        "bytes_read": int(np.mean([s.bytes_read for s in samples])),
        "bytes_useful": int(np.mean([s.bytes_useful for s in samples])),
        "num_reads": float(np.mean([s.num_reads for s in samples])),
    }
    out["read_amplification"] = out["bytes_read"] / out["bytes_useful"] if out["bytes_useful"] else None
    for key in ("top1", "kl", "recall"):
        vals = [getattr(s, key) for s in samples if getattr(s, key) is not None]
        out[key] = float(np.mean(vals)) if vals else None
    return out


def _arena_bytes(model, args) -> int:
    """The bench daemon's arena: a full load's largest Period held at once, twice (the next Period's reads
    start while one is computed), 64 MiB at least.  The daemon refuses a Period larger than its stream
    reserve: a Llama-3-8B shape at 16,384 tokens holds 512 MiB per 8-layer Period (bf16)."""
    from engine_client.reprefill import model_geometry, parse_system

    geometry = model_geometry(model, group_layers=args.group_layers, probe_bits=args.store_probe_bits)
    period_layers = max(args.period_layers, parse_system(args.system).schedule.period_layers if args.system else 0)
    groups_per_period = -(-period_layers // args.group_layers)
    per_group = sorted((geometry.extent_padded_bytes(g) for g in range(geometry.num_groups)), reverse=True)
    period = sum(per_group[:groups_per_period]) * geometry.num_chunks(args.prefix_tokens)
    return max(64 << 20, -(-(2 * period + (16 << 20)) // (1 << 20)) << 20)


def run_reprefill_bench(args) -> dict:
    from engine_client.client import KVStoreClient
    from engine_client.compute_model import parse_profile
    from engine_client.model.loader import load_checkpoint
    from engine_client.model.selection_profile import calibrated_probe_bits
    from engine_client.reprefill import ModelRunner, parse_system, window_periods
    from engine_client.selection import exact_chunk_scores
    from kvstore_tools.bench.fidelity import chunk_recall, compare_logits
    from kvstore_tools.make_checkpoint import checkpoint_path

    from .eval_common import bench_device

    torch.set_num_threads(max(1, args.threads or os.cpu_count() or 1))
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    device = bench_device(args)  # before the checkpoint is made: a bad --device costs nothing
    if args.model in IN_MEMORY_MODELS:  # a whole model's shape, made on the device (no checkpoint to write)
        model = seeded_model(args.model, device, dtype, args.seed)
    else:
        model = load_checkpoint(checkpoint_path(args), dtype=dtype, device=device)
    args.store_probe_bits = calibrated_probe_bits(model) if args.store_probe_bits == "auto" else args.store_probe_bits
    try:  # before the prefill: Periods that mix sliding-window and global layers are refused
        for period in {args.period_layers, parse_system(args.system).schedule.period_layers if args.system else args.period_layers}:
            window_periods(model.config, period)
    except InvalidArgument as exc:
        raise BenchError(str(exc)) from None
    gen = torch.Generator().manual_seed(args.seed)
    vocab = model.config.vocab_size
    prefix = torch.randint(0, vocab, (args.prefix_tokens,), generator=gen)
    suffixes = [torch.randint(0, vocab, (args.suffix_tokens,), generator=gen) for _ in range(args.repeats)]
    daemon = None
    target = args.target
    if not target:
        from .daemon_io import DaemonArgs, _Daemon

        # no CPU tier: every system reads from disk, request after request
        # (the tiers are measured by --workload zipf)
        daemon = _Daemon(
            os.path.join(args.directory, "reprefill-store"),
            DaemonArgs(args.backend, args.iodepth),
            extra=["--prefetch-reserve-fraction", "1", "--shm-arena-bytes", str(_arena_bytes(model, args))],
        )
        target = f"unix:{daemon.socket}"
    try:
        with KVStoreClient(target) as client:
            runner = ModelRunner(model, client, group_layers=args.group_layers, probe_bits=args.store_probe_bits)
            handle = runner.store_prefix(prefix, progress=progress)
            report = {"prefix": vars(handle).copy(), "systems": {}, "requests": {}, "state_bytes": {}}
            prefix_id = handle.prefix_id

            def config(budget, selector):
                if selector == args.selector and args.system:  # a named system, at its own Periods
                    return parse_system(args.system).replace(budget=budget)
                return parse_system(selector).replace(budget=budget, period_layers=args.period_layers)

            def run(budget, selector):
                cfg = config(budget, selector)
                return lambda suffix: runner.reprefill(prefix_id, suffix, cfg)

            run(1.0, "full")(suffixes[0])  # warm-up: first touches, summaries resident
            references, samples = [], []
            for suffix in suffixes:
                res = run(1.0, "full")(suffix)
                references.append(res.logits)
                samples.append(_sample(res))
            _add_system(report, "full-load", samples)
            true_scores = _true_scores(runner, prefix_id, suffixes, args, exact_chunk_scores) if args.recall else None
            for budget in progress(args.budgets, "reprefill budgets"):
                if budget >= 1:
                    continue
                first = run(budget, args.selector)(suffixes[0])  # warm-up: what it fetched once is the prefix's client state
                report["state_bytes"][f"reprefill@{budget:g}"] = {
                    "probe_bytes": first.probe_bytes,
                    "state_bytes_fetched": first.state_bytes_fetched,
                }
                samples = []
                for i, suffix in enumerate(suffixes):
                    res = run(budget, args.selector)(suffix)
                    s = _sample(res)
                    s.top1, s.kl = compare_logits(references[i], res.logits)
                    if true_scores is not None:  # over the selected Periods: a sliding layer's loads its window, unranked
                        windows = set(window_periods(model.config, args.period_layers))
                        recalls = [
                            chunk_recall(sel, t)
                            for k, (sel, t) in enumerate(zip(res.selected, true_scores[i]))
                            if k * args.period_layers not in windows
                        ]
                        s.recall = float(np.mean(recalls)) if recalls else None
                    samples.append(s)
                _add_system(report, f"reprefill@{budget:g}", samples)
            if args.recompute_runs:
                if model.device.type == "cuda":  # warm-up, as every other row has: a GPU's first run of a shape
                    runner.full_recompute(prefix, suffixes[0])  # picks its kernels (131 ms against 26 on an H200)
                samples = []
                for i, suffix in enumerate(suffixes[: args.recompute_runs]):
                    logits, seconds = runner.full_recompute(prefix, suffix, progress=progress)
                    s = Sample(ttft_s=seconds, compute_s=seconds)
                    s.top1, s.kl = compare_logits(references[i], logits)
                    samples.append(s)
                _add_system(report, "full-recompute", samples)
            if args.profile:  # the per-request choice among recompute, full load and the sparse path
                from .reprefill_choice import choice_row

                report["choices"] = {}
                for budget in (b for b in args.budgets if b < 1):
                    cfg = config(budget, args.selector)
                    samples, paths = choice_row(
                        runner,
                        prefix,
                        suffixes,
                        references,
                        cfg,
                        parse_profile(args.profile),
                        sample=_sample,
                        compare_logits=compare_logits,
                    )
                    _add_system(report, f"choice@{budget:g}", samples)
                    report["choices"][f"choice@{budget:g}"] = paths
            report["daemon_stats"] = {"bytes_read": client.stats().bytes_read}
    finally:
        if daemon is not None:
            daemon.stop()
    report["params"] = {
        k: getattr(args, k)
        for k in (
            "model",
            "dtype",
            "prefix_tokens",
            "suffix_tokens",
            "budgets",
            "repeats",
            "selector",
            "system",
            "period_layers",
            "group_layers",
            "store_probe_bits",
            "profile",
        )
    }
    report["params"]["threads"] = torch.get_num_threads()
    report["machine"] = machine_info(args.directory)
    report["ratios"] = reprefill_ratios(report["systems"])
    return report


def _add_system(report: dict, name: str, samples: list[Sample]) -> None:
    """The system's row and the per-request records it is computed from."""
    report["systems"][name] = summarize(samples)
    report["requests"][name] = [asdict(s) for s in samples]


def _sample(res) -> Sample:
    return Sample(
        ttft_s=res.ttft_s,
        io_wait_s=res.io_wait_s,
        compute_s=res.compute_s,
        select_s=res.select_s,
        tokens_loaded=res.tokens_loaded,
        bytes_read=res.bytes_read,
        bytes_useful=res.bytes_useful,
        num_reads=res.num_reads,
    )


def _true_scores(runner, prefix_id, suffixes, args, exact_chunk_scores):
    """Exact per-chunk attention mass of each period's first layer (with all chunks loaded)."""
    from engine_client.reprefill import parse_system

    out = []
    for suffix in suffixes:
        cfg = parse_system("full").replace(budget=1.0, period_layers=args.period_layers, report_attention=False)
        res = runner.reprefill(prefix_id, suffix, cfg)
        out.append(res.chunk_attention)
    return out


def add_reprefill_parser(sub) -> None:
    p = sub.add_parser("reprefill", help="Re-Prefill TTFT vs full recompute and full load")
    from .eval_common import add_device_flag

    add_device_flag(p)
    from engine_client.model import zoo

    p.add_argument(
        "--model",
        default="qwen2.5-0.5b-shape",
        choices=("tiny", "small", "qwen2.5-0.5b-shape", *sorted(IN_MEMORY_MODELS), *sorted(zoo.MODELS)),
        help=f"a seeded shape ({', '.join(sorted(IN_MEMORY_MODELS))}: made in memory on the device, --workload single), "
        f"or a pretrained model ({', '.join(sorted(zoo.MODELS))}; --workload zipf)",
    )
    p.add_argument("--checkpoint", help="an HF-format checkpoint directory (default: a seeded one made under --directory)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--prefix-tokens", type=int, default=16384)
    p.add_argument("--suffix-tokens", type=int, default=64)
    from kvstore.cli_flags import add_alias, fractions_arg, unix_target

    p.add_argument("--budgets", type=fractions_arg, default=[0.05, 0.10, 0.25, 0.50, 1.0])
    p.add_argument("--repeats", type=int, default=3, help="suffixes timed per system")
    p.add_argument(
        "--recompute-runs",
        type=int,
        default=1,
        help="full-recompute runs (slow: the whole prefix); --workload zipf: 0 leaves out its recompute row (every request)",
    )
    p.add_argument("--selector", default="summary", choices=("summary", "exact", "recent"))
    p.add_argument(
        "--system",
        help="the reprefill rows run this named system (engine_client.reprefill.systems, e.g. ckv+int4-probes+standins) "
        "at each budget, at its own Periods, in place of --selector at --period-layers",
    )
    p.add_argument("--period-layers", type=int, default=8)
    p.add_argument("--group-layers", type=int, default=4, help="stored period group (SubPeriod)")
    p.add_argument(
        "--store-probe-bits",
        type=lambda v: v if v == "auto" else int(v),
        choices=(0, 4, 8, "auto"),
        default=0,
        help="the stored prefix keeps its probe keys quantized to this many bits (0: in the KV dtype; auto: the model's)",
    )
    p.add_argument(
        "--profile",
        help="adds a choice@B row per budget: per request the cheapest of recompute, full load and the sparse path at B, "
        "predicted from this accelerator profile (h100, a100, a800, custom:..., or file:PATH from kvstore-bench calibrate)",
    )
    p.add_argument("--no-recall", dest="recall", action="store_false", help="skip the true-top-chunk recall")
    p.add_argument("--socket-path", dest="target", type=unix_target, help="a running daemon (default: start one in --data-dir)")
    p.add_argument("--data-dir", dest="directory", default=".kvstore/bench")
    add_alias(p, "--target", "target")  # older spellings (kvstore.cli_flags)
    add_alias(p, "--directory", "directory")
    p.add_argument("--backend", default="auto", choices=("auto", "posix", "kvikio"))
    p.add_argument("--io-queue-depth", dest="iodepth", type=int, default=16)
    add_alias(p, "--iodepth", "iodepth", type=int)
    p.add_argument("--threads", type=int, help="torch threads (default: all cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    from .plots import add_plot_flag
    from .zipf_systems import SYSTEMS, systems_arg

    add_plot_flag(p, "TTFT by system and budget (mean split into I/O wait, select and compute; P95 whiskers)")

    z = p.add_argument_group("shared-prefix workload (--workload zipf): systems side by side")
    z.add_argument("--workload", choices=("single", "zipf"), default="single", help="single: one prefix (default); zipf: many")
    z.add_argument(
        "--systems",
        type=systems_arg,
        default=["contiguouskv-paper", "contiguouskv", "impress", "as-h2o", "as-lru"],
        help=f"from {', '.join(SYSTEMS)}",
    )
    z.add_argument(
        "--task",
        help="pretrained model: prefixes are this real-text task's held-out examples (passkey, niah, ...) and each "
        "request asks its prefix's question, so accuracy sits next to the timings (default: random tokens)",
    )
    z.add_argument("--task-start", type=int, default=0, help="--task: offset into the evaluation seeds")
    z.add_argument(
        "--ask",
        choices=("prefix", "any-key"),
        default="prefix",
        help="--task: each request asks its prefix's question (prefix), or about one of the keys its prefix holds, "
        "drawn per request from --seed (any-key: multikey's four needles), so requests on one prefix need different chunks",
    )
    z.add_argument(
        "--warm-state",
        action="store_true",
        help="each system's client state (key summaries, probe keys, value sums, a tail) is fetched when its prefixes "
        "are stored (ModelRunner.warm), as IMPRESS's probe keys are made then, so no timed request pays a first fetch",
    )
    z.add_argument(
        "--standin-layers",
        metavar="PATH",
        help="the stand-in layers file of contiguouskv-standin (default: the one next to the checkpoint, "
        "python -m kvstore_tools.models calibrate-standins)",
    )
    z.add_argument("--prefixes", type=int, default=20)
    z.add_argument("--requests", type=int, default=40, help="timed requests per system and budget")
    z.add_argument("--warmup", type=int, default=10, help="requests before timing (they fill the tiers)")
    z.add_argument("--alpha", type=float, default=1.0, help="Zipf exponent of prefix popularity")
    z.add_argument(
        "--memory-fraction",
        type=float,
        default=0.10,
        help="CPU tier as a share of the stored bytes (the prefetch reserve comes on top, from the same arena)",
    )
    z.add_argument(
        "--trace-out",
        metavar="PATH",
        help="write a JSONL trace of every request's daemon calls per system (kvstore-bench replay reads it)",
    )
    p.set_defaults(run=command_reprefill)


def command_reprefill(args) -> int:
    import json

    from .plots import check_plot_path, plot_ttft

    if args.prefix_tokens < 1 or args.suffix_tokens < 1 or args.repeats < 1:
        raise BenchError("--prefix-tokens, --suffix-tokens and --repeats must be positive")
    check_plot_path(args.plot)
    if args.trace_out and args.workload != "zipf":
        raise BenchError("--trace-out records the systems of --workload zipf; add --workload zipf")
    if args.model in IN_MEMORY_MODELS and (args.workload == "zipf" or args.checkpoint):
        raise BenchError(f"--model {args.model} is made in memory for --workload single; it takes no --checkpoint")
    if args.profile:
        if args.workload == "zipf":
            raise BenchError("--profile adds the per-request choice to --workload single; the zipf workload compares systems")
        from engine_client.compute_model import parse_profile

        try:
            parse_profile(args.profile)
        except InvalidArgument as exc:
            raise BenchError(f"--profile: {exc}") from None
    if args.workload == "zipf":
        from .figures import format_zipf_report
        from .workload import run_zipf_bench
        from .zipf_systems import check_zipf_args

        check_zipf_args(args)
        report = run_zipf_bench(args)
        text = format_zipf_report(report)
    else:
        report = run_reprefill_bench(args)
        text = format_reprefill_report(report)
    print(json.dumps(report, indent=2, sort_keys=True, default=float) if args.json else text)
    if args.plot:
        plot_ttft(report, args.plot)
    return 0
