"""``kvstore-bench prefill``: dense prefill time per layer, the project's decoder against transformers.

Both run the same pretrained model (``engine_client.model.zoo``; transformers
loads the same GGUF) on the same token ids of real prose, on the same number
of torch threads, in float32.  Ours is timed layer by layer through the
decoder's layer API (``embed``, ``layer_forward``, ``final_logits``: what a
Re-Prefill runner calls); transformers' layers are timed with forward hooks
inside one ``model(ids)`` call.  One short warm-up forward precedes each;
each layer's time is its fastest over ``--repeats`` runs (the machine may be
shared: the report gives its load average).

``--shapes`` turns on the per-layer comparison instead (``layer_compare``):
one layer of each named model shape with random weights, the project's
against a minimal layer, eager and (on CUDA) in a CUDA graph, and the compute
model's figure, on ``--device``.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import time
import warnings

import torch

from .io_jobs import BenchError, UsageError

WARMUP_TOKENS = 32


def prose_text() -> str:
    """The Apache-2.0 licence text shipped in grpcio's wheel (a pinned dependency): real English prose."""
    files = importlib.metadata.distribution("grpcio").files or []
    path = next((f for f in files if str(f).endswith("licenses/LICENSE")), None)
    if path is None:
        raise BenchError("grpcio's wheel has no licenses/LICENSE to take prose from")
    return path.read_text(encoding="utf-8")


