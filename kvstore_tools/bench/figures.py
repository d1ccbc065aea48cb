"""The Zipf benchmark's figures from its per-request records (pure: no I/O, no torch).

Every figure printed for a system - means, P95, hit rate - and every
headline ratio between systems is computed here, from the raw records the
benchmark keeps (``report["requests"]``), so a reader or a test can
recompute any of them from those records.

A record is one timed request of one system at one budget: a dict of plain
numbers (``ttft_s``, ``io_wait_s``, ``tokens_loaded`` per Period,
``bytes_disk`` including fetched client state, ...).
"""

from __future__ import annotations

import numpy as np

# Ratios of means, numerator system over denominator, for each metric.
RATIO_METRICS = {"ttft": "ttft_s", "tokens": "tokens_loaded", "bytes": "bytes_disk", "io wait": "io_wait_s"}
BASELINES = ("impress", "as-h2o", "as-lru")
REFERENCES = ("contiguouskv", "contiguouskv-paper")
ABLATIONS = ("contiguouskv-noprefetch", "contiguouskv-lfu")


def mean_of(records: list[dict], field: str) -> float | None:
    """Mean of ``field`` over the records that have it (None when none has)."""
    have = [r[field] for r in records if r.get(field) is not None]
    return float(np.mean(have)) if have else None


def summarize(records: list[dict]) -> dict:
    """One system's row from its timed requests."""
    ttft = np.array([r["ttft_s"] for r in records])
    units = sum(r["units"] for r in records)
    fields = (
        "io_wait_s",
        "daemon_wait_s",
        "select_s",
        "compute_s",
        "tokens_loaded",
        "token_cap",
        "bytes_disk",
        "state_bytes_fetched",
        "bytes_useful",
        "bytes_cpu",
        "bytes_gpu",
        "spec_used",
        "spec_wasted",
        "groups_covered",
        "hint_recall",
        "prev_recall",
        "top1",
        "kl",
        "correct",
        "decode_s",
    )
    row = {"requests": len(records), "ttft_mean_s": float(ttft.mean()), "ttft_p95_s": float(np.percentile(ttft, 95))}
    row.update({f"{f}_mean": mean_of(records, f) for f in fields})
    row["hit_rate"] = sum(r["hit_units"] for r in records) / units if units else None
    return row


def _ratio(requests: dict[str, list[dict]], num: str, den: str, field: str) -> float | None:
    a, b = requests.get(num), requests.get(den)
    if not a or not b:
        return None
    top, bottom = mean_of(a, field), mean_of(b, field)
    return top / bottom if top is not None and bottom else None


def headline_ratios(requests: dict[str, list[dict]], budgets) -> dict[str, float]:
    """``"<metric> <system>/<reference> @<budget>"`` -> ratio of the two systems' means.

    ``requests``: ``"system@budget"`` -> its timed records.  Each baseline
    (and each ablation) over ``contiguouskv`` and over ``contiguouskv-paper``
    at every budget; ``as-lru`` runs once, at budget 1, against both at
    every budget, and so does ``recompute`` (its TTFT).  Ratios whose systems
    did not run are left out.
    """
    out: dict[str, float] = {}
    for b in budgets:
        for ref in REFERENCES:
            den = f"{ref}@{b:g}"
            others = [o for o in REFERENCES + BASELINES + ABLATIONS if o != ref]
            for other in others:
                num = "as-lru@1" if other == "as-lru" else f"{other}@{b:g}"
                for metric, field in RATIO_METRICS.items():
                    value = _ratio(requests, num, den, field)
                    if value is not None:
                        out[f"{metric} {other}/{ref} @{b:g}"] = value
            value = _ratio(requests, "recompute", den, "ttft_s")  # the row without a store, where it ran
            if value is not None:
                out[f"ttft recompute/{ref} @{b:g}"] = value
    return out


def format_zipf_report(report: dict) -> str:
    """The table and the ratios, as printed without ``--json``."""
    w, p = report["workload"], report["params"]
    lines = [
        f"model {p['model']} ({p['dtype']}, {p['threads']} threads); {w['prefixes']} prefixes x {w['prefix_tokens']} tokens, "
        f"Zipf alpha {w['alpha']}, {w['requests']} requests timed after {w['warmup']} warm-up, suffix {w['suffix_tokens']} tokens; "
        f"memory {w['memory_fraction']:.0%} of stored bytes (CPU tier + client state) plus a prefetch reserve",
        f"{'system@budget':<28}{'TTFT ms':>9}{'P95 ms':>9}{'I/O ms':>8}{'sel ms':>8}{'comp ms':>9}{'tokens':>8}{'cap':>6}"
        f"{'MB disk':>9}{'state MB':>9}{'hit':>6}{'spec MB':>8}{'waste':>7}{'pushed':>7}{'top1':>6}{'KL':>8}{'acc':>6}{'full':>6}",
    ]
    if w.get("task"):
        asks = "one of its keys, drawn per request" if w.get("ask") == "any-key" else "its question"
        lines.insert(1, f"task {w['task']}: each prefix a held-out example (seeds {w['task_seeds']}), each request {asks}")

    def num(v, scale=1.0, spec=".2f"):
        return "-" if v is None else format(v * scale, spec)

    for name, r in report["systems"].items():
        lines.append(
            f"{name:<28}{r['ttft_mean_s'] * 1e3:>9.1f}{r['ttft_p95_s'] * 1e3:>9.1f}{num(r['io_wait_s_mean'], 1e3, '.1f'):>8}"
            f"{num(r['select_s_mean'], 1e3, '.1f'):>8}{num(r['compute_s_mean'], 1e3, '.1f'):>9}{num(r['tokens_loaded_mean'], 1, '.0f'):>8}"
            f"{num(r['token_cap_mean'], 1, '.0f'):>6}{num(r['bytes_disk_mean'], 1e-6):>9}{num(r['state_bytes_fetched_mean'], 1e-6):>9}"
            f"{num(r['hit_rate']):>6}{num(r['spec_used_mean'], 1e-6):>8}{num(r['spec_wasted_mean'], 1e-6):>7}"
            f"{num(r['groups_covered_mean']):>7}{num(r['top1_mean']):>6}{num(r['kl_mean'], 1, '.4f'):>8}"
            f"{num(r.get('correct_mean')):>6}{num(r.get('full_kv_accuracy')):>6}"
        )
    for key, value in report["ratios"].items():
        lines.append(f"{key} = {value:.2f}")
    return "\n".join(lines)
