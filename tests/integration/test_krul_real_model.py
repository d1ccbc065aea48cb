"""Smoke run of ``kvstore_tools.krul_ir_layers`` on SmolLM2-135M: one short prompt, every layer's map through the sketch."""

import re

import pytest
import torch

from kvstore_tools import krul_ir_layers

zoo = pytest.importorskip("engine_client.model.zoo")


def test_the_ir_layer_count_runs_on_a_short_prompt(capsys):
    torch.set_num_threads(2)
    try:
        zoo.locate("smollm2-135m")
    except zoo.ModelNotInstalled as exc:
        pytest.skip(str(exc))
    assert krul_ir_layers.main(["--prompts", "1", "--tokens", "48", "--grid", "8", "--gammas", "0.0,2.0"]) == 0
    out = capsys.readouterr().out
    masses = [float(m) for m in re.findall(r"^\s+\d+ (\d\.\d\d)$", out, re.MULTILINE)]
    assert len(masses) == 30 and all(0.0 <= m <= 2.0 for m in masses)
    assert "p0: 30/30 I-R; non-I-R []; pairs at ratio 0.5: [(" in out  # gamma 0: every layer may pair, 15 layers do
    assert "p0: 0/30 I-R; non-I-R [0, 1," in out  # gamma 2: no row puts all its mass on both windows