def prose_tokens(tokenizer, num_tokens: int) -> list[int]:
    """``num_tokens`` ids of the prose, repeated end to end if it is shorter."""
    ids = tokenizer.encode(prose_text())
    return (ids * (num_tokens // len(ids) + 1))[:num_tokens]


DEFAULT_MODEL = "smollm2-135m"
DEFAULT_TOKENS = 2000
DEFAULT_REPEATS = 2


def add_prefill_parser(sub) -> None:
    from .layer_compare import add_layer_flags

    p = sub.add_parser(
        "prefill",
        help="dense prefill ms per layer: the project's decoder vs transformers; with --shapes, one layer vs a minimal layer",
    )
    p.add_argument("--model", help=f"a name from python -m kvstore_tools.models list (default {DEFAULT_MODEL})")
    p.add_argument("--tokens", type=int, help=f"prompt tokens (default {DEFAULT_TOKENS})")
    p.add_argument("--threads", type=int, default=2, help="torch threads for both (on a CPU)")
    p.add_argument(
        "--repeats",
        type=int,
        help=f"timed runs of each; the fastest run of each layer is kept (default {DEFAULT_REPEATS}); with --shapes the median (default 10)",
    )
    p.add_argument("--no-reference", dest="reference", action="store_false", help="time only the project's decoder")
    p.add_argument("--json", action="store_true")
    add_layer_flags(p)
    p.set_defaults(run=command_prefill)


def command_prefill(args) -> int:
    import json

    from .layer_compare import command_layers, layer_flags_given

    if args.shapes is not None:
        return command_layers(args)
    given = layer_flags_given(args)
    if given:
        raise UsageError(f"{', '.join(given)}: only with --shapes (the per-layer comparison); the pretrained run is CPU-only")
    model = DEFAULT_MODEL if args.model is None else args.model
    tokens = DEFAULT_TOKENS if args.tokens is None else args.tokens
    repeats = DEFAULT_REPEATS if args.repeats is None else args.repeats
    if min(tokens, args.threads, repeats) < 1:
        raise BenchError("--tokens, --threads and --repeats must be positive")
    report = run_prefill(model, tokens, args.threads, args.reference, repeats)
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else format_prefill(report))
    return 0


def run_prefill(model: str, num_tokens: int, threads: int, reference: bool = True, repeats: int = 1) -> dict:
    from engine_client.model import zoo

    torch.set_num_threads(threads)
    try:
        loaded = zoo.load(model, dtype=torch.float32)
    except (zoo.UnknownModel, zoo.ModelNotInstalled) as exc:
        raise BenchError(str(exc)) from None
    ids = prose_tokens(loaded.tokenizer, num_tokens)
    report = {
        "model": model,
        "tokens": num_tokens,
        "threads": threads,
        "dtype": "float32",
        "torch": torch.__version__,
        "repeats": repeats,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, CPU only",
        "load_average_1min_before": round(os.getloadavg()[0], 2),  # other processes on the machine skew timings
        "ours": _time_ours(loaded.decoder, ids, repeats),
    }
    if reference:
        report["transformers"] = _time_transformers(zoo.locate(model), ids, repeats)
    return report


def _time_ours(decoder, ids: list[int], repeats: int) -> dict:
    def run(tokens):
        per_layer = []
        start = time.perf_counter()
        hidden = decoder.embed(tokens)
        positions = torch.arange(tokens.numel())
        for layer in range(decoder.num_layers):
            t0 = time.perf_counter()
            hidden, _ = decoder.layer_forward(layer, hidden, positions, None)
            per_layer.append((time.perf_counter() - t0) * 1e3)
        decoder.final_logits(hidden)
        return per_layer, (time.perf_counter() - start) * 1e3

    run(torch.tensor(ids[:WARMUP_TOKENS]))
    return _best([run(torch.tensor(ids)) for _ in range(repeats)])


def _time_transformers(gguf_path, ids: list[int], repeats: int) -> dict:
    try:
        import transformers
    except ImportError:
        raise BenchError("the transformers reference needs the test extra: pip install -e '.[test]' (or pass --no-reference)") from None
    with warnings.catch_warnings():  # the reference's own load-time warnings
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
    model.eval()
    starts: dict[int, float] = {}
    per_layer: list[float] = []

    def pre(module, _args, index):
        starts[index] = time.perf_counter()

    def post(module, _args, _out, index):
        per_layer.append((time.perf_counter() - starts[index]) * 1e3)

    layers = model.model.layers
    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(lambda m, a, i=i: pre(m, a, i))
        layer.register_forward_hook(lambda m, a, o, i=i: post(m, a, o, i))
    runs = []
    with torch.inference_mode():
        model(torch.tensor([ids[:WARMUP_TOKENS]]))
        for _ in range(repeats):
            per_layer.clear()
            start = time.perf_counter()
            model(torch.tensor([ids]))
            runs.append((list(per_layer), (time.perf_counter() - start) * 1e3))
    summary = _best(runs)
    summary["version"] = transformers.__version__
    summary["attention"] = model.config._attn_implementation
    return summary


def _best(runs: list[tuple[list[float], float]]) -> dict:
    """Fastest time of each layer over the runs, and the fastest total."""
    per_layer = [min(times) for times in zip(*(r[0] for r in runs))]
    total_ms = min(r[1] for r in runs)
    return {
        "total_ms": round(total_ms, 1),
        "layers_ms": round(sum(per_layer), 1),
        "mean_layer_ms": round(sum(per_layer) / len(per_layer), 2),
        "max_layer_ms": round(max(per_layer), 2),
        "per_layer_ms": [round(x, 2) for x in per_layer],
    }


def format_prefill(report: dict) -> str:
    systems = [s for s in ("ours", "transformers") if s in report]
    lines = [
        f"prefill of {report['tokens']} tokens, {report['model']}, {report['dtype']}, {report['threads']} threads, "
        f"best of {report['repeats']} ({report['machine']}; load average {report['load_average_1min_before']})"
    ]
    lines.append(f"{'':<18}" + "".join(f"{s:>14}" for s in systems))
    for key, label in (
        ("mean_layer_ms", "ms per layer"),
        ("max_layer_ms", "slowest layer ms"),
        ("layers_ms", "all layers ms"),
        ("total_ms", "total ms"),
    ):
        lines.append(f"{label:<18}" + "".join(f"{report[s][key]:>14.1f}" for s in systems))
    return "\n".join(lines)
