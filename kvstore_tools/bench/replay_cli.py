"""``kvstore-bench replay``'s command line: one trace, or several traces for a scaling table.

One ``--trace``: the report of ``replay.run_replay`` (``--concurrency`` adds
its levels; ``--plot`` draws TTFT against them).  Several, comma-separated
(the same systems recorded at different prefix lengths): each is replayed in
turn and the report adds ``scaling``, per system the figures at each prefix
length under the profile next to the recorded run's on this CPU, and where
the I/O wait overtakes the compute (``replay_report.scaling_rows``);
``--plot`` then draws TTFT against prefix length.
"""

from __future__ import annotations

import argparse
import json

from .io_jobs import BenchError
from .replay import profile_arg, run_replay


def add_replay_parser(sub) -> None:
    from kvstore.cli_flags import add_alias

    p = sub.add_parser("replay", help="replay a Re-Prefill trace against a real daemon at an accelerator's compute speed")
    p.add_argument(
        "--trace",
        required=True,
        type=lambda t: [k.strip() for k in t.split(",") if k.strip()],
        help="a JSONL trace (kvstore-bench reprefill --workload zipf --trace-out), or several, comma-separated, for a scaling table",
    )
    p.add_argument(
        "--profile",
        default="h100",
        help="h100, a100, a800 or custom:flops=..,bw=..,h2d=..[,eff=..,mem_eff=..,overhead=..] (engine_client/compute_model.py), or file:PATH (kvstore-bench calibrate)",
    )
    p.add_argument(
        "--systems", type=lambda t: [k.strip() for k in t.split(",") if k.strip()], help="system@budget keys to replay (default: all)"
    )
    p.add_argument("--data-dir", dest="directory", default=".kvstore/bench")
    add_alias(p, "--directory", "directory")
    p.add_argument("--backend", default="auto", choices=("auto", "posix", "kvikio"))
    p.add_argument("--io-queue-depth", dest="iodepth", type=int, default=16)
    p.add_argument(
        "--concurrency",
        type=streams_arg,
        default=[1],
        help="comma-separated numbers of clients replaying the timed requests at once on each system's daemon (e.g. 1,2,4,8)",
    )
    p.add_argument(
        "--plot", help="a PNG: TTFT against prefix length (several traces) or against --concurrency (one trace, two levels or more)"
    )
    p.add_argument("--json", action="store_true", help="the report as JSON, every request's record included")
    p.set_defaults(run=command_replay)


def streams_arg(text: str) -> list[int]:
    """Comma-separated numbers of concurrent clients, each in [1, 64] (``--concurrency``, ``contention --streams``)."""
    try:
        levels = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
    if not levels or levels[0] < 1 or levels[-1] > 64:
        raise argparse.ArgumentTypeError(f"each level must be in [1, 64], got {text!r}")
    return levels


def command_replay(args) -> int:
    from .plots import check_plot_path
    from .replay_report import format_replay_report, format_scaling, scaling_rows

    profile_arg(args.profile)  # before any daemon starts
    check_plot_path(args.plot)
    traces = args.trace
    if not traces:
        raise BenchError("--trace: give at least one trace file")
    if args.plot and len(traces) == 1 and args.concurrency == [1]:
        raise BenchError("--plot draws TTFT against --concurrency (two levels or more) or against prefix length (several --trace files)")
    reports = [run_replay(argparse.Namespace(**{**vars(args), "trace": t})) for t in traces]
    if len(reports) == 1:
        report = reports[0]
        if args.plot:
            from .plots import plot_concurrency

            plot_concurrency(report, args.plot)
        print(json.dumps(report, indent=2, sort_keys=True, default=float) if args.json else format_replay_report(report))
        return 0
    report = {"traces": reports, "scaling": scaling_rows(reports)}
    if args.plot:
        from .plots import plot_scaling

        plot_scaling(report, args.plot)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True, default=float))
    else:
        print("\n\n".join(format_replay_report(r) for r in reports) + "\n\n" + format_scaling(report))
    return 0
