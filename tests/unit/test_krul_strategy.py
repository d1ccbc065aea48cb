"""Krul's attention sketch and strategy selector against loop-by-loop references."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_client.krul import (
    AttentionSketch,
    AttentionStats,
    Strategy,
    choose_strategy,
    edge_mass,
    layer_distances,
    pooled_attention,
    record_strategy,
)
from kvstore.contract import InvalidArgument


def causal_map(heads: int, n: int, seed: int) -> torch.Tensor:
    """A random causal attention map ``[heads, n, n]``: softmax rows over keys ``0..i``."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(heads, n, n, generator=gen) * 3
    return scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf")).softmax(-1)


def reference_pool(attn: torch.Tensor, grid: tuple[int, int]) -> list:
    """Cell means with Python loops; bin width = the smallest power of two whose grid covers n."""
    heads, n, _ = attn.shape
    widths = [2 ** math.ceil(math.log2(math.ceil(n / g))) for g in grid]
    a = attn.double().tolist()
    out = []
    for h in range(heads):
        rows = []
        for i in range(grid[0]):
            cells = []
            for j in range(grid[1]):
                qs = range(i * widths[0], min((i + 1) * widths[0], n))
                ks = range(j * widths[1], min((j + 1) * widths[1], n))
                cells.append(sum(a[h][q][k] for q in qs for k in ks) / (len(qs) * len(ks)) if len(qs) and len(ks) else 0.0)
            rows.append(cells)
        out.append(rows)
    return out


def reference_edge_mass(attn: torch.Tensor) -> float:
    """Per row i (t = i + 1 keys): mass on keys [0, e) plus on [t - e, t), e = ceil(t / 10); mean over heads and rows."""
    heads, n, _ = attn.shape
    a = attn.double().tolist()
    total = 0.0
    for h in range(heads):
        for i in range(n):
            t = i + 1
            e = math.ceil(t / 10)
            total += sum(a[h][i][:e]) + sum(a[h][i][t - e : t])
    return total / (heads * n)


# ---------------------------------------------------------------- pooling and the sketch


@pytest.mark.parametrize("n,grid", [(1, (1, 1)), (7, (4, 4)), (20, (3, 5)), (37, (4, 4)), (33, (8, 2)), (5, (16, 16))])
def test_pooled_attention_matches_the_loop_reference(n, grid):
    attn = causal_map(2, n, seed=n)
    expected = torch.tensor(reference_pool(attn, grid), dtype=torch.float64)
    torch.testing.assert_close(pooled_attention(attn, grid).double(), expected, rtol=0, atol=1e-7)
    assert edge_mass(attn) == pytest.approx(reference_edge_mass(attn), abs=1e-12)


@pytest.mark.parametrize("n,prefill,grid", [(37, 7, (4, 4)), (64, 1, (4, 4)), (50, 50, (3, 5)), (129, 16, (8, 8)), (3, 1, (4, 4))])
def test_the_sketch_folding_rows_one_at_a_time_equals_pooling_the_whole_map(n, prefill, grid):
    attn = causal_map(3, n, seed=n + prefill)
    sketch = AttentionSketch(num_layers=2, num_heads=3, grid=grid)
    sketch.add_prefill(1, attn[:, :prefill, :prefill])
    for i in range(prefill, n):  # decode rows: the grid coarsens as the conversation outgrows it
        sketch.add_decode(1, attn[:, i, : i + 1])
    assert sketch.num_rows(1) == n and sketch.num_rows(0) == 0
    torch.testing.assert_close(sketch.pooled(1), pooled_attention(attn, grid), rtol=0, atol=1e-7)
    assert sketch.edge_mass(1) == pytest.approx(reference_edge_mass(attn), abs=1e-12)


def test_a_later_turn_folds_in_as_a_block_of_rows_over_all_keys():
    attn = causal_map(2, 45, seed=3)
    sketch = AttentionSketch(num_layers=1, num_heads=2, grid=4)
    sketch.add_prefill(0, attn[:, :12, :12])  # turn 1
    for i in range(12, 20):  # its answer
        sketch.add_decode(0, attn[:, i, : i + 1])
    sketch.add_prefill(0, attn[:, 20:45, :45])  # turn 2's prompt: 25 new rows over 45 keys
    torch.testing.assert_close(sketch.pooled(0), pooled_attention(attn, 4), rtol=0, atol=1e-7)
    assert sketch.edge_mass(0) == pytest.approx(reference_edge_mass(attn), abs=1e-12)


