"""``kvstore-bench restore``: bringing back an inactive conversation's KV, every way side by side, with its answer.

    kvstore-bench restore --model smollm2-135m --task multiturn --tokens 2048 --examples 20 \\
        [--workload fixed|sharegpt] [--kv-quant kv8] [--stream eval] [--threads 2] [--json]

Each example is a conversation of the real-text ``multiturn`` task: the
earlier turns (the needle in one of them) are the stored history, the last
user turn (the question) is the new input; ``--tokens`` long, or with
``--workload sharegpt`` as long as the returns to inactive conversations of
a ShareGPT-shaped trace (``sharegpt_lengths``, capped at ``--tokens``).  The
history is prefilled once, an ``AttentionEstimator`` fed by that prefill,
and stored in a daemon started for the run as a worker leaves a
conversation: its history put and recorded as a turn (``AppendTurn``), then
marked inactive (``MarkInactive``) with its KV quantized (``--kv-quant``)
as the compressed form and the estimator's statistics as its strategy
(``krul.record_strategy`` at ``--gamma`` / ``--ratio``).  Then per
conversation, in one interleaved run, each system looks the conversation up
(``GetConversation``: which prefix holds which form) and restores it:

* ``recompute``: the history's KV recomputed from its tokens;
* ``load``: every chunk of the stored history loaded (uncompressed);
* ``load-<q>``: every chunk of the quantized history loaded and dequantized;
* ``krul-<q>``: Krul's restoration of the quantized history: each layer
  recomputes its first chunks while the rest loads, counts from
  ``plan_restore`` (pyramid) on this machine's measured profile;
* ``krul-<q>-uniform``: the ablation, the same count for every layer;

each followed by the new turn's prefill over the restored KV and greedy
decoding (the answer).  Restores go through ``engine_client.krul.restoration``
(one code path, plans of all-recompute and all-load included); reads come
from disk (O_DIRECT, no CPU tier: an inactive conversation is not in memory).
Two storage baselines are evaluated in process, for accuracy and stored
bytes only (no stored format of theirs exists): ``minicache`` (MiniCache's
fixed pairs: adjacent layers of the latter half, SLERP-merged,
``engine_client.krul.merge``) and ``h2o`` (the history's tokens with the
most accumulated attention kept, sink and recent included, at the
quantized form's storage).

Reported per system: TTFT (restore + the new turn's prefill) mean and P95,
each as a ratio to ``krul-<q>``; restore time split into recompute, load,
recompute idle for loads and loader idle (bubbles); bytes stored and
loaded; accuracy with its Wilson interval; the first answer token's
agreement with ``load`` (uncompressed restoration); with ``sharegpt``,
TTFT per bin of history length.  The measured profile and the chosen
recompute share ``r_c`` are printed, and the estimator's time per history.
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack

import numpy as np
import torch

from kvstore.cli_flags import add_alias
from kvstore.contract.kvquant import KV_QUANT

from .eval_common import add_device_flag, bench_device, check_strategy_flags, load_pretrained
from .io_jobs import BenchError
from .restore_report import format_restore, make_report

QUANT = tuple(KV_QUANT)
SINK_TOKENS, RECENT_TOKENS = 16, 64
MIN_SHAREGPT_TOKENS = 256  # a return shorter than this is floored to it (a multiturn conversation needs a few turns)


def add_restore_parser(sub) -> None:
    p = sub.add_parser("restore", help="restore an inactive conversation: recompute, load, Krul; TTFT, bytes and accuracy")
    add_device_flag(p)
    p.add_argument("--model", default="smollm2-135m", help="a name from python -m kvstore_tools.models list")
    p.add_argument("--task", default="multiturn", help="a real-text task (kvstore_tools.tasks.text); multiturn by default")
    p.add_argument("--tokens", type=int, default=2048, help="tokens of each conversation (history + new turn)")
    p.add_argument("--examples", type=int, default=20, help="conversations")
    p.add_argument(
        "--workload",
        choices=("fixed", "sharegpt"),
        default="fixed",
        help="fixed: every conversation --tokens long; sharegpt: the lengths of returns in a ShareGPT-shaped trace, capped at --tokens",
    )
    p.add_argument("--stream", choices=("eval", "tune"), default="eval", help="seed stream of the examples")
    p.add_argument("--start", type=int, default=0, help="first seed's offset in the stream")
    p.add_argument("--kv-quant", choices=QUANT, default="kv8", help="the compressed form's quantization (kvstore.contract.kvquant)")
    p.add_argument("--group-layers", type=int, default=4, help="layers per stored group (a load is one call per group)")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--max-new-tokens", type=int, default=0, help="tokens to decode (default: the task's)")
    p.add_argument("--gamma", type=float, default=0.6, help="the recorded strategy's input-sensitivity threshold")
    p.add_argument("--ratio", type=float, default=0.5, help="the recorded strategy's share of paired layers")
    p.add_argument("--no-baselines", dest="baselines", action="store_false", help="skip the in-process minicache and h2o rows")
    p.add_argument(
        "--paper-profile",
        default="h100",
        help="an accelerator profile (engine_client.compute_model: h100, a100, a800, custom:...) to plan the same restore for on paper",
    )
    p.add_argument(
        "--paper-load-gbps", type=float, default=6.0, help="storage read rate of that host, GB/s (an assumption: one NVMe drive)"
    )
    p.add_argument("--data-dir", dest="directory", default=".kvstore/bench", help="where the run's store lives (removed after)")
    add_alias(p, "--directory", "directory")  # older spelling
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=command_restore)


def command_restore(args) -> int:
    if min(args.tokens, args.examples, args.threads, args.group_layers) < 1:
        raise BenchError("--tokens, --examples, --threads and --group-layers must be positive")
    from engine_client.compute_model import parse_profile

    try:
        args.paper = parse_profile(args.paper_profile)
    except ValueError as exc:
        raise BenchError(f"--paper-profile: {exc}") from None
    check_strategy_flags(args)
    if not args.paper_load_gbps > 0:
        raise BenchError("--paper-load-gbps must be positive")
    report = run_restore(args)
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else format_restore(report))
    return 0


def sharegpt_lengths(args) -> list[int]:
    """Tokens of ``--examples`` returns to an inactive conversation (history + the new input), in trace order.

    From ``workloads.conversation_trace`` (the ShareGPT shape Krul quotes:
    outputs ~6.5x the inputs), seeded by the stream and ``--start``: every
    turn after the first is a return; its length is capped at ``--tokens``
    (the model's reach on this machine) and floored at ``MIN_SHAREGPT_TOKENS``.
    """
    from kvstore_tools.tasks.text import seeds
    from kvstore_tools.workloads import conversation_trace

    seed = seeds(1, args.stream, args.start)[0]
    out: list[int] = []
    conversations = args.examples
    while len(out) < args.examples:  # a trace long enough to hold that many returns
        events = conversation_trace(conversations, seed=seed)
        out = [min(args.tokens, max(MIN_SHAREGPT_TOKENS, e.history_tokens + e.input_tokens)) for e in events if e.turn > 0]
        conversations *= 2
    return out[: args.examples]


def run_restore(args) -> dict:
    from kvstore.progress import progress
    from kvstore_tools.tasks import text

    from .daemon_io import private_daemon_client

    pm = load_pretrained(args.model, args.threads, bench_device(args))
    lengths = sharegpt_lengths(args) if args.workload == "sharegpt" else [args.tokens] * args.examples
    try:  # one example per length, seeds in order from --start (a held-out stream by default)
        examples = [
            text.examples(args.task, pm.tokenizer, 1, n, stream=args.stream, start=args.start + i)[0] for i, n in enumerate(lengths)
        ]
    except (KeyError, ValueError) as exc:
        raise BenchError(f"--task {args.task} --tokens {args.tokens}: {exc}") from None
    rows: dict[str, list[dict]] = {}
    with ExitStack() as stack:
        flags = ("--prefetch-reserve-fraction", "1", "--shm-arena-bytes", str(512 << 20))
        client = private_daemon_client(args.directory, "restore-store-", stack, flags)
        profile = None
        started = time.perf_counter()
        for i, ex in enumerate(progress(examples, "conversations", total=len(examples), unit="conv")):
            profile, per = _one_conversation(pm, client, ex, args, profile, warm=i == 0)
            for name, row in per.items():
                rows.setdefault(name, []).append(row)
        seconds = time.perf_counter() - started
    return make_report(args, pm, examples, rows, profile, seconds)


def _one_conversation(pm, client, ex, args, profile, *, warm: bool):
    from engine_client.generation import dense_generate
    from engine_client.krul import (
        AttentionEstimator,
        bytes_per_token_layer,
        choose_strategy,
        make_plan,
        measure_profile,
        plan_restore,
        recompute_flops,
        record_strategy,
        restore_kv,
    )
    from engine_client.krul.pyramid import RestoreCosts
    from engine_client.prefill import prefill_with_attention
    from engine_client.runner import model_geometry

    model, tok = pm.decoder, pm.tokenizer
    q = args.kv_quant
    history = torch.as_tensor(ex.prefix_tokens, dtype=torch.long)
    turn = torch.as_tensor(ex.suffix_tokens, dtype=torch.long)
    n, num_layers = history.numel(), model.num_layers
    max_new = args.max_new_tokens or int(ex.meta.get("max_new_tokens", 16))
    with AttentionEstimator(model) as estimator:  # the worker's sketch of the conversation, fed by its own prefill
        _, kv, mass = prefill_with_attention(model, history, range(num_layers) if args.baselines else (), observe=estimator.observe)
        t0 = time.perf_counter()
        stats = estimator.stats()
        estimator_row = {"estimator_wait_s": time.perf_counter() - t0, "estimator_busy_s": estimator.busy_s}
    selected = choose_strategy(stats, gamma=args.gamma, ratio=args.ratio)
    plain = model_geometry(model, group_layers=args.group_layers)
    quant = model_geometry(model, group_layers=args.group_layers, kv_quant=q)
    # the conversation as a worker leaves it: its history stored and recorded as a turn, then marked
    # inactive with the quantized history as its compressed form
    conv = f"bench-{args.stream}-{ex.seed}"
    client.append_turn(conv, 0, client.put_prefix(history.numpy(), kv, plain).prefix_id)
    compressed = client.put_prefix(history.numpy(), kv, quant).prefix_id
    # what the record keeps: how to restore the compressed form, and the statistics a later compression starts from
    # (the selector's pairs are not merged: "Restoring a conversation" in the README says why)
    strategy = record_strategy(stats, selected, kv_quant=q, restore="pyramid", group_layers=args.group_layers, merge="none")
    client.mark_inactive(conv, compressed_prefix_id=compressed, format=q, strategy=strategy)
    if profile is None:
        profile = measure_profile(model, client, compressed, history, quant)
    f, f_att = recompute_flops(model.config)
    c = plain.chunk_tokens

    def plan_for(geo, shape=None, counts=None):
        per = bytes_per_token_layer(geo, n)
        if counts is not None:
            return make_plan(RestoreCosts(n, f, f_att, (per,) * num_layers, profile), counts, "given")
        return plan_restore(
            num_layers, n, recompute_flops_per_token_layer=f, attention_flops_per_token_pair=f_att,
            bytes_per_token_layer=per, profile=profile, shape=shape, step_tokens=c,
        )  # fmt: skip

    runs = {  # name: (geometry, read the compressed form, plan)
        "recompute": (plain, False, plan_for(plain, counts=[n] * num_layers)),
        "load": (plain, False, plan_for(plain, counts=[0] * num_layers)),
        f"load-{q}": (quant, True, plan_for(quant, counts=[0] * num_layers)),
        f"krul-{q}": (quant, True, plan_for(quant, "pyramid")),
        f"krul-{q}-uniform": (quant, True, plan_for(quant, "uniform")),
    }

    def restore(geo, from_compressed, plan):
        t0 = time.perf_counter()
        info = client.get_conversation(conv)  # which prefixes hold it: the worker's first step
        pid = info.compressed.prefix_id if from_compressed else info.turns[-1].prefix_id
        record_s = time.perf_counter() - t0
        restored, t = restore_kv(model, client, pid, history, geo, plan)
        return restored, t, record_s, info.compressed_bytes if from_compressed else info.uncompressed_bytes

    if warm:  # the first restore of a run pays for kernel and page warm-up: once per system, untimed
        for run in runs.values():
            restore(*run)
    out, reference = {}, None
    for name, (geo, from_compressed, plan) in runs.items():
        restored, t, record_s, stored_bytes = restore(geo, from_compressed, plan)
        gen = dense_generate(model, history, turn, max_new, tokenizer=tok, prefix_kv=restored)
        if name == "load":
            reference = gen
        out[name] = {
            "seed": ex.seed,
            "history_tokens": ex.num_prefix_tokens,
            "correct": bool(ex.is_correct(gen.text)),
            "text": gen.text,
            "first_token": int(gen.tokens[0]) if gen.tokens else -1,
            "ttft_s": record_s + t.total_s + gen.ttft_s,
            "restore_s": record_s + t.total_s,
            "record_s": record_s,
            "recompute_s": t.recompute_s,
            "load_s": t.load_s,
            "compute_wait_s": t.compute_wait_s,
            "load_idle_s": t.load_idle_s,
            "bytes_loaded": t.bytes_useful,
            "bytes_stored": stored_bytes,  # as the conversation record counts it
            "r_c": plan.r_c,
            "recompute_tokens": list(plan.recompute_tokens),
        }
    for row in out.values():
        row["first_token_agrees"] = row["first_token"] == out["load"]["first_token"]
    out[f"krul-{q}"].update(estimator_row, non_ir=len(selected.non_ir), pairs=[list(p) for p in selected.pairs])
    if args.baselines:
        out.update(_baselines(model, tok, ex, history, turn, kv, mass, max_new, plain, quant, reference))
    return profile, out


def _baselines(model, tok, ex, history, turn, kv, mass, max_new, plain, quant, reference) -> dict:
    """In-process accuracy rows of MiniCache's fixed pairs and of H2O eviction at the quantized form's storage."""
    from engine_client.generation import dense_generate
    from engine_client.krul import merge_pair, restore
    from engine_client.selection.tokens import storage_order

    n, num_layers = history.numel(), model.num_layers
    raw = plain.kv_bytes(n)
    merged_kv, stored, angles = kv.clone(), raw, []
    for a in range(num_layers // 2, num_layers - 1, 2):  # adjacent pairs of the latter half
        pair = merge_pair(kv[a], kv[a + 1], retain_threshold=np.pi)  # every token merged: MiniCache's fixed compression
        merged_kv[a], merged_kv[a + 1] = restore(pair)
        stored += pair.nbytes - pair.raw_nbytes
        cos = torch.nn.functional.cosine_similarity(kv[a].double(), kv[a + 1].double(), dim=-1)  # [2, H, n]
        angles.append(torch.arccos(cos.clamp(-1, 1)).median().item())
    keep = max(SINK_TOKENS + RECENT_TOKENS, round(n * quant.kv_bytes(n) / raw))
    order = storage_order(mass.sum(dim=0), sink_tokens=SINK_TOKENS, local_tokens=RECENT_TOKENS)
    keep_rows = torch.sort(order[: min(keep, n)]).values
    out = {}
    for name, kw, nbytes in (
        ("minicache", {"prefix_kv": merged_kv}, stored),
        ("h2o", {"prefix_kv": kv, "keep_rows": keep_rows}, raw * keep_rows.numel() / n),
    ):
        gen = dense_generate(model, history, turn, max_new, tokenizer=tok, **kw)
        out[name] = {
            "seed": ex.seed,
            "history_tokens": ex.num_prefix_tokens,
            "correct": bool(ex.is_correct(gen.text)),
            "text": gen.text,
            "first_token_agrees": bool(gen.tokens[:1] == reference.tokens[:1]),
            "bytes_stored": int(nbytes),
            **({"pair_angle_median_rad": float(np.median(angles))} if name == "minicache" else {}),
        }
    return out
