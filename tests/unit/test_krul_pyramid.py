"""The recompute/load restoration plan against brute force over every monotone plan."""

import dataclasses
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_client.krul import HardwareProfile, RestoreCosts, check_plan, make_plan, plan_restore, recompute_flops, repair
from engine_client.model.config import ModelConfig
from kvstore.contract import InvalidArgument


def loop_times(costs: RestoreCosts, counts) -> tuple[float, float]:
    """``(T_C, T_L)`` token by token: token i of a layer costs f + f_att (i + 1) FLOPs; each loaded token its layer's bytes."""
    f, f_att = costs.recompute_flops_per_token_layer, costs.attention_flops_per_token_pair
    flops = sum(f + f_att * (i + 1) for n in counts for i in range(n))
    loaded = sum((costs.num_tokens - n) * b for n, b in zip(counts, costs.bytes_per_token_layer))
    return flops / costs.profile.flops_per_s, loaded / costs.profile.load_bytes_per_s


def token_step(costs: RestoreCosts, step_tokens: int) -> float:
    """The most one step of ``step_tokens`` at one layer can change ``T_C - T_L``."""
    k = min(step_tokens, costs.num_tokens)
    compute = max(costs.compute_s(n + k) - costs.compute_s(n) for n in range(costs.num_tokens - k + 1))
    return compute + max(costs.load_s(layer, k) for layer in range(costs.num_layers))


def monotone_plans(num_layers: int, counts: list[int]):
    """Every non-increasing tuple of ``num_layers`` values from ``counts``."""
    yield from itertools.combinations_with_replacement(sorted(counts, reverse=True), num_layers)


rates = st.floats(1.0, 1e6)


@st.composite
def problems(draw, max_layers=6, max_tokens=40):
    num_layers = draw(st.integers(1, max_layers))
    return {
        "num_layers": num_layers,
        "num_tokens": draw(st.integers(1, max_tokens)),
        "recompute_flops_per_token_layer": draw(st.floats(0.0, 1e3)),
        "attention_flops_per_token_pair": draw(st.floats(0.0, 50.0)),
        "bytes_per_token_layer": draw(st.lists(st.floats(0.0, 1e3), min_size=num_layers, max_size=num_layers)),
        "profile": HardwareProfile(draw(rates), draw(rates)),
        "step_tokens": draw(st.integers(1, 8)),
    }


@settings(max_examples=300, deadline=None)
@given(problem=problems())
def test_a_plan_has_no_gap_covers_every_token_layer_once_and_balances_at_least_as_well_as_uniform(problem):
    pyramid = plan_restore(**problem)
    uniform = plan_restore(**problem, shape="uniform")
    num_tokens, step = problem["num_tokens"], problem["step_tokens"]
    allowed = set(range(0, num_tokens, step)) | {num_tokens}
    for plan in (pyramid, uniform):
        check_plan(plan)
        assert all(n in allowed for n in plan.recompute_tokens)
        # recomputed: tokens [0, n_l); loaded: [n_l, N); together every token of every layer exactly once
        assert all(n + loaded == num_tokens for n, loaded in zip(plan.recompute_tokens, plan.load_tokens))
        assert all(a >= b for a, b in zip(plan.recompute_tokens, plan.recompute_tokens[1:]))
        assert (plan.t_compute, plan.t_load) == pytest.approx(loop_times(plan.costs, plan.recompute_tokens), rel=1e-9, abs=1e-12)
        assert plan.r_c == pytest.approx(sum(plan.recompute_tokens) / (num_tokens * problem["num_layers"]))
    assert len(set(uniform.recompute_tokens)) == 1
    every_uniform = [make_plan(pyramid.costs, [n] * problem["num_layers"]) for n in sorted(allowed)]
    tolerance = 1e-9 * max(pyramid.restore_s, 1e-12)
    assert uniform.imbalance_s <= min(p.imbalance_s for p in every_uniform) + tolerance
    assert pyramid.imbalance_s <= uniform.imbalance_s + tolerance
    all_load, all_recompute = every_uniform[0], every_uniform[-1]
    if all_load.t_compute - all_load.t_load < 0 < all_recompute.t_compute - all_recompute.t_load:
        assert pyramid.imbalance_s <= token_step(pyramid.costs, step) / 2 + tolerance


