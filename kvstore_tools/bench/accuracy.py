"""``kvstore-bench accuracy``: answer accuracy of a checkpoint on the held-out synthetic recall tasks.

    kvstore-bench accuracy --task kv|multiturn|fewshot --path PATH [--examples N] [--tokens 2048]
                           [--checkpoint DIR] [--seed S] [--json] [--plot out.png]

``PATH`` says which KV the question is answered over:

``full``            dense attention over the whole prefix, in process;
``drop-answer``     the whole prefix except the 16-token chunks that overlap the
                    answer record(s), in process (the check that the answer
                    really has to be read from the prefix; expect chance);
``SELECTOR@BUDGET`` the real Re-Prefill: a daemon is started on a private
                    socket, ``ModelRunner.store_prefix`` stores each prefix and
                    ``ModelRunner.reprefill`` answers the suffix from the chunks
                    that ``SELECTOR`` (summary, exact, recent) picks within
                    ``BUDGET`` (a fraction of the prefix's chunks).

Examples come from the tasks' "eval" seed stream, disjoint from the stream
the model was trained on.  The prediction is the argmax of the first
answer-token logits; the accuracy is printed with its Wilson 95% interval.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch

from kvstore.contract.kvquant import KV_QUANT
from kvstore.progress import progress

from .eval_common import (
    CHUNK_TOKENS,
    DEFAULT_BUDGET,
    add_device_flag,
    bench_device,
    budget_fraction,
    is_path_system,
    keep_rows_without,
    path_config,
    wilson_interval,
)

DEFAULT_CHECKPOINT = os.path.join(os.path.dirname(__file__), "..", "..", "checkpoints", "recall-small")
PERIOD_LAYERS = 4


@dataclass(frozen=True)
class EvalPath:
    kind: str  # "full" | "drop-answer" | "reprefill"
    selector: str = ""
    budget: float = 1.0

    @property
    def name(self) -> str:
        return f"{self.selector}@{self.budget:g}" if self.kind == "reprefill" else self.kind

    def config(self):
        """The Re-Prefill config of a ``reprefill`` path (a plain selector at ``PERIOD_LAYERS``)."""
        return path_config(self.selector, self.budget, PERIOD_LAYERS)


def parse_path(text: str | None) -> EvalPath:
    """``full``, ``drop-answer`` or ``SYSTEM@BUDGET`` (None: the default system at 5%); ValueError otherwise."""
    from engine_client.reprefill import DEFAULT_SYSTEM
    from engine_client.reprefill.systems import known_systems

    if text is None:
        return EvalPath("reprefill", DEFAULT_SYSTEM, DEFAULT_BUDGET)
    if text in ("full", "drop-answer"):
        return EvalPath(text)
    selector, sep, budget = text.partition("@")
    if not sep or not is_path_system(selector):
        raise ValueError(
            f"path must be full, drop-answer or SYSTEM@BUDGET with SYSTEM a selector (summary, exact, recent) or a named system ({known_systems()}); got {text!r}"
        )
    return EvalPath("reprefill", selector, budget_fraction(budget, text))


def chance_level(task: str) -> float:
    """Accuracy of a uniform guess among the task's possible answers."""
    from kvstore_tools.tasks import fewshot, vocab

    return 1.0 / (fewshot.NUM_LABELS if task == "fewshot" else vocab.NUM_VALUES)


def held_out_examples(task: str, num_examples: int, num_tokens: int, seed: int, *, need_prefix_answer: bool = False):
    """The first ``num_examples`` examples of the eval stream (those whose answer is in the prefix, if asked)."""
    from kvstore_tools import tasks

    module = tasks.get_task(task)
    rng = tasks.rng_for("eval", seed, task)
    out = []
    for _ in range(100 * num_examples):
        ex = module.example(rng, num_tokens)
        if ex.answer_spans or not need_prefix_answer:
            out.append(ex)
        if len(out) == num_examples:
            break
    return out


# ---------------------------------------------------------------------------- in-process paths


