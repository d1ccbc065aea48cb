"""``kvstore-bench reprefill --workload zipf``: systems side by side on a shared-prefix workload.

Many requests over a set of shared prefixes (Zipf popularity, a different
suffix each), memory tiers smaller than the stored data, warm-up requests
excluded, as in ContiguousKV's evaluation.  Every system runs the same
request stream on the same daemon binary and client, switched by config,
each on its own data directory (so cache scores do not leak between them).

One budget and one memory for all.  Budget: ``token_cap`` prefix tokens per
Period, sink and local included (the first and last 16 tokens, kept by
every system); a request that loads more fails the run.  Memory: the
daemon's CPU tier is ``--memory-fraction`` of the stored bytes *minus* the
client state the system keeps resident between requests (ContiguousKV's
key summaries, IMPRESS's probe keys), and every byte of client state
fetched from the daemon counts in ``bytes_disk``.

The systems (``zipf_systems.SYSTEMS``) are described in ``zipf_systems``.

Fidelity is measured against full attention over the in-memory prefix KV
(top-1 agreement, KL of the next-token distribution).  With a pretrained
model and ``--task``, each prefix is a held-out real-text example
(``kvstore_tools.tasks.text``), each request asks that example's question
(or, ``--ask any-key``, about one of the keys it holds: multikey's four
needles, so requests on one prefix need different chunks) and decodes its
answer greedily after the Re-Prefill, and every system's
accuracy is reported next to the full KV's on the same requests (decoding
is not part of TTFT).  Figures and ratios:
``figures.py``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .baselines import chooser, impress_probe, stored_layout
from .figures import headline_ratios, summarize
from .io_jobs import BenchError
from .machine import machine_info
from .trace import RecordingClient, TraceWriter, request_record, system_header
from .zipf_memory import memory_split, probe_state_bytes, window_tail_bytes
from .zipf_prefixes import Prefix, dense_logits, full_kv_answers, max_new_tokens, prefill_all, request_examples, task_examples
from .zipf_recompute import RecomputeRun
from .zipf_systems import NAMED_SELECTION, SYSTEMS, System, refuse_on_sliding_windows, standin_profile


def run_zipf_bench(args) -> dict:
    from engine_client.model.loader import load_checkpoint
    from kvstore_tools.make_checkpoint import checkpoint_path
    from kvstore_tools.workloads import zipf_requests

    from .eval_common import bench_device

    torch.set_num_threads(max(1, args.threads or os.cpu_count() or 1))
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    device = bench_device(args)  # before the checkpoint is made: a bad --device costs nothing
    model = load_checkpoint(checkpoint_path(args), dtype=dtype, device=device)
    refuse_on_sliding_windows(model, args)
    args.standin_profile = standin_profile(model, checkpoint_path(args), args)
    tokenizer, examples = task_examples(args, checkpoint_path(args))
    vocab = model.config.vocab_size
    requests = zipf_requests(
        args.prefixes,
        args.warmup + args.requests,
        alpha=args.alpha,
        seed=args.seed,
        suffix_tokens=args.suffix_tokens,
        vocab_size=vocab,
    )
    table, keys = request_examples(args, tokenizer, examples, requests) if examples else (None, None)
    if table:  # each request asks its prefix's question, or one of its keys (--ask any-key)
        requests = [dataclasses.replace(r, suffix=table[r.prefix][k].suffix_tokens.copy()) for r, k in zip(requests, keys)]
    t0 = time.perf_counter()
    prefixes = prefill_all(model, args, examples)
    prefill_s = time.perf_counter() - t0
    references = [dense_logits(model, prefixes[r.prefix].kv, torch.as_tensor(r.suffix)) for r in requests]
    full_kv = full_kv_answers(model, prefixes, table, tokenizer) if table else None
    systems, records = _run_interleaved(model, prefixes, requests, references, args, (table, keys, tokenizer))
    if getattr(args, "trace_out", None):
        print(f"trace written to {args.trace_out}", file=sys.stderr, flush=True)
    if full_kv is not None:
        for key, rows in records.items():
            for row in rows:
                row["full_kv_correct"] = full_kv[row["prefix"]][keys[row["request"]]]
            systems[key]["full_kv_accuracy"] = float(np.mean([row["full_kv_correct"] for row in rows])) if rows else None
    report = {"systems": systems, "requests": records}
    report["workload"] = {
        "prefixes": args.prefixes,
        "prefix_tokens": args.prefix_tokens,
        "suffix_tokens": args.suffix_tokens,
        "requests": args.requests,
        "warmup": args.warmup,
        "alpha": args.alpha,
        "memory_fraction": args.memory_fraction,
        "warm_state": bool(getattr(args, "warm_state", False)),
        "prefix_popularity": np.bincount([r.prefix for r in requests[args.warmup :]], minlength=args.prefixes).tolist(),
        "prefill_s": prefill_s,
        "task": args.task,
        "task_seeds": [ex.seed for ex in examples] if examples else None,
        "ask": getattr(args, "ask", "prefix") if examples else None,
        # per prefix (--ask prefix), or per prefix and key (--ask any-key; each row names its "key")
        "full_kv_correct": None if full_kv is None else [k[0] for k in full_kv] if getattr(args, "ask", "prefix") == "prefix" else full_kv,
    }
    report["params"] = {
        k: getattr(args, k) for k in ("model", "dtype", "budgets", "period_layers", "group_layers", "seed", "systems", "selector")
    }
    report["params"]["threads"] = torch.get_num_threads()
    if args.standin_profile is not None:
        from .text_accuracy import standin_summary

        report["params"]["standin_layers"] = standin_summary(args.standin_profile)
    report["machine"] = machine_info(args.directory)
    report["ratios"] = headline_ratios(records, args.budgets)
    return report


@dataclass
class _Run:
    key: str
    sysdef: System
    budget: float
    daemon: object
    client: object
    runner: object
    cfg: object
    ids: list
    probes: list  # per prefix: IMPRESS's resident partial probe keys (None for other systems)
    state_bytes: int  # client state charged to this system's memory
    rows: list
    daemon_flags: list = field(default_factory=list)
    last_result: object = None  # the latest request's ReprefillResult (for --trace-out)


def _run_interleaved(model, prefixes, requests, references, args, task=(None, None, None)) -> tuple[dict, dict]:
    """Every system x budget on its own daemon and data directory, all up at
    once; each request goes to every system in turn (rotating who goes first),
    so background load on the machine falls on all of them alike.
    ``task``: ``(per prefix its questions, per request the one it asks, tokenizer)`` when requests ask one.
    Returns ``(rows by system, timed request records by system)``."""
    examples, keys, tokenizer = task
    runs: list[_Run] = []
    tracer = None
    try:
        for name in args.systems:
            sysdef = SYSTEMS[name]
            for budget in args.budgets if sysdef.budgeted else [1.0]:
                runs.append(_start(model, name, sysdef, budget, prefixes, args))
        if getattr(args, "trace_out", None):
            tracer = _start_trace(model, prefixes, runs, args)
        # 0: no recompute row; --task: none either (its rows score answers decoded over what was loaded), nor
        # --trace-out (the replay models recompute at the profile's speed: replay_choice.recompute_rows)
        wanted = getattr(args, "recompute_runs", 1) and not examples and tracer is None
        recompute = RecomputeRun(model) if wanted else None
        slots = runs + [recompute] if recompute is not None else runs
        for i, req in enumerate(requests):
            k = i % len(slots)
            for run in slots[k:] + slots[:k]:
                if run is recompute:
                    row = recompute.request(prefixes[req.prefix], req, references[i])
                    if i >= args.warmup:
                        recompute.rows.append({"request": i, "prefix": req.prefix, **row})
                    continue
                example = examples[req.prefix][keys[i]] if examples else None
                if tracer is not None:
                    run.runner.client.begin()
                row = _one_request(run, prefixes[req.prefix], req, references[i], example, tokenizer)
                if tracer is not None:
                    events = run.runner.client.take()
                    tracer.request(request_record(run, i, i < args.warmup, req.prefix, req.suffix, run.last_result, events))
                if i >= args.warmup:
                    asked = {"key": keys[i]} if examples and getattr(args, "ask", "prefix") != "prefix" else {}
                    run.rows.append({"request": i, "prefix": req.prefix, **asked, **row})
            if (i + 1) % 10 == 0:
                print(f"{i + 1}/{len(requests)} requests", file=sys.stderr, flush=True)
        systems = {}
        for run in runs:
            resident = run.runner.resident_bytes() + sum(p.nbytes() for p in run.probes if p is not None)
            if resident > run.state_bytes:
                raise BenchError(f"{run.key}: {resident} bytes of client state, {run.state_bytes} charged")
            st = run.client.stats()
            systems[run.key] = summarize(run.rows) | {
                "cpu_tier_bytes": st.cpu_tier_bytes,
                "prefetch_reserve_bytes": st.prefetch_reserve_bytes,
                "stored_bytes": st.bytes_stored,
                "client_state_bytes": run.state_bytes,
            }
        records = {run.key: run.rows for run in runs}
        if recompute is not None:
            systems[recompute.key], records[recompute.key] = summarize(recompute.rows), recompute.rows
        return systems, records
    finally:
        if tracer is not None:
            tracer.close()
        for run in runs:
            run.client.close()
            run.daemon.stop()


def _start_trace(model, prefixes, runs, args):
    """--trace-out: the header (model, stored prefixes, each system's daemon and layout, how they ran)."""
    header = {
        "model": {"name": args.model, "dtype": args.dtype, "fingerprint": model.fingerprint, "config": dataclasses.asdict(model.config)},
        "prefixes": [{"index": i, "num_tokens": p.tokens.numel(), "tokens": p.tokens.tolist()} for i, p in enumerate(prefixes)],
        "systems": [system_header(run) for run in runs],
        "run": {
            "order": "each request to every system in turn, the first rotating; one daemon and data directory per system",
            "warmup": args.warmup,
            "requests": args.requests,
            "prefixes": args.prefixes,
            "prefix_tokens": args.prefix_tokens,
            "suffix_tokens": args.suffix_tokens,
            "alpha": args.alpha,
            "memory_fraction": args.memory_fraction,
            "period_layers": args.period_layers,
            "group_layers": args.group_layers,
            "seed": args.seed,
            "threads": torch.get_num_threads(),
            "backend": args.backend,
            "iodepth": args.iodepth,
            "task": args.task,
            "ask": getattr(args, "ask", "prefix") if args.task else None,
            "warm_state": bool(getattr(args, "warm_state", False)),
        },
    }
    writer = TraceWriter(args.trace_out)
    writer.header(header)
    return writer


def _start(model, name: str, sysdef: System, budget: float, prefixes, args) -> _Run:
    from engine_client.client import KVStoreClient
    from engine_client.model.selection_profile import calibrated_probe_bits
    from engine_client.reprefill import ModelRunner, model_geometry, parse_system
    from engine_client.reprefill.window import stored_layers

    from .daemon_io import DaemonArgs, _Daemon

    named = parse_system(sysdef.selection) if sysdef.selection in NAMED_SELECTION else None
    store_bits = named.selection.probe_bits if named else 0  # a system scoring with quantized probe keys stores them so
    if store_bits == "auto":  # at the model's calibrated width (model.selection_profile)
        store_bits = calibrated_probe_bits(model)
    # the runner's layout: on a model with sliding-window layers, the window tail (its global layers as extents)
    stored = stored_layers(model.config, window_tail=bool(model.config.sliding_layers), group_layers=args.group_layers)
    geo = model_geometry(model, chunk_tokens=sysdef.chunk_tokens, group_layers=args.group_layers, probe_bits=store_bits, layers=stored)
    probes = [impress_probe(p, args.period_layers) if sysdef.selection == "impress" else None for p in prefixes]
    state = sum(p.nbytes() for p in probes if p is not None)
    if sysdef.selection == "summary":
        state = sum(ModelRunner.summary_bytes(geo, p.tokens.numel(), args.period_layers) for p in prefixes)
    if store_bits:
        state = sum(probe_state_bytes(geo, p.tokens.numel(), store_bits) for p in prefixes)
    if named and named.attention.standin_layers:  # the stand-in layers' value sums, [Hkv, d] float32 each, resident per prefix
        layers = args.standin_profile.layers if named.attention.standin_layers == "calibrated" else named.attention.standin_layers
        state += len(prefixes) * len(layers) * geo.model.num_kv_heads * geo.model.head_dim * 4
    if stored.tail is not None:
        state += sum(window_tail_bytes(geo, stored.tail, p.tokens.numel()) for p in prefixes)
    memory, reserve_fraction = memory_split(geo, args, state)
    key = f"{name}@{budget:g}"
    data_dir = os.path.join(args.directory, "zipf-store", key)
    shutil.rmtree(data_dir, ignore_errors=True)
    flags = [
        "--shm-arena-bytes",
        str(memory),
        "--prefetch-reserve-fraction",
        repr(reserve_fraction),
        "--cache-policy",
        sysdef.policy,
        "--score-flush-seconds",
        "60",
    ]
    daemon = _Daemon(data_dir, DaemonArgs(args.backend, args.iodepth), extra=flags)
    client = KVStoreClient(f"unix:{daemon.socket}")
    runner_client = RecordingClient(client) if getattr(args, "trace_out", None) else client
    runner = ModelRunner(
        model,
        runner_client,
        chunk_tokens=sysdef.chunk_tokens,
        group_layers=args.group_layers,
        probe_bits=store_bits,
        standin_layers=args.standin_profile,
    )
    # --selector: the chunk systems' scorer
    selection = named or parse_system(args.selector if sysdef.selection == "summary" else "full").replace(period_layers=args.period_layers)
    cfg = selection.replace(
        budget=budget,
        speculate=sysdef.speculate,
        overlap=sysdef.overlap,
        lookahead=sysdef.lookahead,
        push=sysdef.push,
    )
    assert runner.geometry == geo, "the bench sizes memory for the runner's own layout"
    ids = []
    for p in prefixes:
        if runner.window is not None:  # the global layers' extents, then each prefix's window tail
            ids.append(runner.store_prefix(p.tokens, kv=p.kv).prefix_id)
            continue
        kv = stored_layout(p, args.period_layers)[0] if sysdef.reordered else p.kv
        ids.append(client.put_prefix(p.tokens.numpy(), _np_kv(kv), geo, model_fingerprint=model.fingerprint).prefix_id)
    if getattr(args, "warm_state", False):  # what IMPRESS's probe keys are from the start: resident before any request
        for pid in ids:
            runner.warm(pid, cfg)
    return _Run(key, sysdef, budget, daemon, client, runner, cfg, ids, probes, state, [], flags)


def _one_request(run: _Run, prefix: Prefix, req, reference, example=None, tokenizer=None) -> dict:
    from engine_client.reprefill import window_periods
    from engine_client.selection.tokens import token_cap
    from kvstore_tools.bench.fidelity import compare_logits

    n = prefix.tokens.numel()
    cap = token_cap(n, run.budget)
    choose = chooser(run, prefix, cap, run.probes[req.prefix])
    answer = {}
    if example is None:
        res = run.runner.reprefill(run.ids[req.prefix], torch.as_tensor(req.suffix), run.cfg, choose=choose)
    else:  # the question, answered greedily over what the Re-Prefill loaded (decoding is not TTFT)
        gen = run.runner.generate(run.ids[req.prefix], req.suffix, run.cfg, max_new_tokens(example), tokenizer=tokenizer, choose=choose)
        res = gen.reprefill
        answer = {"correct": bool(example.is_correct(gen.text)), "answer_text": gen.text, "decode_s": float(sum(gen.step_s))}
    run.last_result = res
    periods = len(res.selected)
    loaded = [int(np.sum(_chunk_sizes(s.numpy(), n, run.sysdef.chunk_tokens))) for s in res.selected]
    windows = set(window_periods(run.runner.model.config, run.cfg.schedule.period_layers))  # their window, whatever the budget
    period = run.cfg.schedule.period_layers
    if max((t for k, t in enumerate(loaded) if k * period not in windows), default=0) > cap:
        raise BenchError(f"{run.key} loaded {max(loaded)} tokens in a period, over the budget of {cap}")
    top1, kl = compare_logits(reference, res.logits)
    return {
        "ttft_s": res.ttft_s,
        "io_wait_s": res.io_wait_s,
        "compute_s": res.compute_s,
        "select_s": res.select_s,
        "tokens_loaded": res.tokens_loaded / periods,
        "token_cap": cap,
        "bytes_disk": res.bytes_read + res.state_bytes_fetched + res.probe_bytes,
        "state_bytes_fetched": res.state_bytes_fetched + res.probe_bytes,
        "bytes_useful": res.bytes_useful,
        "bytes_cpu": res.bytes_cpu,
        "bytes_gpu": res.bytes_gpu,
        "hit_units": res.units_cpu + res.units_gpu,
        "units": res.units_disk + res.units_cpu + res.units_gpu,
        "spec_used": res.spec_bytes_used,
        "spec_wasted": res.spec_bytes_wasted,
        "groups_covered": res.groups_covered / periods,
        "hints_sent": sum(h is not None for h in res.hints),
        "standin_rows": res.standin_rows,
        "daemon_wait_s": res.daemon_wait_s,
        **_guess_recalls(res),
        "top1": float(top1),
        "kl": float(kl),
        **answer,
    }


def _chunk_sizes(chunks: np.ndarray, n: int, chunk_tokens: int) -> np.ndarray:
    return np.minimum(chunk_tokens, n - chunks * chunk_tokens)


def _np_kv(kv: torch.Tensor) -> np.ndarray:
    from engine_client.client import as_numpy_kv

    return as_numpy_kv(kv)


def _guess_recalls(res) -> dict:
    """How much of each later period's set a guess held, sink and local chunks left out:
    the look-ahead hint (``hint_recall``) and the previous period's set (``prev_recall``)."""
    out = {}
    for key, guesses in (("hint_recall", res.hints), ("prev_recall", [None] + res.selected[:-1])):
        fractions = []
        for p in range(1, len(res.selected)):
            real = set(res.selected[p].tolist()[1:-1])
            if real and guesses[p] is not None:
                fractions.append(len(real & set(guesses[p].tolist())) / len(real))
        if fractions:
            out[key] = float(np.mean(fractions))
    return out
