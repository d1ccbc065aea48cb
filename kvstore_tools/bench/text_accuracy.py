"""``kvstore-bench accuracy --model NAME``: greedy-decoded answers of a pretrained model on real-text tasks.

    kvstore-bench accuracy --model smollm2-135m --task passkey|niah|...|file:PATH --tokens N
                           --path full|drop-needle|full-streaming|SELECTOR@BUDGET[,PATH...] [--examples N] [--json]

Paths (several, comma-separated, share each example's prefill and store):

``full``            dense prefill of the prefix, the suffix over all its rows, greedy decoding (in process);
``drop-needle``     the same without the 16-token chunks that overlap the needle(s): the answer must
                    then be lost, which shows it is read from the needle;
``sparse-prefill@ALPHA`` the full KV; each layer's suffix prefill attends through the vertical and
                    slash lines covering ALPHA of its last 16 queries' attention (LoopServe,
                    ``engine_client.sparse_prefill``);
``full-streaming``  the full KV for retrieval heads, only the sink and recent rows for the model's
                    streaming heads (LServe; ``python -m kvstore_tools.models calibrate-heads NAME`` makes
                    the classification, ``engine_client.model.streaming``), first token and decoding;
``SELECTOR@BUDGET`` Re-Prefill through a real daemon on a private socket: ``store_prefix`` then
                    ``ModelRunner.generate`` (the suffix over the chunks each Period selects, then
                    decoding over them).

``--store-probe-bits 4|8`` stores each prefix's probe keys quantized
(``StoreGeometry.probe_bits``): exact paths at that width read them as
stored, and ``probe_bytes`` counts the packed rows.  ``--store-kv-quant
kv8|kv4|kv8t|kv4t`` stores each prefix's KV quantized (``kvstore.contract.kvquant``):
every daemon path then reads it dequantized (``exact@1.0`` is the full KV as
stored), while ``full`` stays the unquantized reference.

An example is correct when the decoded text holds an accepted answer (numbers
as whole numbers).  Examples use the evaluation seeds (from 1_000_000 on,
``--start`` offsets them); accuracy comes with its Wilson 95% interval.  Per
example: the needle's depth, for ``full`` the answer's margins (teacher-forced,
each token of the first accepted answer after a space: its logit minus the best
other token's, ``generation.answer_margins``; the small ones are the close calls
a sparse path can tip), and for Re-Prefill, the fraction of the needle's chunks
each Period loaded.
"""

from __future__ import annotations

import time
from contextlib import ExitStack

import numpy as np
import torch

from kvstore.progress import bar as progress_bar
from kvstore.progress import progress

from .eval_common import CHUNK_TOKENS, DEFAULT_BUDGET, budget_fraction, is_path_system, keep_rows_without, path_config, wilson_interval

# paths computed densely in process: the full KV, without the needle's chunks, LServe's streaming heads
DENSE_PATHS = ("full", "drop-needle", "full-streaming")
# sparse-prefill@ALPHA: the full KV, the suffix's prefill through LoopServe's lines covering ALPHA
SPARSE_PREFILL = "sparse-prefill"


def parse_paths(text: str | None) -> list[tuple[str, str, float]]:
    """``full``, ``drop-needle`` or ``SYSTEM@BUDGET``, comma-separated -> ``[(name, system, budget)]``;
    None: the default system at 5%."""
    if text is None:
        from engine_client.reprefill import DEFAULT_SYSTEM

        text = f"{DEFAULT_SYSTEM}@{DEFAULT_BUDGET:g}"
    out = []
    for item in text.split(","):
        item = item.strip()
        if item in DENSE_PATHS:
            out.append((item, "", 1.0))
            continue
        selector, sep, budget = item.partition("@")
        if selector == SPARSE_PREFILL and sep:
            value = budget_fraction(budget, item)
            out.append((f"{selector}@{value:g}", selector, value))
            continue
        if not sep or not is_path_system(selector):
            from engine_client.reprefill.systems import known_systems

            raise ValueError(
                f"path must be full, drop-needle, full-streaming, sparse-prefill@ALPHA or SYSTEM@BUDGET with SYSTEM a selector "
                f"(summary, exact, recent) or a named system ({known_systems()}); got {item!r}"
            )
        value = budget_fraction(budget, item)
        out.append((f"{selector}@{value:g}", selector, value))
    if len({name for name, _, _ in out}) != len(out):
        raise ValueError(f"path {text!r} names a path twice")
    return out


