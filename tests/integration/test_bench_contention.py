"""A small run of ``kvstore-bench contention`` and its refusals of bad flags."""

import json

import pytest
from helpers import assert_png, run_bench


@pytest.mark.timeout(240)
def test_contention_bench_serves_every_request_and_leaves_no_lease(tmp_path):
    plot = tmp_path / "contention.png"
    out = run_bench(
        "contention",
        "--streams",
        "1,3",
        "--loads",
        "1,0.05",
        "--requests",
        "2",
        "--data-dir",
        str(tmp_path),
        "--plot",
        str(plot),
        "--json",
    )
    report = json.loads(out.stdout)
    assert [(lv["load"], lv["streams"]) for lv in report["levels"]] == [(1.0, 1), (1.0, 3), (0.05, 1), (0.05, 3)]
    for lv in report["levels"]:
        assert lv["failures"] == 0 and lv["completed"] == lv["requests"] == 2 * lv["streams"], lv
        assert lv["leased_bytes_after"] == 0
        assert lv["p50_ms"] <= lv["p99_ms"]
    assert report["levels"][0]["chunks_per_request"] == 38 and report["levels"][2]["chunks_per_request"] == 2
    assert_png(plot)


@pytest.mark.parametrize(
    "flag, value, says",
    [("--streams", "0", "each level must be in [1, 64]"), ("--loads", "1.5", "fraction of the chunks"), ("--requests", "0", "positive")],
)
def test_contention_bench_refuses_bad_flags_in_one_line(flag, value, says):
    out = run_bench("contention", flag, value, expect=2)
    assert says in out.stderr and "Traceback" not in out.stderr
