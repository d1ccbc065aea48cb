"""``python -m tools.models``: the pretrained models that ship in installed packages.

``list``                         the registered names, licence and whether the file is installed.
``fetch NAME [--cache-dir D] [--dtype T]``
                                 locate the GGUF in its package (no network) and export it into
                                 the model cache as an HF checkpoint; print both paths.
``export NAME --out DIR [--dtype float32|bfloat16]``
                                 write the HF checkpoint (config.json, model.safetensors,
                                 tokenizer.json, tokenizer_config.json) to DIR.

Exit status 0 on success, 1 with a one-line message when the model is unknown,
its package is missing or the file cannot be read, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import sys

from engine_client.model import zoo
from engine_client.model.config import UnsupportedModel
from engine_client.model.loader import CheckpointError


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
    return parser


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
    else:
        print(zoo.export(args.name, args.out, args.dtype))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (zoo.UnknownModel, zoo.ModelNotInstalled, CheckpointError, UnsupportedModel, ImportError, OSError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
