"""The per-request choice between recompute, full load and sparse Re-Prefill: directions on known shapes."""

import dataclasses

import pytest

from engine_client.compute_model import AcceleratorProfile
from engine_client.model.config import ModelConfig
from engine_client.path_choice import RequestShape, choose, predict, speculation
from kvstore_tools.bench.layer_shapes import SHAPES

# an H200-like measured profile (../shared/gpu figures: achieved GEMM rate, pinned copies, a virtio disk)
H200 = AcceleratorProfile(
    "h200-measured",
    539e12,
    3.8e12,
    54.9e9,
    matmul_efficiency=1.0,
    mem_efficiency=1.0,
    layer_overhead_s=60e-6,
    pageable_h2d_bytes_per_s=8.8e9,
    disk_bytes_per_s=1.6e9,
    period_overhead_s=0.3e-3,
    source="test",
)


def config(shape: str, layers: int) -> ModelConfig:
    return ModelConfig(
        architecture="Qwen2ForCausalLM" if SHAPES[shape]["attention_bias"] else "LlamaForCausalLM",
        num_hidden_layers=layers,
        rms_norm_eps=1e-6,
        max_position_embeddings=131072,
        tie_word_embeddings=False,
        **SHAPES[shape],
    )


def request(cfg: ModelConfig, tokens: int, budget: float, periods: int) -> RequestShape:
    kv = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 2 * tokens
    return RequestShape(tokens, 64, kv, periods, budget, scored_rows=tokens)


def test_a_small_model_on_a_short_prefix_recomputes():
    """Qwen2.5-0.5B shape, 2048 tokens: its prefill is a few ms, below any read of its KV from this disk."""
    cfg = config("qwen2.5-0.5b", 24)
    c = choose(cfg, H200, request(cfg, 2048, 0.05, 24))
    assert c.path == "recompute", c.reason
    assert c.predicted["recompute"] < c.predicted["full-load"]


def test_a_large_model_on_a_long_prefix_loads_sparsely_and_far_faster():
    """Llama-3-8B shape, 16k tokens, 5%: the sparse path beats the best of recompute and full load by a wide margin."""
    cfg = config("llama3-8b", 32)
    c = choose(cfg, H200, request(cfg, 16384, 0.05, 32))
    assert c.path == "sparse", c.reason
    best_other = min(c.predicted["recompute"], c.predicted["full-load"])
    assert best_other / c.seconds > 5, c.predicted


def test_without_a_disk_rate_only_recompute_is_costed_and_the_reason_says_so():
    cfg = config("smollm2-135m", 30)
    named = dataclasses.replace(H200, disk_bytes_per_s=None)
    c = choose(cfg, named, request(cfg, 4096, 0.05, 30))
    assert c.path == "recompute" and set(c.predicted) == {"recompute"}
    assert "kvstore-bench calibrate" in c.reason


@pytest.mark.parametrize("shape, layers", [("smollm2-135m", 30), ("llama3-8b", 32)])
def test_costs_move_the_right_way(shape, layers):
    cfg = config(shape, layers)
    base = request(cfg, 8192, 0.05, layers)
    p = predict(cfg, H200, base)
    faster_disk = predict(cfg, dataclasses.replace(H200, disk_bytes_per_s=16e9), base)
    assert faster_disk["full-load"] < p["full-load"] and faster_disk["sparse"] <= p["sparse"]
    assert faster_disk["recompute"] == p["recompute"]  # nothing is read
    more = predict(cfg, H200, dataclasses.replace(base, budget=0.25))
    assert more["sparse"] > p["sparse"] and more["full-load"] == p["full-load"]
    longer = predict(cfg, H200, request(cfg, 16384, 0.05, layers))
    assert all(longer[k] > p[k] for k in p)


def test_bad_shapes_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="budget must be a fraction"):
        RequestShape(100, 8, 1000, 2, 1.5)
    with pytest.raises(ValueError, match="num_periods must be a positive integer"):
        RequestShape(100, 8, 1000, 0, 0.5)


