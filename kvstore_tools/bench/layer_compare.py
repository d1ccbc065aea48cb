"""``kvstore-bench prefill --shapes``: one decoder layer, the project's against a minimal layer of the same shape.

For each model shape (``layer_shapes``: random weights, layer 0 timed) and
each case (new rows over prefix rows), side by side:

* ``project_s``: ``Decoder.layer_forward`` called as the Re-Prefill runner
  calls it (positions from ``Decoder.position_range``, the prefix rows as a
  ``[2, Hkv, r, d]`` tensor on the device);
* ``minimal_eager_s``: ``minimal_layer.MinimalLayer``, the same arithmetic
  with everything but its intermediates made up front, run eagerly;
* ``minimal_graph_s``: that layer captured in a CUDA graph and replayed (on
  CUDA only; ``graph_note`` says why a row has none);
* ``model_s``: ``compute_model.layer_seconds`` under ``--profile``;
* ``fixed_cost_over_graph_us``: project minus graph, the project layer's cost
  beyond the kernels a layer of this shape needs (target: at most 100 us).

Cases: a dense prefill of ``--prefill-tokens`` over no rows, then each of
``--suffix-tokens`` new rows over all ``--context`` prefix rows, and the first
of them also over ``--sparse-fraction`` of those rows (the rows a sparse
Re-Prefill loads).  The new rows sit after the whole prefix, as in the runner.
Each time is the median of ``--repeats`` runs after ``--warmup`` runs, the
device synchronised before and after each.  Every row also says how far the
minimal layer's output and new KV rows are from the project's on the same
weights and input (``minimal_max_abs_diff``; float32 agrees to ~1e-6), and on
CUDA how far the graph's output is from the eager run's.
"""

from __future__ import annotations

import shlex
import statistics
import sys
import time
from dataclasses import dataclass

from .io_jobs import UsageError
from .layer_shapes import SHAPES

FIXED_COST_TARGET_US = 100.0
DTYPES = ("float32", "bfloat16", "float16")
# dest -> (flag, default): the flags of this mode; None in args means "not given"
LAYER_FLAGS = {
    "shapes": ("--shapes", None),
    "device": ("--device", None),
    "dtype": ("--dtype", None),
    "prefill_tokens": ("--prefill-tokens", 2048),
    "context": ("--context", 16384),
    "suffix_tokens": ("--suffix-tokens", "64,1024"),
    "sparse_fraction": ("--sparse-fraction", 0.05),
    "warmup": ("--warmup", 3),
    "profile": ("--profile", "h100"),
}
DEFAULT_REPEATS = 10


@dataclass(frozen=True)
class Case:
    name: str  # "prefill" | "reprefill-sparse" | "reprefill-full"
    new_tokens: int
    context_rows: int  # prefix rows attended to
    prefix_tokens: int  # the new rows' first position (the whole prefix's length)


@dataclass(frozen=True)
class LayerOptions:
    shapes: tuple[str, ...]
    device: str
    dtype: str
    cases: tuple[Case, ...]
    repeats: int
    warmup: int
    threads: int
    profile: object  # compute_model.AcceleratorProfile


def add_layer_flags(p) -> None:
    from .eval_common import add_device_flag

    g = p.add_argument_group("per-layer comparison (--shapes): the project's layer vs a minimal layer, random weights")
    g.add_argument("--shapes", help=f"comma-separated model shapes ({', '.join(SHAPES)}); turns this mode on")
    add_device_flag(g)
    g.add_argument("--dtype", help=f"{', '.join(DTYPES)} (default: bfloat16 on cuda, float32 on cpu)")
    g.add_argument("--prefill-tokens", type=int, help="new rows of the dense prefill case; 0 skips it (default 2048)")
    g.add_argument("--context", type=int, help="prefix tokens of the Re-Prefill cases (default 16384)")
    g.add_argument("--suffix-tokens", help="comma-separated new rows of the Re-Prefill cases, each over every prefix row (default 64,1024)")
    g.add_argument(
        "--sparse-fraction",
        type=float,
        help="the first --suffix-tokens case also runs over this fraction of the prefix rows; 0 skips it (default 0.05)",
    )
    g.add_argument("--warmup", type=int, help="untimed runs before the timed ones (default 3)")
    g.add_argument(
        "--profile",
        help="the compute model's accelerator: h100, a100, a800, custom:flops=..,bw=..,h2d=.. or file:PATH (default h100)",
    )


def layer_flags_given(args) -> list[str]:
    return [flag for dest, (flag, _) in LAYER_FLAGS.items() if getattr(args, dest, None) is not None]


