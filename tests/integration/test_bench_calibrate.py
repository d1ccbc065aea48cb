"""``kvstore-bench calibrate`` writes a profile that ``--profile file:PATH`` reads back; bad files are refused in one line."""

import json

import pytest
from helpers import run_bench

from engine_client.compute_model import AcceleratorProfile, parse_profile
from kvstore.contract.errors import InvalidArgument


@pytest.mark.timeout(240)
def test_calibrate_measures_this_machine_and_the_file_reads_back(tmp_path):
    out = tmp_path / "cpu.json"
    proc = run_bench(
        "calibrate", "--device", "cpu", "--shape", "smollm2-135m", "--tokens", "128", "--context", "512",
        "--disk-bytes", str(16 << 20), "--data-dir", str(tmp_path), "--out", str(out),
    )  # fmt: skip
    assert f"--profile file:{out}" in proc.stdout
    profile = parse_profile(f"file:{out}")
    assert isinstance(profile, AcceleratorProfile) and profile.name == "calibrated-cpu"
    assert profile.matmul_efficiency == 1.0 and profile.dtype_bytes == 4  # float32 on a CPU
    for rate in (profile.peak_flops, profile.mem_bytes_per_s, profile.h2d_bytes_per_s, profile.disk_bytes_per_s):
        assert rate > 0
    assert 0 < profile.period_overhead_s < 1 and 0 < profile.layer_overhead_s < 1
    assert "measured" in profile.source and "calibrate" in profile.source


def test_profile_files_are_refused_naming_the_file_and_key(tmp_path):
    good = {"name": "x", "peak_flops": 1e12, "mem_bytes_per_s": 1e11, "h2d_bytes_per_s": 1e10}
    cases = {
        "missing.json": (None, "No such file"),
        "notjson.json": ("{", "not JSON"),
        "unknown.json": (json.dumps(good | {"flops": 1}), "profile.flops"),
        "negative.json": (json.dumps(good | {"disk_bytes_per_s": -1}), "profile.disk_bytes_per_s"),
        "short.json": (json.dumps({"name": "x"}), "profile.peak_flops"),
    }
    for name, (text, says) in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(InvalidArgument, match=says) as info:
            parse_profile(f"file:{path}")
        assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_calibrate_refuses_a_missing_output_directory(tmp_path):
    proc = run_bench("calibrate", "--device", "cpu", "--no-disk", "--out", str(tmp_path / "nope" / "p.json"), expect=1)
    assert "--out" in proc.stderr and proc.stderr.strip().count("\n") == 0
