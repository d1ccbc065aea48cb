"""``python -m kvstore_tools.period_probe``: one-layer Periods through a real daemon, no model."""

import json
import subprocess
import sys

import numpy as np
import pytest

from kvstore_tools.period_probe import geometry, main, pair_set


def test_each_request_reads_every_periods_pairs_through_a_real_daemon(tmp_path, capsys):
    assert main([str(tmp_path), "--tokens", "512", "--layers", "3", "--fraction", "0.1", "--requests", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    geo = geometry(3)
    per_period = 2  # 32 chunks at 10%: one pair
    assert all(len(pair_set(np.random.default_rng(s), 32, 0.1)) == 2 for s in range(20))
    assert len(report["requests"]) == 2
    for row in report["requests"]:
        chunks = round(row["mb"] * 1e6 / geo.extent_bytes(0, 16))
        assert chunks == 3 * per_period  # every Period's pairs, whole extents
        assert row["reads"] >= 3 and row["mb_disk"] == pytest.approx(row["mb"])
        assert 0 < row["period_wait_median_ms"] <= row["request_ms"]
    # the store is kept: a second run of the same shape reuses it
    assert main([str(tmp_path), "--tokens", "512", "--layers", "3", "--requests", "1", "--page-cache"]) == 0
    assert "request 0:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flag, value, says",
    [
        ("--tokens", "500", "multiple of 16"),
        ("--fraction", "0", "(0, 0.5]"),
        ("--fraction", "x", "(0, 0.5]"),
        ("--requests", "0", "at least 1"),
    ],
)
def test_bad_flags_get_one_line_and_nothing_is_made(tmp_path, flag, value, says):
    proc = subprocess.run(
        [sys.executable, "-m", "kvstore_tools.period_probe", str(tmp_path / "store"), flag, value], capture_output=True, text=True
    )
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "store").exists()