def path_configs(paths, period_layers: int) -> dict:
    """``{path name: ReprefillConfig}`` of the Re-Prefill paths (``eval_common.path_config``)."""
    return {name: path_config(sel, budget, period_layers) for name, sel, budget in paths if sel and sel != SPARSE_PREFILL}


def default_group_layers(configs) -> int:
    """The stored group when ``--group-layers`` is not given: the largest of 4, 2 and 1 that divides every path's Period."""
    return next(g for g in (4, 2, 1) if all(cfg.schedule.period_layers % g == 0 for cfg in configs))


def check_store_probe_bits(paths, store_bits: int, period_layers: int) -> None:
    """A store keeping probe keys quantized serves exact paths of that width only (``ModelRunner.check_request``)."""
    if not store_bits:
        return
    for name, cfg in path_configs(paths, period_layers).items():
        bits = cfg.selection.probe_bits  # "auto" is the model's width: the runner checks it per request
        if cfg.selection.selector == "exact" and bits not in (store_bits, "auto"):
            raise ValueError(
                f"--store-probe-bits {store_bits}: path {name} scores with probe_bits={bits}; exact paths need probe_bits={store_bits}"
            )


def needle_loaded(needle_chunks: np.ndarray, selected) -> list[float]:
    """Per Period: the fraction of the needle's chunks among the chunks it loaded."""
    if needle_chunks.size == 0:
        return []
    want = set(needle_chunks.tolist())
    return [len(want & set(sel.tolist())) / len(want) for sel in selected]


