"""How much of a layer's chunk set the daemon could have read ahead, under the default system.

    python -m kvstore_tools.layer_overlap [--model smollm2-135m] [--tokens 2048] [--budget 0.05] [--examples 3] [--random] [--json]

The default system selects at every layer, so a layer's read can only start
once its set is known, unless the daemon reads a guess ahead.  Two guesses
exist: the previous layer's set (``speculate``, the default) and the next
layer's own queries on the hidden state at hand (``lookahead=1``).  For each
prompt (pass-key and NIAH from the tuning stream, a real daemon, the
pretrained model on the CPU) this runs one Re-Prefill with ``lookahead=1``
and prints, averaged over layers 1 to L-1, the share of each layer's set
that the previous layer's set holds and the share the look-ahead guess
holds.  ``--random`` adds three prompts of random tokens on the same shape
with random weights (the device check's models), whose layers agree far
less: what a random-weight TTFT table says of speculation is not what a
trained model gets.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

RANDOM_SHAPES = {"smollm2-135m": "smollm2-135m-shape"}  # a model -> its random-weight shape (layer_shapes)


def overlaps(selected: list, hints: list) -> tuple[float, float]:
    """Mean over layers 1.. of (previous set ∩ set, guess ∩ set) / set."""
    prev, guess = [], []
    for p in range(1, len(selected)):
        cur = set(np.asarray(selected[p]).tolist())
        prev.append(len(cur & set(np.asarray(selected[p - 1]).tolist())) / len(cur))
        guess.append(len(cur & set(np.asarray(hints[p]).tolist())) / len(cur) if hints[p] is not None else 0.0)
    return float(np.mean(prev)), float(np.mean(guess))


def measure(args) -> list[dict]:
    import torch

    from engine_client.client import KVStoreClient
    from engine_client.model import zoo
    from engine_client.reprefill import ModelRunner, parse_system
    from kvstore_tools.bench.daemon_io import DaemonArgs, _Daemon
    from kvstore_tools.bench.layer_shapes import seeded_model
    from kvstore_tools.tasks.text import examples

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    pretrained = zoo.load(args.model, dtype=torch.float32)
    context = pretrained.config.max_position_embeddings
    if args.tokens + 64 > context:  # the prompts run a few tokens past --tokens, and the random ones add 32
        raise ValueError(f"--tokens: {args.tokens} tokens and a question pass {args.model}'s context of {context}")
    cases = []
    for task in args.tasks:
        for ex in examples(task, pretrained.tokenizer, args.examples, args.tokens, stream="tune"):
            cases.append(
                (f"trained {task} seed {ex.seed}", pretrained.decoder, torch.as_tensor(ex.prefix_tokens), torch.as_tensor(ex.suffix_tokens))
            )
    if args.random:
        model = seeded_model(RANDOM_SHAPES[args.model], torch.device("cpu"), torch.float32, 0)
        gen = torch.Generator().manual_seed(0)
        for i in range(3):
            prefix = torch.randint(0, model.config.vocab_size, (args.tokens,), generator=gen)
            cases.append((f"random {i}", model, prefix, torch.randint(0, model.config.vocab_size, (32,), generator=gen)))
    store = tempfile.mkdtemp(prefix="layer-overlap-")
    daemon = _Daemon(store, DaemonArgs(), extra=["--prefetch-reserve-fraction", "1"])
    rows = []
    try:
        with KVStoreClient(f"unix:{daemon.socket}") as client:
            runners: dict[int, ModelRunner] = {}
            cfg = parse_system("ckv+int4-probes+standins+lookahead=1").replace(budget=args.budget)
            for name, model, prefix, suffix in cases:
                runner = runners.setdefault(id(model), ModelRunner(model, client, group_layers=1, probe_bits=4))
                res = runner.reprefill(runner.store_prefix(prefix).prefix_id, suffix, cfg)
                previous, guess = overlaps(res.selected, res.hints)
                rows.append(
                    {"prompt": name, "chunks_per_layer": int(len(res.selected[1])), "previous_set": previous, "lookahead_guess": guess}
                )
    finally:
        daemon.stop()
        shutil.rmtree(store, ignore_errors=True)
    return rows


def main(argv=None) -> int:
    from kvstore.cli_flags import one_fraction_arg, positive_int
    from kvstore_tools.tasks.text import TASKS

    ap = argparse.ArgumentParser(prog="python -m kvstore_tools.layer_overlap", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", choices=sorted(RANDOM_SHAPES), help="a pretrained model (default smollm2-135m)")
    ap.add_argument("--tokens", type=positive_int, default=2048, help="prompt tokens (default 2048)")
    ap.add_argument("--budget", type=one_fraction_arg, default=0.05, help="the fraction of chunks a layer loads (default 0.05)")
    ap.add_argument("--examples", type=positive_int, default=3, help="prompts per task (default 3)")
    ap.add_argument("--tasks", default="passkey,niah", help="comma-separated text tasks (default passkey,niah)")
    ap.add_argument("--random", action="store_true", help="add random tokens on the random-weight shape")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    args.tasks = [t for t in args.tasks.split(",") if t]
    bad = [t for t in args.tasks if t not in TASKS]
    if bad or not args.tasks:
        ap.error(f"argument --tasks: unknown task {bad[0] if bad else ''!r} (known: {', '.join(TASKS)})")
    from engine_client.model import zoo

    try:
        rows = measure(args)
    except (zoo.UnknownModel, zoo.ModelNotInstalled, ValueError) as exc:
        print(f"layer_overlap: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"params": vars(args), "rows": rows}, indent=1))
    else:
        for r in rows:
            print(
                f"{r['prompt']:28s} {r['chunks_per_layer']:4d} chunks a layer; the previous layer's set holds "
                f"{r['previous_set']:.2f} of it, the look-ahead guess {r['lookahead_guess']:.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
