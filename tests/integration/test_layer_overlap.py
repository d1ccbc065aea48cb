"""``python -m kvstore_tools.layer_overlap``: the default system's per-layer sets against the guesses a daemon could read ahead."""

import json
import subprocess
import sys

import pytest

from kvstore_tools.layer_overlap import main, overlaps


def test_overlaps_are_shares_of_each_layers_set():
    selected = [[0, 1, 2, 3], [0, 1, 8, 9], [8, 9, 10, 11]]
    hints = [None, [0, 1, 8, 7], [8, 9, 10, 11, 12]]
    previous, guess = overlaps(selected, hints)
    assert previous == pytest.approx((2 / 4 + 2 / 4) / 2)
    assert guess == pytest.approx((3 / 4 + 4 / 4) / 2)


def test_a_short_run_on_the_pretrained_model_and_its_random_shape(capsys):
    assert main(["--tokens", "512", "--examples", "1", "--tasks", "passkey", "--random", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["prompt"].split()[0] for r in rows] == ["trained", "random", "random", "random"]
    for r in rows:
        assert r["chunks_per_layer"] >= 2 and 0 <= r["previous_set"] <= 1 and 0 <= r["lookahead_guess"] <= 1


@pytest.mark.parametrize(
    "flag, value, says",
    [
        ("--tokens", "0", "at least 1"),
        ("--budget", "0", "(0, 1]"),
        ("--tasks", "nope", "unknown task"),
        ("--model", "gpt", "invalid choice"),
    ],
)
def test_bad_flags_get_one_line(flag, value, says):
    proc = subprocess.run([sys.executable, "-m", "kvstore_tools.layer_overlap", flag, value], capture_output=True, text=True)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr


def test_a_prompt_past_the_models_context_is_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "kvstore_tools.layer_overlap", "--tokens", "9000", "--examples", "1", "--tasks", "passkey"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "context" in proc.stderr and "Traceback" not in proc.stderr
