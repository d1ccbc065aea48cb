"""Per-head aggregation of chunk scores and the Period plan (full layers charged to the budget)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_client.selection import (
    PeriodInputs,
    aggregate_heads,
    budget_count,
    exact_chunk_scores,
    exact_head_chunk_scores,
    get_selector,
    plan_periods,
    select_chunks,
    summary_chunk_scores,
    summary_head_chunk_scores,
)
from engine_client.selection.heads import kv_head_scores
from kvstore.contract.errors import InvalidArgument


def _min_max(keys, c):
    chunks = [keys[:, t : t + c] for t in range(0, keys.shape[1], c)]
    return torch.stack([x.amin(dim=1) for x in chunks]), torch.stack([x.amax(dim=1) for x in chunks])


def test_sum_over_heads_reproduces_the_existing_scores():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(6, 3, 4, generator=g), torch.randn(2, 21, 4, generator=g)  # 21 tokens: short last chunk
    heads = exact_head_chunk_scores(q, k, 4)
    assert heads.shape == (6, 6)
    torch.testing.assert_close(heads.sum(dim=1), torch.full((6,), 3.0))  # one unit per query
    torch.testing.assert_close(aggregate_heads(heads, "sum"), exact_chunk_scores(q, k, 4))
    kmin, kmax = _min_max(k, 4)
    torch.testing.assert_close(aggregate_heads(summary_head_chunk_scores(q, kmin, kmax), "sum"), summary_chunk_scores(q, kmin, kmax))


def test_max_aggregation_keeps_the_chunk_one_head_wants():
    # Head 0 puts all its mass on chunk 3; heads 1 and 2 spread a little more
    # than that over chunks 1 and 2 together.  Sum ranks chunk 1 first; max
    # ranks chunk 3 first.
    heads = torch.tensor(
        [
            [0.0, 0.0, 0.0, 1.0, 0.0],
            [0.0, 0.6, 0.4, 0.0, 0.0],
            [0.0, 0.6, 0.4, 0.0, 0.0],
        ]
    )
    assert int(aggregate_heads(heads, "sum").argmax()) == 1
    assert int(aggregate_heads(heads, "max").argmax()) == 3
    sel = get_selector("exact", "max")
    assert sel.head_aggregation == "max"


def test_max_selector_picks_the_sharp_head_s_chunk_on_toy_keys():
    # One KV head, two query heads, head dim 1, chunks of 2 tokens.  Query
    # head 0 is sharp on token 6 (chunk 3); query head 1 is weak and prefers
    # chunks 1 and 2 a little.
    keys = torch.tensor([[[0.0], [0.0], [1.0], [1.0], [1.0], [1.0], [30.0], [0.0], [0.0], [0.0]]])  # [1, 10, 1]
    q = torch.tensor([[[1.0]], [[-0.05]]])  # [2, 1, 1]
    inputs = PeriodInputs(q, chunk_tokens=2, probe_keys=keys)
    assert get_selector("exact", "max").select(inputs, 3, sink_chunks=1, local_chunks=1).tolist() == [0, 3, 4]
    kmin, kmax = _min_max(keys, 2)
    summ = PeriodInputs(q, chunk_tokens=2, key_min=kmin, key_max=kmax)
    assert get_selector("summary", "max").select(summ, 3, sink_chunks=1, local_chunks=1).tolist() == [0, 3, 4]


def test_bad_aggregation_is_an_error_naming_the_field():
    with pytest.raises(InvalidArgument, match="head_aggregation"):
        get_selector("exact", "mean")
    with pytest.raises(InvalidArgument, match="head_aggregation"):
        aggregate_heads(torch.ones(2, 3), "median")


def test_plan_without_full_layers_is_the_plain_schedule():
    # 125 chunks x 30 layers at 5%: 187.5 -> 187 chunk-layers, 6 chunks per layer.
    plan = plan_periods(30, 125, 0.05, period_layers=2)
    assert len(plan.periods) == 15 and all(count == 6 for _, _, count in plan.periods)
    assert plan.periods[-1] == (28, 2, 6) and plan.kv_fraction <= 0.05
    assert plan_periods(30, 125, 0.05, period_layers=8).periods[-1] == (24, 6, 6)  # short last Period
    assert plan_periods(4, 10, 0.01, period_layers=1).periods[0] == (0, 1, 2)  # raised to sink + local
    assert plan_periods(4, 10, 3, period_layers=2).chunk_layers == 12  # an int is a count per layer


def test_full_layers_are_charged_to_the_budget():
    # 250 chunks, 10%: 25 chunks x 30 layers = 750 chunk-layers.  Two full
    # layers take 500; 28 layers share 250 -> 8 each (224 <= 250).
    plan = plan_periods(30, 250, 0.10, period_layers=2, full_layers=2)
    assert plan.periods[0] == (0, 2, 250)
    assert {count for _, _, count in plan.periods[1:]} == {8}
    assert plan.chunk_layers == 500 + 28 * 8 <= 25 * 30
    with pytest.raises(InvalidArgument, match="full_layers"):  # at 5% two full layers cost more than the budget
        plan_periods(30, 250, 0.05, period_layers=2, full_layers=2)
    with pytest.raises(InvalidArgument, match="full_layers"):  # not a whole Period
        plan_periods(30, 250, 0.5, period_layers=2, full_layers=1)


def test_whole_layers_load_every_chunk_on_top_of_the_budget():
    plain = plan_periods(30, 250, 0.10, period_layers=1)
    plan = plan_periods(30, 250, 0.10, period_layers=1, whole_layers=(1, 19))
    assert [c for _, _, c in plan.periods] == [250 if first in (1, 19) else 25 for first, _, _ in plain.periods]
    assert plan.chunk_layers == plain.chunk_layers + 2 * (250 - 25)
    assert plan_periods(30, 250, 0.10, period_layers=2, whole_layers=(2,)).periods[1] == (2, 2, 250)
    for bad in ((30,), (1, 1), (-1,), (True,)):
        with pytest.raises(InvalidArgument, match="whole_layers"):
            plan_periods(30, 250, 0.10, period_layers=1, whole_layers=bad)
    with pytest.raises(InvalidArgument, match="whole_layers"):  # not a Period's first layer
        plan_periods(30, 250, 0.10, period_layers=2, whole_layers=(3,))


@settings(max_examples=200, deadline=None)
@given(
    num_layers=st.integers(1, 40),
    m=st.integers(1, 400),
    budget=st.floats(0.01, 1.0),
    period=st.integers(1, 8),
    full_periods=st.integers(0, 4),
)
def test_plan_never_exceeds_the_plain_budget(num_layers, m, budget, period, full_periods):
    full = full_periods * period
    try:
        plan = plan_periods(num_layers, m, budget, period_layers=period, full_layers=full)
    except InvalidArgument:
        assert full  # only full layers can make a plan impossible
        return
    forced = min(m, 2) * num_layers  # sink + local, the floor of a plan without full layers
    assert plan.chunk_layers <= max(budget * m * num_layers + 1e-6, forced if not full else 0)
    assert sum(layers for _, layers, _ in plan.periods) == num_layers
    for first, _, count in plan.periods:
        assert count == m if first < full else 1 <= count <= m


def test_follow_takes_each_top_chunk_with_the_chunk_after_it():
    scores = torch.tensor([0.0, 5, 1, 9, 2, 0, 3, 0, 0, 0])
    assert select_chunks(scores, 6).tolist() == [0, 1, 3, 4, 6, 9]  # plain: the four best
    assert select_chunks(scores, 6, follow=1).tolist() == [0, 1, 2, 3, 4, 9]  # 3 then 4, 1 then 2
    assert select_chunks(scores, 3, follow=1).tolist() == [0, 3, 9]  # the budget ends between a chunk and its follower
    assert select_chunks(scores, 5, follow=2).tolist() == [0, 3, 4, 5, 9]


def test_follow_top_gives_followers_to_the_best_chunks_only():
    scores = torch.tensor([0.0, 5, 1, 9, 0, 2, 3, 0, 0, 0])  # ranked 3, 1, 6, 5, 2, ...
    assert select_chunks(scores, 6).tolist() == [0, 1, 3, 5, 6, 9]  # plain: the four best
    assert select_chunks(scores, 6, follow=1).tolist() == [0, 1, 2, 3, 4, 9]  # 3 then 4, 1 then 2
    assert select_chunks(scores, 6, follow=1, follow_top=1).tolist() == [0, 1, 3, 4, 6, 9]  # 3 then 4, then 1 and 6 alone
    assert select_chunks(scores, 7, follow=1, follow_top=2).tolist() == [0, 1, 2, 3, 4, 6, 9]  # 3 then 4, 1 then 2, 6
    assert select_chunks(scores, 6, follow=1, follow_top=0).tolist() == select_chunks(scores, 6, follow=1).tolist()
    assert select_chunks(scores, 6, follow_top=1).tolist() == select_chunks(scores, 6).tolist()  # nothing to bring
    with pytest.raises(InvalidArgument, match="follow_top"):
        select_chunks(scores, 5, follow=1, follow_top=-1)


def test_follow_never_counts_a_forced_or_repeated_chunk():
    scores = torch.tensor([0.0, 0, 0, 0, 0, 0, 7, 8, 1, 0])  # 8's follower is the local chunk
    assert select_chunks(scores, 5, follow=1).tolist() == [0, 6, 7, 8, 9]
    with pytest.raises(InvalidArgument, match="follow"):
        select_chunks(scores, 5, follow=-1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=60), st.integers(0, 3), st.floats(0.01, 1.0))
def test_follow_spends_exactly_the_budget(values, follow, budget):
    scores = torch.tensor(values)
    m = len(values)
    got = select_chunks(scores, budget, follow=follow)
    assert got.numel() == len(set(got.tolist())) == budget_count(m, budget)
    assert 0 in got.tolist() and m - 1 in got.tolist()
    if follow == 0:
        assert torch.equal(got, select_chunks(scores, budget))


def test_kv_head_scores_take_each_query_group_s_sharpest_head():
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(6, 3, 4, generator=g), torch.randn(2, 40, 4, generator=g)  # 3 query heads per KV head
    heads = exact_head_chunk_scores(q, k, 8)  # [6, 5]
    got = kv_head_scores(heads, 2)
    normed = heads / heads.sum(dim=1, keepdim=True)
    want = torch.stack([normed[0:3].amax(dim=0), normed[3:6].amax(dim=0)])
    torch.testing.assert_close(got, want)
    assert torch.equal(got.amax(dim=0), aggregate_heads(heads, "max"))  # the shared set's max is their max
    with pytest.raises(InvalidArgument, match="head_scores"):
        kv_head_scores(heads, 4)
