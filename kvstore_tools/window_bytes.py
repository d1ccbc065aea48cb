"""Bytes stored and read per Re-Prefill request for a model with sliding-window layers.

    python -m kvstore_tools.window_bytes [--model gemma3-270m] [--tokens 2048,8192,32768] [--budgets 0.05,0.10]

The runner's default layout for such a model is the window tail
(``engine_client.reprefill.window``): the global layers' chunks as extents,
and per prefix each sliding layer's last ``ceil(W / c) * c`` rows as pages,
which a runner fetches once and keeps; a request then reads only the
budget's chunks of the global layers.  The table sets that against storing
every layer whole (a request reads its window's last chunks at each sliding
layer, ``selection.window_chunk_count``, and the budget's chunks at each
global layer, per ``ModelRunner.plan``), against reading every layer's
selected chunks the same way (sliding layers selected like global ones),
and against the whole prefix.  KV only, in the model's stored dtype; probe
keys and summaries are not counted (the window tail keeps them for the
global layers only).

``--measure`` runs both layouts on the pretrained model through a real daemon
(``measure``) and prints what the store wrote and each request read.
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
    stored: int  # every layer whole
    stored_window_tail: int  # the window tail: global layers' chunks, and the sliding layers' last window as pages
    read_window_tail: int  # per request, the tail kept: the global layers' budget chunks
    tail_fetch: int  # once per prefix and runner: the tail pages
    read_windowed: int  # every layer whole: sliding layers their window's chunks, global layers the budget's chunks
    read_selected: int  # every layer the budget's chunks
    whole_prefix: int  # every layer's every chunk


def window_bytes(config: ModelConfig, num_tokens: int, budget: float, *, chunk_tokens: int = 16, dtype_bytes: int = 2) -> WindowBytes:
    """The row of ``num_tokens`` at ``budget`` (a fraction) for ``config``'s geometry (module docstring)."""
    layers, sliding = config.num_hidden_layers, set(config.sliding_layers)
    m = -(-num_tokens // chunk_tokens)
    row = 2 * config.num_key_value_heads * config.head_dim * dtype_bytes  # K and V of one token, one layer
    chunk = chunk_tokens * row
    window = window_chunk_count(num_tokens, config.sliding_window, chunk_tokens) if sliding else 0
    tail_rows = -(-config.sliding_window // chunk_tokens) * chunk_tokens if sliding else 0  # whole pages, zeros before 0
    windowed = plan_periods(layers, m, budget, period_layers=1, window_layers=tuple(sorted(sliding)), window_chunks=window or 1)
    selected = plan_periods(layers, m, budget, period_layers=1)
    global_read = sum(count for l0, _, count in windowed.periods if l0 not in sliding) * chunk
    tail = tail_rows * row * len(sliding)
    return WindowBytes(
        num_tokens,
        budget,
        stored=m * layers * chunk,
        stored_window_tail=m * (layers - len(sliding)) * chunk + tail,
        read_window_tail=global_read,
        tail_fetch=tail,
        read_windowed=windowed.chunk_layers * chunk,
        read_selected=selected.chunk_layers * chunk,
        whole_prefix=m * layers * chunk,
    )


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f}"


def table(config: ModelConfig, tokens, budgets, *, dtype_bytes: int = 2) -> str:
    """A markdown table of ``window_bytes`` rows, MiB."""
    lines = [
        "| tokens | budget | stored, window tail | stored, every layer whole | read per request, window tail "
        "| tail fetched once | read per request, every layer whole | read, every layer selected | whole prefix |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in tokens:
        for b in budgets:
            r = window_bytes(config, n, b, dtype_bytes=dtype_bytes)
            cells = (r.stored_window_tail, r.stored, r.read_window_tail, r.tail_fetch, r.read_windowed, r.read_selected, r.whole_prefix)
            lines.append(f"| {n} | {b:.0%} | " + " | ".join(_mib(c) for c in cells) + " |")
    return "\n".join(lines)


def _numbers(kind):
    def parse(text: str):
        try:
            return [kind(x) for x in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None

    return parse


def measure(model_name: str, tokens, budgets, directory: str, *, dtype: str = "bfloat16") -> list[dict]:
    """Both layouts through a real daemon on the pretrained model: per prefix length, one tuning-stream
    pass-key prompt, prefilled once and stored by a window-tail runner and a whole-layout runner; per
    budget, two requests each (the first fetches the runner's state, the second finds it kept).  Bytes
    are the store's and the runner's own counters; the two layouts' first-token logits are compared."""
    from contextlib import ExitStack

    import torch

    from engine_client.model import zoo
    from engine_client.prefill import chunked_prefill
    from engine_client.reprefill import ModelRunner, ReprefillConfig
    from kvstore.progress import progress
    from kvstore_tools.bench.daemon_io import private_daemon_client
    from kvstore_tools.tasks import text

    pm = zoo.load(model_name, dtype=getattr(torch, dtype))
    model, rows = pm.decoder, []
    with ExitStack() as stack:
        client = private_daemon_client(directory, "window-bytes-", stack)
        for n in progress(tokens, "prefixes", unit="prefix"):
            (ex,) = text.examples("passkey", pm.tokenizer, 1, n, stream="tune", start=1)
            _, kv = chunked_prefill(model, torch.as_tensor(ex.prefix_tokens))
            logits = {}
            for layout, window_tail in (("window tail", None), ("every layer whole", False)):
                runner = ModelRunner(model, client, window_tail=window_tail)
                handle = runner.store_prefix(ex.prefix_tokens, kv=kv)
                for b in budgets:
                    cfg = ReprefillConfig().replace(budget=b, report_attention=False)
                    runner.forget(handle.prefix_id)  # the first request fetches the runner's state
                    first = runner.reprefill(handle.prefix_id, ex.suffix_tokens, cfg)
                    again = runner.reprefill(handle.prefix_id, ex.suffix_tokens, cfg)
                    logits[(layout, b)] = again.logits
                    rows.append(
                        {
                            "tokens": len(ex.prefix_tokens),
                            "layout": layout,
                            "budget": b,
                            "stored_bytes": handle.bytes_written,
                            "first_request_bytes": first.bytes_useful + first.state_bytes_fetched + first.probe_bytes,
                            "request_bytes": again.bytes_useful + again.state_bytes_fetched + again.probe_bytes,
                            "request_kv_bytes": again.bytes_useful,
                            "resident_bytes": runner.resident_bytes(),
                            "ttft_s": again.ttft_s,
                            "top1": int(again.logits.argmax()),
                        }
                    )
            for row in rows[-2 * len(budgets) :]:
                other = logits[("every layer whole", row["budget"])]
                row["max_logit_diff"] = float((logits[(row["layout"], row["budget"])] - other).abs().max())
    return rows


def measured_table(rows: list[dict]) -> str:
    lines = [
        "| tokens | budget | layout | stored | first request | each later request (KV from extents) | kept by the runner | TTFT, s | top-1 | max logit diff |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tokens']} | {r['budget']:.0%} | {r['layout']} | {_mib(r['stored_bytes'])} | {_mib(r['first_request_bytes'])} "
            f"| {_mib(r['request_bytes'])} ({_mib(r['request_kv_bytes'])}) | {_mib(r['resident_bytes'])} | {r['ttft_s']:.2f} "
            f"| {r['top1']} | {r['max_logit_diff']:.2g} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvstore_tools.window_bytes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma3-270m", help="a zoo model (its config only, unless --measure)")
    parser.add_argument("--tokens", type=_numbers(int), default=[2048, 8192, 32768])
    parser.add_argument("--budgets", type=_numbers(float), default=[0.05, 0.10])
    parser.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bfloat16", help="the stored KV dtype (--measure: the model's)")
    parser.add_argument(
        "--measure", action="store_true", help="also store and serve one prompt per length in both layouts (module docstring)"
    )
    parser.add_argument("--directory", default="bench-data", help="--measure: where the daemon's store goes (removed after)")
    parser.add_argument("--json", action="store_true", help="--measure: print the measured rows as JSON")
    args = parser.parse_args(argv)
    from engine_client.model import zoo

    config = ModelConfig.from_json_file(zoo.cached_checkpoint(args.model) / "config.json")
    if bad := [n for n in args.tokens if not 0 < n < config.max_position_embeddings]:
        parser.error(f"--tokens: {bad[0]} is outside the model's context (1..{config.max_position_embeddings - 1})")
    if bad := [b for b in args.budgets if not 0 < b <= 1]:
        parser.error(f"--budgets: {bad[0]} is not a fraction in (0, 1]")
    if not args.measure:
        print(table(config, args.tokens, args.budgets, dtype_bytes=DTYPE_BYTES[args.dtype]))
        return 0
    rows = measure(args.model, args.tokens, args.budgets, args.directory, dtype=args.dtype)
    if args.json:
        import json

        print(json.dumps({"model": args.model, "dtype": args.dtype, "rows": rows}, indent=2))
    else:
        print(table(config, args.tokens, args.budgets, dtype_bytes=DTYPE_BYTES[args.dtype]))
        print()
        print(measured_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
