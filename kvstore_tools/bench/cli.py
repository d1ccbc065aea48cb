"""``kvstore-bench``: benchmarks of the store's I/O path.

Subcommands (a parser and a ``command_*`` function each, bound with
``set_defaults(run=...)``; more, such as ``reprefill``, plug in the same way):

``reprefill``  Re-Prefill TTFT against full recompute and full load
        (``reprefill``).

``prefill``  dense prefill ms per layer of a pretrained model, the project's
        decoder against transformers on the same threads (``prefill``); with
        ``--shapes``, one layer of each model shape against a minimal layer,
        eager and in a CUDA graph, and the compute model (``layer_compare``).

``io``  fio-style raw job through the store's backend (``io_jobs``), and with
        ``--compare-fio`` the same job run by fio right after on the same file
        (``fio``).  ``--chunked`` runs the chunked-read benchmark instead
        (``chunked.run_chunked``); ``--via-daemon`` times random chunk reads
        in-process and through a daemon on both data paths (``daemon_io``).

``--plot PATH`` on ``io``, ``reprefill``, ``accuracy`` and ``recall`` draws the
report as a figure (``plots``).

``--no-progress`` and ``--log-level`` go before or after the subcommand.

Exit status: 0 on success, 2 for bad arguments (argparse's usage, or one
line for a bad ``--plot`` path), 1 when the benchmark could not run (one
line on stderr), such as a subcommand that needs the engine extra (torch)
on an install without it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import threading

from kvstore import cli_flags
from kvstore.cli_flags import fractions_arg, one_fraction_arg
from kvstore.config import BoolFlag, HelpFormatter
from kvstore.contract.errors import KVStoreError
from kvstore.contract.kvquant import KV_QUANT
from kvstore.io import BACKENDS
from kvstore.progress import add_progress_flag, set_enabled

from .fio import compare_with_fio, format_comparison
from .io_jobs import RW_MODES, BenchError, JobSpec, UsageError, busy_core, format_run, parse_size, run_io
from .plots import ENGINE_EXTRA, add_plot_flag, check_plot_path

DEFAULT_DIRECTORY = ".kvstore/bench"
DEFAULT_FILENAME = "kvstore-bench.io"
DEFAULT_BUDGETS = (0.05, 0.25)  # --budget when none is given


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_job_options(parser: argparse.ArgumentParser) -> None:
    job = parser.add_argument_group("job (fio's options of the same names)")
    job.add_argument("--rw", choices=RW_MODES, default="randread")
    job.add_argument("--bs", type=_size, default=parse_size("256k"), help="block size (4k, 32k, 256k, 1m; k=1024)")
    job.add_argument("--iodepth", type=int, default=16, help="requests in flight per job (fio's name; --io-queue-depth elsewhere)")
    cli_flags.add_alias(job, "--io-queue-depth", "iodepth", type=int)
    job.add_argument("--numjobs", type=int, default=1, help="jobs, one process each, on the same file")
    job.add_argument("--size", type=_size, default=parse_size("1g"), help="file bytes each job covers")
    job.add_argument("--runtime", type=float, default=10.0, help="seconds (time based, like fio --time_based)")
    job.add_argument("--direct", action=BoolFlag, default=True, help="O_DIRECT, no page cache (default; --direct 0/1 still taken)")
    job.add_argument("--backend", choices=BACKENDS, default="auto", help="the store's I/O backend (auto: as the daemon chooses)")
    job.add_argument(
        "--busy-core",
        action="store_true",
        help="keep one core busy with a competing process (python -c 'while True: pass') during our run and fio's",
    )
    job.add_argument(
        "--data-dir",
        dest="directory",
        default=DEFAULT_DIRECTORY,
        help="work directory: the default --filename, the --via-daemon stores and the --chunked store (DATA_DIR/store)",
    )
    cli_flags.add_alias(job, "--directory", "directory")
    job.add_argument("--filename", help=f"test file (default: DATA_DIR/{DEFAULT_FILENAME})")
    job.add_argument("--seed", type=int, help="offset and data seed (default: random, reported)")
    job.add_argument("--json", action="store_true", help="print only machine-readable JSON")
    add_plot_flag(job, "throughput and latency, ours beside fio's when it ran")


def _add_compare_options(parser: argparse.ArgumentParser) -> None:
    cmp = parser.add_argument_group("comparison with fio")
    cmp.add_argument("--compare-fio", action="store_true", help="run fio on the same file right after, report ours/fio")
    cmp.add_argument("--fio-ioengine", default="libaio", help="fio's --ioengine (libaio, io_uring, psync)")
    cmp.add_argument(
        "--via-daemon",
        action="store_true",
        help="random chunk reads in-process, through a daemon (shm and bytes paths), and fio (with --compare-fio)",
    )
    cmp.add_argument(
        "--transport",
        choices=("unix", "tcp"),
        default="unix",
        help="--via-daemon: the unix socket (shm and bytes paths) or loopback TCP with a token (bytes in the stream and data connections)",
    )
    cmp.add_argument(
        "--page-cache",
        action="store_true",
        help="--via-daemon: read through the page cache (no O_DIRECT), the file read once before: the service path without the disk",
    )


def _add_chunked_options(parser: argparse.ArgumentParser) -> None:
    """Options of ``--chunked``; None means chunked.DEFAULTS decides."""
    chk = parser.add_argument_group("chunked reads (--chunked; defaults: kvstore_tools.bench.chunked.DEFAULTS)")
    chk.add_argument("--chunked", action="store_true", help="run the chunked-read benchmark instead of a raw job")
    chk.add_argument(
        "--budgets",
        dest="budget",
        type=fractions_arg,
        help=f"fractions of chunks read, comma-separated (default {','.join(map(str, DEFAULT_BUDGETS))})",
    )
    cli_flags.add_alias(chk, "--budget", "budget", type=one_fraction_arg, action=cli_flags.AppendAlias)
    chk.add_argument("--layers", type=int)
    chk.add_argument("--kv-heads", type=int)
    chk.add_argument("--head-dim", type=int)
    chk.add_argument("--dtype")
    chk.add_argument("--tokens", type=int, help="tokens of the stored prefix")
    chk.add_argument("--chunk-tokens", type=int)
    chk.add_argument("--group-layers", type=int, help="layers per stored group (the SubPeriod)")
    cli_flags.add_alias(chk, "--period-layers", "group_layers", type=int)  # its older name
    chk.add_argument("--kv-quant", choices=("", *KV_QUANT), help="store the KV quantized (kvstore.contract.kvquant)")
    chk.add_argument("--selection", choices=("random", "runs", "both"))
    chk.add_argument("--groups", choices=("all", "period"), help="one read for all period groups, or one per group")
    chk.add_argument(
        "--max-read-run-bytes",
        dest="max_read_run",
        type=_size,
        help="largest coalesced read (the store's max_read_run_bytes; default: the store's default)",
    )
    cli_flags.add_alias(chk, "--max-read-run", "max_read_run", type=_size)  # its older name


# Subcommands whose modules import torch: their parsers are built only when chosen,
# so `kvstore-bench --help` and `kvstore-bench io` never import it.
LAZY_COMMANDS = {
    "reprefill": ("kvstore_tools.bench.reprefill", "add_reprefill_parser", "Re-Prefill TTFT vs full recompute and full load"),
    "accuracy": ("kvstore_tools.bench.accuracy", "add_accuracy_parser", "answer accuracy on the held-out synthetic recall tasks"),
    "prefill": ("kvstore_tools.bench.prefill", "add_prefill_parser", "dense prefill time per layer against transformers"),
    "recall": ("kvstore_tools.bench.recall", "add_recall_parser", "per-layer needle recall of each selection on a pretrained model"),
    "restore": (
        "kvstore_tools.bench.restore",
        "add_restore_parser",
        "restore an inactive conversation: recompute, load, Krul (TTFT, bytes, accuracy)",
    ),
    "estimator": (
        "kvstore_tools.bench.estimator",
        "add_estimator_parser",
        "Krul's attention estimator: its cost on generation (time per token, memory)",
    ),
    "decode": (
        "kvstore_tools.bench.decode",
        "add_decode_parser",
        "decoding from sparse, quantized KV: dense, Quest, LServe, LoopServe at one token budget",
    ),
    "decode-merge": (
        "kvstore_tools.bench.decode_merge",
        "add_decode_merge_parser",
        "pool kvstore-bench decode --json reports over disjoint seeds into one table",
    ),
    "calibrate": (
        "kvstore_tools.bench.calibrate",
        "add_calibrate_parser",
        "measure this machine's compute, copy, disk and request rates into a profile file (--profile file:PATH)",
    ),
    "contention": (
        "kvstore_tools.bench.contention",
        "add_contention_parser",
        "concurrent readers on the shared-memory arena: requests/s, p50/p99, failures",
    ),
    "cluster": (
        "kvstore_tools.bench.cluster",
        "add_cluster_parser",
        "N daemons sharing a Redis Cluster: local/remote/miss hit rates, bytes moved, cross-node vs local vs recompute",
    ),
    "replay": (
        "kvstore_tools.bench.replay_cli",
        "add_replay_parser",
        "replay a Re-Prefill trace against a real daemon at an accelerator's compute speed",
    ),
}


# What a missing module means: the extra of pyproject.toml that installs it.
EXTRAS = {
    **dict.fromkeys(("torch", "safetensors", "gguf", "tokenizers", "jinja2", "matplotlib"), ENGINE_EXTRA),
    **dict.fromkeys(("transformers", "accelerate"), "pip install 'kvstore[test]'"),
}


class MissingExtra(BenchError):
    """A subcommand needs a module of an optional extra this install lacks."""


def missing_extra(command: str | None, exc: ModuleNotFoundError) -> MissingExtra | None:
    """The one-line error for ``exc`` when an optional extra would install the module; None otherwise."""
    top = (exc.name or "").split(".")[0]
    if top not in EXTRAS:
        return None
    what = f"kvstore-bench {command}" if command else "kvstore-bench"
    return MissingExtra(f"{what} needs {top}, which this install lacks: {EXTRAS[top]}")


def _add_common_flags(parser: argparse.ArgumentParser) -> None:
    """``--no-progress`` and ``--log-level`` after a subcommand as before it (unset: the global value holds)."""
    for flag, kwargs in (
        ("--no-progress", {"dest": "progress", "action": "store_false", "help": "no progress bars"}),
        ("--log-level", {"choices": cli_flags.LOG_LEVELS, "help": "least severe log lines written"}),
    ):
        try:
            parser.add_argument(flag, default=argparse.SUPPRESS, **kwargs)
        except argparse.ArgumentError:  # the subcommand has its own
            pass


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv`` (default: sys.argv): a torch-bound subcommand's options only when it is the one chosen.

    MissingExtra when the chosen subcommand's module needs an extra this install lacks.
    """
    import importlib

    parser = argparse.ArgumentParser(prog="kvstore-bench", description=__doc__.split("\n\n")[0])
    cli_flags.add_version(parser)
    add_progress_flag(parser)
    cli_flags.add_log_level(parser, "warning")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    io = sub.add_parser("io", help="fio-style raw I/O job through the store's backend", formatter_class=HelpFormatter)
    _add_job_options(io)
    _add_compare_options(io)
    _add_chunked_options(io)
    io.set_defaults(run=lambda args: command_io(args, io))
    args = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in args if not a.startswith("-")), None)
    for name, (module, add, help_text) in LAZY_COMMANDS.items():
        if name == chosen:
            try:
                getattr(importlib.import_module(module), add)(sub)
            except ModuleNotFoundError as exc:
                raise missing_extra(name, exc) or exc from None
        else:
            sub.add_parser(name, help=help_text)  # listed in --help; replaced when chosen
    for subparser in sub.choices.values():
        _add_common_flags(subparser)
    return parser