def evaluate(model, tokenizer, examples, paths, args) -> dict[str, list[dict]]:
    """Rows per path name, one per example, in example order."""
    from engine_client.generation import answer_margins, dense_generate

    reprefill = [p for p in paths if p[1] and p[1] != SPARSE_PREFILL]
    configs = path_configs(paths, args.period_layers)
    rows: dict[str, list[dict]] = {name: [] for name, _, _ in paths}
    bar = progress_bar(len(examples) * len(paths), f"{args.task}@{args.tokens}", unit="answer")
    with ExitStack() as stack:
        runner = _runner(model, args, stack) if reprefill else None
        for ex in examples:
            base = {
                "seed": ex.seed,
                "depth": ex.depth,
                "prefix_tokens": ex.num_prefix_tokens,
                "needle_spans": [list(span) for span in ex.needle_spans],
                "needle_chunks": ex.needle_chunks(_chunk_tokens(args)).tolist(),
                "answers": list(ex.answers),
            }
            kv = None
            if any(name in DENSE_PATHS or sel == SPARSE_PREFILL for name, sel, _ in paths):
                from engine_client.prefill import chunked_prefill

                _, kv = chunked_prefill(model, torch.from_numpy(ex.prefix_tokens), progress=progress)
            handle = runner.store_prefix(ex.prefix_tokens, progress=progress) if runner else None
            for name, selector, budget in paths:
                if name in DENSE_PATHS or selector == SPARSE_PREFILL:
                    ct = _chunk_tokens(args)
                    keep = keep_rows_without(ex.num_prefix_tokens, ex.needle_chunks(ct), ct) if name == "drop-needle" else None
                    streaming = args.streaming_heads if name == "full-streaming" else None
                    gen = dense_generate(
                        model,
                        ex.prefix_tokens,
                        ex.suffix_tokens,
                        _max_new(ex, args),
                        tokenizer=tokenizer,
                        keep_rows=keep,
                        prefix_kv=kv,
                        streaming=streaming,
                        sparse_prefill=budget if selector == SPARSE_PREFILL else None,
                    )
                    extra = {} if streaming is None else {"stored_kv_fraction": streaming.stored_fraction(ex.num_prefix_tokens)}
                    if name == "full":  # how close the full KV came to another answer: what sparse paths can tip
                        margins = answer_margins(model, kv, ex.suffix_tokens, _answer_tokens(tokenizer, ex))
                        extra["answer_margins"] = [round(x, 3) for x in margins]
                    if gen.prefill_density is not None:
                        extra["prefill_density"] = gen.prefill_density
                else:
                    cfg = configs[name]
                    resident = runner.resident_bytes()
                    gen = runner.generate(handle.prefix_id, ex.suffix_tokens, cfg, _max_new(ex, args), tokenizer=tokenizer)
                    forced_margins = None
                    if getattr(args, "margins", False) and not cfg.decode.reselect_every:  # a second Re-Prefill, teacher-forced
                        forced = _answer_tokens(tokenizer, ex)
                        forced_margins = runner.generate(handle.prefix_id, ex.suffix_tokens, cfg, forced=forced).answer_margins
                    resident = runner.resident_bytes() - resident  # client state this prefix added (summaries, quantized probes)
                    res = gen.reprefill
                    extra = {
                        "needle_loaded": needle_loaded(ex.needle_chunks(_chunk_tokens(args)), res.selected),
                        "tokens_loaded": res.tokens_loaded,
                        "bytes_read": res.bytes_read,
                        "kv_fraction": res.kv_fraction,
                        # what selection itself read: probe keys (exact scores) and client state (summaries)
                        "probe_bytes": res.probe_bytes,
                        "state_bytes_fetched": res.state_bytes_fetched,
                        "resident_bytes": resident,
                        "standin_rows": res.standin_rows,  # prefix rows attended through stand-ins (standin_layers)
                    }
                    if forced_margins is not None:
                        extra["answer_margins"] = [round(x, 3) for x in forced_margins]
                    if gen.reselect is not None:  # re-selection while decoding (reselect_every): what it read and cost
                        st = gen.reselect
                        extra["decode_bytes_read"] = st.bytes_read
                        extra["decode_bytes_fetched"] = st.bytes_fetched
                        extra["decode_chunks_fetched"] = st.chunks_fetched
                        extra["decode_sets_changed"] = st.sets_changed
                        extra["decode_select_s"] = st.select_s
                        extra["decode_fetch_s"] = st.fetch_s
                rows[name].append(
                    {
                        **base,
                        "correct": ex.is_correct(gen.text),
                        "text": gen.text,
                        "ttft_s": gen.ttft_s,
                        "decode_s": sum(gen.step_s),
                        "new_tokens": len(gen.tokens),
                        **extra,
                    }
                )
                bar.update(1)
    bar.close()
    return rows


def _answer_tokens(tokenizer, ex) -> list[int]:
    """The first accepted answer as the model would write it: after a space (the prompts end before it)."""
    return tokenizer.encode(" " + ex.answers[0])


def _chunk_tokens(args) -> int:
    return getattr(args, "chunk_tokens", None) or CHUNK_TOKENS


def _max_new(ex, args) -> int:
    return args.max_new_tokens or int(ex.meta.get("max_new_tokens", 16))


def _runner(model, args, stack: ExitStack):
    """A ModelRunner on a fresh daemon in a private directory, torn down by ``stack``."""
    from engine_client.reprefill import ModelRunner

    from .daemon_io import private_daemon_client

    client = private_daemon_client(args.directory, "accuracy-store-", stack)
    return ModelRunner(
        model,
        client,
        chunk_tokens=_chunk_tokens(args),
        group_layers=args.group_layers,
        probe_bits=getattr(args, "store_probe_bits", 0),  # 0 unless asked: the client quantizes
        streaming_heads=getattr(args, "streaming_heads", None),
        standin_layers=getattr(args, "standin_profile", None),
        kv_quant=getattr(args, "store_kv_quant", ""),
    )


