"""Small runs of the daemon and Re-Prefill benchmarks (figures are not asserted)."""

import json
import subprocess
import sys

from helpers import data_root


def run_bench(*argv, timeout=240):
    proc = subprocess.run(
        [sys.executable, "-m", "tools.bench.cli", *argv],
        capture_output=True,
        text=True,
        cwd=data_root(),
        timeout=timeout,
        env={"PYTHONPATH": data_root(), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_io_via_daemon_reports_all_paths(tmp_path):
    proc = run_bench("io", "--via-daemon", "--bs", "64k", "--iodepth", "4", "--size", "8m", "--runtime", "0.5",
                     "--directory", str(tmp_path), "--json")
    report = json.loads(proc.stdout)
    assert set(report["rows"]) == {"in-process", "daemon-shm", "daemon-bytes"}
    for row in report["rows"].values():
        assert row["requests"] > 0 and row["bw_bytes_per_s"] > 0
        assert row["io_bytes"] == row["requests"] * 4 * 64 * 1024  # every request read 4 whole extents
    assert set(report["ratio"]) == {"daemon-shm", "daemon-bytes"}


def test_reprefill_bench_smoke(tmp_path):
    proc = run_bench("reprefill", "--model", "tiny", "--dtype", "float32", "--prefix-tokens", "400", "--suffix-tokens", "8",
                     "--repeats", "2", "--budgets", "0.25,1", "--period-layers", "2", "--group-layers", "1",
                     "--directory", str(tmp_path), "--json")
    report = json.loads(proc.stdout)
    systems = report["systems"]
    assert set(systems) == {"full-load", "reprefill@0.25", "full-recompute"}
    assert systems["full-load"]["tokens_loaded"] == 400
    assert systems["reprefill@0.25"]["tokens_loaded"] < 400 * 0.3
    assert systems["full-recompute"]["top1"] == 1.0 and systems["full-recompute"]["kl"] < 1e-6
    assert 0 <= systems["reprefill@0.25"]["recall"] <= 1
    assert "full-load/reprefill@0.25" in report["ratios"]


def test_zipf_workload_runs_every_system_side_by_side(tmp_path):
    systems = "contiguouskv,contiguouskv-sameset,contiguouskv-noprefetch,contiguouskv-lfu,impress,as-h2o,as-lru"
    proc = run_bench("reprefill", "--workload", "zipf", "--systems", systems, "--model", "tiny", "--dtype", "float32",
                     "--prefix-tokens", "512", "--suffix-tokens", "8", "--prefixes", "3", "--requests", "4", "--warmup", "2",
                     "--budgets", "0.25", "--period-layers", "2", "--group-layers", "1", "--memory-fraction", "0.5",
                     "--directory", str(tmp_path), "--json")
    report = json.loads(proc.stdout)
    rows = report["systems"]
    assert set(rows) == {f"{s}@0.25" for s in systems.split(",") if s != "as-lru"} | {"as-lru@1"}
    assert rows["as-lru@1"]["tokens_loaded"] == 512 and rows["as-lru@1"]["top1"] == 1.0
    for name, r in rows.items():
        assert r["requests"] == 4 and 0 <= r["hit_rate"] <= 1 and r["ttft_p95_s"] >= r["ttft_mean_s"] * 0.5
        assert r["cpu_tier_bytes"] > 0
    ck = rows["contiguouskv@0.25"]
    assert ck["tokens_loaded"] <= 512 * 0.25 + 16 and ck["read_amplification"] == 1.0
    assert rows["contiguouskv-noprefetch@0.25"]["spec_used_bytes"] == 0
    assert rows["contiguouskv-noprefetch@0.25"]["groups_covered_per_period"] == 0
    assert 0 <= ck["groups_covered_per_period"] <= 2  # two stored groups per period
    assert "io wait contiguouskv/noprefetch @0.25" in report["ratios"]
    # 64-token blocks holding the selected tokens load at least those tokens
    assert rows["as-h2o@0.25"]["read_amplification"] >= 1.0 and rows["impress@0.25"]["tokens_loaded"] >= 128
    assert "impress/contiguouskv ttft @0.25" in report["ratios"] and "as-lru/contiguouskv ttft @0.25" in report["ratios"]
    assert sum(report["workload"]["prefix_popularity"]) == 4