@torch.inference_mode()
def answer_logits(
    model, prefix_kv: torch.Tensor, num_prefix: int, suffix: np.ndarray, keep_rows: torch.Tensor | None = None
) -> torch.Tensor:
    """Logits ``[vocab]`` at the last suffix token, attending to the prefix rows ``keep_rows`` (all if None).

    ``prefix_kv [L, 2, Hkv, n, d]`` post-RoPE; the suffix takes positions ``n, n+1, ...``.
    """
    toks = torch.as_tensor(suffix, dtype=torch.long)
    positions = torch.arange(num_prefix, num_prefix + toks.numel())
    kv = prefix_kv if keep_rows is None else prefix_kv.index_select(3, keep_rows)
    hidden = model.embed(toks)
    for layer in range(model.num_layers):
        hidden, _ = model.layer_forward(layer, hidden, positions, kv[layer])
    return model.final_logits(hidden)


def predict_in_process(model, examples, path: EvalPath):
    from engine_client.prefill import chunked_prefill

    for ex in progress(examples, f"accuracy {path.kind}", unit="ex"):
        _, kv = chunked_prefill(model, torch.from_numpy(ex.prefix))
        keep = keep_rows_without(ex.prefix.size, ex.answer_chunks(CHUNK_TOKENS)) if path.kind == "drop-answer" else None
        yield int(answer_logits(model, kv, ex.prefix.size, ex.suffix, keep).argmax()), {}


# ---------------------------------------------------------------------------- Re-Prefill through a daemon


def predict_reprefill(model, examples, path: EvalPath, directory: str):
    """Store each prefix in a fresh daemon and answer its suffix by ``ModelRunner.reprefill``."""
    from engine_client.client import KVStoreClient
    from engine_client.reprefill import ModelRunner

    from .daemon_io import DaemonArgs, _Daemon

    os.makedirs(directory, exist_ok=True)
    data_dir = tempfile.mkdtemp(prefix="accuracy-store-", dir=directory)
    daemon = _Daemon(data_dir, DaemonArgs())
    try:
        with KVStoreClient(f"unix:{daemon.socket}") as client:
            cfg = path.config()
            group = 4 if cfg.schedule.period_layers % 4 == 0 else 1  # 4-layer groups where the Periods allow them, as before
            runner = ModelRunner(model, client, chunk_tokens=CHUNK_TOKENS, group_layers=group, probe_bits=0)
            for ex in progress(examples, "accuracy re-prefill", unit="ex"):
                handle = runner.store_prefix(ex.prefix)
                res = runner.reprefill(handle.prefix_id, ex.suffix, cfg)
                wanted = set(ex.answer_chunks(CHUNK_TOKENS).tolist())
                got = [set(sel.tolist()) for sel in res.selected]
                hit = min(len(wanted & g) / len(wanted) for g in got) if wanted else None
                yield int(res.logits.argmax()), {"answer_chunk_recall": hit, "tokens_loaded": res.tokens_loaded}
    finally:
        daemon.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


# ---------------------------------------------------------------------------- the benchmark


def run_accuracy(args) -> dict:
    from engine_client.model.loader import load_checkpoint

    path = parse_path(args.path)
    torch.set_num_threads(max(1, args.threads))
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    model = load_checkpoint(args.checkpoint, dtype=dtype, device=bench_device(args))
    examples = held_out_examples(args.task, args.examples, args.tokens, args.seed, need_prefix_answer=path.kind == "drop-answer")
    start = time.perf_counter()
    if path.kind == "reprefill":
        predictions = predict_reprefill(model, examples, path, args.directory)
    else:
        predictions = predict_in_process(model, examples, path)
    rows = []
    for ex, (pred, extra) in zip(examples, predictions):
        rows.append({"correct": pred == ex.answer, **{k: v for k, v in ex.meta.items() if isinstance(v, (str, bool))}, **extra})
    correct = sum(r["correct"] for r in rows)
    lo, hi = wilson_interval(correct, len(rows))
    report = {
        "task": args.task,
        "path": path.name,
        "tokens": args.tokens,
        "examples": len(rows),
        "correct": correct,
        "accuracy": correct / len(rows) if rows else 0.0,
        "wilson95": [lo, hi],
        "chance": chance_level(args.task),
        "seed": args.seed,
        "checkpoint": os.path.normpath(args.checkpoint),
        "model_fingerprint": model.fingerprint,
        "dtype": args.dtype,
        "seconds": time.perf_counter() - start,
        "breakdown": _breakdown(rows),
    }
    recalls = [r["answer_chunk_recall"] for r in rows if r.get("answer_chunk_recall") is not None]
    if recalls:
        report["answer_chunk_recall"] = float(np.mean(recalls))
    return report