def test_speculation_pays_where_a_periods_compute_outlasts_its_read_and_not_at_gpu_speed_on_a_small_model():
    """Qwen2.5-0.5B shape, 2048 tokens, 5%, 3 Periods: ~0.4 ms of compute a Period on an H200 cannot hide a
    ~1.6 ms read (the replay measured 3.5-4.8 ms a request lost to it); a CPU-like rate can."""
    cfg = config("qwen2.5-0.5b", 24)
    shape = request(cfg, 2048, 0.05, 3)
    floor = dataclasses.replace(H200, layer_overhead_s=40e-6, disk_bytes_per_s=1.05e9, period_overhead_s=1.4e-3)
    gpu = speculation(cfg, floor, shape)
    assert not gpu.pays and gpu.period_compute_s < gpu.period_read_s
    cpu = speculation(cfg, dataclasses.replace(floor, peak_flops=0.3e12, mem_bytes_per_s=20e9), shape)
    assert cpu.pays and cpu.period_compute_s > gpu.period_compute_s
    assert speculation(cfg, dataclasses.replace(floor, disk_bytes_per_s=None), shape) is None
    c = choose(cfg, floor, dataclasses.replace(shape, state_bytes=0))
    assert c.speculate is False
    if c.path == "sparse":
        assert "no speculation" in c.reason


def test_the_sparse_choice_says_whether_it_speculates():
    cfg = config("llama3-8b", 32)
    c = choose(cfg, H200, request(cfg, 16384, 0.05, 32))
    assert c.path == "sparse" and c.speculate is not None
    assert ("no speculation" in c.reason) == (not c.speculate)


def test_a_measured_ratio_reprices_a_path_and_the_reason_says_so():
    """The profile underprices the sparse path (the 2,048-token Qwen2.5-0.5B shape on an H200 measured 4x its
    prediction); priced at what it measured, the choice goes to recompute, and says both figures."""
    from engine_client.path_choice import PathHistory

    cfg = config("qwen2.5-0.5b", 24)
    shape = request(cfg, 2048, 0.05, 3)
    plain = choose(cfg, H200, shape)
    assert plain.modelled == plain.predicted
    history = PathHistory()
    history.record(H200, plain.path, shape, plain.modelled[plain.path], 1.0)  # one request took a whole second
    ratios = history.ratios_for(H200, shape)
    assert ratios == {plain.path: 1.0 / plain.modelled[plain.path]}
    again = choose(cfg, H200, shape, ratios)
    assert again.path != plain.path and again.predicted[plain.path] == pytest.approx(1.0)
    assert again.modelled == plain.modelled and f"{plain.path}: {plain.modelled[plain.path] * 1e3:.2f} ms modelled x" in again.reason


def test_the_history_keeps_a_ratio_per_profile_and_request_class_and_mixes_the_last_two():
    from engine_client.path_choice import PathHistory

    cfg = config("qwen2.5-0.5b", 24)
    small, long, other_budget = request(cfg, 2048, 0.05, 3), request(cfg, 16384, 0.05, 3), request(cfg, 2048, 0.1, 3)
    history = PathHistory()
    history.record(H200, "sparse", small, 1.0, 4.0)
    history.record(H200, "recompute", small, 1.0, 2.0)
    assert history.ratios_for(H200, small) == {"sparse": 4.0, "recompute": 2.0}
    assert history.ratios_for(H200, other_budget) == {"recompute": 2.0}  # the sparse path's ratio is per budget
    assert history.ratios_for(H200, long) == {}  # another length class
    assert history.ratios_for(dataclasses.replace(H200, name="other"), small) == {}  # another profile's prices
    history.record(H200, "sparse", small, 1.0, 2.0)
    assert history.ratios_for(H200, small)["sparse"] == 3.0
    history.record(H200, "sparse", small, 0.0, 2.0)  # nothing to scale: ignored
    assert history.ratios_for(H200, small)["sparse"] == 3.0


def test_a_sliding_window_model_is_priced_by_its_layers_and_its_tail():
    """Gemma 3 270M at 32k tokens: recompute's 15 sliding layers see 512 positions, a loading path reads the
    global layers' bytes and, once per prefix, the sliding layers' window tail."""
    from test_compute_model import gemma3_270m

    gemma, unwindowed = gemma3_270m(), gemma3_270m(layer_types=False)
    n = 32768
    stored = 3 * 2 * 1 * 256 * 2 * n  # the global layers' extents (window-tail layout)
    tail = 15 * 2 * 1 * 256 * 2 * 512
    shape = RequestShape(n, 64, stored, 3, 0.05, scored_rows=n, tail_bytes=tail)
    p, flat = predict(gemma, H200, shape), predict(unwindowed, H200, shape)
    assert p["recompute"] < flat["recompute"] / 2  # 3 of 18 layers grow with the square of the prompt
    assert p["sparse"] < flat["sparse"] and p["full-load"] < flat["full-load"]
    resident = predict(gemma, H200, dataclasses.replace(shape, tail_bytes=0))
    for path in ("full-load", "sparse"):
        assert p[path] - resident[path] >= tail / H200.disk_bytes_per_s * 0.99
    assert p["recompute"] == resident["recompute"]
