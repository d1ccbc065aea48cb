"""``kvstore-bench decode``: decoding from sparse, quantized KV served by the store, system by system.

    kvstore-bench decode --model smollm2-135m --context 4096,8192 --new-tokens 64 --budget-tokens 1024 \\
        [--tasks passkey,niah] [--examples 10] [--systems dense,quest,lserve,lserve-kv4,loopserve] [--json] [--plot PATH]

Every example's prefix is prefilled once and stored twice in one daemon on a
private socket: in the model's dtype, and quantized (``--kv-quant``, KIVI's
per-channel keys by default) for the ``-kv4``/``-kv8`` systems.  Each system
then answers the question through ``ModelRunner.generate``: the first token by
Re-Prefill, then ``--new-tokens`` greedy tokens (the end of sequence does not
stop it, so every system decodes as many).  The systems, each at the same
token budget per layer and KV head (``--budget-tokens``, as a fraction of the
prefix; sink and recent chunk included):

``dense``      every chunk loaded, decoding over all of them;
``quest``      every layer, every token, chunks ranked by their min/max key bound (Quest);
``lserve``     the same bound over 16-token logical pages fetched as 64-token physical pages, the
               choice reused for 4 tokens, streaming heads reading only the sink and recent rows;
``lserve-full-first``  ``lserve`` whose first token loads every chunk (LServe's dense prefill), the
               pages chosen from the first decoding step on;
``loopserve``  re-selected every 4 tokens from those tokens' queries against 4-bit keys;
any named system of ``engine_client.reprefill.systems`` (e.g. ``ckv+int4-probes``, which decodes
over the first token's sets; the old names, ``perlayer-follow-int4`` and the rest, until the
next release); ``NAME-kv4`` / ``NAME-kv8`` the same over the quantized copy; ``NAME@TOKENS``
the same at its own budget (e.g. ``ckv+int4-probes@1536``), so several budgets share one
prefill per example.

Reported per system (the order rotated per example), per context and task:
accuracy with its Wilson interval; time per output token and its attention
kernels' share; the K/V bytes each output token's attention reads from
memory (the rows each head may see, in the model's dtype - a masked head's
hidden rows are counted as not read, which is what a kernel skipping them
reads); the KV bytes the store delivered and read from disk per output
token (the first token's load and the chunks re-selection fetched, over all
tokens); the selector's time and re-selection's fetch time per output
token; and the bytes stored per prefix.  A system with streaming heads
(``lserve``...) reads a third copy stored in LServe's second layout: extents
without the streaming heads' rows, and their sink and recent rows as
per-prefix pages (``engine_client.stream_tail``), counted in its stored
bytes; ``--full-layout`` runs it over the full copy instead, masking.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from contextlib import ExitStack

import numpy as np

from .decode_report import add_vs_dense, format_decode, plot_decode, summarise_rows
from .eval_common import CHUNK_TOKENS, add_device_flag, bench_device, load_pretrained
from .io_jobs import BenchError, UsageError
from .plots import add_plot_flag, check_plot_path

DEFAULT_SYSTEMS = "dense,quest,lserve,lserve-kv4,loopserve,ckv+int4-probes"
QUANT_SUFFIXES = ("-kv4", "-kv8", "-kv4t", "-kv8t", "-kv4h", "-kv8h")
KV4_SCHEMES = ("kv4", "kv4t", "kv4h")  # what --kv-quant may name


def add_decode_parser(sub) -> None:
    from kvstore.cli_flags import add_alias

    p = sub.add_parser("decode", help="decoding from sparse, quantized KV: dense, Quest, LServe, LoopServe at one token budget")
    add_device_flag(p)
    p.add_argument("--model", default="smollm2-135m", help="a name from python -m kvstore_tools.models list")
    p.add_argument("--context", default="4096", help="prefix tokens, comma-separated (e.g. 4096,8192)")
    p.add_argument("--tasks", default="passkey,niah", help="real-text tasks, comma-separated (kvstore_tools.tasks.text)")
    p.add_argument("--examples", type=int, default=5, help="examples per task and context")
    p.add_argument("--stream", choices=("eval", "tune"), default="eval", help="seed stream of the examples")
    p.add_argument("--start", type=int, default=0, help="skip this many seeds of the stream")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated per answer (the first included)")
    p.add_argument("--budget-tokens", type=int, default=1024, help="prefix tokens each layer may attend to (sink and recent included)")
    p.add_argument("--systems", default=DEFAULT_SYSTEMS, help="comma-separated; NAME-kv4 runs NAME over the quantized copy")
    p.add_argument("--kv-quant", default="kv4", help="the quantized copy's scheme for NAME-kv4 (kv4 | kv4t | kv4h); -kv8 systems use kv8")
    p.add_argument("--streaming-heads", metavar="PATH", help="the streaming-heads file (default: the one next to the checkpoint)")
    p.add_argument(
        "--full-layout", action="store_true", help="streaming systems read the full layout and mask (default: the streaming layout)"
    )
    p.add_argument("--standin-layers", metavar="PATH", help="the stand-in layers file (default: the one next to the checkpoint)")
    p.add_argument("--data-dir", dest="directory", default="/tmp", help="where the daemon's store lives")
    add_alias(p, "--directory", "directory")  # older spelling
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--json", action="store_true")
    add_plot_flag(p, "bytes read per output token against accuracy")
    p.set_defaults(run=command_decode)


def parse_systems(text: str, kv_quant: str) -> list[tuple[str, str, str, int | None]]:
    """``[(name, selection system, stored scheme or "", budget tokens or None for --budget-tokens)]``;
    a one-line UsageError for anything unknown."""
    from engine_client.reprefill.systems import ALIASES, is_system, known_systems

    out = []
    for item in (s.strip() for s in text.split(",")):
        spec, budget = item, None
        if "@" in item:
            spec, _, tokens = item.rpartition("@")
            if not tokens.isdigit() or int(tokens) < 1:
                raise UsageError(f"--systems: {item!r}: the budget after @ must be a positive number of tokens")
            budget = int(tokens)
            if spec == "dense":
                raise UsageError(f"--systems: {item!r}: dense loads every chunk; it takes no budget")
        base, quant = spec, ""
        for suffix in QUANT_SUFFIXES:
            if spec.endswith(suffix):
                base, quant = spec[: -len(suffix)], suffix[1:]
                break
        if quant == "kv4":  # NAME-kv4 is --kv-quant's scheme; NAME-kv4t, NAME-kv4h name their own
            quant = kv_quant
        if base != "dense" and not is_system(base):
            raise UsageError(
                f"--systems: unknown system {item!r}; known: dense and named systems ({known_systems()}), each also as NAME-kv4, NAME-kv8, NAME-kv4h, ..."
            )
        if base in ALIASES:
            print(f"note: system {base!r} is now {ALIASES[base]!r}; the old name goes in the next release", file=sys.stderr)
        out.append((item, base, quant, budget))
    if len({n for n, *_ in out}) != len(out) or not out:
        raise UsageError(f"--systems {text!r}: name each system once")
    return out


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{flag} must be positive, got {text!r}")
    return values


def command_decode(args) -> int:
    if min(args.examples, args.new_tokens, args.budget_tokens, args.threads) < 1 or args.start < 0:
        raise UsageError("--examples, --new-tokens, --budget-tokens and --threads must be positive, --start at least 0")
    if args.kv_quant not in KV4_SCHEMES:
        raise UsageError(f"--kv-quant must be one of {', '.join(KV4_SCHEMES)}, got {args.kv_quant!r}")
    args.contexts = _ints(args.context, "--context")
    args.task_names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    from kvstore_tools.tasks.text import TASKS

    unknown = [t for t in args.task_names if t not in TASKS and not t.startswith("file:")]
    if unknown or not args.task_names:
        raise UsageError(f"--tasks: unknown task {unknown[0] if unknown else args.tasks!r}; known: {', '.join(TASKS)}, file:PATH")
    args.system_list = parse_systems(args.systems, args.kv_quant)
    check_plot_path(args.plot)
    report = run_decode(args)
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else format_decode(report))
    if args.plot:
        plot_decode(report, args.plot)
    return 0


def run_decode(args) -> dict:
    from engine_client.model import zoo
    from engine_client.model.streaming import ProfileError, StreamingHeads
    from kvstore_tools.tasks import text

    load_before = round(os.getloadavg()[0], 2)
    pm = load_pretrained(args.model, args.threads, bench_device(args))
    model = pm.decoder
    _refuse_on_sliding_windows(args, model)
    try:
        heads = StreamingHeads.load(args.streaming_heads, model=model) if args.streaming_heads else zoo.streaming_heads(pm)
    except (ProfileError, OSError, ValueError) as exc:
        heads = exc  # only an error when a streaming system runs
    args.standin_profile = None
    configs = [system_config(base) for _, base, *_ in args.system_list if base != "dense"]
    if any(cfg.uses_calibrated_layers for cfg in configs):
        try:
            args.standin_profile = zoo.standin_layers(model, pm.checkpoint_dir, args.standin_layers)
        except ProfileError as exc:
            if any(cfg.needs_calibrated_layers for cfg in configs):
                raise BenchError(str(exc)) from None
            print(f"note: {exc}; the systems run without stand-in rows", file=sys.stderr)
    cells = []
    for n in args.contexts:
        for task in args.task_names:
            try:
                examples = text.examples(task, pm.tokenizer, args.examples, n, stream=args.stream, start=args.start)
            except (KeyError, ValueError) as exc:
                raise UsageError(f"--tasks {task} --context {n}: {exc}") from None
            limit = pm.config.max_position_embeddings
            if any(ex.num_prefix_tokens + ex.suffix_tokens.size + args.new_tokens > limit for ex in examples):
                raise UsageError(f"--context {n} with --new-tokens {args.new_tokens}: longer than the model's {limit} positions")
            cells.append(_run_cell(args, pm, heads, task, n, examples))
    return {
        "model": args.model,
        "contexts": args.contexts,
        "tasks": args.task_names,
        "examples": args.examples,
        "stream": args.stream,
        "start": args.start,
        "new_tokens": args.new_tokens,
        "budget_tokens": args.budget_tokens,
        "kv_quant": args.kv_quant,
        "threads": args.threads,
        "dtype": str(model.dtype).removeprefix("torch."),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, CPU only",
        "load_average_1min_before": load_before,
        **(
            {"streaming_heads": {"fraction": heads.fraction, "sink": heads.sink_tokens, "recent": heads.recent_tokens}}
            if not isinstance(heads, Exception)
            else {}
        ),
        **({"standin_layers": list(args.standin_profile.layers)} if args.standin_profile else {}),
        "cells": cells,
    }


def _refuse_on_sliding_windows(args, model) -> None:
    """Before any prefill, one line for a system a model with sliding-window layers cannot run: re-selecting while
    decoding (Quest, LServe, LoopServe) and streaming heads (LServe) are not supported there; dense and the
    systems that select once at the Re-Prefill are."""
    if not model.config.sliding_layers:
        return
    for name, base, *_ in args.system_list:
        if base == "dense":
            continue
        cfg = system_config(base)
        what = "streaming heads" if cfg.attention.streaming else "re-selecting while decoding" if cfg.decode.reselect_every else ""
        if what:
            raise BenchError(
                f"--systems {name}: {what} is not supported on a model with sliding-window layers ({args.model}); "
                "dense and systems that select once (e.g. ckv+int4-probes) run on it"
            )


def _run_cell(args, pm, heads, task: str, n: int, examples) -> dict:
    """One context x task: every example through every system, one daemon."""
    import torch

    from engine_client.prefill import chunked_prefill
    from engine_client.reprefill import ModelRunner, parse_system
    from kvstore.progress import bar as progress_bar

    from .daemon_io import private_daemon_client

    model = pm.decoder
    systems = args.system_list
    streams = any(base != "dense" and system_config(base).attention.streaming for _, base, *_ in systems)
    if streams and isinstance(heads, Exception):
        raise BenchError(f"a streaming system needs the model's streaming heads: {heads}")
    rows: dict[str, list[dict]] = {name: [] for name, *_ in systems}
    itemsize = torch.empty(0, dtype=model.dtype).element_size()
    row_bytes = 2 * model.config.head_dim * itemsize  # one K and one V vector of one head
    with ExitStack() as stack:
        # dense reads a whole layer per Period: the arena's stream reserve (a quarter) holds the
        # layers in flight (max_periods_ahead = 2, plus the one being computed) with room to spare
        layer_bytes = n * model.config.num_key_value_heads * row_bytes
        arena_bytes = max(256 << 20, -(-32 * layer_bytes // (1 << 20)) << 20)
        client = private_daemon_client(args.directory, "decode-store-", stack, ("--shm-arena-bytes", str(arena_bytes)))
        runners = {}
        for key in {_copy(args, base, quant) for _, base, quant, _ in systems}:
            runners[key] = ModelRunner(
                model,
                client,
                chunk_tokens=CHUNK_TOKENS,
                group_layers=1,
                probe_bits=0,  # the client quantizes probe keys: one stored copy serves every system
                streaming_heads=None if isinstance(heads, Exception) else heads,
                standin_layers=args.standin_profile,
                kv_quant=key[0],
                streaming_layout=key[1],
            )
        bar = progress_bar(len(examples) * len(systems), f"{task}@{n}", unit="answer")
        for i, ex in enumerate(examples):
            _, kv = chunked_prefill(model, torch.from_numpy(ex.prefix_tokens))
            handles = {q: r.store_prefix(ex.prefix_tokens, kv=kv) for q, r in runners.items()}
            del kv
            for name, base, quant, budget in systems[i % len(systems) :] + systems[: i % len(systems)]:
                fraction = min(1.0, (budget or args.budget_tokens) / ex.num_prefix_tokens)
                if base == "dense":
                    cfg = parse_system("full").replace(budget=1.0, period_layers=1)
                else:
                    cfg = system_config(base).replace(budget=fraction)
                runner = runners[_copy(args, base, quant)]
                resident = runner.resident_bytes()
                model.attention_s = 0.0
                try:
                    gen = runner.generate(
                        handles[_copy(args, base, quant)].prefix_id,
                        ex.suffix_tokens,
                        cfg,
                        args.new_tokens,
                        tokenizer=pm.tokenizer,
                        eos_token_ids=(),
                    )
                finally:
                    model.attention_s = None
                rows[name].append(_row(ex, gen, runner, resident, row_bytes))
                bar.update(1)
            for key, runner in runners.items():  # a 100-example run would keep 30 GB of 4k prefixes
                runner.forget(handles[key].prefix_id)
                client.delete(handles[key].prefix_id)
                if handles[key].tail_batch_id:  # the streaming layout's tail pages
                    client.delete(handles[key].tail_batch_id)
        bar.close()
    return _cell_report(task, n, examples, systems, rows, {name: runners[_copy(args, base, q)] for name, base, q, _ in systems}, heads)


def _copy(args, base: str, quant: str) -> tuple[str, bool]:
    """Which stored copy a system reads: (kv_quant, streaming layout)."""
    return quant, bool(base != "dense" and system_config(base).attention.streaming and not args.full_layout)


def system_config(base: str):
    """The ``ReprefillConfig`` a named system stands for (old names too: ``parse_systems`` noted them)."""
    import warnings

    from engine_client.reprefill import parse_system

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return parse_system(base)


def _row(ex, gen, runner, resident_before: int, row_bytes: int) -> dict:
    res, st = gen.reprefill, gen.reselect
    tokens = len(gen.tokens)
    decode_steps = max(1, len(gen.step_s))
    delivered = res.bytes_useful + (st.bytes_fetched if st else 0)
    disk = res.bytes_read + (st.bytes_read if st else 0)
    select_s = res.select_s + (st.select_s if st else 0.0)
    return {
        "seed": ex.seed,
        "correct": ex.is_correct(gen.text),
        "text": gen.text,
        "depth": ex.depth,
        "prefix_tokens": ex.num_prefix_tokens,
        "suffix_tokens": int(ex.suffix_tokens.size),
        "tokens": tokens,
        "ttft_s": gen.ttft_s,
        "per_token_s": float(np.mean(gen.step_s)) if gen.step_s else 0.0,
        "attention_per_token_s": (gen.decode_attention_s or 0.0) / decode_steps,
        "memory_bytes_per_token": float(np.mean(gen.step_kv_rows)) * row_bytes if gen.step_kv_rows else 0.0,
        "store_bytes_per_token": delivered / tokens,
        "disk_bytes_per_token": disk / tokens,
        "first_token_bytes": res.bytes_useful,
        "decode_bytes": st.bytes_fetched if st else 0,
        "select_per_token_s": select_s / tokens,
        "fetch_per_token_s": (st.fetch_s if st else 0.0) / tokens,  # re-selection's reads while decoding
        "kv_fraction": res.kv_fraction,
        "prefill_density": 1.0 if gen.prefill_density is None else gen.prefill_density,  # share of the suffix's causal cells
        "resident_bytes": runner.resident_bytes() - resident_before,
        "sets_changed": st.sets_changed if st else 0,
    }


def _cell_report(task, n, examples, systems, rows, runners, heads) -> dict:
    """``runners``: each system's, by name."""
    from engine_client.stream_tail import tail_bytes

    out = {"task": task, "context": n, "examples": len(examples), "seeds": [examples[0].seed, examples[-1].seed], "systems": {}}
    tokens = int(np.mean([ex.num_prefix_tokens for ex in examples]))
    for name, base, quant, budget in systems:
        rs = rows[name]
        s = summarise_rows(rs)
        geo = runners[name].geometry
        s["stored_bytes"] = geo.kv_bytes(tokens)
        s["stored_layout"] = "streaming" if geo.streaming_heads else "full"
        if geo.streaming_heads:  # the tail pages: the left-out heads' sink and recent rows, the model's dtype
            s["stored_tail_bytes"] = tail_bytes(geo, heads.sink_tokens, heads.recent_tokens)
            s["stored_bytes"] += s["stored_tail_bytes"]
        m = geo.model  # the same KV in bfloat16: the reference the storage target is stated against
        s["stored_vs_bf16"] = tokens * m.num_layers * 2 * m.num_kv_heads * m.head_dim * 2 / s["stored_bytes"]
        s["kv_quant"] = quant or None
        if budget:
            s["budget_tokens"] = budget
        s["rows"] = rs
        out["systems"][name] = s
    add_vs_dense(out["systems"])
    if not isinstance(heads, Exception):
        out["streaming_layout_fraction"] = heads.stored_fraction(tokens)
    return out