def _value(args, dest):
    value = getattr(args, dest)
    return LAYER_FLAGS[dest][1] if value is None else value


def _int_list(flag: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{flag} must be positive, got {text!r}")
    return values


def plan_cases(prefill_tokens: int, context: int, suffix_tokens: tuple[int, ...], sparse_fraction: float) -> tuple[Case, ...]:
    cases = [Case("prefill", prefill_tokens, 0, 0)] if prefill_tokens else []
    if sparse_fraction:
        cases.append(Case("reprefill-sparse", suffix_tokens[0], max(1, int(context * sparse_fraction)), context))
    cases += [Case("reprefill-full", s, context, context) for s in suffix_tokens]
    return tuple(cases)


def layer_options(args) -> LayerOptions:
    """The validated flags of this mode; a one-line ``UsageError`` naming the flag otherwise."""
    from engine_client.compute_model import parse_profile
    from kvstore.contract.errors import InvalidArgument

    from .eval_common import bench_device

    shapes = tuple(x.strip() for x in args.shapes.split(",") if x.strip())
    unknown = [x for x in shapes if x not in SHAPES]
    if not shapes or unknown:
        raise UsageError(f"--shapes: unknown shape {(unknown or [args.shapes])[0]!r} (known: {', '.join(SHAPES)})")
    if len(set(shapes)) != len(shapes):
        raise UsageError(f"--shapes {args.shapes!r}: name each shape once")
    for flag, value in (("--model", args.model), ("--tokens", args.tokens)):
        if value is not None:
            raise UsageError(f"{flag} is for the pretrained run; --shapes times random weights of each shape")
    if not args.reference:
        raise UsageError("--no-reference is for the pretrained run; --shapes always runs the minimal layer")
    device = bench_device(args)
    dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    if dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    prefill_tokens, context = _value(args, "prefill_tokens"), _value(args, "context")
    repeats = DEFAULT_REPEATS if args.repeats is None else args.repeats
    warmup, fraction = _value(args, "warmup"), _value(args, "sparse_fraction")
    for flag, value, least in (("--prefill-tokens", prefill_tokens, 0), ("--context", context, 1), ("--repeats", repeats, 1)):
        if value < least:
            raise UsageError(f"{flag} must be >= {least}, got {value}")
    if warmup < 0 or args.threads < 1:
        raise UsageError(f"--warmup must be >= 0 and --threads >= 1, got {warmup} and {args.threads}")
    if not 0 <= fraction < 1:
        raise UsageError(f"--sparse-fraction must be in [0, 1), got {fraction}")
    suffix_tokens = _int_list("--suffix-tokens", _value(args, "suffix_tokens"))
    try:
        profile = parse_profile(_value(args, "profile"))
    except InvalidArgument as exc:
        raise UsageError(f"--{exc}") from None
    cases = plan_cases(prefill_tokens, context, suffix_tokens, fraction)
    return LayerOptions(shapes, device, dtype, cases, repeats, warmup, args.threads, profile)


def command_layers(args) -> int:
    import json

    report = run_layers(layer_options(args))
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else format_layers(report))
    return 0


def run_layers(opts: LayerOptions) -> dict:
    import torch

    from engine_client.compute_model import layer_seconds

    from .layer_shapes import random_decoder

    gpu = opts.device == "cuda"
    if not gpu:
        torch.set_num_threads(opts.threads)
    dtype = getattr(torch, opts.dtype)
    rows = []
    with torch.inference_mode():
        for shape in opts.shapes:
            cfg, dec = random_decoder(shape, opts.device, dtype)
            for case in opts.cases:
                row = {"model": shape, "case": case.name, "new_tokens": case.new_tokens, "context_rows": case.context_rows}
                row |= {"prefix_tokens": case.prefix_tokens} | measure_case(dec, case, opts)
                row["model_s"] = layer_seconds(cfg, case.new_tokens, case.context_rows, opts.profile).total
                graph = row["minimal_graph_s"]
                row["fixed_cost_over_graph_us"] = None if graph is None else (row["project_s"] - graph) * 1e6
                rows.append(row)
            del dec
            if gpu:
                torch.cuda.empty_cache()
    return {
        "device": opts.device,
        "device_name": torch.cuda.get_device_name() if gpu else _cpu_name(),
        "torch": torch.__version__,
        "dtype": opts.dtype,
        "threads": None if gpu else opts.threads,
        "repeats": opts.repeats,
        "warmup": opts.warmup,
        "profile": opts.profile.name,
        "fixed_cost_target_us": FIXED_COST_TARGET_US,
        "command": "kvstore-bench " + shlex.join(sys.argv[1:]),
        "rows": rows,
    }


