"""Real-text task accuracy of the transformers sparse path next to the Re-Prefill runner's, on SmolLM2-135M.

    python -m kvstore_tools.hf_sparse_accuracy --task passkey,niah --tokens 2048 --examples 20 --budgets 0.05,0.1 [--start 100] \
        [--system default] [--threads 1] [--json]

Per example, through one real daemon started for the run: the runner stores the prefix; the full KV
answers in transformers (``model.generate`` over prefix and suffix, no store); then, at each budget,
``ModelRunner.generate`` (the project's decoder) and ``SparseReprefill.generate`` (transformers'
model loaded from the same GGUF, ``engine_client.integrations``) answer from the same stored prefix
with the same ``ReprefillConfig`` (``--system``: a named system, ``default`` for ``ReprefillConfig()``,
whose stand-in layers are the runner's calibration).  Printed per task and path: correct answers
(Wilson 95%), KV loaded, and between the runner and transformers the Periods whose chunk sets
are equal, the examples whose tokens are equal and the largest first-token logit difference.
Float32, greedy, 16 new tokens; evaluation seeds from 1,000,000 + ``--start``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
import warnings

import torch

from engine_client.client import KVStoreClient
from engine_client.model import zoo
from engine_client.reprefill import Budget, ModelRunner, ReprefillConfig, parse_system
from kvstore_tools.tasks import text

NEW_TOKENS = 16


def wilson(correct: int, total: int, z: float = 1.96) -> tuple[float, float]:
    if not total:
        return 0.0, 1.0
    p = correct / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * ((p * (1 - p) / total + z * z / (4 * total * total)) ** 0.5) / (1 + z * z / total)
    return max(0.0, centre - half), min(1.0, centre + half)


def load_transformers(dtype: torch.dtype):
    """SmolLM2-135M as transformers loads it from the zoo's GGUF: (model, tokenizer)."""
    import transformers

    path = zoo.locate("smollm2-135m")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
        tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model.eval(), tok


def config(system: str, budget: float) -> ReprefillConfig:
    if system == "default":
        return ReprefillConfig().replace(budget=Budget.fraction(budget))
    return parse_system(system, budget=Budget.fraction(budget))


def run(args, client, models=None) -> dict:
    """The report; ``models``: (transformers model, its tokenizer, the zoo's ``PretrainedModel``), float32, if loaded already."""
    from engine_client.integrations.transformers_cache import KVStorePrefixCache
    from engine_client.integrations.transformers_sparse import SparseReprefill

    if models is None:
        models = (*load_transformers(torch.float32), zoo.load("smollm2-135m", dtype=torch.float32))
    hf, tok, pm = models
    cache = KVStorePrefixCache(client, hf, tok)
    runner = ModelRunner(pm.decoder, client)
    sparse = SparseReprefill(cache, standin_layers=runner.standin_profile, selection_profile=runner.selection_profile)
    standins = list(getattr(runner.standin_profile, "layers", ()))  # what "auto" stand-ins read (ReprefillConfig())
    report = {"system": args.system, "tokens": args.tokens, "budgets": args.budgets, "calibrated_standins": standins, "tasks": {}}
    for task in args.task:
        rows = []
        for ex in text.examples(task, pm.tokenizer, args.examples, args.tokens, start=args.start):
            t0 = time.perf_counter()
            handle = runner.store_prefix(ex.prefix_tokens)
            ids = torch.tensor([[*ex.prefix_tokens.tolist(), *ex.suffix_tokens.tolist()]])
            with torch.no_grad():
                full = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False)
            row = {"seed": ex.seed, "full": ex.is_correct(tok.decode(full[0, ids.shape[1] :], skip_special_tokens=True))}
            for b in args.budgets:
                cfg = config(args.system, b)
                ours = runner.generate(handle.prefix_id, ex.suffix_tokens, cfg, NEW_TOKENS, tokenizer=pm.tokenizer)
                theirs = sparse.generate(handle.prefix_id, ex.suffix_tokens, cfg, NEW_TOKENS)
                sets = [torch.equal(a, c) for a, c in zip(ours.reprefill.selected, theirs.reprefill.selected)]
                row[str(b)] = {
                    "runner": ex.is_correct(ours.text),
                    "transformers": ex.is_correct(theirs.text),
                    "kv_fraction": theirs.reprefill.kv_fraction,
                    "periods_equal": sum(sets),
                    "periods": len(sets),
                    "tokens_equal": ours.tokens == theirs.tokens,
                    "logit_diff": (ours.reprefill.logits.float() - theirs.logits).abs().max().item(),
                }
            row["seconds"] = time.perf_counter() - t0
            rows.append(row)
            print(f"{task} seed {ex.seed}: {json.dumps(row)}", file=sys.stderr)
        report["tasks"][task] = rows
    return report


def summary(report: dict) -> str:
    standins = report.get("calibrated_standins") or "none"
    lines = [
        f"system {report['system']} (calibrated stand-in layers: {standins}), {report['tokens']} prefix tokens, "
        f"float32, greedy {NEW_TOKENS} tokens"
    ]
    lines.append("task      path                    correct (Wilson 95%)        KV loaded  sets equal  tokens equal  max logit diff")
    for task, rows in report["tasks"].items():
        n = len(rows)
        full = sum(r["full"] for r in rows)
        lo, hi = wilson(full, n)
        lines.append(f"{task:9} full KV (transformers)   {full}/{n} ({lo:.0%}-{hi:.0%})")
        for b in report["budgets"]:
            cells = [r[str(b)] for r in rows]
            kv = sum(c["kv_fraction"] for c in cells) / n
            sets = f"{sum(c['periods_equal'] for c in cells)}/{sum(c['periods'] for c in cells)}"
            same = f"{sum(c['tokens_equal'] for c in cells)}/{n}"
            diff = max(c["logit_diff"] for c in cells)
            for path in ("runner", "transformers"):
                k = sum(c[path] for c in cells)
                lo, hi = wilson(k, n)
                lines.append(
                    f"{task:9} {path + ' @' + format(b, '.0%'):23} {k}/{n} ({lo:.0%}-{hi:.0%}){'':12} {kv:8.1%}  {sets:>10}  {same:>12}  {diff:.2g}"
                )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvstore_tools.hf_sparse_accuracy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", type=lambda s: s.split(","), default=["passkey", "niah"])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--examples", type=int, default=20)
    parser.add_argument("--start", type=int, default=100, help="first evaluation seed, after 1,000,000")
    parser.add_argument("--budgets", type=lambda s: [float(x) for x in s.split(",")], default=[0.05, 0.1])
    parser.add_argument("--system", default="default", help="a named system (kvstore-bench accuracy --help), or default")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--target", help="a running daemon (unix:PATH); by default one is started for the run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.target:
        with KVStoreClient(args.target) as client:
            report = run(args, client)
    else:
        from kvstore_tools.bench.daemon_io import private_daemon_client

        with tempfile.TemporaryDirectory() as directory, contextlib.ExitStack() as stack:
            report = run(args, private_daemon_client(directory, "hf-accuracy-", stack))
    print(json.dumps(report) if args.json else summary(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
