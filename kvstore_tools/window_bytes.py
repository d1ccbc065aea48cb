"""Bytes stored and read per Re-Prefill request for a model with sliding-window layers.

    python -m kvstore_tools.window_bytes [--model gemma3-270m] [--tokens 2048,8192,32768] [--budgets 0.05,0.10]

The store keeps every layer's KV whole (the layout of any model); a request
reads, per ``ModelRunner.plan``, its window's last chunks at each sliding
layer (``selection.window_chunk_count``) and the budget's chunks at each
global layer.  The table sets that against reading every layer's selected
chunks the same way (sliding layers selected like global ones, what a runner
without windows reads) and against the whole prefix, and shows what a layout
keeping only each sliding layer's window tail would store (not built: a
prefix shared by a longer one has another window).  KV only, in the model's
stored dtype; probe keys and summaries are not counted.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from engine_client.model.config import ModelConfig
from engine_client.selection import plan_periods, window_chunk_count

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class WindowBytes:
    num_tokens: int
    budget: float
    stored: int  # every layer whole (the layout)
    stored_window_tail: int  # sliding layers keeping their window's chunks only (not built)
    read_windowed: int  # sliding layers their window, global layers the budget's chunks
    read_selected: int  # every layer the budget's chunks
    whole_prefix: int  # every layer's every chunk


def window_bytes(config: ModelConfig, num_tokens: int, budget: float, *, chunk_tokens: int = 16, dtype_bytes: int = 2) -> WindowBytes:
    """The row of ``num_tokens`` at ``budget`` (a fraction) for ``config``'s geometry (module docstring)."""
    layers, sliding = config.num_hidden_layers, set(config.sliding_layers)
    m = -(-num_tokens // chunk_tokens)
    chunk = chunk_tokens * 2 * config.num_key_value_heads * config.head_dim * dtype_bytes  # K and V of one chunk, one layer
    window = window_chunk_count(num_tokens, config.sliding_window, chunk_tokens) if sliding else 0
    windowed = plan_periods(layers, m, budget, period_layers=1, window_layers=tuple(sorted(sliding)), window_chunks=window or 1)
    selected = plan_periods(layers, m, budget, period_layers=1)
    return WindowBytes(
        num_tokens,
        budget,
        stored=m * layers * chunk,
        stored_window_tail=(m * (layers - len(sliding)) + window * len(sliding)) * chunk,
        read_windowed=windowed.chunk_layers * chunk,
        read_selected=selected.chunk_layers * chunk,
        whole_prefix=m * layers * chunk,
    )


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f}"


def table(config: ModelConfig, tokens, budgets, *, dtype_bytes: int = 2) -> str:
    """A markdown table of ``window_bytes`` rows, MiB."""
    lines = [
        "| tokens | budget | stored (every layer whole) | stored, window tails (not built) | read, windowed | read, every layer selected | whole prefix |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in tokens:
        for b in budgets:
            r = window_bytes(config, n, b, dtype_bytes=dtype_bytes)
            cells = (r.stored, r.stored_window_tail, r.read_windowed, r.read_selected, r.whole_prefix)
            lines.append(f"| {n} | {b:.0%} | " + " | ".join(_mib(c) for c in cells) + " |")
    return "\n".join(lines)


def _numbers(kind):
    def parse(text: str):
        try:
            return [kind(x) for x in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None

    return parse


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvstore_tools.window_bytes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma3-270m", help="a zoo model (its config only)")
    parser.add_argument("--tokens", type=_numbers(int), default=[2048, 8192, 32768])
    parser.add_argument("--budgets", type=_numbers(float), default=[0.05, 0.10])
    parser.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bfloat16", help="the stored KV dtype")
    args = parser.parse_args(argv)
    from engine_client.model import zoo

    config = ModelConfig.from_json_file(zoo.cached_checkpoint(args.model) / "config.json")
    print(table(config, args.tokens, args.budgets, dtype_bytes=DTYPE_BYTES[args.dtype]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