def _cpu_name() -> str:
    from .machine import machine_info

    info = machine_info(".")
    return f"{info['cpu_model']} x{info['num_cpus']}"


def median_seconds(fn, gpu: bool, warmup: int, repeats: int) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs after ``warmup`` runs, synchronised before and after each."""
    import torch

    sync = torch.cuda.synchronize if gpu else (lambda: None)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_case(dec, case: Case, opts: LayerOptions) -> dict:
    """Times of the project's layer 0, the minimal layer eager, and (CUDA) captured, on the same random input."""
    import torch

    from .minimal_layer import GraphedLayer, MinimalLayer

    c, gpu = dec.config, opts.device == "cuda"
    s, r = case.new_tokens, case.context_rows
    gen = torch.Generator(device=dec.device).manual_seed(1)
    hidden = torch.randn(s, c.hidden_size, generator=gen, device=dec.device).to(dec.dtype)  # [s, hidden]
    prefix_kv = torch.randn(2, c.num_key_value_heads, r, c.head_dim, generator=gen, device=dec.device).to(dec.dtype)  # [2, Hkv, r, d]
    positions = dec.position_range(case.prefix_tokens, s)  # what the runner passes: no host sync per layer

    def project():
        return dec.layer_forward(0, hidden, positions, prefix_kv if r else None)

    out = {"project_s": median_seconds(project, gpu, opts.warmup, opts.repeats)}
    ours, ours_kv = project()
    layer = MinimalLayer(c, dec.weights.layers[0], prefix_kv, case.prefix_tokens, s)
    layer.hidden_in.copy_(hidden)
    out["minimal_eager_s"] = median_seconds(layer.forward, gpu, opts.warmup, opts.repeats)
    eager = layer.forward().clone()
    out["minimal_max_abs_diff"] = max(_max_abs(eager, ours), _max_abs(layer.suffix_kv(), ours_kv))
    out["attention_mask"], out["attention_mask_note"] = layer.mask_kind, layer.mask_note
    out |= {"minimal_graph_s": None, "graph_max_abs_diff": None, "graph_note": None}
    if not gpu:
        out["graph_note"] = "CUDA graphs need --device cuda"
        return out
    try:
        graphed = GraphedLayer(layer, opts.warmup)
    except RuntimeError as exc:  # a capture the installed torch refuses: the row says so, the others still run
        out["graph_note"] = f"capture failed: {str(exc).splitlines()[0][:200]}"
        return out
    out["minimal_graph_s"] = median_seconds(graphed.replay, gpu, opts.warmup, opts.repeats)
    out["graph_max_abs_diff"] = _max_abs(graphed.replay(), eager)
    return out


def _max_abs(a, b) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def format_layers(report: dict) -> str:
    lines = [
        f"one decoder layer (layer 0, random weights), {report['dtype']}, {report['device_name']} ({report['device']}), "
        f"torch {report['torch']}; median of {report['repeats']} runs after {report['warmup']} warm-ups",
        f"model: compute_model roofline, profile {report['profile']}; fixed = project - minimal graph "
        f"(target <= {report['fixed_cost_target_us']:.0f} us)",
    ]
    header = (
        f"{'case':<18}{'new x rows':>16}{'project ms':>12}{'eager ms':>10}{'graph ms':>10}{'model ms':>10}{'fixed us':>10}{'max diff':>10}"
    )
    notes = sorted({row["graph_note"] for row in report["rows"] if row["graph_note"]})

    def ms(v):
        return f"{'-':>10}" if v is None else f"{v * 1e3:>10.3f}"

    for shape in dict.fromkeys(row["model"] for row in report["rows"]):
        lines += ["", shape, header]
        for row in (r for r in report["rows"] if r["model"] == shape):
            fixed = row["fixed_cost_over_graph_us"]
            lines.append(
                f"{row['case']:<18}{str(row['new_tokens']) + ' x ' + str(row['context_rows']):>16}{row['project_s'] * 1e3:>12.3f}"
                f"{ms(row['minimal_eager_s'])}{ms(row['minimal_graph_s'])}{ms(row['model_s'])}"
                f"{'-' if fixed is None else f'{fixed:.0f}':>10}{row['minimal_max_abs_diff']:>10.1e}"
            )
    lines += [f"graph: {n}" for n in notes]
    lines += [f"minimal layer's mask: {n}" for n in sorted({r["attention_mask_note"] for r in report["rows"]} - {None})]
    lines.append("max diff: minimal layer's output and new KV rows against the project's (same weights and input)")
    return "\n".join(lines)
