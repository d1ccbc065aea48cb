"""``kvstore-bench restore`` on SmolLM2-135M, one short conversation: every system, its bytes and its plan."""

import json

from helpers import run_bench
from pretrained import needs_smollm2


@needs_smollm2
def test_restore_bench_reports_every_system_from_its_rows(tmp_path):
    proc = run_bench(
        "restore", "--tokens", "320", "--examples", "1", "--stream", "tune", "--kv-quant", "kv4t",
        "--threads", "2", "--directory", str(tmp_path), "--json", timeout=300,
    )  # fmt: skip
    r = json.loads(proc.stdout)
    systems = r["systems"]
    assert sorted(systems) == sorted(["recompute", "load", "load-kv4t", "krul-kv4t", "krul-kv4t-uniform", "minicache", "h2o"])
    load, quant, krul = systems["load"], systems["load-kv4t"], systems["krul-kv4t"]
    rows = {name: s["rows"][0] for name, s in systems.items()}
    # what is loaded is what each plan leaves to load: all of it, nothing, or the pyramid's share
    assert rows["recompute"]["bytes_loaded"] == 0 and rows["recompute"]["r_c"] == 1.0
    assert rows["load"]["bytes_loaded"] == rows["load"]["bytes_stored"] and rows["load"]["r_c"] == 0.0
    assert rows["load-kv4t"]["bytes_loaded"] == rows["load-kv4t"]["bytes_stored"] < rows["load"]["bytes_stored"] / 3
    assert rows["krul-kv4t"]["bytes_loaded"] <= rows["load-kv4t"]["bytes_loaded"]
    counts = rows["krul-kv4t"]["recompute_tokens"]
    assert all(a >= b for a, b in zip(counts, counts[1:]))  # a pyramid: never more recompute deeper
    # ratios and storage are recomputed from the rows, not carried over
    assert abs(krul["ttft_mean_vs_krul"] - 1.0) < 1e-9
    assert abs(load["ttft_mean_vs_krul"] - load["ttft_s_mean"] / krul["ttft_s_mean"]) < 1e-9
    assert abs(quant["storage_vs_load"] - rows["load"]["bytes_stored"] / rows["load-kv4t"]["bytes_stored"]) < 1e-9
    assert r["profile"]["flops_per_s"] > 0 and r["profile"]["load_bytes_per_s"] > 0 and 0 <= r["profile"]["overlap"] <= 1
    for s in systems.values():
        assert s["correct"] == sum(row["correct"] for row in s["rows"]) and s["examples"] == 1
    assert rows["load"]["first_token_agrees"]  # the reference agrees with itself
    # the record's statistics came from an estimator fed by the history's prefill
    k = rows["krul-kv4t"]
    assert k["estimator_busy_s"] > 0 and 0 < k["non_ir"] <= 30 and 2 * len(k["pairs"]) <= 15
    paper = r["paper"]  # the same restore planned for an H100 host: modelled times, in order
    assert paper["profile"] == "h100" and 0 <= paper["krul-kv4t"]["r_c"] <= 1
    assert paper["krul-kv4t"]["restore_s"] <= min(paper["recompute_s"], paper["load-kv4t_s"]) + 1e-12
    assert paper["load-kv4t_s"] < paper["load_s"]