def job_spec(args: argparse.Namespace) -> JobSpec:
    """The JobSpec the parsed ``io`` options describe (seed drawn when not given)."""
    return JobSpec(
        rw=args.rw,
        block_bytes=args.bs,
        iodepth=args.iodepth,
        numjobs=args.numjobs,
        size_bytes=args.size,
        runtime_s=args.runtime,
        direct=bool(args.direct),
        backend=args.backend,
        filename=args.filename or os.path.join(args.directory, DEFAULT_FILENAME),
        seed=args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31),
    )


def _print_json(report: dict) -> None:
    print(json.dumps(report, indent=2, sort_keys=True))


def command_io(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``io``: a raw job (optionally against fio), or ``--chunked``."""
    check_plot_path(args.plot)
    report = _run_io_command(args, parser)
    if args.plot:
        from .plots import plot_io

        plot_io(report, args.plot)
    return 0


def _run_io_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    """Run what the ``io`` options ask for, print it; the report."""
    if args.chunked:
        from .chunked import run_chunked  # needs the store; imported only when asked for

        args.budget = args.budget or list(DEFAULT_BUDGETS)
        args.data_dir = os.path.join(args.directory, "store")
        report = run_chunked(args)
        if args.json:
            _print_json(report)
        return report
    spec = job_spec(args)
    try:
        spec.check()
    except ValueError as exc:
        parser.error(str(exc))  # exits 2
    if args.via_daemon:
        from .daemon_io import format_daemon_report, run_daemon_comparison

        report = run_daemon_comparison(args)
        _print_json(report) if args.json else print(format_daemon_report(report))
        return report
    with busy_core(args.busy_core):
        if args.compare_fio:
            report = compare_with_fio(spec, ioengine=args.fio_ioengine)  # checks for fio before our run
        else:
            report = run_io(spec)
    report["params"]["busy_core"] = args.busy_core
    if args.json:
        _print_json(report)
    else:
        print(format_comparison(report) if args.compare_fio else format_run(report))
    return report


def _terminated(signum, _frame):
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Console entry point of ``kvstore-bench``; returns the exit status.

    SIGTERM unwinds like an exception (exit status 143), so a benchmark stopped with ``kill`` still
    stops the private daemon it started and removes its store instead of leaving both behind.
    """
    try:
        parser = build_parser(argv)
    except MissingExtra as exc:  # before --help too: the subcommand cannot run here at all
        print(f"kvstore-bench: error: {exc}", file=sys.stderr)
        return 1
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    args = None
    try:
        args = parser.parse_args(argv)
        set_enabled(args.progress)
        logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s", force=True)
        return args.run(args)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2, message printed); SIGTERM (143)
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except UsageError as exc:  # a bad argument argparse could not check: one line
        print(f"kvstore-bench: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # a module the run imports late (torch, matplotlib)
        error = missing_extra(getattr(args, "command", None), exc)
        if error is None:
            raise
        print(f"kvstore-bench: error: {error}", file=sys.stderr)
        return 1
    except (BenchError, KVStoreError, OSError) as exc:  # could not run: say why, no traceback
        print(f"kvstore-bench: error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # a model this command does not take (engine_client.model.UnsupportedModel): one line
        config = sys.modules.get("engine_client.model.config")  # loaded by whatever loaded the model
        if config is None or not isinstance(exc, config.UnsupportedModel):
            raise
        print(f"kvstore-bench: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # the daemon refused a call (engine_client.rpc.KVStoreRpcError): its status and message
        rpc = sys.modules.get("engine_client.rpc")  # loaded by whatever made the call
        if rpc is None or not isinstance(exc, rpc.KVStoreRpcError):
            raise
        print(f"kvstore-bench: error: the daemon refused a call: {exc}", file=sys.stderr)
        return 1
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


if __name__ == "__main__":
    sys.exit(main())