def run_text_accuracy(args) -> dict:
    from engine_client.model import zoo
    from kvstore_tools.tasks import text

    paths = parse_paths(args.path)
    torch.set_num_threads(max(1, args.threads))
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    from .eval_common import bench_device

    pm = zoo.load(args.model, dtype=dtype, device=bench_device(args))
    depths = [float(d) for d in args.depths.split(",")] if args.depths else None
    examples = text.examples(
        args.task, pm.tokenizer, args.examples, args.tokens, stream=getattr(args, "stream", "eval"), start=args.start, depths=depths
    )
    limit = pm.config.max_position_embeddings
    too_long = [ex.seed for ex in examples if ex.num_prefix_tokens + ex.suffix_tokens.size + _max_new(ex, args) > limit]
    if too_long:
        raise ValueError(f"examples {too_long[:3]} exceed the model's context of {limit} tokens with their question and answer")
    configs = path_configs(paths, args.period_layers)
    if getattr(args, "group_layers", None) is None:
        args.group_layers = default_group_layers(configs.values())
    streams = any(name == "full-streaming" for name, _, _ in paths) or any(cfg.attention.streaming for cfg in configs.values())
    args.streaming_heads = zoo.streaming_heads(pm) if streams else None
    args.standin_profile = calibrated_profile(pm, configs.values(), getattr(args, "standin_layers", None))
    from engine_client.model.selection_profile import packaged_selection

    selection = packaged_selection(pm.decoder)  # what "auto" follow_top, probe_bits and local_chunks read below
    start = time.perf_counter()
    rows = evaluate(pm.decoder, pm.tokenizer, examples, paths, args)
    seconds = time.perf_counter() - start
    results = {}
    for name, rs in rows.items():
        correct = sum(r["correct"] for r in rs)
        lo, hi = wilson_interval(correct, len(rs))
        results[name] = {
            "correct": correct,
            "examples": len(rs),
            "accuracy": correct / len(rs),
            "wilson95": [lo, hi],
            "ttft_s_mean": float(np.mean([r["ttft_s"] for r in rs])),
            "rows": rs,
        }
        for key in (
            "kv_fraction",
            "stored_kv_fraction",
            "prefill_density",
            "bytes_read",
            "probe_bytes",
            "state_bytes_fetched",
            "resident_bytes",
            "decode_s",
            "decode_bytes_fetched",
        ):
            if rs and key in rs[0]:
                results[name][f"{key}_mean"] = float(np.mean([r[key] for r in rs]))
        loaded = [r["needle_loaded"] for r in rs if r.get("needle_loaded")]
        if loaded:
            results[name]["needle_loaded_per_period"] = np.mean(loaded, axis=0).tolist()
    return {
        "model": args.model,
        "task": args.task,
        "tokens": args.tokens,
        "examples": len(examples),
        "chunk_tokens": _chunk_tokens(args),
        "dtype": args.dtype,
        "stream": getattr(args, "stream", "eval"),
        "seeds": [examples[0].seed, examples[-1].seed] if examples else [],
        "period_layers": args.period_layers,
        "group_layers": args.group_layers,
        "store_probe_bits": getattr(args, "store_probe_bits", 0),
        **_kv_storage(pm.decoder, args),
        "threads": args.threads,
        "seconds": seconds,
        **({"streaming_heads": _profile_summary(args.streaming_heads)} if args.streaming_heads else {}),
        **({"standin_layers": standin_summary(args.standin_profile)} if args.standin_profile else {}),
        **({"selection_profile": {k: getattr(selection, k) for k in ("follow_top", "probe_bits", "local_chunks")}} if selection else {}),
        "paths": results,
    }