@settings(max_examples=150, deadline=None)
@given(problem=problems(max_layers=3, max_tokens=6))
def test_the_pyramid_is_within_half_a_token_step_of_the_best_monotone_plan(problem):
    plan = plan_restore(**problem)
    costs = plan.costs
    allowed = sorted(set(range(0, costs.num_tokens, problem["step_tokens"])) | {costs.num_tokens})
    best = min(make_plan(costs, counts).imbalance_s for counts in monotone_plans(costs.num_layers, allowed))
    assert plan.imbalance_s <= best + token_step(costs, problem["step_tokens"]) / 2 + 1e-9 * max(plan.restore_s, 1e-12)


def test_infinite_bandwidth_loads_everything_and_infinite_compute_recomputes_everything():
    common = {"recompute_flops_per_token_layer": 1e9, "attention_flops_per_token_pair": 1e5, "bytes_per_token_layer": 4096.0}
    for shape in ("pyramid", "uniform"):
        loads = plan_restore(8, 100, profile=HardwareProfile(1e12, math.inf), shape=shape, **common)
        assert loads.recompute_tokens == (0,) * 8 and loads.load_tokens == (100,) * 8 and loads.t_load == 0.0
        recomputes = plan_restore(8, 100, profile=HardwareProfile(math.inf, 1e9), shape=shape, **common)
        assert recomputes.recompute_tokens == (100,) * 8 and recomputes.t_compute == 0.0 and recomputes.r_c == 1.0


def test_cheaper_deep_layers_load_while_the_shallow_ones_recompute():
    # layers 4..7 are merged pairs: half the bytes per token
    common = {
        "recompute_flops_per_token_layer": 1e3,
        "attention_flops_per_token_pair": 10.0,
        "bytes_per_token_layer": [100.0] * 4 + [50.0] * 4,
        "profile": HardwareProfile(1e6, 1e5),
    }
    pyramid = plan_restore(8, 200, **common)
    uniform = plan_restore(8, 200, **common, shape="uniform")
    # the first tokens of a cheap layer still go before the late (long-attention) tokens of a dear one
    assert pyramid.recompute_tokens == (113,) * 4 + (6,) * 4 and uniform.recompute_tokens == (71,) * 8
    assert pyramid.restore_s < 0.96 * uniform.restore_s
    linear = plan_restore(8, 200, **{**common, "attention_flops_per_token_pair": 0.0})
    assert linear.recompute_tokens == (200, 200, 191, 9, 0, 0, 0, 0)
    assert linear.restore_s < 0.9 * plan_restore(8, 200, **{**common, "attention_flops_per_token_pair": 0.0}, shape="uniform").restore_s


def test_equal_layers_with_linear_costs_fill_the_shallow_layers_first():
    plan = plan_restore(4, 10, recompute_flops_per_token_layer=1.0, bytes_per_token_layer=1.0, profile=HardwareProfile(1.0, 1.0))
    assert plan.recompute_tokens == (10, 10, 0, 0) and plan.imbalance_s == 0.0


def test_chunk_steps_move_whole_chunks_but_the_last():
    plan = plan_restore(
        6,
        100,
        recompute_flops_per_token_layer=5.0,
        attention_flops_per_token_pair=0.1,
        bytes_per_token_layer=7.0,
        profile=HardwareProfile(1.0, 1.0),
        step_tokens=16,
    )
    assert all(n % 16 == 0 or n == 100 for n in plan.recompute_tokens)
    assert plan.imbalance_s <= token_step(plan.costs, 16) / 2


def test_check_plan_refuses_a_gap_and_repair_closes_it_by_raising_earlier_layers():
    costs = plan_restore(4, 20, recompute_flops_per_token_layer=3.0, bytes_per_token_layer=2.0, profile=HardwareProfile(1.0, 1.0)).costs
    gapped = make_plan(costs, [8, 5, 12, 3])
    with pytest.raises(InvalidArgument, match="^recompute_tokens: layer 2 recomputes 12 tokens, more than layer 1's 5"):
        check_plan(gapped)
    fixed = repair(gapped)
    assert fixed.recompute_tokens == (12, 12, 12, 3) and fixed.load_tokens == (8, 8, 8, 17)
    assert (fixed.t_compute, fixed.t_load) == pytest.approx(loop_times(costs, fixed.recompute_tokens))
    check_plan(fixed)
    assert repair(fixed) == fixed