def test_a_sample_of_rows_gives_each_cell_the_mean_over_its_sampled_rows():
    attn = causal_map(2, 40, seed=5)
    rows = torch.tensor([0, 3, 9, 17, 18, 30, 39])
    sketch = AttentionSketch(1, 2, grid=(4, 5))
    sketch.add_rows(0, attn[:, rows[:3], :10], rows[:3])  # covers 10 rows, folds 3
    sketch.add_rows(0, attn[:, rows[3:], :], rows[3:])
    assert sketch.num_rows(0) == 40 and sketch.num_folded(0) == 7
    expected = torch.zeros(2, 4, 5, dtype=torch.float64)  # bins of 16 rows x 8 keys
    for cell_row in range(4):
        members = [int(r) for r in rows if r // 16 == cell_row]
        for cell_col in range(5):
            cols = list(range(cell_col * 8, min(40, cell_col * 8 + 8)))
            if members and cols:
                expected[:, cell_row, cell_col] = attn[:, members][:, :, cols].double().sum((1, 2)) / (len(members) * len(cols))
    torch.testing.assert_close(sketch.pooled(0).double(), expected, rtol=0, atol=1e-7)
    per_row = []
    for r in rows.tolist():
        t, e = r + 1, math.ceil((r + 1) / 10)
        per_row.append(float(attn[:, r, :e].sum() + attn[:, r, t - e : t].sum()) / 2)
    assert sketch.edge_mass(0) == pytest.approx(sum(per_row) / len(per_row), abs=1e-6)
    with pytest.raises(InvalidArgument, match="^rows: must be increasing"):
        sketch.add_rows(0, causal_map(2, 42, seed=6)[:, [41, 40], :], torch.tensor([41, 40]))
    with pytest.raises(InvalidArgument, match="^attn: expected"):
        sketch.add_rows(0, attn[:, :1, :], torch.tensor([40]))  # k must pass the rows covered
    assert sketch.num_rows(0) == 40 and sketch.num_folded(0) == 7  # refused calls change nothing


def test_the_sketch_state_does_not_grow_with_the_conversation():
    sketch = AttentionSketch(num_layers=3, num_heads=2, grid=8)
    size = sketch.nbytes
    assert size == 3 * 2 * 8 * 8 * 8 + 3 * 8 * 8 + 4 * 8 * 3  # sums, row counts per bin, a few numbers per layer
    attn = causal_map(2, 300, seed=1)
    for layer in range(3):
        sketch.add_prefill(layer, attn)
    assert sketch.nbytes == size
    assert sketch._sums.shape == (3, 2, 8, 8)
    stats = sketch.stats()
    assert stats.maps.shape == (3, 2, 8, 8) and stats.maps.dtype == torch.float32
    assert stats.edge_mass.tolist() == pytest.approx([reference_edge_mass(attn)] * 3, abs=1e-6)


def test_the_sketch_refuses_rows_out_of_order_and_wrong_shapes():
    sketch = AttentionSketch(num_layers=2, num_heads=2, grid=4)
    attn = causal_map(2, 10, seed=0)
    with pytest.raises(InvalidArgument, match="^attn: expected \\[2, q, 0 \\+ q\\]"):
        sketch.add_prefill(0, attn[:, 4:, :])  # rows 4..9 before rows 0..3
    with pytest.raises(InvalidArgument, match="^attn: "):
        sketch.add_prefill(0, causal_map(3, 10, seed=0))
    with pytest.raises(InvalidArgument, match="^layer: 2 out of range"):
        sketch.add_prefill(2, attn)
    with pytest.raises(InvalidArgument, match="^attn_row: "):
        sketch.add_decode(0, attn[:, 0, :1].unsqueeze(0))
    bad = attn.clone()
    bad[0, 3, 1] = float("nan")
    with pytest.raises(InvalidArgument, match="^attn: contains NaN"):
        sketch.add_prefill(0, bad)
    sketch.add_prefill(0, attn)
    with pytest.raises(InvalidArgument, match="^sketch: layers hold different"):
        sketch.stats()
    with pytest.raises(InvalidArgument, match="^attn: expected a causal map"):
        pooled_attention(attn[:, :5, :], 4)
    with pytest.raises(InvalidArgument, match="^grid: "):
        pooled_attention(attn, 0)


# ---------------------------------------------------------------- the strategy


def brute_force_greedy(maps: list[list[float]], edge: list[float], gamma: float, ratio: float) -> tuple[list, list]:
    """The greedy rule restated: repeatedly the closest pair of two unpaired I-R layers, while 2 more fit."""
    num_layers = len(maps)
    non_ir = [layer for layer in range(num_layers) if edge[layer] < gamma]
    free = [layer for layer in range(num_layers) if layer not in non_ir]
    limit = math.floor(round(num_layers * ratio, 9))
    pairs = []
    while 2 * (len(pairs) + 1) <= limit:
        options = [(math.dist(maps[a], maps[b]), a, b) for a, b in itertools.combinations(free, 2)]
        if not options:
            break
        _, a, b = min(options)
        pairs.append((a, b))
        free.remove(a)
        free.remove(b)
    return pairs, non_ir


@st.composite
def layer_stats(draw):
    num_layers = draw(st.integers(1, 8))
    heads, rows, cols = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    # small integers: squared distances are exact, so equal distances tie in both implementations
    values = draw(st.lists(st.integers(0, 3), min_size=num_layers * heads * rows * cols, max_size=num_layers * heads * rows * cols))
    edge = draw(st.lists(st.floats(0.0, 2.0), min_size=num_layers, max_size=num_layers))
    maps = torch.tensor(values, dtype=torch.float32).reshape(num_layers, heads, rows, cols)
    return AttentionStats(maps, torch.tensor(edge, dtype=torch.float32))


@settings(max_examples=300, deadline=None)
@given(stats=layer_stats(), gamma=st.floats(0.0, 2.0), ratio=st.floats(0.0, 1.0))
def test_the_greedy_selection_matches_a_brute_force_restatement(stats, gamma, ratio):
    strategy = choose_strategy(stats, gamma=gamma, ratio=ratio)
    flat = stats.maps.reshape(stats.num_layers, -1).tolist()
    pairs, non_ir = brute_force_greedy(flat, stats.edge_mass.tolist(), gamma, ratio)
    assert list(strategy.pairs) == pairs
    assert list(strategy.non_ir) == non_ir
    assert strategy.distances == pytest.approx([math.dist(flat[a], flat[b]) for a, b in pairs])
    paired = [layer for pair in strategy.pairs for layer in pair]
    assert len(paired) == len(set(paired)), "a layer in two pairs"
    assert not set(paired) & set(strategy.non_ir), "a non-I-R layer was paired"
    max_pairs = math.floor(round(stats.num_layers * ratio, 9)) // 2
    assert len(strategy.pairs) == min(max_pairs, (stats.num_layers - len(non_ir)) // 2)
    assert Strategy.from_dict(strategy.to_dict()) == strategy


def test_the_greedy_rule_is_not_the_best_matching():
    # four layers whose maps lie on a line at 0, 1, 1.9, 2.9: the closest pair (1, 2) leaves (0, 3)
    maps = torch.tensor([0.0, 1.0, 1.9, 2.9]).reshape(4, 1, 1, 1)
    stats = AttentionStats(maps, torch.full((4,), 2.0))
    strategy = choose_strategy(stats, gamma=1.0, ratio=1.0)
    assert strategy.pairs == ((1, 2), (0, 3))
    assert sum(strategy.distances) == pytest.approx(0.9 + 2.9)
    matchings = [((0, 1), (2, 3)), ((0, 2), (1, 3)), ((0, 3), (1, 2))]
    dist = layer_distances(maps)
    best = min(matchings, key=lambda m: sum(float(dist[a, b]) for a, b in m))
    assert best == ((0, 1), (2, 3)) and sum(float(dist[a, b]) for a, b in best) == pytest.approx(2.0)


def test_gamma_splits_input_sensitive_layers_and_ratio_caps_the_pairs():
    maps = torch.arange(6, dtype=torch.float32).reshape(6, 1, 1, 1)
    stats = AttentionStats(maps, torch.tensor([0.2, 1.0, 1.5, 1.9, 0.99, 2.0]))
    strategy = choose_strategy(stats, gamma=1.0, ratio=0.5)  # floor(3) layers -> one pair
    assert strategy.non_ir == (0, 4)  # an edge mass equal to gamma is I-R
    assert strategy.pairs == ((1, 2),) and strategy.shared_layers == (1, 2)
    assert choose_strategy(stats, gamma=1.0, ratio=1.0).pairs == ((1, 2), (3, 5))
    assert choose_strategy(stats, gamma=1.0, ratio=0.0).pairs == ()
    assert choose_strategy(stats, gamma=2.0, ratio=1.0).non_ir == (0, 1, 2, 3, 4)
    assert choose_strategy(stats, gamma=0.0, ratio=1.0).pairs == ((0, 1), (2, 3), (4, 5))


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"gamma": 2.5, "ratio": 0.5}, "gamma"),
        ({"gamma": -0.1, "ratio": 0.5}, "gamma"),
        ({"gamma": 1.0, "ratio": 1.2}, "ratio"),
        ({"gamma": 1.0, "ratio": float("nan")}, "ratio"),
        ({"gamma": True, "ratio": 0.5}, "gamma"),
    ],
)
def test_bad_parameters_name_their_field(kwargs, field):
    stats = AttentionStats(torch.zeros(4, 1, 2, 2), torch.ones(4))
    with pytest.raises(InvalidArgument, match=f"^{field}: "):
        choose_strategy(stats, **kwargs)