def _breakdown(rows: list[dict]) -> dict:
    """Accuracy per value of each string/bool example fact (e.g. multi-turn question position)."""
    out = {}
    keys = sorted({k for r in rows for k, v in r.items() if k != "correct" and isinstance(v, (str, bool))})
    for key in keys:
        for value in sorted({r[key] for r in rows if key in r}, key=str):
            sel = [r["correct"] for r in rows if r.get(key) == value]
            out[f"{key}={value}"] = {"examples": len(sel), "accuracy": sum(sel) / len(sel)}
    return out


def format_report(r: dict) -> str:
    lo, hi = r["wilson95"]
    lines = [
        f"{r['task']} @ {r['tokens']} tokens, path {r['path']}: {r['correct']}/{r['examples']} = {r['accuracy']:.1%} "
        f"(Wilson 95% {lo:.1%}..{hi:.1%}; chance {r['chance']:.1%}) in {r['seconds']:.0f}s"
    ]
    if "answer_chunk_recall" in r:
        lines.append(f"  answer chunks selected (worst period): {r['answer_chunk_recall']:.1%}")
    for key, b in r["breakdown"].items():
        lines.append(f"  {key}: {b['accuracy']:.1%} of {b['examples']}")
    return "\n".join(lines)


def add_accuracy_parser(sub) -> argparse.ArgumentParser:
    from engine_client.reprefill import DEFAULT_SYSTEM
    from engine_client.reprefill.systems import known_systems
    from kvstore.cli_flags import add_alias
    from kvstore_tools.tasks import TASKS

    p = sub.add_parser(
        "accuracy", help="answer accuracy on held-out recall tasks (toy checkpoint or --model on real text), full / drop / Re-Prefill"
    )
    add_device_flag(p)
    p.add_argument("--task", required=True, help=f"toy checkpoint: {', '.join(TASKS)}; --model: a real-text task or file:PATH")
    p.add_argument(
        "--path",
        default=None,
        help=f"full | drop-answer (toy) | drop-needle, full-streaming, sparse-prefill@ALPHA (--model) | SYSTEM@BUDGET, SYSTEM a plain "
        f"selector (summary, exact, recent, at --period-layers) or a named system ({known_systems()}; "
        f"engine_client.reprefill.systems), BUDGET a fraction in (0, 1]; --model accepts several, comma-separated "
        f"(default: {DEFAULT_SYSTEM}@{DEFAULT_BUDGET:g}, the system that keeps the answer)",
    )
    p.add_argument("--model", default=None, help="a pretrained model by name (smollm2-135m): real-text tasks, greedy decoding")
    p.add_argument("--depths", default="", help="--model: needle depths to cycle through, e.g. 0,0.25,0.5,0.75,1 (default: seeded)")
    p.add_argument("--start", type=int, default=0, help="--model: offset into the evaluation seeds (1_000_000 + start on)")
    p.add_argument(
        "--standin-layers",
        metavar="PATH",
        help="--model: the stand-in layers file of the *-standin systems (default: the one next to the checkpoint, "
        "python -m kvstore_tools.models calibrate-standins)",
    )
    p.add_argument(
        "--stream",
        choices=("eval", "tune"),
        default="eval",
        help="--model: seed stream; choose a design on 'tune' (seeds below 1000), report on 'eval'",
    )
    p.add_argument("--max-new-tokens", type=int, default=0, help="--model: tokens to decode (default: the task's)")
    p.add_argument(
        "--margins",
        action="store_true",
        help="--model: also teacher-force the accepted answer through each Re-Prefill path (a second Re-Prefill per example) "
        "and record its per-token margins, as 'full' always does",
    )
    p.add_argument("--period-layers", type=int, default=8, help="--model: layers sharing one chunk selection")
    p.add_argument(
        "--chunk-tokens",
        type=int,
        default=CHUNK_TOKENS,
        help=f"--model: tokens per stored chunk, the unit selection loads (default {CHUNK_TOKENS}); budgets stay fractions of the prefix",
    )
    p.add_argument(
        "--group-layers",
        type=int,
        default=None,
        help="--model: layers per stored group (default: the largest of 1, 2 and 4 that every path's Periods are multiples of: "
        "1 for the per-layer systems, 4 for 8-layer Periods)",
    )
    p.add_argument(
        "--store-probe-bits",
        type=int,
        choices=(0, 4, 8),
        default=0,
        help="--model: store each prefix's probe keys quantized to this many bits (0: in the KV dtype); exact paths must use the same probe_bits",
    )
    p.add_argument(
        "--store-kv-quant",
        choices=("", *KV_QUANT),
        default="",
        help="--model: store each prefix's KV quantized (kvstore.contract.kvquant; '': in the KV dtype); 'full' stays unquantized",
    )
    p.add_argument("--examples", type=int, default=200, help="held-out examples")
    p.add_argument("--tokens", type=int, default=2048, help="prefix + suffix tokens of each example")
    p.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT, help="HF checkpoint directory (default: checkpoints/recall-small)")
    p.add_argument("--seed", type=int, default=0, help="seed of the held-out (eval) stream")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="compute dtype (and stored KV dtype)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--data-dir", dest="directory", default=".kvstore/bench", help="where the Re-Prefill paths put their temporary store")
    add_alias(p, "--directory", "directory")  # older spelling
    p.add_argument("--json", action="store_true", help="print only machine-readable JSON")
    from .plots import add_plot_flag

    add_plot_flag(p, "accuracy against budget per selector (Wilson 95%% whiskers; full and drop paths as levels)")
    p.set_defaults(run=lambda args: command_accuracy(args, p))
    return p


