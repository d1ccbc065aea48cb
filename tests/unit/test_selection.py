import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_client.selection import (
    SELECTORS,
    FullSelector,
    PeriodInputs,
    budget_count,
    chunk_upper_bounds,
    exact_chunk_scores,
    get_selector,
    select_chunks,
    summaries_for_layer,
    summary_chunk_scores,
)
from kvstore.contract.kv_values import key_summary


def chunk_min_max(keys: torch.Tensor, chunk_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference summaries: ``keys`` ``[Hkv, n, d]`` -> key_min, key_max ``[m, Hkv, d]``."""
    n = keys.shape[1]
    chunks = [keys[:, t : t + chunk_tokens] for t in range(0, n, chunk_tokens)]
    return torch.stack([c.amin(dim=1) for c in chunks]), torch.stack([c.amax(dim=1) for c in chunks])


def brute_force_exact(queries: torch.Tensor, keys: torch.Tensor, chunk_tokens: int) -> list[float]:
    """Equation 1 with Python loops in float64."""
    num_q_heads, num_queries, d = queries.shape
    num_kv_heads, n, _ = keys.shape
    group = num_q_heads // num_kv_heads
    q, k = queries.double().tolist(), keys.double().tolist()
    scores = [0.0] * math.ceil(n / chunk_tokens)
    for h in range(num_q_heads):
        kv = h // group
        for t in range(num_queries):
            logits = [sum(a * b for a, b in zip(q[h][t], k[kv][j])) / math.sqrt(d) for j in range(n)]
            top = max(logits)
            weights = [math.exp(x - top) for x in logits]
            total = sum(weights)
            for j, w in enumerate(weights):
                scores[j // chunk_tokens] += w / total
    return scores


# ---------------------------------------------------------------- exact


@pytest.mark.parametrize(
    "num_q_heads,num_kv_heads,head_dim,n,chunk_tokens",
    [(1, 1, 1, 37, 16), (7, 1, 1, 37, 16), (7, 1, 4, 21, 5), (14, 2, 4, 33, 16), (2, 2, 3, 1, 16)],
)
def test_exact_matches_brute_force_and_sums_to_softmax_mass(num_q_heads, num_kv_heads, head_dim, n, chunk_tokens):
    gen = torch.Generator().manual_seed(n * 100 + num_q_heads)
    num_queries = 3
    queries = torch.randn(num_q_heads, num_queries, head_dim, generator=gen) * 2
    keys = torch.randn(num_kv_heads, n, head_dim, generator=gen) * 2
    scores = exact_chunk_scores(queries, keys, chunk_tokens)
    assert scores.dtype == torch.float32
    assert scores.shape == (math.ceil(n / chunk_tokens),)
    assert scores.tolist() == pytest.approx(brute_force_exact(queries, keys, chunk_tokens), rel=1e-5, abs=1e-5)
    assert float(scores.sum()) == pytest.approx(num_queries * num_q_heads, rel=1e-6)


def test_exact_gqa_uses_kv_head_of_each_query_group():
    # Hq=2, Hkv=2, d=1, n=2, c=1: head 0 sees keys [10, 0] -> all mass on token 0;
    # head 1 sees keys [0, 10] -> all mass on token 1.  A wrong mapping gives [2, 0] or [0, 2].
    queries = torch.tensor([[[1.0]], [[1.0]]])  # [Hq=2, s=1, d=1]
    keys = torch.tensor([[[10.0], [-10.0]], [[-10.0], [10.0]]])  # [Hkv=2, n=2, d=1]
    assert exact_chunk_scores(queries, keys, 1).tolist() == pytest.approx([1.0, 1.0], abs=1e-6)
    # GQA ratio 2 with one KV head: both query heads use KV head 0
    assert exact_chunk_scores(queries, keys[:1], 1).tolist() == pytest.approx([2.0, 0.0], abs=1e-6)


def test_exact_query_blocking_gives_same_scores():
    gen = torch.Generator().manual_seed(1)
    queries = torch.randn(8, 9, 4, generator=gen)
    keys = torch.randn(2, 100, 4, generator=gen)
    whole = exact_chunk_scores(queries, keys, 16)
    for block_elems in (1, 200, 2 * 100 * 7):  # one row per block, two rows, seven rows
        assert torch.allclose(exact_chunk_scores(queries, keys, 16, max_block_elems=block_elems), whole, atol=1e-5)


def test_exact_bfloat16_inputs_are_scored_in_float32():
    gen = torch.Generator().manual_seed(2)
    queries = torch.randn(4, 64, 8, generator=gen).bfloat16()
    keys = torch.randn(1, 300, 8, generator=gen).bfloat16()
    scores = exact_chunk_scores(queries, keys, 16)
    assert scores.dtype == torch.float32
    assert torch.allclose(scores, exact_chunk_scores(queries.float(), keys.float(), 16), atol=1e-5)
    assert float(scores.sum()) == pytest.approx(4 * 64, rel=1e-6)


@pytest.mark.parametrize(
    "queries,keys,field",
    [
        (torch.zeros(3, 2, 4), torch.zeros(2, 5, 4), "queries"),  # 3 heads not a multiple of 2
        (torch.zeros(2, 2, 3), torch.zeros(2, 5, 4), "queries"),  # head_dim mismatch
        (torch.zeros(2, 4), torch.zeros(2, 5, 4), "queries"),  # not 3-D
        (torch.zeros(2, 2, 4), torch.zeros(2, 0, 4), "probe_keys"),  # empty prefix
    ],
)
def test_exact_rejects_bad_shapes_naming_the_field(queries, keys, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        exact_chunk_scores(queries, keys, 16)


# ---------------------------------------------------------------- summary bound


@settings(max_examples=150, deadline=None)
@given(
    num_kv_heads=st.integers(1, 3),
    group=st.integers(1, 4),
    num_queries=st.integers(1, 5),
    head_dim=st.integers(1, 8),
    n=st.integers(1, 60),
    chunk_tokens=st.integers(1, 17),
    seed=st.integers(0, 2**31 - 1),
    spread=st.sampled_from([1e-3, 1.0, 30.0]),
)
def test_upper_bound_dominates_every_key_in_the_chunk(num_kv_heads, group, num_queries, head_dim, n, chunk_tokens, seed, spread):
    gen = torch.Generator().manual_seed(seed)
    queries = torch.randn(num_kv_heads * group, num_queries, head_dim, generator=gen) * spread
    keys = torch.randn(num_kv_heads, n, head_dim, generator=gen) * spread
    key_min, key_max = chunk_min_max(keys, chunk_tokens)
    bound = chunk_upper_bounds(queries, key_min, key_max)  # [Hq, s, m]
    m = math.ceil(n / chunk_tokens)
    assert bound.shape == (num_kv_heads * group, num_queries, m)
    # float32 rounding scales with the terms summed, not with the (possibly cancelled) result:
    # slack = 1e-5 * (1 + sum_i |q_i| * max_t |k_t,i|)
    key_absmax = torch.maximum(key_min.abs(), key_max.abs()).double()  # [m, Hkv, d]
    for h in range(num_kv_heads * group):
        dots = queries[h].double() @ keys[h // group].double().T  # [s, n]
        magnitude = queries[h].double().abs() @ key_absmax[:, h // group].T  # [s, m]
        for j in range(m):
            true_max = dots[:, j * chunk_tokens : (j + 1) * chunk_tokens].amax(dim=1)  # [s]
            slack = 1e-5 * (1 + magnitude[:, j])
            assert (bound[h, :, j].double() >= true_max - slack).all()


def test_upper_bound_is_tight_for_one_token_chunks():
    gen = torch.Generator().manual_seed(3)
    queries = torch.randn(6, 4, 5, generator=gen)
    keys = torch.randn(3, 11, 5, generator=gen)
    key_min, key_max = chunk_min_max(keys, 1)  # min == max == the key
    exact = torch.einsum("hgsd,hnd->hgsn", queries.view(3, 2, 4, 5), keys).reshape(6, 4, 11)
    assert torch.allclose(chunk_upper_bounds(queries, key_min, key_max), exact, atol=1e-5)


def test_summaries_for_layer_reads_the_store_layout():
    # summaries built the way the writer does: key_summary per extent, [chunks, layers, heads, 2, dim]
    gen = np.random.default_rng(4)
    layers, heads, dim, chunk_tokens, n = 3, 2, 4, 16, 37
    kv = gen.standard_normal((layers, 2, heads, n, dim)).astype(np.float32)  # [layers, K|V, heads, n, dim]
    summaries = np.stack(
        [key_summary(kv[:, :, :, t : t + chunk_tokens], "float32") for t in range(0, n, chunk_tokens)]
    )  # [chunks, layers, heads, 2, dim]
    for layer in range(layers):
        key_min, key_max = summaries_for_layer(summaries, layer)
        ref_min, ref_max = chunk_min_max(torch.from_numpy(kv[layer, 0]), chunk_tokens)
        assert key_min.dtype == torch.float32 and key_min.shape == (3, heads, dim)
        assert torch.equal(key_min, ref_min) and torch.equal(key_max, ref_max)
        assert torch.equal(summaries_for_layer(torch.from_numpy(summaries), layer)[1], ref_max)
    with pytest.raises(ValueError, match="^layer:"):
        summaries_for_layer(summaries, layers)


def test_summary_ranking_agrees_with_exact_on_an_aligned_chunk():
    gen = torch.Generator().manual_seed(5)
    heads, head_dim, chunk_tokens, m = 4, 8, 16, 10
    direction = torch.randn(head_dim, generator=gen)
    direction /= direction.norm()
    queries = direction * 4 + 0.1 * torch.randn(heads, 6, head_dim, generator=gen)  # [Hq, s, d]
    keys = 0.3 * torch.randn(2, m * chunk_tokens - 5, head_dim, generator=gen)  # [Hkv, n, d]; short last chunk
    keys[:, 6 * chunk_tokens + 3] = direction * 6  # chunk 6 holds one clearly aligned key
    keys[:, 3 * chunk_tokens + 9] = direction * 3  # chunk 3 a weaker one
    exact = exact_chunk_scores(queries, keys, chunk_tokens)
    summary = summary_chunk_scores(queries, *chunk_min_max(keys, chunk_tokens))
    assert int(exact.argmax()) == int(summary.argmax()) == 6
    assert float(summary.sum()) == pytest.approx(heads * 6, rel=1e-6)
    expected = [0, 3, 6, 9]  # sink, two best, local
    assert select_chunks(exact, 4).tolist() == select_chunks(summary, 4).tolist() == expected


# ---------------------------------------------------------------- budget


def test_budget_count_examples():
    assert budget_count(100, 0.05) == 5  # not 6: 0.05 * 100 == 5.000000000000001
    assert budget_count(101, 0.05) == 5  # floor: a budget never loads more than its fraction
    assert budget_count(120, 0.05) == 6
    assert budget_count(10, 0.01) == 2  # raised to sink + local
    assert budget_count(1, 0.5) == 1  # sink and local are the same single chunk
    assert budget_count(3, 1.0) == 3
    assert budget_count(50, 7) == 7
    assert budget_count(50, 1, sink_chunks=2, local_chunks=3) == 5
    assert budget_count(4, 1, sink_chunks=2, local_chunks=3) == 4
    assert budget_count(50, 1, sink_chunks=0, local_chunks=0) == 1


def test_select_chunks_exact_ids():
    scores = torch.tensor([0.0, 5.0, 1.0, 5.0, 9.0, 2.0, 0.5, 0.1])
    assert select_chunks(scores, 4).tolist() == [0, 1, 4, 7]  # tie 1 vs 3 -> lower index
    assert select_chunks(scores, 5).tolist() == [0, 1, 3, 4, 7]
    assert select_chunks(scores, 3, sink_chunks=0, local_chunks=0).tolist() == [1, 3, 4]
    assert select_chunks(scores, 0.5, sink_chunks=2, local_chunks=1).tolist() == [0, 1, 4, 7]
    assert select_chunks(scores, 2, sink_chunks=2, local_chunks=2).tolist() == [0, 1, 6, 7]
    assert select_chunks(scores.bfloat16(), 1.0).tolist() == list(range(8))
    assert select_chunks(scores, 4).dtype == torch.long


@settings(max_examples=300, deadline=None)
@given(
    m=st.integers(1, 120),
    sink=st.integers(0, 3),
    local=st.integers(0, 3),
    data=st.data(),
)
def test_select_chunks_properties(m, sink, local, data):
    budget = data.draw(
        st.one_of(
            st.floats(min_value=1e-6, max_value=1.0, exclude_min=False),
            st.integers(1, m),
        )
    )
    scores = torch.tensor(data.draw(st.lists(st.integers(-3, 3), min_size=m, max_size=m)), dtype=torch.float32)
    chosen = select_chunks(scores, budget, sink_chunks=sink, local_chunks=local).tolist()
    count = budget_count(m, budget, sink, local)
    assert len(chosen) == count
    assert chosen == sorted(set(chosen))
    assert all(0 <= j < m for j in chosen)
    forced = set(range(min(sink, m))) | set(range(m - min(local, m), m))
    assert forced <= set(chosen)
    # the rest: the best scores, ties to the lower index (reference: sort by (-score, index))
    rest = sorted((j for j in range(m) if j not in forced), key=lambda j: (-float(scores[j]), j))
    assert set(chosen) - forced == set(rest[: count - len(forced)])


def _reference_with_followers_and_pages(
    scores: list[float], count: int, sink: int, local: int, follow: int, page: int, top: int = 0
) -> list[int]:
    """select_chunks spelled out in plain Python: rank by (-score, index), pages by (-max, page); with ``top``,
    only the first ``top`` chunks of the ranking bring followers."""
    m = len(scores)
    forced = set(range(min(sink, m))) | set(range(m - min(local, m), m))
    rest = count - len(forced)
    if page > 1:
        pages = sorted(range(-(-m // page)), key=lambda p: (-max(scores[p * page : (p + 1) * page]), p))
        order = [c for p in pages for c in range(p * page, min(m, (p + 1) * page)) if c not in forced]
        taken = order[:rest]
    else:
        taken = []
        ranking = sorted((j for j in range(m) if j not in forced), key=lambda j: (-scores[j], j))
        for rank, c in enumerate(ranking):
            brings = follow if top == 0 or rank < top else 0
            for j in range(c, min(m, c + brings + 1)):
                if len(taken) < rest and j not in forced and j not in taken:
                    taken.append(j)
    return sorted(forced | set(taken))


@settings(max_examples=300, deadline=None)
@given(
    m=st.integers(1, 90),
    sink=st.integers(0, 2),
    local=st.integers(0, 2),
    follow=st.integers(0, 2),
    top=st.integers(0, 3),
    page=st.integers(1, 4),
    data=st.data(),
)
def test_select_chunks_with_followers_and_pages_matches_the_plain_python_reference(m, sink, local, follow, top, page, data):
    if follow and page > 1:
        page = 1
    budget = data.draw(st.integers(1, m))
    values = data.draw(st.lists(st.integers(-2, 2), min_size=m, max_size=m))  # many ties
    dtype = data.draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float64]))
    chosen = select_chunks(
        torch.tensor(values, dtype=dtype), budget, sink_chunks=sink, local_chunks=local, follow=follow, follow_top=top, page_chunks=page
    )
    assert chosen.dtype == torch.long and chosen.device.type == "cpu"
    count = budget_count(m, budget, sink, local)
    assert chosen.tolist() == _reference_with_followers_and_pages([float(v) for v in values], count, sink, local, follow, page, top)


@pytest.mark.parametrize("budget", [0, -1, 0.0, -0.1, 1.5, float("nan"), float("inf"), 11, True, "5%", None])
def test_bad_budgets_are_errors_naming_budget(budget):
    with pytest.raises(ValueError, match="^budget:"):
        budget_count(10, budget)
    with pytest.raises(ValueError, match="^budget:"):
        select_chunks(torch.zeros(10), budget)


def test_bad_sink_local_and_scores_are_errors_naming_the_field():
    with pytest.raises(ValueError, match="^sink_chunks:"):
        budget_count(10, 0.5, sink_chunks=-1)
    with pytest.raises(ValueError, match="^local_chunks:"):
        select_chunks(torch.zeros(10), 0.5, local_chunks=1.5)
    with pytest.raises(ValueError, match="^scores:"):
        select_chunks(torch.tensor([0.0, float("nan")]), 1)
    with pytest.raises(ValueError, match="^scores:"):
        select_chunks(torch.zeros(2, 2), 1)
    with pytest.raises(ValueError, match="^num_chunks:"):
        select_chunks(torch.zeros(0), 1)


# ---------------------------------------------------------------- selectors


def period_inputs(m_tokens: int = 70, chunk_tokens: int = 16) -> PeriodInputs:
    gen = torch.Generator().manual_seed(6)
    queries = torch.randn(4, 3, 8, generator=gen)  # [Hq, s, d]
    keys = torch.randn(2, m_tokens, 8, generator=gen)  # [Hkv, n, d]
    key_min, key_max = chunk_min_max(keys, chunk_tokens)
    return PeriodInputs(queries, chunk_tokens, probe_keys=keys, key_min=key_min, key_max=key_max)


def test_get_selector_by_name_and_unknown_name_lists_the_names():
    assert sorted(SELECTORS) == ["exact", "full", "recent", "summary"]
    for name in SELECTORS:
        assert get_selector(name).name == name
    with pytest.raises(ValueError, match="exact, full, recent, summary"):
        get_selector("h2o")


@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_selector_contract(name):
    inputs = period_inputs()
    before = [t.clone() for t in (inputs.queries, inputs.probe_keys, inputs.key_min, inputs.key_max)]
    selector = get_selector(name)
    scores = selector.score(inputs)
    assert scores.shape == (5,) and scores.dtype == torch.float32 and torch.isfinite(scores).all()
    chosen = selector.select(inputs, 3).tolist()
    assert chosen == sorted(set(chosen)) and {0, 4} <= set(chosen)
    assert len(chosen) == (5 if isinstance(selector, FullSelector) else 3)
    assert torch.equal(selector.score(inputs), scores)  # deterministic
    after = (inputs.queries, inputs.probe_keys, inputs.key_min, inputs.key_max)
    assert all(torch.equal(a, b) for a, b in zip(before, after))  # no side effects
    with pytest.raises(ValueError, match="^budget:"):
        selector.select(inputs, 0)


def test_selectors_report_missing_inputs():
    queries = torch.zeros(1, 1, 1)
    with pytest.raises(ValueError, match="^probe_keys:"):
        get_selector("exact").score(PeriodInputs(queries, key_min=torch.zeros(2, 1, 1), key_max=torch.zeros(2, 1, 1)))
    with pytest.raises(ValueError, match="^key_min:"):
        get_selector("summary").score(PeriodInputs(queries, probe_keys=torch.zeros(1, 5, 1)))
    with pytest.raises(ValueError, match="^probe_keys:"):
        get_selector("recent").score(PeriodInputs(queries))


def test_recency_keeps_sink_and_most_recent():
    inputs = PeriodInputs(torch.zeros(1, 1, 1), 4, probe_keys=torch.zeros(1, 37, 1))  # m = 10
    assert get_selector("recent").select(inputs, 4).tolist() == [0, 7, 8, 9]


def test_period_inputs_from_store_summaries():
    inputs = period_inputs()
    summaries = torch.stack([inputs.key_min, inputs.key_max], dim=2).unsqueeze(1)  # [m, 1 layer, Hkv, 2, d]
    from_store = PeriodInputs.from_store_summaries(inputs.queries, summaries.numpy(), 0)
    assert from_store.num_chunks == 5
    assert torch.equal(get_selector("summary").score(from_store), get_selector("summary").score(inputs))
