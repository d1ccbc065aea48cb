"""Compare chunk-selection rules on a real model, in process, on tuning prompts.

    python -m kvstore_tools.selection_study --task niah --tokens 4096 --examples 10 [--start 0] [--stream tune]
                                    [--rules P1+follow-exact,P2+follow-int4,...] [--budget 0.05] [--layer-gains]
                                    [--standins 8,19] [--json]

A sparse Re-Prefill without the daemon: the prefix is prefilled once; for
each rule the question runs layer by layer (a sliding-window layer over its
window's last rows at their positions, as the runner gives it, whatever the
rule; it gains nothing with ``--layer-gains``), each Period's first layer scores
the chunks with the question's queries of the hidden state at hand (as the
runner does), keeps ``floor(budget x chunks x layers) / layers`` chunks per
layer (sink and local included, ``select_chunks``) and attends only to them.
The answer is teacher-forced: a rule keeps the answer when every answer token
is the argmax after the question and the answer tokens before it, which is
what greedy decoding over the same rows would produce.

``--layer-gains``: per layer, how much loading that one layer in full
raises the answer's weakest teacher-forced margin (its logit minus the best
other token's) over the first rule's sets: the layers whose left-out rows
take the answer's margin, where stand-in rows go (``engine_client.standin``).
``--standins 8,19``: the first rule's sets with stand-in rows at those
layers, their values the mean of the rows left out per KV head (as the
runner does) and, to compare, per 16-token chunk.

A rule is ``P<period layers>[+follow][+nolocal][+nosink][+cum][+first<f>][+lead<n>][+tail<n>][+hsum][+oracle]-<scorer>``
(``+nolocal``/``+nosink``: the last/first chunk is not forced into the set, its place goes
to the scores; ``+tail<n>``: only the question's last ``n`` queries score; ``+hsum``: query heads' mass
summed instead of each head's normalised maximum; ``+oracle``: the
evidence's chunks ranked first at every scored layer, a bound on what
finding it is worth, not a rule a runner can follow; ``+cum``: each selection ranks by the mass summed over every
scored layer so far, each layer's normalised to one; ``+first<f>``: the
first scored layer takes a share ``f`` of the chunk-layers, the others
split the rest; ``+lead<n>``: only the ``n`` best chunks bring the chunk
after them), scorer one of ``exact``
(the layer's keys), ``int4``/``int8`` (those keys quantized per token and
head, ``selection/probes.py``), ``summary`` (the channel min/max bound) or
``ch<k>`` (the ``k`` channels of largest mean magnitude per KV head, as
IMPRESS's partial probes).  Scores are the maximum (``+hsum``: the sum) over query heads of each
head's softmax mass (``head_aggregation="max"``).  ``drop<a>-<b>``: the full
KV but the needle's chunks in layers ``[a, b)``, to see which layers need it.

It is meant for the tuning seed stream: decide on ``--stream tune``, then
measure the chosen system once with ``kvstore-bench accuracy --stream eval``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

import numpy as np
import torch

DEFAULT_RULES = "P1-exact,P1+follow-exact,P2+follow-exact,P1+follow-int4,P1+follow-summary,drop0-14"
CHUNK = 16


def head_scores(q: torch.Tensor, keys: torch.Tensor, scorer: str) -> torch.Tensor:
    """``[Hq, m]`` softmax mass per query head and chunk (summed over the question's queries)."""
    from engine_client.selection.heads import exact_head_chunk_scores, summary_head_chunk_scores
    from engine_client.selection.probes import quantize_keys

    if scorer == "summary":
        from kvstore_tools.bench.recall import chunk_summaries

        kmin, kmax = chunk_summaries(keys, CHUNK)
        return summary_head_chunk_scores(q, kmin, kmax)
    keys = keys.float()
    if scorer.startswith("int"):
        keys = quantize_keys(keys, int(scorer[3:])).dequantize()
    elif scorer.startswith("ch"):
        idx = keys.abs().mean(1).topk(int(scorer[2:]), -1).indices  # [Hkv, k]
        mask = torch.zeros_like(keys[:, :1, :]).scatter_(-1, idx[:, None, :], 1.0)
        keys = keys * mask
    elif scorer != "exact":
        raise ValueError(f"unknown scorer {scorer!r}")
    return exact_head_chunk_scores(q, keys, CHUNK)


def parse_rule(rule: str):
    """``("drop", a, b)`` or ``("select", period, follow, scorer, local, cum, first, lead, sink, tail, heads, oracle)``."""
    if m := re.fullmatch(r"drop(\d+)-(\d+)", rule):
        return ("drop", int(m[1]), int(m[2]))
    if m := re.fullmatch(
        r"P([1-9]\d*)(\+follow)?(\+nolocal)?(\+nosink)?(\+cum)?(\+first0?\.\d+)?(\+lead\d)?(\+tail[1-9]\d*)?(\+hsum)?(\+oracle)?"
        r"-(exact|summary|int4|int8|ch[1-9]\d*)",
        rule,
    ):
        first = float(m[6][6:]) if m[6] else None
        lead = int(m[7][5:]) if m[7] else None
        tail = int(m[8][5:]) if m[8] else None
        return (
            "select",
            int(m[1]),
            1 if m[2] or lead else 0,
            m[11],
            0 if m[3] else 1,
            bool(m[5]),
            first,
            lead,
            0 if m[4] else 1,
            tail,
            "sum" if m[9] else "max",
            bool(m[10]),
        )
    raise ValueError(
        f"rule {rule!r}: expected P<layers>[+follow][+nolocal][+nosink][+cum][+first<f>][+lead<n>][+tail<n>][+hsum][+oracle]-<scorer>"
        " or drop<a>-<b>"
    )


@torch.inference_mode()
def keeps_answer(model, kv, question, answer, rule, budget, needle, whole=()) -> tuple[bool, list[float]]:
    """(every answer token is the argmax, fraction of the needle's chunks in each layer's set).

    ``whole``: layers that attend to every prefix row instead (``--layer-gains``).
    """
    ok, loaded, _ = _teacher_forced(model, kv, question, answer, rule, budget, needle, whole)
    return ok, loaded


def layer_gains(model, kv, question, answer, rule, budget, needle) -> list[float]:
    """Per layer: the answer's weakest teacher-forced margin with that one layer whole, minus the rule's own
    (``--layer-gains``; what ``python -m kvstore_tools.models calibrate-standins`` averages)."""
    weakest = min(_teacher_forced(model, kv, question, answer, rule, budget, needle)[2])
    sliding = set(model.config.sliding_layers)  # they see their window whatever the rule: nothing to gain
    return [
        0.0 if layer in sliding else min(_teacher_forced(model, kv, question, answer, rule, budget, needle, (layer,))[2]) - weakest
        for layer in range(model.num_layers)
    ]


def standin_rows(layer_kv, rows, keys, values, values_by: str) -> torch.Tensor:
    """The selected rows ``layer_kv [2, Hkv, r, d]`` at positions ``rows``, then a stand-in for every other
    prefix row: its 4-bit key from ``keys [Hkv, n, d]`` and, as value, the mean over the rows left out of
    ``values [Hkv, n, d]`` per KV head (``values_by="head"``, what ``engine_client.standin`` does) or per
    16-token chunk (``"chunk"``: each row the mean of its own chunk)."""
    from engine_client.selection.probes import quantize_keys
    from engine_client.standin import standin_kv, value_sum

    probe = quantize_keys(keys.float(), 4).dequantize(layer_kv.dtype)
    if values_by == "head":
        return standin_kv(layer_kv, rows, probe, value_sum(values))
    if values_by != "chunk":
        raise ValueError(f"stand-in values by 'head' or 'chunk', not {values_by!r}")
    n = keys.shape[1]
    left = torch.ones(n, dtype=torch.bool)
    left[rows] = False
    chunk = torch.arange(n) // CHUNK
    m = int(chunk[-1]) + 1
    sums = torch.zeros(values.shape[0], m, values.shape[2]).index_add_(1, chunk[left], values[:, left].float())
    counts = torch.bincount(chunk[left], minlength=m).clamp(min=1)
    means = (sums / counts[None, :, None])[:, chunk[left]].to(layer_kv.dtype)  # [Hkv, n - r, d]
    return torch.cat([layer_kv, torch.stack([probe[:, left], means])], dim=2)


@torch.inference_mode()
def _teacher_forced(model, kv, question, answer, rule, budget, needle, whole=(), standin=(), values_by="head"):
    """``keeps_answer``'s two results and each answer token's margin (its logit minus the best other).

    ``standin``: layers whose rows not selected stand in (``standin_rows``, values by ``values_by``)."""
    from engine_client.selection import aggregate_heads, plan_periods, select_chunks

    n = kv.shape[3]
    m = -(-n // CHUNK)
    layers = model.num_layers
    toks = torch.cat([question, answer])
    s = question.numel()
    pos = torch.arange(n, n + toks.numel())
    hidden = model.embed(toks)
    spec = parse_rule(rule)
    k = plan_periods(layers, m, budget, period_layers=1).periods[0][2]
    scored = [la for la in range(layers) if model.config.window_of(la) is None]
    if spec[0] == "select" and spec[6] is not None:  # +first<f>: the first scored layer takes f of the chunk-layers
        first = max(1, min(m, round(spec[6] * k * len(scored))))
        rest = max(1, (k * len(scored) - first) // max(1, len(scored) - 1))
        ks = {la: first if i == 0 else rest for i, la in enumerate(scored)}
    else:
        ks = dict.fromkeys(scored, k)
    chosen, loaded, acc = None, [], None
    for layer in range(layers):
        window = model.config.window_of(layer)
        if window is not None:  # a sliding layer sees its window's last rows, at their positions, as the runner gives them
            at = torch.arange(max(0, n - window), n)
            loaded.append(float(np.isin(needle, torch.unique(at // CHUNK).numpy()).mean()))
            hidden, _ = model.layer_forward(layer, hidden, pos, kv[layer][:, :, at], prefix_positions=at)
            continue
        if spec[0] == "drop":
            chosen = torch.tensor([c for c in range(m) if not (spec[1] <= layer < spec[2] and c in needle)])
        elif layer % spec[1] == 0:
            q = model.layer_queries(layer, hidden[:s], pos[:s])
            if spec[9]:  # +tail<n>: only the question's last n queries score
                q = q[:, -spec[9] :]
            scores = aggregate_heads(head_scores(q, kv[layer, 0], spec[3]), spec[10])
            if spec[5]:  # +cum: the mass of every scored layer so far, each layer's scores summing to one
                scores = scores / scores.sum()
                acc = scores if acc is None else acc + scores
                scores = acc
            if spec[11]:  # +oracle: the evidence's chunks first, whatever they score (what finding it is worth)
                scores = scores.clone()
                scores[torch.as_tensor(needle, dtype=torch.long)] = float("inf")
            chosen = select_chunks(scores, ks[layer], follow=spec[2], follow_top=spec[7] or 0, local_chunks=spec[4], sink_chunks=spec[8])
        loaded.append(float(np.isin(needle, chosen.numpy()).mean()))
        rows = torch.cat([torch.arange(c * CHUNK, min(n, (c + 1) * CHUNK)) for c in chosen.tolist()])
        layer_kv = kv[layer] if layer in whole else kv[layer][:, :, rows]
        if layer in standin and layer not in whole:
            layer_kv = standin_rows(layer_kv, rows, kv[layer, 0], kv[layer, 1], values_by)
        hidden, _ = model.layer_forward(layer, hidden, pos, layer_kv)
    logits = model._logits(hidden)[s - 1 : s - 1 + answer.numel()]  # the teacher-forced answer's positions
    mine = logits.gather(1, answer[:, None])[:, 0]
    margins = mine - logits.scatter(1, answer[:, None], float("-inf")).amax(1)
    return bool(torch.equal(logits.argmax(-1), answer)), loaded, margins.tolist()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvstore_tools.selection_study", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--task", default="niah")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--examples", type=int, default=6)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--stream", choices=("tune", "eval"), default="tune")
    p.add_argument("--rules", default=DEFAULT_RULES)
    p.add_argument("--budget", type=float, default=0.05)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--layer-gains",
        action="store_true",
        help="per layer, how much loading it in full raises the answer's weakest margin over the first rule's sets",
    )
    p.add_argument(
        "--standins",
        default="",
        help="comma-separated layers: the first rule's sets with stand-ins there, values per KV head and per chunk",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        rules = [r.strip() for r in args.rules.split(",") if r.strip()]
        for r in rules:
            parse_rule(r)
        standins = tuple(int(x) for x in args.standins.split(",") if x.strip())
        if not 0 < args.budget <= 1 or args.examples < 1:
            raise ValueError("--budget must be in (0, 1] and --examples >= 1")
    except ValueError as exc:
        p.error(str(exc))
    from engine_client.model import zoo
    from engine_client.prefill import chunked_prefill
    from kvstore.progress import progress
    from kvstore_tools.tasks import text

    torch.set_num_threads(args.threads)
    pm = zoo.load(args.model, dtype=torch.float32)
    examples = text.examples(args.task, pm.tokenizer, args.examples, args.tokens, stream=args.stream, start=args.start)
    rows = []
    t0 = time.perf_counter()
    for ex in progress(examples, desc=f"{args.task}@{args.tokens}", total=len(examples), unit="example"):
        _, kv = chunked_prefill(pm.decoder, torch.from_numpy(ex.prefix_tokens))
        question = torch.from_numpy(ex.suffix_tokens).long()
        answer = torch.tensor(pm.tokenizer.encode(" " + ex.answers[0]), dtype=torch.long)
        needle = ex.needle_chunks(CHUNK)
        row = {"seed": ex.seed, "depth": ex.depth}
        for rule in rules:
            ok, loaded, margins = _teacher_forced(pm.decoder, kv, question, answer, rule, args.budget, needle)
            row[rule] = {"kept": ok, "needle_loaded": loaded, "margins": margins}
        if args.layer_gains:  # the first rule's sets with one layer whole, each layer in turn
            row["layer_gains"] = layer_gains(pm.decoder, kv, question, answer, rules[0], args.budget, needle)
        for by in ("head", "chunk") if standins else ():
            ok, _, margins = _teacher_forced(pm.decoder, kv, question, answer, rules[0], args.budget, needle, (), standins, by)
            row[f"standin-{by}"] = {"kept": ok, "margins": margins}
        rows.append(row)
    report = {
        "model": args.model,
        "task": args.task,
        "tokens": args.tokens,
        "stream": args.stream,
        "budget": args.budget,
        "seeds": [rows[0]["seed"], rows[-1]["seed"]],
        "seconds": time.perf_counter() - t0,
        "rows": rows,
        "kept": {r: sum(row[r]["kept"] for row in rows) for r in rules},
    }
    if args.layer_gains:
        report["layer_gains_mean"] = np.mean([row["layer_gains"] for row in rows], axis=0).round(3).tolist()
    for by in ("head", "chunk") if standins else ():
        key = f"standin-{by}"
        report["kept"][key] = sum(row[key]["kept"] for row in rows)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"{args.model} {args.task} @ {args.tokens} tokens, {args.stream} seeds {report['seeds']}, budget {args.budget:g}")
        for r in rules:
            per_layer = np.mean([row[r]["needle_loaded"] for row in rows], axis=0)
            print(f"  {r:22s} kept {report['kept'][r]}/{len(rows)}   needle loaded, layers 14-23: {per_layer[14:24].mean():.2f}")
        for key in [k for k in report["kept"] if k not in rules] + rules[:1]:
            weakest = np.mean([min(row[key]["margins"]) for row in rows])
            print(f"  {key:22s} kept {report['kept'][key]}/{len(rows)}   weakest answer margin, mean: {weakest:.2f}")
        if args.layer_gains:
            gains = report["layer_gains_mean"]
            top = sorted(range(len(gains)), key=lambda i: -gains[i])[:6]
            print(
                f"  {rules[0]} with one layer whole, weakest answer margin gained (mean): "
                + ", ".join(f"layer {i} {gains[i]:+.2f}" for i in top)
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