def command_accuracy(args, parser) -> int:
    import json

    from .plots import check_plot_path, plot_accuracy

    check_plot_path(args.plot)
    if args.model:
        return _command_text_accuracy(args, parser)
    from kvstore_tools.tasks import TASKS

    if args.task not in TASKS:
        parser.error(f"--task must be one of {', '.join(TASKS)} for the toy checkpoint (real-text tasks need --model)")
    try:
        parse_path(args.path)
    except ValueError as exc:
        parser.error(str(exc))  # exits 2
    if args.examples < 1 or args.tokens < 64:
        parser.error("--examples must be >= 1 and --tokens >= 64")
    report = run_accuracy(args)
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else format_report(report))
    if args.plot:
        plot_accuracy(report, args.plot)
    return 0


def _command_text_accuracy(args, parser) -> int:
    import json

    from kvstore_tools.tasks import text

    from .text_accuracy import check_store_probe_bits, format_text_report, parse_paths, run_text_accuracy

    try:
        check_store_probe_bits(parse_paths(args.path), args.store_probe_bits, args.period_layers)
        if not args.task.startswith("file:"):
            text.get_task(args.task)
    except ValueError as exc:
        parser.error(str(exc))
    if args.examples < 1 or args.tokens < 64 or args.max_new_tokens < 0:
        parser.error("--examples must be >= 1, --tokens >= 64 and --max-new-tokens >= 0")
    if not 1 <= args.chunk_tokens <= args.tokens:
        parser.error(f"--chunk-tokens must be in [1, --tokens={args.tokens}], got {args.chunk_tokens}")
    try:
        report = run_text_accuracy(args)
    except (ValueError, LookupError) as exc:  # unknown model, bad JSONL line, prompt too long: one line
        print(f"kvstore-bench accuracy: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else format_text_report(report))
    if args.plot:
        from .plots import plot_accuracy

        plot_accuracy(report, args.plot)
    return 0