def test_the_recorded_strategy_keeps_the_choice_and_each_layers_edge_mass_and_refuses_a_mismatch():
    stats = AttentionStats(torch.rand(4, 1, 2, 2, generator=torch.Generator().manual_seed(0)), torch.tensor([0.2, 0.91234, 1.5, 1.9]))
    chosen = choose_strategy(stats, gamma=0.5, ratio=1.0)
    kept = record_strategy(stats, chosen, kv_quant="kv8")
    assert kept["kv_quant"] == "kv8" and Strategy.from_dict(kept["selector"]) == chosen
    assert kept["edge_mass"] == [0.2, 0.9123, 1.5, 1.9]
    with pytest.raises(InvalidArgument, match="^strategy: has 4 layers, the statistics 2"):
        record_strategy(AttentionStats(torch.zeros(2, 1, 2, 2), torch.ones(2)), chosen)
    with pytest.raises(InvalidArgument, match="^strategy: \\['edge_mass'\\] are the statistics' fields"):
        record_strategy(stats, chosen, edge_mass=[1.0])


def test_inconsistent_statistics_are_refused():
    with pytest.raises(InvalidArgument, match="^stats.edge_mass: has 3 layers, the maps 4"):
        AttentionStats(torch.zeros(4, 1, 2, 2), torch.ones(3))
    with pytest.raises(InvalidArgument, match="^stats.maps: expected 4 dimensions"):
        AttentionStats(torch.zeros(4, 2, 2), torch.ones(4))
    with pytest.raises(InvalidArgument, match="^stats.maps: contains NaN"):
        AttentionStats(torch.full((2, 1, 1, 1), float("nan")), torch.ones(2))


