"""``python -m kvstore_tools.device_check --device cpu --quick``: every step recorded, a failed and a timed-out step
do not stop the others, the calibrated profile and the TTFT report are what the benches read and write."""

import json
import os
import subprocess
import sys

import pytest
from helpers import data_root

from engine_client.compute_model import read_profile_file
from kvstore_tools.device_check import STEPS


def _device_check(*argv, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "kvstore_tools.device_check", *argv],
        capture_output=True,
        text=True,
        cwd=data_root(),
        timeout=timeout,
        env={"PYTHONPATH": data_root(), "PATH": "/usr/bin:/bin"},
    )


def _processes_naming(text: str) -> list[str]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read().decode(errors="replace").replace("\0", " ")
            except OSError:
                continue
            if text in cmdline:
                out.append(cmdline)
    return out


@pytest.mark.timeout(120)
def test_quick_cpu_run_records_every_step_and_goes_on_past_a_failure_and_a_timeout(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    # env made to fail, ttft-16k given 1 s (it cannot start torch in that): both recorded, the rest runs
    proc = _device_check(str(out), "--device", "cpu", "--quick", "--work-dir", str(work), "--fail-step", "env", "--limit", "ttft-16k=1")
    assert proc.returncode == 1, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    steps = {s["name"]: s for s in summary["steps"]}
    assert list(steps) == list(STEPS)
    status = {name: s["status"] for name, s in steps.items()}
    assert status == {
        "env": "failed",
        "tests": "passed",
        "calibrate": "passed",
        "ttft-2k": "passed",
        "ttft-16k": "timeout",
        "ttft-8b-4k": "passed",
        "ttft-8b-16k": "passed",
        "zipf-2k": "passed",
        "ttft-smollm2": "skipped",
    }, {n: (s["status"], s["reason"]) for n, s in steps.items()}
    assert steps["env"]["reason"] == "exit status 1: env: made to fail by --fail-step"
    assert steps["ttft-16k"]["reason"] == "stopped after 1 s (its limit)"
    assert steps["ttft-smollm2"]["reason"]
    for s in steps.values():
        assert "\n" not in (s["reason"] or "") and "\n" not in (s["result"] or "")
        if s["status"] != "skipped":
            assert (out / s["log"]).is_file()
    assert not _processes_naming(str(tmp_path)), "a step's process (or the daemon a bench started) outlived it"

    # the CUDA-path tests: pytest's own counts
    tests = json.loads((out / "tests.json").read_text())
    assert tests["passed"] > 0 and tests["failed"] == 0 and tests["files"]
    assert all(f.startswith("tests/unit/") for f in tests["files"])  # --quick: the unit files among them

    # the profile reads back as --profile file:PATH does, and is what the summary says
    profile = read_profile_file(str(out / "calibrate-profile.json"))
    assert profile.name == "calibrated-cpu" and profile.disk_bytes_per_s > 0 and profile.period_overhead_s > 0
    assert steps["calibrate"]["data"]["peak_flops"] == profile.peak_flops

    # the TTFT report is the bench's, through its daemon; the summary's row is taken from it
    report = json.loads((out / "ttft-2k.json").read_text())
    assert set(report["systems"]) == {"full-recompute", "full-load", "reprefill@0.05", "reprefill@0.1", "choice@0.05", "choice@0.1"}
    assert report["params"]["profile"] == f"file:{out / 'calibrate-profile.json'}"  # priced on the calibrated profile
    assert sum(report["choices"]["choice@0.05"]["chosen"].values()) == report["systems"]["choice@0.05"]["runs"]
    assert report["params"]["prefix_tokens"] == 256 and report["daemon_stats"]["bytes_read"] > 0
    from engine_client.reprefill import DEFAULT_SYSTEM

    assert summary["command"].startswith("python -m kvstore_tools.device_check ")  # the command as typed, no quotes
    assert summary["system"] == report["params"]["system"] == DEFAULT_SYSTEM  # the product's default, on a store laid out for it
    assert report["params"]["store_probe_bits"] == 4 and report["params"]["group_layers"] == 1
    row, *whole = summary["ttft"]  # ttft-2k, then the two whole-model steps (a small shape made in memory in --quick)
    assert [(r["model"], r["prefix_tokens"]) for r in whole] == [("smollm2-135m-shape", 128), ("smollm2-135m-shape", 256)]
    in_memory = json.loads((out / "ttft-8b-16k.json").read_text())
    assert in_memory["params"]["model"] == "smollm2-135m-shape" and in_memory["systems"]["reprefill@0.05"]["recall"] is None
    assert row["ttft_ms"]["full-load"] == pytest.approx(report["systems"]["full-load"]["ttft_mean_s"] * 1e3, abs=0.01)
    assert "full-load" in (out / "ttft-2k.txt").read_text()

    # the Zipf step: ContiguousKV and its baselines at one budget, the summary's figures from the bench's rows
    zipf = json.loads((out / "zipf-2k.json").read_text())
    ratios = steps["zipf-2k"]["data"]["over_reference"]
    for name in ("impress@0.25", "as-h2o@0.25", "recompute"):  # --quick: 25% of 512 tokens; and no store at all
        assert ratios[name] == pytest.approx(zipf["systems"][name]["ttft_mean_s"] / zipf["systems"]["contiguouskv@0.25"]["ttft_mean_s"])

    # the printed table names every step and its status; stores went, the seeded checkpoint stayed
    for name, st in status.items():
        assert any(line.startswith(name) and st in line for line in proc.stdout.splitlines()), proc.stdout
    assert sorted(p.name for p in work.iterdir()) == ["models"]


def test_bad_arguments_are_one_line_and_exit_2(tmp_path):
    (tmp_path / "file").write_text("")
    cases = [
        (),
        (str(tmp_path / "file"),),
        (str(tmp_path), "--device", "tpu"),
        (str(tmp_path), "--budget-s", "0"),
        (str(tmp_path), "--limit", "nosuch=5"),
        (str(tmp_path), "--limit", "tests=-1"),
        (str(tmp_path), "--only", "env,nosuch"),
        (str(tmp_path), "--fail-step", "nosuch"),
        (str(tmp_path), "--system", "nosuch"),
    ]
    for argv in cases:
        proc = _device_check(*argv, timeout=60)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert proc.stderr.startswith("python -m kvstore_tools.device_check: error: ") and proc.stderr.count("\n") == 1, (argv, proc.stderr)
    assert not (tmp_path / "summary.json").exists()
