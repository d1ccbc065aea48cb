"""Small runs of the daemon and Re-Prefill benchmarks: their figures are checked
against the raw measurements they come from, not against expected values."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import assert_png, data_root, run_bench

from kvstore_tools.bench.plots import ttft_bars

SMALL_IO = ("io", "--via-daemon", "--bs", "64k", "--iodepth", "4", "--size", "8m", "--runtime", "0.5", "--json")


def test_io_via_daemon_reports_all_paths(tmp_path):
    proc = run_bench(*SMALL_IO, "--directory", str(tmp_path), "--plot", str(tmp_path / "io.png"))
    assert_png(tmp_path / "io.png")
    report = json.loads(proc.stdout)
    assert set(report["rows"]) == {"in-process", "daemon-shm", "daemon-bytes"}
    for row in report["rows"].values():
        assert row["requests"] > 0 and row["bw_bytes_per_s"] > 0
        assert row["io_bytes"] == row["requests"] * 4 * 64 * 1024  # every request read 4 whole extents
    assert set(report["ratio"]) == {"daemon-shm", "daemon-bytes"}


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode().split("\0")
    except OSError:
        return []


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return out


def test_a_terminated_bench_stops_its_daemon_and_removes_its_socket_directory(tmp_path):
    argv = list(SMALL_IO)
    argv[argv.index("--runtime") + 1] = "5"  # the in-process rows first, then the daemon's
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvstore_tools.bench.cli", *argv, "--directory", str(tmp_path)],
        cwd=data_root(),
        env={"PYTHONPATH": data_root(), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    daemons = []
    try:
        while not daemons and time.monotonic() < deadline and proc.poll() is None:
            daemons = [c for c in _children(proc.pid) if "kvstore.cli" in _cmdline(c)]
            time.sleep(0.1)
        assert daemons, "the bench never started its daemon"
        daemon_argv = _cmdline(daemons[0])
        run_dir = os.path.dirname(daemon_argv[daemon_argv.index("--socket-path") + 1])
        while not os.path.exists(os.path.join(run_dir, "ready")) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1)  # the reading threads are under way
        proc.send_signal(signal.SIGTERM)
        with proc:
            assert proc.wait(90) == 143, proc.stderr.read()[-2000:]
            assert b"Traceback" not in proc.stderr.read()  # the reading threads stop before their clients close
        assert not os.path.exists(f"/proc/{daemons[0]}"), "the daemon outlived the bench"
        assert not os.path.exists(run_dir), "the daemon's socket directory was left behind"
    finally:  # a failed run leaves no process behind
        for pid in [proc.pid, *daemons]:
            if "kvstore" in " ".join(_cmdline(pid)) or "kvstore_tools.bench" in " ".join(_cmdline(pid)):
                os.kill(pid, signal.SIGKILL)


def test_io_via_daemon_over_tcp_reports_both_remote_paths(tmp_path):
    proc = run_bench(*SMALL_IO, "--directory", str(tmp_path), "--transport", "tcp", "--page-cache")
    report = json.loads(proc.stdout)
    assert set(report["rows"]) == {"in-process", "daemon-bytes", "daemon-data"}
    assert report["params"]["transport"] == "tcp" and report["params"]["page_cache"]
    for row in report["rows"].values():
        assert row["requests"] > 0
        assert row["io_bytes"] == row["requests"] * 4 * 64 * 1024
    rows = report["rows"]
    assert report["ratio"]["daemon-data/daemon-bytes"] == pytest.approx(
        rows["daemon-data"]["bw_bytes_per_s"] / rows["daemon-bytes"]["bw_bytes_per_s"]
    )


def test_reprefill_bench_smoke(tmp_path):
    proc = run_bench(
        "reprefill",
        "--model",
        "tiny",
        "--dtype",
        "float32",
        "--prefix-tokens",
        "400",
        "--suffix-tokens",
        "8",
        "--repeats",
        "2",
        "--budgets",
        "0.25,1",
        "--period-layers",
        "2",
        "--group-layers",
        "1",
        "--directory",
        str(tmp_path),
        "--json",
        "--plot",
        str(tmp_path / "ttft.png"),
    )
    report = json.loads(proc.stdout)
    assert "\r" not in proc.stderr  # no progress bar off a terminal (the prefill's, the budgets')
    assert_png(tmp_path / "ttft.png")
    systems = report["systems"]
    for name, row in systems.items():  # every row, and the figure's bars, from the kept request records
        ttft = [r["ttft_s"] for r in report["requests"][name]]
        assert len(ttft) == row["runs"]
        assert row["ttft_mean_s"] == pytest.approx(np.mean(ttft)) and row["ttft_p95_s"] == pytest.approx(np.percentile(ttft, 95))
    bars = {b["key"]: b for b in ttft_bars(report["requests"])}
    assert list(bars) == ["reprefill@0.25", "full-load", "full-recompute"]
    for name, b in bars.items():
        assert b["mean_s"] == pytest.approx(systems[name]["ttft_mean_s"]) and b["p95_s"] == pytest.approx(systems[name]["ttft_p95_s"])
        assert b["parts"]["io_wait_s"] == pytest.approx(systems[name]["io_wait_mean_s"])
        assert sum(b["parts"].values()) + b["other_s"] == pytest.approx(b["mean_s"])
    assert set(systems) == {"full-load", "reprefill@0.25", "full-recompute"}
    assert systems["full-load"]["tokens_loaded"] == 400
    assert systems["reprefill@0.25"]["tokens_loaded"] < 400 * 0.3
    assert systems["full-recompute"]["top1"] == 1.0 and systems["full-recompute"]["kl"] < 1e-6
    assert 0 <= systems["reprefill@0.25"]["recall"] <= 1
    assert "full-load/reprefill@0.25" in report["ratios"]


ZIPF_SYSTEMS = "contiguouskv-paper,contiguouskv,contiguouskv-noprefetch,contiguouskv-lfu,impress,as-h2o,as-lru"


@pytest.fixture(scope="module")
def zipf_run(tmp_path_factory):
    """``(report, path of its --plot figure)``."""
    directory = tmp_path_factory.mktemp("zipf")
    # tiny model: 2 layers, Periods of 1 layer (2 periods), stored groups of 1; 512-token prefixes (32 chunks)
    proc = run_bench(
        "reprefill",
        "--workload",
        "zipf",
        "--systems",
        ZIPF_SYSTEMS,
        "--model",
        "tiny",
        "--dtype",
        "float32",
        "--prefix-tokens",
        "512",
        "--suffix-tokens",
        "8",
        "--prefixes",
        "3",
        "--requests",
        "4",
        "--warmup",
        "2",
        "--budgets",
        "0.25",
        "--period-layers",
        "1",
        "--group-layers",
        "1",
        "--memory-fraction",
        "0.5",
        "--directory",
        str(directory),
        "--json",
        "--plot",
        str(directory / "ttft.png"),
    )
    return json.loads(proc.stdout), directory / "ttft.png"


@pytest.fixture(scope="module")
def zipf_report(zipf_run):
    return zipf_run[0]


def test_zipf_figure_draws_every_system_from_the_request_records(zipf_run):
    report, png = zipf_run
    assert_png(png)
    bars = ttft_bars(report["requests"], report["params"]["systems"])
    assert [b["key"] for b in bars] == [f"{s}@0.25" for s in ZIPF_SYSTEMS.split(",") if s != "as-lru"] + ["as-lru@1", "recompute"]
    for b in bars:
        row = report["systems"][b["key"]]
        assert b["requests"] == row["requests"] == 4
        assert b["mean_s"] == pytest.approx(row["ttft_mean_s"]) and b["p95_s"] == pytest.approx(row["ttft_p95_s"])
        assert b["parts"]["select_s"] == pytest.approx(row["select_s_mean"])
        assert b["parts"]["compute_s"] == pytest.approx(row["compute_s_mean"])


def test_zipf_every_ratio_is_recomputed_from_the_request_records(zipf_report):
    requests = zipf_report["requests"]
    fields = {"ttft": "ttft_s", "tokens": "tokens_loaded", "bytes": "bytes_disk", "io wait": "io_wait_s"}
    names = ZIPF_SYSTEMS.split(",")
    expected = set()
    for ref in ("contiguouskv", "contiguouskv-paper"):
        for other in names:
            if other != ref:
                expected |= {f"{metric} {other}/{ref} @0.25" for metric in fields}
        expected.add(f"ttft recompute/{ref} @0.25")  # the row without a store: its TTFT only
    assert set(zipf_report["ratios"]) == expected  # every system against both ContiguousKV rows
    for key, value in zipf_report["ratios"].items():
        metric, num, den = re.fullmatch(r"(.+) (\S+)/(\S+) @0.25", key).groups()
        num_key = {"as-lru": "as-lru@1", "recompute": "recompute"}.get(num, f"{num}@0.25")
        top = np.mean([r[fields[metric]] for r in requests[num_key]])
        bottom = np.mean([r[fields[metric]] for r in requests[f"{den}@0.25"]])
        assert value == pytest.approx(top / bottom, rel=1e-9), key
    for name, row in zipf_report["systems"].items():  # and every printed mean and percentile
        ttft = [r["ttft_s"] for r in requests[name]]
        assert len(ttft) == row["requests"] == 4
        assert row["ttft_mean_s"] == pytest.approx(np.mean(ttft)) and row["ttft_p95_s"] == pytest.approx(np.percentile(ttft, 95))
        assert row["bytes_disk_mean"] == pytest.approx(np.mean([r["bytes_disk"] for r in requests[name]]))
        units = sum(r["units"] for r in requests[name])
        assert row["hit_rate"] == (pytest.approx(sum(r["hit_units"] for r in requests[name]) / units) if units else None)


def test_zipf_every_system_keeps_to_one_budget(zipf_report):
    requests = zipf_report["requests"]
    for name, records in requests.items():
        for r in records:
            assert name == "recompute" or r["tokens_loaded"] <= r["token_cap"], name
    assert {r["token_cap"] for r in requests["contiguouskv@0.25"]} == {128}  # ceil(0.25 x 32) chunks of 16
    # H2O loads exactly its retained tokens (compacted), the whole budget; AttentionStore the whole prefix
    assert all(r["tokens_loaded"] == 128 for r in requests["as-h2o@0.25"])
    assert all(r["tokens_loaded"] == 512 for r in requests["as-lru@1"])
    # IMPRESS: whole 64-token blocks, as many as fit
    assert all(r["tokens_loaded"] == 128 for r in requests["impress@0.25"])
    # exact attention over the whole prefix is the reference itself, and so is recomputing it (nothing read)
    assert all(r["top1"] == 1.0 and r["kl"] < 1e-6 for r in requests["as-lru@1"] + requests["recompute"])
    assert all(r["bytes_disk"] == r["io_wait_s"] == 0 and r["compute_s"] == r["ttft_s"] > 0 for r in requests["recompute"])
    assert [r["request"] for r in requests["recompute"]] == [r["request"] for r in requests["as-lru@1"]]  # the same timed requests


def test_zipf_client_state_is_charged_and_counted(zipf_report):
    rows, requests = zipf_report["systems"], zipf_report["requests"]
    # 3 prefixes x 32 chunks x 2 periods x 2 KV heads x (min, max) x head dim 16, float32
    summaries = 3 * 32 * 2 * 2 * 2 * 16 * 4
    # IMPRESS: 3 prefixes x 2 periods x 1 KV head x 512 tokens x 8 of 16 channels, float32
    probes = 3 * 2 * 1 * 512 * 8 * 4
    slot = 64 << 10
    for name in ("contiguouskv-paper@0.25", "contiguouskv@0.25", "contiguouskv-noprefetch@0.25"):
        assert rows[name]["client_state_bytes"] == summaries
    assert rows["impress@0.25"]["client_state_bytes"] == probes
    assert rows["as-h2o@0.25"]["client_state_bytes"] == rows["as-lru@1"]["client_state_bytes"] == 0
    # the CPU tier gives up what the client keeps (in whole slots)
    full = rows["as-lru@1"]["cpu_tier_bytes"]
    assert rows["contiguouskv@0.25"]["cpu_tier_bytes"] == full - -(-summaries // slot) * slot
    assert rows["impress@0.25"]["cpu_tier_bytes"] == full - -(-probes // slot) * slot
    # summaries fetched from the daemon count as bytes read: a prefix's first request pays all of them
    # (2 layers x 32 chunks x 2 KV heads x 2 x 16, float32), a later one nothing
    fetch = 2 * 32 * 2 * 2 * 16 * 4
    for name in ("contiguouskv-paper@0.25", "contiguouskv@0.25"):
        for r in requests[name]:
            assert r["state_bytes_fetched"] in (0, fetch) and r["bytes_disk"] >= r["state_bytes_fetched"]
    for name in ("impress@0.25", "as-h2o@0.25", "as-lru@1"):
        assert all(r["state_bytes_fetched"] == 0 for r in requests[name])


def test_zipf_paper_rules_and_product_extensions_differ(zipf_report):
    requests = zipf_report["requests"]
    for r in requests["contiguouskv-paper@0.25"]:  # period i's own set, no hints, nothing pushed
        assert r["hints_sent"] == 0 and r["groups_covered"] == 0
    for r in requests["contiguouskv@0.25"]:  # a look-ahead hint for the second period
        assert r["hints_sent"] == 1
    for r in requests["contiguouskv-noprefetch@0.25"]:
        assert r["spec_used"] == r["spec_wasted"] == 0 and r["groups_covered"] == 0
    # layer-wise preloading: AttentionStore loads the next period ahead and computes on it without a
    # round trip (pushed groups), and none of it is wasted. Whether what it loads ahead comes from disk
    # (spec_used) or from the tiers depends on what the CPU tier held when the read-ahead ran, a matter
    # of timing on a loaded machine, so the count of disk bytes read ahead is not asserted.
    assert sum(r["groups_covered"] for r in requests["as-lru@1"]) > 0  # computed on preloaded (pushed) groups
    assert all(r["spec_wasted"] == 0 for r in requests["as-lru@1"] + requests["as-h2o@0.25"])


def _choice_run(tmp_path, profile):
    proc = run_bench(
        "reprefill",
        *("--model", "tiny", "--dtype", "float32", "--prefix-tokens", "400", "--suffix-tokens", "8", "--repeats", "2"),
        *("--budgets", "0.25", "--period-layers", "2", "--group-layers", "1", "--recompute-runs", "1", "--no-recall"),
        *("--profile", profile, "--directory", str(tmp_path), "--json"),
    )
    return json.loads(proc.stdout)


def test_reprefill_choice_row_takes_the_path_its_profile_prices_cheapest(tmp_path):
    """``--profile``: a choice@B row beside the rows it chooses from; what it took follows the profile."""
    slow_compute = tmp_path / "slow-compute.json"  # a fast disk and a slow accelerator: never recompute
    slow_compute.write_text(
        json.dumps(
            {
                "name": "slow",
                "peak_flops": 1e9,
                "mem_bytes_per_s": 1e10,
                "h2d_bytes_per_s": 1e11,
                "disk_bytes_per_s": 1e12,
                "dtype_bytes": 4,
            }
        )
    )
    named = _choice_run(tmp_path / "a", "h100")  # no disk rate: the loading paths cannot be priced
    priced = _choice_run(tmp_path / "b", f"file:{slow_compute}")
    for report in (named, priced):
        row, paths = report["systems"]["choice@0.25"], report["choices"]["choice@0.25"]
        assert row["runs"] == 2 == sum(paths["chosen"].values())
        assert [r["ttft_s"] for r in report["requests"]["choice@0.25"]] and row["ttft_mean_s"] > 0
        best = min(report["systems"][b]["ttft_mean_s"] for b in ("full-load", "full-recompute"))
        assert report["ratios"]["min(full-load, full-recompute)/choice@0.25"] == pytest.approx(best / row["ttft_mean_s"])
    assert named["choices"]["choice@0.25"]["chosen"] == {"recompute": 2}
    assert named["systems"]["choice@0.25"]["tokens_loaded"] == 0 and named["systems"]["choice@0.25"]["top1"] == 1.0
    assert "recompute" not in priced["choices"]["choice@0.25"]["chosen"]
    assert priced["systems"]["choice@0.25"]["tokens_loaded"] > 0


def test_reprefill_profile_and_in_memory_models_are_checked_before_any_prefill(tmp_path):
    from helpers import run_bench_each

    base = ("reprefill", "--model", "tiny", "--prefix-tokens", "64", "--directory", str(tmp_path))
    whole = ("reprefill", "--model", "llama3-8b-shape", "--directory", str(tmp_path))  # made in memory: single workload
    out = run_bench_each(
        [
            (*base, "--profile", "nosuch"),
            (*base, "--workload", "zipf", "--profile", "h100"),
            (*whole, "--workload", "zipf"),
            (*whole, "--checkpoint", str(tmp_path)),
        ]
    )
    for (code, err), flag in zip(out, ("--profile", "--profile", "llama3-8b-shape", "llama3-8b-shape")):
        lines = [line for line in err.splitlines() if line.strip()]
        assert code != 0 and len(lines) == 1 and flag in lines[0], err
    assert not (tmp_path / "reprefill-store").exists()