@pytest.mark.parametrize(
    "change,field",
    [
        ({"pairs": [[0, 1], [1, 2]], "distances": [0.1, 0.2]}, "strategy.pairs"),
        ({"pairs": [[2, 1]]}, "strategy.pairs"),
        ({"pairs": [[0, 9]]}, "strategy.pairs"),
        ({"pairs": [[0, 3]]}, "strategy.pairs"),  # 3 is non-I-R
        ({"pairs": [[0, 1], [2, 4]], "distances": [0.1, 0.2]}, "strategy.pairs"),  # 4 layers > floor(6 x 0.5)
        ({"non_ir": [3, 3]}, "strategy.non_ir"),
        ({"distances": []}, "strategy.distances"),
        ({"distances": ["x"]}, "strategy"),
        ({"gamma": 3}, "strategy.gamma"),
        ({"ratio": "0.5"}, "strategy.ratio"),
        ({"num_layers": 0}, "strategy.num_layers"),
        ({"extra": 1}, "strategy"),
    ],
)
def test_a_stored_strategy_is_checked_when_read(change, field):
    good = {"num_layers": 6, "pairs": [[0, 1]], "non_ir": [3], "gamma": 1.0, "ratio": 0.5, "distances": [0.1]}
    assert Strategy.from_dict(good).to_dict() == good
    with pytest.raises(InvalidArgument, match=f"^{field}: "):
        Strategy.from_dict({**good, **change})
