"""``kvstore-bench estimator`` on SmolLM2-135M, one short conversation: every system generates the same tokens."""

import json

from helpers import run_bench, run_bench_each
from pretrained import needs_smollm2


@needs_smollm2
def test_estimator_bench_reports_every_system_and_the_strategies_it_chooses():
    proc = run_bench(
        "estimator", "--tokens", "320", "--examples", "1", "--new-tokens", "4", "--stream", "tune",
        "--threads", "2", "--json", timeout=300,
    )  # fmt: skip
    r = json.loads(proc.stdout)
    systems = r["systems"]
    assert sorted(systems) == sorted(["none", "estimator", "estimator-b1", "estimator-deferred", "estimator-stride"])
    assert all(s["same_tokens"] and s["tokens"] == 4 for s in systems.values())  # the estimator only reads
    for name in ("estimator", "estimator-b1", "estimator-deferred", "estimator-stride"):
        s = systems[name]
        assert s["busy_s"] > 0 and s["sketch_bytes"] == 30 * (9 * 32 * 32 + 32) * 8 + 4 * 8 * 30
        assert abs(s["ttft_vs_none"] - s["ttft_s"] / systems["none"]["ttft_s"]) < 1e-9
    # deferred: nothing is computed before stats(), so the wait is the whole compute and every input was queued
    deferred = systems["estimator-deferred"]
    assert deferred["finish_wait_s"] >= deferred["busy_s"] and deferred["queued_peak_bytes"] >= systems["estimator"]["queued_peak_bytes"]
    (st,) = r["strategies"]
    assert len(st["edge_mass"]) == 30 and all(0 <= e <= 2 for e in st["edge_mass"])
    assert st["stride_same_non_ir"] == (set(st["stride_non_ir"]) == set(st["non_ir"]))


def test_a_strategy_flag_out_of_range_is_refused_in_one_line():
    want = "kvstore-bench: error: --gamma must be in [0, 2] (an edge mass) and --ratio in [0, 1]"
    proc = run_bench("estimator", "--gamma", "-0.1", expect=1, timeout=120)  # refused before the model loads
    assert proc.stderr.strip() == want
    cases = [
        [bench, flag, value]
        for bench in ("estimator", "restore")
        for flag, value in (("--gamma", "-0.1"), ("--gamma", "nan"), ("--ratio", "7"))
    ]
    for argv, (status, err) in zip(cases, run_bench_each(cases, timeout=120)):  # every case, in one process
        assert (status, err.strip()) == (1, want), argv
