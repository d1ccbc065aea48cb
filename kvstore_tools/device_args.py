"""The device check's command-line pieces: argument types (one-line errors) and the ttft steps' system flags."""

from __future__ import annotations

import argparse
import sys

from kvstore.cli_flags import positive_seconds


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit status 2 (argparse would print its usage first)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def limits(text: str, known: tuple[str, ...]) -> tuple[str, float]:
    """``STEP=SECONDS`` with STEP one of ``known``."""
    name, sep, value = text.partition("=")
    if not sep or name not in known:
        raise argparse.ArgumentTypeError(f"expected STEP=SECONDS with STEP one of {', '.join(known)}, got {text!r}")
    try:
        return name, positive_seconds(value)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{name}: {exc}") from None


def steps(text: str, known: tuple[str, ...]) -> list[str]:
    """A comma-separated list of steps of ``known``."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown step {', '.join(unknown) or text!r} (steps: {', '.join(known)})")
    return names


def system(text: str) -> str:
    """A system ``engine_client.reprefill.parse_system`` knows."""
    from engine_client.reprefill import parse_system
    from kvstore.contract import InvalidArgument

    try:
        parse_system(text, warn=False)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc).splitlines()[0][:300]) from None
    return text


def system_args(system: str, bench_period: int) -> list[str]:
    """The reprefill rows' system (the product's default, or ``summary``: 8-layer Periods selected by key summaries)
    at its own Periods, on a store laid out for it (groups that divide its Periods and the full load's, probe keys
    at its bits)."""
    from engine_client.reprefill import parse_system

    cfg = parse_system(system, warn=False)
    period = cfg.schedule.period_layers
    group = next(g for g in (4, 2, 1) if period % g == 0 and bench_period % g == 0)
    return ["--system", system, "--group-layers", str(group), "--store-probe-bits", str(cfg.selection.probe_bits)]
