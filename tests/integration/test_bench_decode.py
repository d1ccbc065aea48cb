"""``kvstore-bench decode`` on SmolLM2-135M, one short prompt, through a real daemon: what each system reads per token."""

import json

import pytest
from helpers import run_bench, run_bench_each
from pretrained import needs_smollm2

SYSTEMS = ["dense", "quest", "quest@192", "lserve", "lserve-kv4", "lserve-kv4h", "loopserve-sp"]


@needs_smollm2
def test_decode_bench_reports_bytes_read_per_token_for_each_system():
    proc = run_bench(
        "decode", "--context", "320", "--tasks", "passkey", "--examples", "1", "--new-tokens", "5", "--budget-tokens", "128",
        "--stream", "tune", "--systems", ",".join(SYSTEMS), "--streaming-heads", "docs/figures/streaming-heads-smollm2-135m.json",
        "--threads", "2", "--json", timeout=300,
    )  # fmt: skip
    r = json.loads(proc.stdout)
    (cell,) = r["cells"]
    systems = cell["systems"]
    assert sorted(systems) == sorted(SYSTEMS)
    for s in systems.values():
        (row,) = s["rows"]
        assert row["tokens"] == 5 and s["correct"] in (0, 1) and s["wilson95"][0] <= s["wilson95"][1]
    dense = systems["dense"]["rows"][0]
    n, sfx = dense["prefix_tokens"], dense["suffix_tokens"]
    # decoding step t (t = 1..4) reads every prefix row, the suffix and t generated rows, in all 30 layers and 3 KV heads
    rows = sum(30 * 3 * (n + sfx + t) for t in range(1, 5)) / 4
    assert systems["dense"]["memory_bytes_per_token"] == rows * 2 * 64 * 4  # K and V, 64 float32 each
    # at the same chunk budget, the streaming heads see only sink + recent rows: LServe reads less than Quest
    assert systems["lserve"]["memory_bytes_per_token"] < systems["quest"]["memory_bytes_per_token"] < rows * 2 * 64 * 4
    assert systems["lserve-kv4"]["memory_bytes_per_token"] == systems["lserve"]["memory_bytes_per_token"]  # dequantized on load
    # streaming systems read LServe's second layout: no streaming-head rows in the extents, a tail of 5 float32 pages
    # of the 31 left-out (layer, head) pairs (36 streaming heads, one kept in each of the 5 layers where all 3 stream)
    assert systems["lserve"]["stored_layout"] == "streaming" == systems["lserve-kv4"]["stored_layout"] != systems["quest"]["stored_layout"]
    tail = systems["lserve"]["stored_tail_bytes"]
    assert tail == systems["lserve-kv4"]["stored_tail_bytes"] == 5 * 16 * 31 * 2 * 64 * 4
    assert systems["lserve"]["stored_bytes"] - tail < systems["quest"]["stored_bytes"] * (1 - 0.3)  # 40% of heads, 3% of rows kept
    assert (systems["lserve-kv4"]["stored_bytes"] - tail) * 5 < systems["lserve"]["stored_bytes"] - tail  # float32 model: kv4 ~6x smaller
    assert systems["lserve-kv4"]["store_bytes_per_token"] < systems["lserve"]["store_bytes_per_token"]
    assert systems["dense"]["fetch_per_token_s"] == 0 == systems["dense"]["sets_changed"]  # chooses nothing while decoding
    assert systems["quest"]["select_per_token_s"] > systems["dense"]["select_per_token_s"]  # Quest scores at every token
    assert 0 < cell["streaming_layout_fraction"] < 1
    # NAME-kv4h: its own scheme beside --kv-quant's kv4, the same rows read, fewer bytes stored
    # (about the same rows: summaries of rounded keys may choose another page, and a page in the recent window
    # adds rows the streaming heads see)
    assert systems["lserve-kv4h"]["memory_bytes_per_token"] == pytest.approx(systems["lserve"]["memory_bytes_per_token"], rel=0.05)
    assert systems["lserve-kv4h"]["stored_bytes"] < systems["lserve-kv4"]["stored_bytes"]
    assert systems["loopserve-sp"]["prefill_density"] < 1 == systems["dense"]["prefill_density"]  # the new turn's lines only
    # NAME@TOKENS: the same system at its own budget, on the same prefix; the others keep --budget-tokens
    assert systems["quest@192"]["budget_tokens"] == 192 and "budget_tokens" not in systems["quest"] and r["budget_tokens"] == 128
    assert systems["quest"]["kv_fraction"] < systems["quest@192"]["kv_fraction"] < 1
    assert systems["quest"]["memory_bytes_per_token"] < systems["quest@192"]["memory_bytes_per_token"] < rows * 2 * 64 * 4


@needs_smollm2
def test_decode_bench_refuses_bad_flags_in_one_line():
    cases = (
        (["--systems", "dense,warp"], "unknown system 'warp'"),
        (["--context", "4k"], "--context must be comma-separated integers"),
        (["--kv-quant", "kv8"], "--kv-quant must be one of kv4, kv4t, kv4h"),
        (["--tasks", "passkey,haiku"], "--tasks: unknown task 'haiku'"),
        (["--budget-tokens", "0"], "must be positive"),
        (["--systems", "dense,quest@1k"], "'quest@1k': the budget after @ must be a positive number of tokens"),
        (["--systems", "dense@512,quest"], "'dense@512': dense loads every chunk; it takes no budget"),
    )
    proc = run_bench("decode", *cases[0][0], expect=2)  # one as the console script runs, the rest in one process
    assert cases[0][1] in proc.stderr and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    for (argv, want), (status, err) in zip(cases[1:], run_bench_each([["decode", *argv] for argv, _ in cases[1:]])):
        assert status == 2 and want in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, (argv, err)
