"""The Zipf shared-prefix benchmark on the pretrained model with real-text prefixes:
each request asks its prefix's question, and accuracy sits next to the timings."""

import json

import numpy as np
import pytest
from pretrained import needs_smollm2
from test_bench_smoke import run_bench

SYSTEMS = "contiguouskv-perlayer,contiguouskv-standin,as-h2o"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    import torch

    from engine_client.model import zoo
    from engine_client.model.standins import StandinLayers

    directory = tmp_path_factory.mktemp("zipf-real")
    decoder = zoo.load("smollm2-135m", dtype=torch.float32).decoder
    gains = tuple(0.5 if layer in (8, 19) else 0.0 for layer in range(decoder.num_layers))
    standins = StandinLayers(decoder.fingerprint, (8, 19), gains, 2, 0.2).save(directory / "standins.json")
    proc = run_bench(
        "reprefill",
        "--workload",
        "zipf",
        "--model",
        "smollm2-135m",
        "--dtype",
        "float32",
        "--task",
        "passkey",
        "--systems",
        SYSTEMS,
        "--prefix-tokens",
        "256",
        "--prefixes",
        "2",
        "--requests",
        "2",
        "--warmup",
        "1",
        "--budgets",
        "0.25",
        "--period-layers",
        "8",
        "--group-layers",
        "1",
        "--memory-fraction",
        "0.5",
        "--threads",
        "2",
        "--directory",
        str(directory),
        "--standin-layers",
        str(standins),
        "--json",
        timeout=600,
    )
    return json.loads(proc.stdout)


@needs_smollm2
def test_every_request_asks_its_prefix_question_and_is_scored(report):
    w = report["workload"]
    assert w["task"] == "passkey" and len(w["task_seeds"]) == 2
    assert min(w["task_seeds"]) >= 1_000_000  # held-out evaluation seeds
    assert len(w["full_kv_correct"]) == 2 and all(isinstance(c, bool) for c in w["full_kv_correct"])
    for key, rows in report["requests"].items():
        assert len(rows) == 2
        for row in rows:
            assert isinstance(row["correct"], bool) and isinstance(row["answer_text"], str)
            assert row["full_kv_correct"] == w["full_kv_correct"][row["prefix"]]
            assert 0.0 <= row["top1"] <= 1.0 and row["kl"] >= 0.0
            assert row["tokens_loaded"] <= row["token_cap"]
        row = report["systems"][key]
        assert row["correct_mean"] == pytest.approx(np.mean([r["correct"] for r in rows]))
        assert row["full_kv_accuracy"] == pytest.approx(np.mean([r["full_kv_correct"] for r in rows]))


@needs_smollm2
def test_the_perlayer_product_charges_its_resident_probes_and_their_first_fetch(report):
    rows = report["requests"]["contiguouskv-perlayer@0.25"]
    sysrow = report["systems"]["contiguouskv-perlayer@0.25"]
    assert sysrow["client_state_bytes"] > 0  # 4-bit probe keys of both prefixes, charged to its memory
    for r in rows:
        assert r["bytes_disk"] >= r["state_bytes_fetched"] >= 0


@needs_smollm2
def test_the_standin_system_attends_to_every_row_left_out_at_its_two_layers(report):
    n = report["workload"]["prefix_tokens"]
    assert report["params"]["standin_layers"]["layers"] == [8, 19]  # the file given, reported
    stand = report["systems"]["contiguouskv-standin@0.25"]
    plain = report["systems"]["contiguouskv-perlayer@0.25"]
    # the value sums of layers 8 and 19, [Hkv=3, d=64] float32 per prefix, on top of the probe keys
    assert stand["client_state_bytes"] - plain["client_state_bytes"] == 2 * 2 * 3 * 64 * 4
    for row in report["requests"]["contiguouskv-standin@0.25"]:
        assert 0 < row["standin_rows"] < 2 * n  # the rows not loaded at layers 8 and 19
    for key in ("contiguouskv-perlayer@0.25", "as-h2o@0.25"):
        assert all(r["standin_rows"] == 0 for r in report["requests"][key])


@needs_smollm2
def test_asking_any_key_gives_requests_on_one_prefix_different_questions(tmp_path):
    proc = run_bench(
        "reprefill", "--workload", "zipf", "--model", "smollm2-135m", "--dtype", "float32", "--task", "multikey",
        "--ask", "any-key", "--systems", "contiguouskv-perlayer", "--prefix-tokens", "256", "--prefixes", "2",
        "--requests", "6", "--warmup", "0", "--budgets", "0.25", "--period-layers", "8", "--group-layers", "1",
        "--threads", "2", "--directory", str(tmp_path), "--json", timeout=600,
    )  # fmt: skip
    report = json.loads(proc.stdout)
    w = report["workload"]
    assert w["ask"] == "any-key" and len(w["full_kv_correct"]) == 2
    assert all(len(keys) == 4 and all(isinstance(c, bool) for c in keys) for keys in w["full_kv_correct"])
    rows = report["requests"]["contiguouskv-perlayer@0.25"]
    assert len(rows) == 6 and {r["key"] for r in rows} <= {0, 1, 2, 3}
    for r in rows:
        assert r["full_kv_correct"] == w["full_kv_correct"][r["prefix"]][r["key"]]
    by_prefix = {}
    for r in rows:
        by_prefix.setdefault(r["prefix"], set()).add(r["key"])
    assert any(len(keys) > 1 for keys in by_prefix.values())  # one prefix asked about two of its needles


def _refusal(*args):
    import subprocess
    import sys

    from helpers import data_root

    return subprocess.run(
        [sys.executable, "-m", "kvstore_tools.bench.cli", "reprefill", "--workload", "zipf", *args],
        capture_output=True,
        text=True,
        cwd=data_root(),
        timeout=120,
    )


@needs_smollm2
def test_any_key_on_a_task_with_one_question_is_refused_in_one_line(tmp_path):
    proc = _refusal("--model", "smollm2-135m", "--task", "passkey", "--ask", "any-key", "--directory", str(tmp_path))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith("--ask any-key needs --task multikey (a prefix holding several keys), got --task passkey")
    )
    assert not any(tmp_path.iterdir())  # refused before any prefill


def test_a_task_on_random_weights_is_refused_in_one_line(tmp_path):
    proc = _refusal("--model", "tiny", "--task", "passkey")
    assert proc.returncode != 0
    assert "--task needs a pretrained model" in proc.stderr and "Traceback" not in proc.stderr


def test_per_layer_systems_over_wider_stored_groups_are_refused_in_one_line(tmp_path):
    proc = _refusal("--model", "tiny", "--systems", "as-lru,contiguouskv-standin", "--group-layers", "2", "--directory", str(tmp_path))
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].endswith("contiguouskv-standin select at every layer: they need --group-layers 1")
    assert "Traceback" not in proc.stderr and not any(tmp_path.iterdir())


@needs_smollm2
def test_the_standin_system_without_its_calibration_file_is_refused_in_one_line(tmp_path):
    missing = tmp_path / "absent.json"
    proc = _refusal("--model", "smollm2-135m", "--systems", "contiguouskv-standin", "--group-layers", "1", "--standin-layers", str(missing))
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].endswith(f"no stand-in layers file at {missing}")
    assert "Traceback" not in proc.stderr