@pytest.mark.parametrize(
    "plan_change,field",
    [
        ({"recompute_tokens": (5, 5, 21, 0)}, "recompute_tokens"),
        ({"recompute_tokens": (5, 5, -1, -1)}, "recompute_tokens"),
        ({"recompute_tokens": (5, 5, 5)}, "recompute_tokens"),
        ({"load_tokens": (15, 15, 15, 19)}, "load_tokens"),
    ],
)
def test_check_plan_refuses_counts_out_of_range(plan_change, field):
    costs = plan_restore(4, 20, recompute_flops_per_token_layer=3.0, bytes_per_token_layer=2.0, profile=HardwareProfile(1.0, 1.0)).costs
    plan = dataclasses.replace(make_plan(costs, [5, 5, 5, 0]), **plan_change)
    with pytest.raises(InvalidArgument, match=f"^{field}: "):
        check_plan(plan)


@pytest.mark.parametrize(
    "change,field",
    [
        ({"shape": "diamond"}, "shape"),
        ({"bytes_per_token_layer": [1.0, 2.0]}, "bytes_per_token_layer"),
        ({"bytes_per_token_layer": -1.0}, "bytes_per_token_layer"),
        ({"num_tokens": 0}, "num_tokens"),
        ({"num_layers": 0}, "num_layers"),
        ({"step_tokens": 0}, "step_tokens"),
        ({"recompute_flops_per_token_layer": float("nan")}, "recompute_flops_per_token_layer"),
        ({"attention_flops_per_token_pair": math.inf}, "costs"),
        ({"profile": None}, "profile"),
    ],
)
def test_bad_arguments_name_their_field(change, field):
    args = {
        "num_layers": 3,
        "num_tokens": 10,
        "recompute_flops_per_token_layer": 1.0,
        "bytes_per_token_layer": 1.0,
        "profile": HardwareProfile(1.0, 1.0),
    }
    with pytest.raises(InvalidArgument, match=f"^{field}: "):
        plan_restore(**{**args, **change})
    with pytest.raises(InvalidArgument, match="^profile.flops_per_s: "):
        HardwareProfile(0.0, 1.0)


def test_recompute_flops_of_a_llama_layer():
    config = ModelConfig(
        architecture="LlamaForCausalLM",
        vocab_size=100,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        attention_bias=False,
    )
    f, f_att = recompute_flops(config)
    qkv, out, mlp = 64 * (4 + 2 + 2) * 16, 4 * 16 * 64, 3 * 64 * 160
    assert f == 2 * (qkv + out + mlp) and f_att == 4 * 4 * 16


def _restore_s(costs: RestoreCosts, counts) -> float:
    t_compute, t_load = loop_times(costs, counts)
    o = costs.profile.overlap
    return max(t_compute, t_load) + (1 - o) * min(t_compute, t_load)


@settings(max_examples=200, deadline=None)
@given(problem=problems(max_layers=4, max_tokens=24), overlap=st.floats(0.0, 0.99))
def test_with_streams_that_share_hardware_the_plan_is_no_slower_than_all_load_all_recompute_or_uniform(problem, overlap):
    problem["profile"] = dataclasses.replace(problem["profile"], overlap=overlap)
    plan = plan_restore(**problem)
    check_plan(plan)
    costs, n = plan.costs, problem["num_tokens"]
    assert math.isclose(plan.restore_s, _restore_s(costs, plan.recompute_tokens), rel_tol=1e-9, abs_tol=1e-12)
    bounds = sorted({*range(0, n, problem["step_tokens"]), n})
    others = [[0] * costs.num_layers, [n] * costs.num_layers, *([b] * costs.num_layers for b in bounds)]
    assert plan.restore_s <= min(_restore_s(costs, c) for c in others) * (1 + 1e-9) + 1e-12


def test_serial_streams_load_what_is_cheaper_to_load_and_recompute_what_is_cheaper_to_recompute():
    kw = dict(num_layers=4, num_tokens=64, recompute_flops_per_token_layer=100.0, bytes_per_token_layer=10.0, step_tokens=16)
    loads = plan_restore(**kw, profile=HardwareProfile(1000.0, 1000.0, overlap=0.0))  # 0.1 s to recompute, 0.01 s to load a token
    assert loads.recompute_tokens == (0, 0, 0, 0)
    computes = plan_restore(**kw, profile=HardwareProfile(1e5, 10.0, overlap=0.0))  # 1 ms to recompute, 1 s to load
    assert computes.recompute_tokens == (64, 64, 64, 64)
    concurrent = plan_restore(**kw, profile=HardwareProfile(1000.0, 1000.0))  # fully overlapped: balance, some recompute
    assert 0 < concurrent.r_c < 1
    with pytest.raises(InvalidArgument, match="overlap"):
        HardwareProfile(1.0, 1.0, overlap=1.5)