def calibrated_profile(pm, configs, path=None):
    """The model's calibrated layers when a path asks for them (``model.standins``; ``path``: a file other than the
    one next to the checkpoint): refused without them where a path needs them, a one-line note where it asked
    "auto" (the default system), which then runs without stand-ins."""
    import sys

    from engine_client.model import zoo
    from engine_client.model.standins import ProfileError

    configs = list(configs)
    if not any(cfg.uses_calibrated_layers for cfg in configs):
        return None
    try:
        return zoo.standin_layers(pm.decoder, pm.checkpoint_dir, path)
    except ProfileError as exc:
        if any(cfg.needs_calibrated_layers for cfg in configs):
            raise
        print(f"note: {exc}; the paths run without stand-in rows", file=sys.stderr)
        return None


def standin_summary(prof) -> dict:
    """What a report says of the stand-in layers it ran with (``model.standins``)."""
    return {"layers": list(prof.layers), "gains": [round(prof.gains[i], 3) for i in prof.layers], "calibration": prof.calibration}


def _kv_storage(model, args) -> dict:
    """With ``--store-kv-quant``: the scheme and how much smaller a prefix of ``--tokens`` is stored than in the KV dtype."""
    name = getattr(args, "store_kv_quant", "")
    if not name:
        return {}
    from engine_client.runner import model_geometry

    plain, quant = model_geometry(model), model_geometry(model, kv_quant=name)
    return {"store_kv_quant": name, "kv_storage_ratio": plain.kv_bytes(args.tokens) / quant.kv_bytes(args.tokens)}


def _profile_summary(prof) -> dict:
    return {
        "fraction": prof.fraction,
        "sink_tokens": prof.sink_tokens,
        "recent_tokens": prof.recent_tokens,
        "threshold": prof.threshold,
        "target_fraction": prof.target_fraction,
        "calibration": prof.calibration,
        "per_layer": [sum(layer) for layer in prof.streaming],
    }


def format_text_report(r: dict) -> str:
    lines = [f"{r['model']} {r['task']} @ {r['tokens']} tokens, {r['examples']} examples (seeds {r['seeds']}) in {r['seconds']:.0f}s"]
    if r.get("store_probe_bits"):
        lines[0] += f", probe keys stored at {r['store_probe_bits']} bits"
    if r.get("store_kv_quant"):
        lines[0] += f", KV stored as {r['store_kv_quant']} ({r['kv_storage_ratio']:.2f}x smaller than {r['dtype']})"
    for name, p in r["paths"].items():
        lo, hi = p["wilson95"]
        line = f"  {name:>14}: {p['correct']}/{p['examples']} = {p['accuracy']:.1%} (Wilson 95% {lo:.1%}..{hi:.1%}), TTFT {p['ttft_s_mean']:.2f}s"
        if "kv_fraction_mean" in p:
            line += (
                f", KV loaded {p['kv_fraction_mean']:.1%}, read {p['bytes_read_mean'] / 1e6:.2f} MB"
                f" + probe keys {p['probe_bytes_mean'] / 1e6:.2f} MB + state {p['state_bytes_fetched_mean'] / 1e6:.2f} MB"
                f", resident {p['resident_bytes_mean'] / 1e6:.2f} MB"
            )
        if "prefill_density_mean" in p:
            line += f", suffix prefill computed {p['prefill_density_mean']:.1%} of its attention cells"
        if "stored_kv_fraction_mean" in p:
            line += f", KV kept {p['stored_kv_fraction_mean']:.1%} (streaming heads {r['streaming_heads']['fraction']:.0%})"
        line += f", decode {p['decode_s_mean']:.2f}s"
        if "decode_bytes_fetched_mean" in p:
            line += f" (re-selection fetched {p['decode_bytes_fetched_mean'] / 1e6:.2f} MB while decoding)"
        if "needle_loaded_per_period" in p:
            line += "; needle chunks loaded per Period " + " ".join(f"{x:.0%}" for x in p["needle_loaded_per_period"])
        lines.append(line)
    return "\n".join(lines)
