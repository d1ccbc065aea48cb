"""``kvstore-bench reprefill --workload zipf``: systems side by side on a shared-prefix workload.

Many requests over a set of shared prefixes (Zipf popularity, a different
suffix each), memory tiers smaller than the stored data, warm-up requests
excluded, as in ContiguousKV's evaluation.  Every system runs the same
request stream on the same daemon binary and client, switched by config,
each on its own data directory (so cache scores do not leak between them):

* ``contiguouskv``: 16-token chunks, per-Period selection on key summaries,
  intra-period streaming + inter-period speculation from a look-ahead guess
  (period i+1's queries of the hidden state at period i's start, twice the
  budget) with pushed speculative groups, attention x frequency tiers;
* ``contiguouskv-sameset``: speculation from period i's own set, as
  ContiguousKV describes it (ablation);
* ``contiguouskv-noprefetch``: no speculation, each period waits for all its
  groups before computing (ablation);
* ``contiguouskv-lfu``: LFU tiers instead of attention x frequency (ablation);
* ``impress``: 64-token blocks; important tokens found from the probe keys of
  each period's first layer (read from disk), blocks with the most of them
  loaded; IMPRESS's importance-score tiers;
* ``as-h2o``: 64-token blocks; H2O heavy-hitter tokens (accumulated attention
  at the end of prefill, query-agnostic), every block holding one loaded;
  LRU tiers;
* ``as-lru``: AttentionStore-like: the whole prefix KV, LRU tiers.

Baselines stream groups as they arrive (layer-wise overlap) but do not
speculate.  Fidelity is measured against full attention over the in-memory
prefix KV (top-1 agreement, KL of the next-token distribution).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

from .io_jobs import BenchError, machine_info


@dataclass(frozen=True)
class System:
    chunk_tokens: int
    selection: str  # summary | impress | h2o | full
    policy: str
    speculate: bool = False
    overlap: bool = True
    budgeted: bool = True
    lookahead: float = 0.0


LOOKAHEAD = 2.0  # contiguouskv's speculative guess: twice the budget, scored one period ahead

SYSTEMS = {
    "contiguouskv": System(16, "summary", "score", speculate=True, lookahead=LOOKAHEAD),
    "contiguouskv-sameset": System(16, "summary", "score", speculate=True),
    "contiguouskv-noprefetch": System(16, "summary", "score", speculate=False, overlap=False),
    "contiguouskv-lfu": System(16, "summary", "lfu", speculate=True, lookahead=LOOKAHEAD),
    "impress": System(64, "impress", "impress"),
    "as-h2o": System(64, "h2o", "lru"),
    "as-lru": System(16, "full", "lru", budgeted=False),
}


def systems_arg(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [n for n in names if n not in SYSTEMS]
    if bad or not names:
        import argparse

        raise argparse.ArgumentTypeError(f"unknown systems {bad}; choose from {', '.join(SYSTEMS)}")
    return names


@dataclass
class _Prefix:
    tokens: torch.Tensor
    kv: torch.Tensor  # [L, 2, Hkv, n, d] in the model dtype
    h2o: torch.Tensor | None = None  # [periods, n]


def run_zipf_bench(args) -> dict:
    from engine_client.model.loader import load_checkpoint
    from engine_client.workloads import zipf_requests

    from .reprefill import checkpoint_path

    torch.set_num_threads(max(1, args.threads or os.cpu_count() or 1))
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    model = load_checkpoint(checkpoint_path(args), dtype=dtype)
    vocab = model.config.vocab_size
    requests = zipf_requests(
        args.prefixes,
        args.warmup + args.requests,
        alpha=args.alpha,
        seed=args.seed,
        suffix_tokens=args.suffix_tokens,
        vocab_size=vocab,
    )
    t0 = time.perf_counter()
    prefixes = _prefill_all(model, args)
    prefill_s = time.perf_counter() - t0
    if any(SYSTEMS[s].selection == "h2o" for s in args.systems):
        from engine_client.selection.tokens import h2o_token_scores

        for p in prefixes:
            p.h2o = h2o_token_scores(model, p.kv, p.tokens, period_layers=args.period_layers)
    references = [_dense_logits(model, prefixes[r.prefix].kv, torch.as_tensor(r.suffix)) for r in requests]
    report = {"systems": _run_interleaved(model, prefixes, requests, references, args), "workload": {}}
    report["workload"] = {
        "prefixes": args.prefixes,
        "prefix_tokens": args.prefix_tokens,
        "suffix_tokens": args.suffix_tokens,
        "requests": args.requests,
        "warmup": args.warmup,
        "alpha": args.alpha,
        "memory_fraction": args.memory_fraction,
        "prefix_popularity": np.bincount([r.prefix for r in requests[args.warmup :]], minlength=args.prefixes).tolist(),
        "prefill_s": prefill_s,
    }
    report["params"] = {
        k: getattr(args, k) for k in ("model", "dtype", "budgets", "period_layers", "group_layers", "seed", "systems", "selector")
    }
    report["params"]["threads"] = torch.get_num_threads()
    report["machine"] = machine_info(args.directory)
    report["ratios"] = _ratios(report["systems"], args.budgets)
    return report


def _prefill_all(model, args) -> list[_Prefix]:
    """Each prefix's KV, computed once and cached under --directory (same seed, same model)."""
    from engine_client.runner import chunked_prefill

    out = []
    gen = torch.Generator().manual_seed(args.seed)
    cache = os.path.join(args.directory, "zipf-kv")
    os.makedirs(cache, exist_ok=True)
    for i in range(args.prefixes):
        tokens = torch.randint(0, model.config.vocab_size, (args.prefix_tokens,), generator=gen)
        key = hashlib.sha256(f"{model.fingerprint}/{args.dtype}/{tokens.numpy().tobytes().hex()}".encode()).hexdigest()[:24]
        path = os.path.join(cache, f"{key}.pt")
        if os.path.exists(path):
            kv = torch.load(path)
        else:
            t0 = time.perf_counter()
            _, kv = chunked_prefill(model, tokens)
            torch.save(kv, path + ".tmp")
            os.replace(path + ".tmp", path)
            print(f"prefilled prefix {i} ({args.prefix_tokens} tokens) in {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
        out.append(_Prefix(tokens, kv))
    return out


@torch.inference_mode()
def _dense_logits(model, kv: torch.Tensor, suffix: torch.Tensor) -> torch.Tensor:
    """First-token logits with full attention over the prefix KV (the fidelity reference)."""
    n = kv.shape[3]
    positions = torch.arange(n, n + suffix.numel())
    hidden = model.embed(suffix)
    for layer in range(model.num_layers):
        hidden, _ = model.layer_forward(layer, hidden, positions, kv[layer])
    return model.final_logits(hidden)


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
    rows: list


def _run_interleaved(model, prefixes, requests, references, args) -> dict:
    """Every system x budget on its own daemon and data directory, all up at
    once; each request goes to every system in turn (rotating who goes first),
    so background load on the machine falls on all of them alike."""
    runs: list[_Run] = []
    try:
        for name in args.systems:
            sysdef = SYSTEMS[name]
            for budget in args.budgets if sysdef.budgeted else [1.0]:
                runs.append(_start(model, name, sysdef, budget, prefixes, args))
        for i, req in enumerate(requests):
            k = i % len(runs)
            for run in runs[k:] + runs[:k]:
                row = _one_request(run, prefixes[req.prefix], run.ids[req.prefix], req, references[i], args)
                if i >= args.warmup:
                    run.rows.append(row)
            if (i + 1) % 10 == 0:
                print(f"{i + 1}/{len(requests)} requests", file=sys.stderr, flush=True)
        out = {}
        for run in runs:
            st = run.client.stats()
            tier = {"cpu_tier_bytes": st.cpu_tier_bytes, "prefetch_reserve_bytes": st.prefetch_reserve_bytes, "stored_bytes": st.bytes_stored}
            out[run.key] = _summarize(run.rows, tier)
        return out
    finally:
        for run in runs:
            run.client.close()
            run.daemon.stop()


def _start(model, name: str, sysdef: System, budget: float, prefixes, args) -> _Run:
    from engine_client.client import KVStoreClient
    from engine_client.runner import ModelRunner, ReprefillConfig, model_geometry

    from .daemon_io import _Daemon
    from .reprefill import _DaemonArgs

    geo = model_geometry(model, chunk_tokens=sysdef.chunk_tokens, group_layers=args.group_layers)
    memory, reserve_fraction = memory_split(geo, args)
    key = f"{name}@{budget:g}"
    data_dir = os.path.join(args.directory, "zipf-store", key)
    shutil.rmtree(data_dir, ignore_errors=True)
    daemon = _Daemon(
        data_dir,
        _DaemonArgs(args),
        extra=[
            "--shm-arena-bytes", str(memory), "--prefetch-reserve-fraction", repr(reserve_fraction),
            "--cache-policy", sysdef.policy, "--score-flush-seconds", "60",
        ],
    )
    client = KVStoreClient(f"unix:{daemon.socket}")
    runner = ModelRunner(model, client, chunk_tokens=sysdef.chunk_tokens, group_layers=args.group_layers)
    cfg = ReprefillConfig(
        budget=budget,
        period_layers=args.period_layers,
        selector=args.selector if sysdef.selection == "summary" else "full",  # --selector: the chunk systems' scorer
        speculate=sysdef.speculate,
        overlap=sysdef.overlap,
        lookahead=sysdef.lookahead,
    )
    ids = [client.put_prefix(p.tokens.numpy(), _np_kv(p.kv), geo, model_fingerprint=model.fingerprint).prefix_id for p in prefixes]
    return _Run(key, sysdef, budget, daemon, client, runner, cfg, ids, [])


def _one_request(run: _Run, prefix: _Prefix, prefix_id: str, req, reference, args) -> dict:
    from engine_client.fidelity import compare_logits

    choose, extra = _chooser(run.sysdef, run.budget, run.runner, prefix_id, prefix, args)
    res = run.runner.reprefill(prefix_id, torch.as_tensor(req.suffix), run.cfg, choose=choose)
    top1, kl = compare_logits(reference, res.logits)
    periods = len(res.selected)
    return {
        "ttft_s": res.ttft_s,
        "io_wait_s": res.io_wait_s,
        "compute_s": res.compute_s,
        "select_s": res.select_s,
        "tokens_loaded": res.tokens_loaded / periods,
        "tokens_selected": extra.get("selected", res.tokens_loaded) / periods,
        "bytes_disk": res.bytes_read + extra.get("probe_bytes", 0),
        "bytes_useful": res.bytes_useful,
        "bytes_cpu": res.bytes_cpu,
        "bytes_gpu": res.bytes_gpu,
        "hit_units": res.units_cpu + res.units_gpu,
        "units": res.units_disk + res.units_cpu + res.units_gpu,
        "spec_used": res.spec_bytes_used,
        "spec_wasted": res.spec_bytes_wasted,
        "groups_covered": res.groups_covered / periods,
        "daemon_wait_s": res.daemon_wait_s,
        **_guess_recalls(res),
        "top1": float(top1),
        "kl": float(kl),
    }


SLOT = 64 << 10


def memory_split(geo, args) -> tuple[int, float]:
    """The daemon's memory: a CPU tier of ``memory_fraction`` of the stored bytes,
    plus a prefetch reserve of three periods' worth of a whole prefix (what a
    full-load request may hold at once), carved from the same arena.
    Returns ``(arena bytes, reserve fraction)``; identical for every system."""
    per_prefix = _extent_bytes(geo, args.prefix_tokens)
    tier = max(SLOT, int(args.memory_fraction * per_prefix * args.prefixes) // SLOT * SLOT)
    per_period = per_prefix * min(args.period_layers, geo.model.num_layers) // geo.model.num_layers
    reserve = -(-3 * per_period // SLOT) * SLOT
    return tier + reserve, reserve / (tier + reserve)


def _extent_bytes(geo, n: int) -> int:
    m = geo.model
    return m.num_layers * 2 * m.num_kv_heads * m.head_dim * m.numpy_dtype().itemsize * n


def _np_kv(kv: torch.Tensor) -> np.ndarray:
    from engine_client.client import as_numpy_kv

    return as_numpy_kv(kv)


def _chooser(sysdef: System, budget: float, runner, prefix_id: str, prefix: _Prefix, args):
    """The token-level baselines' per-period selection (None: the runner's own selector)."""
    extra: dict = {}
    if sysdef.selection in ("summary", "full"):
        return None, extra
    from engine_client.selection.tokens import impress_token_scores, select_blocks_for_tokens

    geo = runner.geometry
    extra["selected"] = 0
    extra["probe_bytes"] = 0

    def choose(period, l0, q, m):
        if sysdef.selection == "h2o":
            scores = prefix.h2o[period]
            mode = "cover"
        else:
            keys = runner.client.get_probe_keys(prefix_id, l0 // geo.period_layers)  # [Hkv, n, d], read from disk
            extra["probe_bytes"] += keys.nbytes
            from engine_client.client import to_torch

            scores = impress_token_scores(q, to_torch(np.ascontiguousarray(keys), geo.model.dtype).float())
            mode = "dense"
        blocks, tokens = select_blocks_for_tokens(scores, budget, block_tokens=sysdef.chunk_tokens, mode=mode)
        extra["selected"] += int(tokens.numel())
        return blocks

    return choose, extra


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


def _summarize(rows: list[dict], tier: dict) -> dict:
    def mean(k):
        return float(np.mean([r[k] for r in rows]))

    def mean_of(k):  # None when no request has it
        have = [r[k] for r in rows if k in r]
        return float(np.mean(have)) if have else None

    ttft = np.array([r["ttft_s"] for r in rows])
    units = sum(r["units"] for r in rows)
    return {
        "requests": len(rows),
        "ttft_mean_s": float(ttft.mean()),
        "ttft_p95_s": float(np.percentile(ttft, 95)),
        "io_wait_mean_s": mean("io_wait_s"),
        "compute_mean_s": mean("compute_s"),
        "select_mean_s": mean("select_s"),
        "tokens_loaded": mean("tokens_loaded"),
        "tokens_selected": mean("tokens_selected"),
        "bytes_disk": mean("bytes_disk"),
        "bytes_useful": mean("bytes_useful"),
        "read_amplification": mean("tokens_loaded") / mean("tokens_selected") if mean("tokens_selected") else None,
        "hit_rate": sum(r["hit_units"] for r in rows) / units if units else None,
        "cpu_hit_bytes": mean("bytes_cpu"),
        "gpu_hit_bytes": mean("bytes_gpu"),
        "spec_used_bytes": mean("spec_used"),
        "spec_wasted_bytes": mean("spec_wasted"),
        "groups_covered_per_period": mean("groups_covered"),
        "daemon_wait_mean_s": mean("daemon_wait_s"),
        "hint_recall": mean_of("hint_recall"),
        "prev_recall": mean_of("prev_recall"),
        "top1": mean("top1"),
        "kl": mean("kl"),
        **tier,
    }


def _ratios(systems: dict, budgets) -> dict:
    out = {}
    for b in budgets:
        ck = systems.get(f"contiguouskv@{b:g}")
        if ck is None:
            continue
        for other in ("impress", "as-h2o", "contiguouskv-noprefetch", "contiguouskv-sameset", "contiguouskv-lfu"):
            row = systems.get(f"{other}@{b:g}")
            if row:
                out[f"{other}/contiguouskv ttft @{b:g}"] = row["ttft_mean_s"] / ck["ttft_mean_s"]
                out[f"{other}/contiguouskv tokens @{b:g}"] = row["tokens_loaded"] / ck["tokens_loaded"]
        row = systems.get("as-lru@1")
        if row:
            out[f"as-lru/contiguouskv ttft @{b:g}"] = row["ttft_mean_s"] / ck["ttft_mean_s"]
        nop = systems.get(f"contiguouskv-noprefetch@{b:g}")
        if nop and nop["io_wait_mean_s"]:
            out[f"io wait contiguouskv/noprefetch @{b:g}"] = ck["io_wait_mean_s"] / nop["io_wait_mean_s"]
            same = systems.get(f"contiguouskv-sameset@{b:g}")
            if same:
                out[f"io wait contiguouskv-sameset/noprefetch @{b:g}"] = same["io_wait_mean_s"] / nop["io_wait_mean_s"]
    return out


def format_zipf_report(report: dict) -> str:
    w = report["workload"]
    p = report["params"]
    lines = [
        f"model {p['model']} ({p['dtype']}, {p['threads']} threads), chunk selector {p.get('selector', 'summary')}; {w['prefixes']} prefixes x {w['prefix_tokens']} tokens, "
        f"Zipf alpha {w['alpha']}, {w['requests']} requests timed after {w['warmup']} warm-up, suffix {w['suffix_tokens']} tokens; "
        f"CPU tier {w['memory_fraction']:.0%} of stored bytes, plus a prefetch reserve of 3 periods' extents carved from the same arena",
        f"{'system@budget':<28}{'TTFT ms':>9}{'P95 ms':>9}{'I/O ms':>8}{'comp ms':>9}{'tokens':>8}{'MB disk':>9}"
        f"{'ampl':>6}{'hit':>6}{'spec MB':>8}{'waste':>7}{'pushed':>7}{'top1':>6}{'KL':>8}",
    ]
    for name, r in report["systems"].items():
        lines.append(
            f"{name:<28}{r['ttft_mean_s'] * 1e3:>9.1f}{r['ttft_p95_s'] * 1e3:>9.1f}{r['io_wait_mean_s'] * 1e3:>8.1f}"
            f"{r['compute_mean_s'] * 1e3:>9.1f}{r['tokens_loaded']:>8.0f}{r['bytes_disk'] / 1e6:>9.2f}"
            f"{(r['read_amplification'] or 0):>6.2f}{(r['hit_rate'] or 0):>6.2f}{r['spec_used_bytes'] / 1e6:>8.2f}"
            f"{r['spec_wasted_bytes'] / 1e6:>7.2f}{r['groups_covered_per_period']:>7.2f}{r['top1']:>6.2f}{r['kl']:>8.4f}"
        )
    for key, value in report["ratios"].items():
        lines.append(f"{key} = {value:.2f}")
    return "\n".join(lines)


def check_zipf_args(args) -> None:
    if args.prefixes < 1 or args.requests < 1 or args.warmup < 0:
        raise BenchError("--prefixes and --requests must be positive, --warmup >= 0")
    if not 0 < args.memory_fraction <= 1:
        raise BenchError("--memory-fraction must be in (0, 1]")
