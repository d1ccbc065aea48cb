"""``kvstore-bench decode-merge`` over the decode reports kept in docs/figures: pooled figures are the rows' own."""

import copy
import json
import os

import numpy as np
import pytest
from helpers import data_root, run_bench

from kvstore_tools.bench.decode_merge import merge_reports
from kvstore_tools.bench.eval_common import wilson_interval
from kvstore_tools.bench.io_jobs import UsageError

FIGURES = os.path.join(data_root(), "docs", "figures")
# the 8000-token runs: seeds 0-7 of both tasks in one report, 8-19 in one report per task
PARTS = ["decode-8000-eval-8.json", "decode-passkey-8000-eval-s8.json", "decode-niah-8000-eval-s8.json"]


def _load(name: str) -> tuple[str, dict]:
    with open(os.path.join(FIGURES, name)) as f:
        return name, json.load(f)


def test_pooled_cells_are_computed_from_every_report_s_rows():
    reports = [_load(name) for name in PARTS]
    merged = merge_reports(reports)
    assert [(c["task"], c["context"], c["examples"]) for c in merged["cells"]] == [("passkey", 8000, 20), ("niah", 8000, 20)]
    for cell in merged["cells"]:
        assert cell["seed_ranges"] == [[1_000_000, 1_000_019]]
        for name, s in cell["systems"].items():
            parts = [c["systems"][name] for _, r in reports for c in r["cells"] if c["task"] == cell["task"]]
            rows = [row for part in parts for row in part["rows"]]
            assert [row["seed"] for row in s["rows"]] == sorted(row["seed"] for row in rows)
            assert s["correct"] == sum(part["correct"] for part in parts) == sum(row["correct"] for row in rows)
            assert s["wilson95"] == list(wilson_interval(s["correct"], 20))
            for key in ("per_token_s", "ttft_s", "memory_bytes_per_token", "store_bytes_per_token"):
                assert s[key] == pytest.approx(np.mean([row[key] for row in rows]), rel=1e-12)
            # the parts' means weighted by their examples: the pooled mean, as the rows give it
            assert s["per_token_s"] == pytest.approx(sum(p["per_token_s"] * len(p["rows"]) for p in parts) / 20, rel=1e-12)
    assert [m["start"] for m in merged["merged_from"]] == [0, 8, 8]
    assert merged["examples"] == 20 and merged["budget_tokens"] == 1024


def test_a_seed_run_twice_or_unlike_settings_are_refused():
    a, b = _load(PARTS[1]), _load(PARTS[1])
    with pytest.raises(UsageError, match=r"seed 1000008 of passkey @ 8000 is also in decode-passkey-8000-eval-s8.json"):
        merge_reports([a, ("again.json", b[1])])
    other = copy.deepcopy(_load(PARTS[0])[1])
    other["budget_tokens"] = 2048
    with pytest.raises(UsageError, match=r"^other.json: budget_tokens is 2048, .* has 1024; only like runs pool$"):
        merge_reports([a, ("other.json", other)])
    fewer = copy.deepcopy(_load(PARTS[0])[1])
    for cell in fewer["cells"]:
        del cell["systems"]["dense"]
    with pytest.raises(UsageError, match=r"passkey @ 8000 runs systems perlayer-follow-int4, .* runs dense, perlayer-follow-int4"):
        merge_reports([a, ("fewer.json", fewer)])
    with pytest.raises(UsageError, match=r"^x.json: not a kvstore-bench decode --json report$"):
        merge_reports([a, ("x.json", {"cells": []})])
    (cell,) = merge_reports([a])["cells"]  # one report: its figures again, from its rows
    assert cell["systems"]["dense"]["correct"] == a[1]["cells"][0]["systems"]["dense"]["correct"]
    assert "vs_dense" in cell["systems"]["perlayer-follow-int4"] and "vs_dense" not in a[1]["cells"][0]["systems"]["perlayer-follow-int4"]


def test_a_system_s_own_budget_pools_only_with_the_same_budget():
    p, n = (copy.deepcopy(_load(name)[1]) for name in PARTS[1:])
    for r, budget in ((p, 1536), (n, 1536)):
        for cell in r["cells"]:
            cell["systems"]["perlayer-follow-int4"]["budget_tokens"] = budget
    first = ("p.json", p)
    merged = merge_reports([first, ("n.json", n)])  # the two tasks' cells: each system's budget kept as it is
    assert {c["systems"]["perlayer-follow-int4"]["budget_tokens"] for c in merged["cells"]} == {1536}
    assert "budget_tokens" not in merged["cells"][0]["systems"]["dense"]
    later = copy.deepcopy(_load(PARTS[0])[1])  # seeds 0-7 of the same cells, at --budget-tokens only
    with pytest.raises(
        UsageError, match=r"^later.json: passkey @ 8000 system 'perlayer-follow-int4' has budget_tokens None, p.json has 1536$"
    ):
        merge_reports([first, ("later.json", later)])


def test_the_command_prints_the_pooled_table_and_names_a_bad_file_in_one_line(tmp_path):
    paths = [os.path.join("docs", "figures", name) for name in PARTS]
    proc = run_bench("decode-merge", *paths, timeout=60)
    assert "passkey @ 8000 tokens, 20 examples (seeds 1000000..1000019)" in proc.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    proc = run_bench("decode-merge", paths[0], str(bad), expect=2, timeout=60)
    assert f"{bad}: not JSON" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_pooled_cells_compare_each_system_with_dense_on_the_same_seeds():
    merged = merge_reports([_load(name) for name in PARTS])
    for cell in merged["cells"]:
        dense = {row["seed"]: row["correct"] for row in cell["systems"]["dense"]["rows"]}
        s = cell["systems"]["perlayer-follow-int4"]
        v = s["vs_dense"]
        mine = {row["seed"]: row["correct"] for row in s["rows"]}
        assert v["only_system"] == sum(mine[x] and not dense[x] for x in dense)
        assert v["only_reference"] == sum(dense[x] and not mine[x] for x in dense)
        assert v["difference"] == pytest.approx((s["correct"] - cell["systems"]["dense"]["correct"]) / 20)
        assert "vs_dense" not in cell["systems"]["dense"]
