"""``kvstore-bench reprefill --profile P``: the product's per-request choice as a row beside the systems it chooses from.

For each budget ``B`` the bench times, ``choice@B`` answers the same suffixes
through ``ModelRunner.answer`` with the profile ``P`` (a named accelerator or
a ``kvstore-bench calibrate`` file): per request, the cheapest of recompute,
loading the whole prefix and the sparse path at ``B``, as ``path_choice``
predicts them for that machine, each path repriced by what it measured on
the runner before (``path_choice.PathHistory``).  The row's TTFT is the
answer's own (the look-up, the prediction and the path it took, to the
first token); its I/O, compute and selection columns are those of the path
taken.  ``paths`` counts what was chosen, with the first request's reason
for each path.  One untimed answer comes first, as every row has a
warm-up; the path it took is ``warm_up`` (what it measured reprices that
path for the timed ones).
"""

from __future__ import annotations

from collections import Counter

from .reprefill_report import Sample


def choice_row(runner, prefix, suffixes, references, cfg, profile, *, sample, compare_logits):
    """``(samples, paths)`` of the choice at ``cfg``'s budget over ``suffixes`` (``references``: full-load logits)."""
    warm = runner.answer(prefix, suffixes[0], cfg, profile=profile, store=False)
    samples, chosen, reasons = [], Counter(), {}
    for i, suffix in enumerate(suffixes):
        ans = runner.answer(prefix, suffix, cfg, profile=profile, store=False)
        s = sample(ans.reprefill) if ans.reprefill is not None else None
        if s is None:  # recomputed: all of it compute
            s = Sample(ttft_s=ans.ttft_s, compute_s=ans.ttft_s)
        s.ttft_s = ans.ttft_s
        s.top1, s.kl = compare_logits(references[i], ans.logits)
        samples.append(s)
        chosen[ans.path] += 1
        reasons.setdefault(ans.path, ans.reason)
    return samples, {"chosen": dict(chosen), "reasons": reasons, "warm_up": {"path": warm.path, "reason": warm.reason}}
