"""``kvstore-bench prefill --shapes``: the project's layer against a minimal layer of the same shape.

The minimal layer is the floor the project's layer is measured against, so it
must compute the same thing: in float32 its output and new KV rows match
``Decoder.layer_forward`` on the same weights and input.
"""

import json

import pytest
import torch

from kvstore_tools.bench import cli
from kvstore_tools.bench.layer_shapes import random_decoder
from kvstore_tools.bench.minimal_layer import GraphedLayer, MinimalLayer

TINY = ["--context", "48", "--prefill-tokens", "24", "--suffix-tokens", "5,12", "--sparse-fraction", "0.25"]
TINY = TINY + ["--repeats", "1", "--warmup", "0", "--threads", "1"]
CASES = {("prefill", 24, 0), ("reprefill-sparse", 5, 12), ("reprefill-full", 5, 48), ("reprefill-full", 12, 48)}


def _layers(shape, device, dtype, prefix_rows, start, new_tokens, seed=1):
    """The project's decoder and a minimal layer on its layer-0 weights, with the same random input."""
    cfg, dec = random_decoder(shape, device, dtype)
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(new_tokens, cfg.hidden_size, generator=gen).to(device, dtype)  # [s, hidden]
    prefix_kv = torch.randn(2, cfg.num_key_value_heads, prefix_rows, cfg.head_dim, generator=gen).to(device, dtype)
    layer = MinimalLayer(cfg, dec.weights.layers[0], prefix_kv, start, new_tokens)
    layer.hidden_in.copy_(hidden)
    return dec, layer, hidden, prefix_kv


@pytest.mark.parametrize("shape", ["smollm2-135m", "qwen2.5-0.5b"])  # Llama-style, and Qwen2 with q/k/v bias
@pytest.mark.parametrize("prefix_rows, start, new_tokens", [(0, 0, 9), (7, 40, 5), (33, 33, 1)])
def test_minimal_layer_computes_what_the_project_layer_computes(shape, prefix_rows, start, new_tokens):
    dec, layer, hidden, prefix_kv = _layers(shape, "cpu", torch.float32, prefix_rows, start, new_tokens)
    with torch.inference_mode():
        positions = dec.position_range(start, new_tokens)
        ours, ours_kv = dec.layer_forward(0, hidden, positions, prefix_kv if prefix_rows else None)
        out = layer.forward()
        torch.testing.assert_close(out, ours, atol=1e-4, rtol=0)
        torch.testing.assert_close(layer.suffix_kv(), ours_kv, atol=1e-4, rtol=0)
        # the comparison sees the positions: one position later, the new keys (rotated at their absolute
        # positions) differ, and so does the output wherever there are prefix rows to be nearer to
        shifted = MinimalLayer(dec.config, dec.weights.layers[0], prefix_kv, start + 1, new_tokens)
        shifted.hidden_in.copy_(hidden)
        moved = (shifted.forward() - ours).abs().max()
        assert (shifted.suffix_kv() - ours_kv).abs().max() > 1e-3
        assert moved > 1e-4 if prefix_rows else moved < 1e-4


def test_layer_mode_times_every_shape_and_case_on_the_cpu(capsys):
    shapes = ["smollm2-135m", "qwen2.5-0.5b"]
    argv = ["prefill", "--shapes", ",".join(shapes), "--device", "cpu", *TINY, "--json"]
    assert cli.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["device"] == "cpu" and report["dtype"] == "float32" and report["torch"] == torch.__version__
    assert report["profile"] == "h100" and report["command"].startswith("kvstore-bench")
    rows = report["rows"]
    assert {(r["model"], r["case"], r["new_tokens"], r["context_rows"]) for r in rows} == {(m, *c) for m in shapes for c in CASES}
    assert len(rows) == len(shapes) * len(CASES)
    for row in rows:
        assert row["project_s"] > 0 and row["minimal_eager_s"] > 0 and row["model_s"] > 0
        assert row["minimal_max_abs_diff"] <= 1e-4, row  # the same computation, float32
        assert row["minimal_graph_s"] is None and row["fixed_cost_over_graph_us"] is None
        assert "cuda" in row["graph_note"]
        assert row["prefix_tokens"] == (0 if row["case"] == "prefill" else 48)


def test_layer_mode_prints_a_table(capsys):
    assert cli.main(["prefill", "--shapes", "smollm2-135m", "--device", "cpu", *TINY]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m" in out and "reprefill-sparse" in out and "5 x 12" in out
    assert "graph: CUDA graphs need --device cuda" in out


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--shapes", "nosuch"], "--shapes: unknown shape 'nosuch'"),
        (["--shapes", "smollm2-135m,smollm2-135m"], "--shapes"),
        (["--shapes", "smollm2-135m", "--suffix-tokens", "64,0"], "--suffix-tokens"),
        (["--shapes", "smollm2-135m", "--suffix-tokens", "a"], "--suffix-tokens"),
        (["--shapes", "smollm2-135m", "--sparse-fraction", "1"], "--sparse-fraction"),
        (["--shapes", "smollm2-135m", "--context", "0"], "--context"),
        (["--shapes", "smollm2-135m", "--dtype", "int8"], "--dtype"),
        (["--shapes", "smollm2-135m", "--profile", "h999"], "--profile"),
        (["--shapes", "smollm2-135m", "--tokens", "100"], "--tokens"),
        (["--device", "cpu"], "--device: only with --shapes"),
    ],
)
def test_bad_layer_flags_are_refused_in_one_line(capsys, argv, says):
    assert cli.main(["prefill", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_device_is_refused(capsys):
    assert cli.main(["prefill", "--shapes", "smollm2-135m", "--device", "cuda"]) == 1
    assert "--device cuda" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graph_replays_what_the_eager_layer_computes_on_cuda(capsys):
    torch.cuda.synchronize()
    for prefix_rows, start, new_tokens in ((0, 0, 64), (40, 200, 16), (200, 200, 64)):
        dec, layer, hidden, prefix_kv = _layers("qwen2.5-0.5b", "cuda", torch.bfloat16, prefix_rows, start, new_tokens)
        with torch.inference_mode():
            # the causal bias (no mask tensor) where its kernel takes GQA heads, else the prebuilt mask, saying why
            assert layer.mask_kind in (("is_causal",) if prefix_rows == 0 else ("causal_lower_right", "boolean mask"))
            assert (layer.mask_kind == "boolean mask") == (layer.mask_note is not None), layer.mask_note
            eager = layer.forward().clone()
            graphed = GraphedLayer(layer)
            layer.hidden_out.zero_()
            assert torch.equal(graphed.replay(), eager)
            layer.hidden_in.copy_(torch.randn_like(hidden))  # a replay reads the static input anew
            assert not torch.equal(graphed.replay(), eager)
            # the lower-right causal bias attends as the project's mask does (bf16: compare loosely)
            ours, _ = dec.layer_forward(0, hidden, dec.position_range(start, new_tokens), prefix_kv if prefix_rows else None)
            assert (eager.float() - ours.float()).abs().max() < 0.1
    assert cli.main(["prefill", "--shapes", "smollm2-135m", *TINY, "--device", "cuda", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    for row in rows:
        assert row["minimal_graph_s"] > 0 and row["graph_max_abs_diff"] == 0.0 and row["graph_note"] is None
        assert row["fixed_cost_over_graph_us"] == pytest.approx((row["project_s"] - row["minimal_graph_s"]) * 1e6)
