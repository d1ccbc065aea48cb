"""Smoke run of ``kvstore-bench prefill`` on the real model (its figures are not asserted)."""

import json

from pretrained import needs_smollm2

from engine_client.model import zoo
from engine_client.model.loader import load_config
from kvstore_tools.bench import cli
from kvstore_tools.bench.prefill import _best


def test_best_keeps_each_layers_fastest_run():
    report = _best([([3.0, 1.0], 10.0), ([2.0, 4.0], 12.0)])
    assert report["per_layer_ms"] == [2.0, 1.0] and report["total_ms"] == 10.0 and report["layers_ms"] == 3.0


@needs_smollm2
def test_prefill_bench_reports_every_layer(capsys):
    assert cli.main(["prefill", "--tokens", "24", "--repeats", "1", "--threads", "1", "--no-reference", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tokens"] == 24 and "transformers" not in report
    ours = report["ours"]
    layers = load_config(zoo.cached_checkpoint("smollm2-135m")).num_hidden_layers
    assert len(ours["per_layer_ms"]) == layers and all(t > 0 for t in ours["per_layer_ms"])
    assert ours["total_ms"] >= ours["layers_ms"]


def test_prefill_bench_refuses_an_unknown_model(capsys):
    assert cli.main(["prefill", "--model", "nope", "--no-reference"]) == 1
    assert "unknown model 'nope'" in capsys.readouterr().err
