"""``kvstore-bench accuracy --model``: a small slice of real-text tasks through a real daemon."""

import argparse

import pytest
from helpers import assert_png
from pretrained import needs_smollm2

from kvstore_tools.bench.plots import plot_accuracy
from kvstore_tools.bench.text_accuracy import format_text_report, parse_paths, run_text_accuracy
from kvstore_tools.tasks.text import answer_in

pytestmark = needs_smollm2


def passkey_args(tmp_path, **fields) -> argparse.Namespace:
    """The bench's arguments for short pass-key prompts; ``fields`` override them."""
    base = dict(model="smollm2-135m", task="passkey", tokens=320, start=0, max_new_tokens=0, period_layers=8, threads=1)
    return argparse.Namespace(**{**base, "dtype": "float32", "directory": str(tmp_path), **fields})


def test_passkey_slice_full_drop_needle_and_reprefill_at_5_percent(tmp_path):
    args = passkey_args(tmp_path, path="full,drop-needle,exact@0.05", examples=2, depths="0.3,0.7", group_layers=4)
    r = run_text_accuracy(args)
    assert r["seeds"] == [1_000_000, 1_000_001] and set(r["paths"]) == {"full", "drop-needle", "exact@0.05"}
    full, drop, sparse = (r["paths"][k] for k in ("full", "drop-needle", "exact@0.05"))
    assert full["correct"] == 2  # the full KV answers short pass-key prompts (checked before writing this)
    assert drop["correct"] == 0  # without the needle's chunks the key is not in the context
    for p in (full, drop, sparse):
        assert p["examples"] == 2 and p["correct"] == sum(row["correct"] for row in p["rows"])
        lo, hi = p["wilson95"]
        assert lo <= p["accuracy"] <= hi
    for row, depth in zip(sparse["rows"], (0.3, 0.7)):
        assert row["depth"] == depth and row["needle_chunks"]
        assert len(row["needle_loaded"]) == 4 and all(0 <= x <= 1 for x in row["needle_loaded"])  # 30 layers / 8
        chunks = -(-row["prefix_tokens"] // 16)
        assert row["tokens_loaded"] <= 4 * 16 * (1 + 1 + -(-chunks * 5 // 100)) + 4 * 16  # sink + local + 5% per Period
        assert row["correct"] == answer_in(row["answers"][0], row["text"])
    assert len(sparse["needle_loaded_per_period"]) == 4
    assert "exact@0.05: " in format_text_report(r)
    plot_accuracy(r, str(tmp_path / "accuracy.png"))  # exact at its one budget; full and drop-needle as levels
    assert_png(tmp_path / "accuracy.png")


def test_eight_token_chunks_reach_the_store_the_needle_and_the_budget(tmp_path):
    paths = "full,drop-needle,ckv+int4-probes@0.05"
    r = run_text_accuracy(passkey_args(tmp_path, path=paths, examples=1, depths="0.5", group_layers=1, chunk_tokens=8, margins=True))
    assert r["chunk_tokens"] == 8
    full, drop, sparse = (r["paths"][k]["rows"][0] for k in ("full", "drop-needle", "ckv+int4-probes@0.05"))
    (a, b), *_ = ex_spans = r["paths"]["full"]["rows"][0]["needle_spans"]
    assert full["needle_chunks"] == list(range(a // 8, (b - 1) // 8 + 1)) and len(ex_spans) == 1
    assert full["correct"] and not drop["correct"]  # dropping the 8-token chunks over the needle loses the key
    # the full KV's answer, token by token, beats every other token
    assert len(full["answer_margins"]) >= 5 and min(full["answer_margins"]) > 0
    # --margins: the sparse path's own, teacher-forced over the rows it loaded; positive where it answered
    assert len(sparse["answer_margins"]) == len(full["answer_margins"])
    assert (min(sparse["answer_margins"]) > 0) == (sparse["text"].split()[0].strip(".") == sparse["answers"][0])
    chunks = -(-sparse["prefix_tokens"] // 8)
    per_layer = max(2, chunks * 5 // 100)  # sink + local at least
    assert len(sparse["needle_loaded"]) == 30 and sparse["tokens_loaded"] <= 30 * 8 * per_layer


def test_naming_no_path_runs_the_default_system_over_the_layout_it_needs(tmp_path, caplog):
    r = run_text_accuracy(
        passkey_args(tmp_path, path=None, examples=1, depths="0.5", group_layers=None, standin_layers=str(tmp_path / "none.json"))
    )
    name = "ckv+probes+standins@0.05"  # the probe keys at the model's width: 4 bits on this one
    assert list(r["paths"]) == [name] and r["group_layers"] == 1 and "standin_layers" not in r  # no calibration file: none
    row = r["paths"][name]["rows"][0]
    assert len(row["needle_loaded"]) == 30 and row["standin_rows"] == 0  # a selection at every layer, no stand-ins
    assert row["correct"] == answer_in(row["answers"][0], row["text"])


def test_paths_are_checked():
    assert parse_paths("full,summary@0.1") == [("full", "", 1.0), ("summary@0.1", "summary", 0.1)]
    for bad, msg in (("nope", "SYSTEM@BUDGET"), ("exact@2", "fraction"), ("full,full", "twice"), ("exact@x", "not a number")):
        with pytest.raises(ValueError, match=msg):
            parse_paths(bad)


def test_the_standin_system_runs_at_the_layers_of_its_file_and_reports_them(tmp_path):
    import torch

    from engine_client.model import zoo
    from engine_client.model.standins import ProfileError, StandinLayers

    path = "perlayer-follow-int4-standin@0.05"
    missing = tmp_path / "absent.json"
    with pytest.raises(ProfileError, match="no stand-in layers file"):
        run_text_accuracy(passkey_args(tmp_path, path=path, examples=1, depths="0.5", group_layers=1, standin_layers=str(missing)))
    decoder = zoo.load("smollm2-135m", dtype=torch.float32).decoder
    gains = tuple(0.5 if layer in (3, 20) else 0.0 for layer in range(decoder.num_layers))
    standins = StandinLayers(decoder.fingerprint, (3, 20), gains, 2, 0.2, {"task": "test"}).save(tmp_path / "s.json")
    r = run_text_accuracy(passkey_args(tmp_path, path=path, examples=1, depths="0.5", group_layers=1, standin_layers=str(standins)))
    assert r["standin_layers"] == {"layers": [3, 20], "gains": [0.5, 0.5], "calibration": {"task": "test"}}
    row = r["paths"][path]["rows"][0]
    assert row["correct"] == answer_in(row["answers"][0], row["text"])
    # every row not loaded at layers 3 and 20 stood in, and their value sums were read for this prefix
    assert 0 < row["standin_rows"] < 2 * row["prefix_tokens"] and row["state_bytes_fetched"] > 0
