"""Token-level baseline selection (AS+H2O, IMPRESS) and its 64-token block mapping."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_client.model import load_checkpoint
from engine_client.runner import chunked_prefill
from engine_client.selection.tokens import (
    h2o_token_scores,
    impress_token_scores,
    select_blocks_for_tokens,
    token_budget,
)
from kvstore.errors import InvalidArgument
from tools.make_checkpoint import make_checkpoint


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # 4 layers; GQA 4 query heads over 2 KV heads, head dim 16
    path = make_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny", seed=3, dtype="float32", overrides={"num_hidden_layers": 4})
    return load_checkpoint(path, dtype=torch.float32)


def random_tokens(n: int, seed: int, vocab: int = 512) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def reference_window_mass(model, tokens, layer, window):
    """The straightforward computation: a dense forward of all tokens, the window's attention at ``layer``."""
    n = tokens.numel()
    positions = torch.arange(n)
    hidden = model.embed(tokens)
    for l in range(layer):
        hidden, _ = model.layer_forward(l, hidden, positions, None)
    q = model.layer_queries(layer, hidden, positions)  # [Hq, n, d]
    _, kv = model.layer_forward(layer, hidden, positions, None)  # [2, Hkv, n, d]
    k = kv[0].repeat_interleave(q.shape[0] // kv.shape[1], dim=0)  # [Hq, n, d]
    logits = q @ k.transpose(1, 2) / math.sqrt(q.shape[2])  # [Hq, n, n]
    logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(logits, -1)[:, n - window :].sum(dim=(0, 1))  # [n]


# ---------------------------------------------------------------- H2O scores


@pytest.mark.parametrize("period_layers, first_layers", [(2, (0, 2)), (3, (0, 3))])
def test_h2o_scores_equal_a_dense_forward(model, period_layers, first_layers):
    tokens = random_tokens(200, seed=1)
    _, kv = chunked_prefill(model, tokens, block_tokens=64)  # [4, 2, 2, 200, 16]
    got = h2o_token_scores(model, kv, tokens, period_layers=period_layers, window=48)
    assert got.shape == (2, 200) and got.dtype == torch.float32
    for p, layer in enumerate(first_layers):
        torch.testing.assert_close(got[p], reference_window_mass(model, tokens, layer, 48), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.sum(dim=1), torch.full((2,), 4.0 * 48))  # one unit per (query head, window query)
    # scoring in small blocks of rows changes nothing
    blocked = h2o_token_scores(model, kv, tokens, period_layers=period_layers, window=48, max_block_elems=500)
    torch.testing.assert_close(blocked, got, rtol=1e-5, atol=1e-5)


def test_h2o_window_longer_than_the_prefix_is_the_whole_prefix(model):
    tokens = random_tokens(37, seed=2)
    _, kv = chunked_prefill(model, tokens)
    got = h2o_token_scores(model, kv, tokens, period_layers=4, window=64)
    assert got.shape == (1, 37)
    torch.testing.assert_close(got[0], reference_window_mass(model, tokens, 0, 37), rtol=1e-4, atol=1e-4)
    assert got[0, 0] >= 4.0  # the first token is seen by every query: at least the first query's full unit per head


def test_h2o_planted_heavy_hitter_is_selected(model):
    tokens = random_tokens(300, seed=4)
    _, kv = chunked_prefill(model, tokens, block_tokens=128)
    window = 64
    positions = torch.arange(300 - window, 300)
    q = model.layer_queries(0, model.embed(tokens[-window:]), positions)  # [Hq, w, d]
    direction = q.reshape(2, 2 * window, -1).mean(dim=1)  # [Hkv, d]: the window queries' mean per KV head
    kv = kv.clone()
    kv[0, 0, :, 150] = 8 * direction / direction.norm(dim=-1, keepdim=True)
    scores = h2o_token_scores(model, kv, tokens, period_layers=2, window=window)
    assert int(scores[0].argmax()) == 150
    blocks, selected = select_blocks_for_tokens(scores[0], 3, mode="cover")
    assert 150 in selected.tolist() and 2 in blocks.tolist()


def test_h2o_rejects_inconsistent_inputs(model):
    tokens = random_tokens(40, seed=5)
    _, kv = chunked_prefill(model, tokens)
    cases = [
        (dict(kv=kv[:3]), "kv"),
        (dict(kv=kv[:, :, :1]), "kv"),
        (dict(tokens=tokens[:39]), "tokens"),
        (dict(window=0), "window"),
        (dict(period_layers=0), "period_layers"),
    ]
    for override, field in cases:
        args = dict(kv=kv, tokens=tokens, period_layers=2, window=16) | override
        with pytest.raises(InvalidArgument) as err:
            h2o_token_scores(model, args.pop("kv"), args.pop("tokens"), **args)
        assert err.value.field == field


# ---------------------------------------------------------------- IMPRESS scores


@pytest.mark.parametrize("hq, hkv", [(4, 2), (3, 1), (2, 2)])
def test_impress_scores_are_the_softmax_mass(hq, hkv):
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(hq, 3, 8, generator=g), torch.randn(hkv, 50, 8, generator=g)
    ref = torch.softmax(q @ k.repeat_interleave(hq // hkv, 0).transpose(1, 2) / math.sqrt(8), -1).sum(dim=(0, 1))
    torch.testing.assert_close(impress_token_scores(q, k), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(impress_token_scores(q, k, max_block_elems=60), ref, rtol=1e-5, atol=1e-5)


def test_impress_planted_heavy_hitter_is_selected():
    g = torch.Generator().manual_seed(6)
    q, k = torch.randn(4, 5, 16, generator=g), torch.randn(2, 640, 16, generator=g)
    direction = q.reshape(2, 10, 16).mean(dim=1)  # [Hkv, d]
    k[:, 300] = 6 * direction / direction.norm(dim=-1, keepdim=True)
    scores = impress_token_scores(q, k)
    assert int(scores.argmax()) == 300
    for mode in ("cover", "dense"):
        blocks, selected = select_blocks_for_tokens(scores, 0.01, mode=mode)  # 7 tokens
        assert 300 in selected.tolist()
    blocks, _ = select_blocks_for_tokens(scores, 0.01, mode="cover")
    assert 300 // 64 in blocks.tolist()


# ---------------------------------------------------------------- block mapping


def loaded_tokens(blocks: torch.Tensor, n: int, block_tokens: int) -> int:
    return sum(min(block_tokens, n - b * block_tokens) for b in blocks.tolist())


def test_cover_loads_every_block_holding_a_selected_token():
    scores = torch.zeros(1000)
    scores[[70, 75, 80, 500, 900]] = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])
    blocks, tokens = select_blocks_for_tokens(scores, 5, mode="cover")
    assert tokens.tolist() == [70, 75, 80, 500, 900]
    assert blocks.tolist() == [0, 1, 7, 14, 15]  # holders of the selected tokens + sink 0 + local 15 (short block)
    blocks, _ = select_blocks_for_tokens(scores, 5, mode="cover", sink_blocks=0, local_blocks=0)
    assert blocks.tolist() == [1, 7, 14]
    blocks, _ = select_blocks_for_tokens(scores, 5, block_tokens=16, sink_blocks=2, local_blocks=3, mode="cover")
    assert blocks.tolist() == [0, 1, 4, 5, 31, 56, 60, 61, 62]  # m = 63


def test_dense_ranks_blocks_by_selected_tokens_then_score_then_index():
    scores = torch.zeros(64)  # 16 blocks of 4; the budget of 10 tokens selects exactly the planted ones
    scores[[8, 9, 10]] = 1.0  # block 2: three selected tokens, low scores
    scores[24] = 100.0  # block 6: one selected token, the top score
    scores[[16, 17]] = 2.0  # block 4: two tokens ...
    scores[[20, 21]] = 3.0  # block 5: ... two tokens, more mass than block 4
    scores[[28, 29]] = 3.0  # block 7: ties block 5 in count and mass; higher index
    kwargs = dict(block_tokens=4, local_blocks=0, mode="dense")
    blocks, tokens = select_blocks_for_tokens(scores, 10, sink_blocks=0, **kwargs)
    assert tokens.tolist() == [8, 9, 10, 16, 17, 20, 21, 24, 28, 29]
    assert blocks.tolist() == [2, 5, 7]  # 12 tokens loaded: count beats score, then mass beats block 4
    blocks, _ = select_blocks_for_tokens(scores, 10, sink_blocks=1, **kwargs)
    assert blocks.tolist() == [0, 2, 5]  # the sink's 4 tokens leave room for two: block 5 before 7 (index)
    # a budget the sink block already covers still loads the densest block
    blocks, tokens = select_blocks_for_tokens(scores, 3, sink_blocks=1, **kwargs)
    assert tokens.tolist() == [20, 21, 24] and blocks.tolist() == [0, 5]


def test_dense_counts_sink_and_local_blocks_towards_the_budget():
    scores = torch.zeros(1000)
    scores[[70, 75, 80, 500, 900]] = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])
    blocks, _ = select_blocks_for_tokens(scores, 5, mode="dense")
    assert blocks.tolist() == [0, 1, 15]  # sink and local exceed 5 tokens: one block by importance, block 1 (3 tokens)
    blocks, tokens = select_blocks_for_tokens(scores, 0.2, mode="dense")  # 200 tokens, sink + local hold 104
    assert tokens.numel() == 200
    assert len(blocks) == 4 and 104 + 64 < 200 <= loaded_tokens(blocks, 1000, 64) < 200 + 64


def test_all_selected_tokens_in_forced_blocks_load_nothing_else():
    scores = torch.zeros(500)
    scores[[1, 2, 498]] = 9.0
    for mode in ("cover", "dense"):
        blocks, tokens = select_blocks_for_tokens(scores, 3, mode=mode)
        assert tokens.tolist() == [1, 2, 498] and blocks.tolist() == [0, 7]


def test_full_budget_loads_every_block():
    scores = torch.rand(130, generator=torch.Generator().manual_seed(0))
    for mode in ("cover", "dense"):
        blocks, tokens = select_blocks_for_tokens(scores, 1.0, mode=mode)
        assert blocks.tolist() == [0, 1, 2] and tokens.tolist() == list(range(130))


def test_a_lone_heavy_hitter_is_selected_but_dense_mode_may_skip_its_block():
    scores = torch.rand(640, generator=torch.Generator().manual_seed(0))
    scores[300] = 50.0
    blocks, tokens = select_blocks_for_tokens(scores, 5, mode="cover")
    assert tokens.tolist() == [300, 332, 337, 385, 530] and blocks.tolist() == [0, 4, 5, 6, 8, 9]
    # dense ranks blocks by selected tokens held: block 5 (332, 337) outranks block 4 (300 alone),
    # and a 5-token budget buys one block beside sink and local
    blocks, tokens = select_blocks_for_tokens(scores, 5, mode="dense")
    assert tokens.tolist() == [300, 332, 337, 385, 530] and blocks.tolist() == [0, 5, 9]


def test_token_budget_rounds_like_the_chunk_budget():
    assert token_budget(100, 0.05) == 5
    assert token_budget(1000, 0.0001) == 1
    assert token_budget(1000, 1.0) == 1000
    assert token_budget(1000, 7) == 7


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(budget=0), "budget"),
        (dict(budget=0.0), "budget"),
        (dict(budget=-0.5), "budget"),
        (dict(budget=1.5), "budget"),
        (dict(budget=float("nan")), "budget"),
        (dict(budget=1001), "budget"),
        (dict(budget=True), "budget"),
        (dict(budget="0.1"), "budget"),
        (dict(mode="sparse"), "mode"),
        (dict(block_tokens=0), "block_tokens"),
        (dict(block_tokens=64.0), "block_tokens"),
        (dict(sink_blocks=-1), "sink_blocks"),
        (dict(local_blocks=None), "local_blocks"),
        (dict(token_scores=torch.zeros(2, 500)), "token_scores"),
        (dict(token_scores=torch.zeros(0)), "token_scores"),
        (dict(token_scores=torch.tensor([1.0, float("nan")] * 500)), "token_scores"),
    ],
)
def test_invalid_arguments_name_their_field(kwargs, field):
    args = dict(token_scores=torch.zeros(1000), budget=5) | kwargs
    with pytest.raises(InvalidArgument) as err:
        select_blocks_for_tokens(args.pop("token_scores"), args.pop("budget"), **args)
    assert err.value.field == field


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 700),
    block_tokens=st.integers(1, 80),
    sink=st.integers(0, 3),
    local=st.integers(0, 3),
    fraction=st.floats(0.001, 1.0),
    seed=st.integers(0, 2**16),
    mode=st.sampled_from(["cover", "dense"]),
    coarse=st.booleans(),
)
def test_block_selection_bounds(n, block_tokens, sink, local, fraction, seed, mode, coarse):
    scores = torch.rand(n, generator=torch.Generator().manual_seed(seed))
    if coarse:  # many ties
        scores = (scores * 4).floor()
    blocks, tokens = select_blocks_for_tokens(
        scores, fraction, block_tokens=block_tokens, sink_blocks=sink, local_blocks=local, mode=mode
    )
    m = -(-n // block_tokens)
    k = token_budget(n, fraction)
    ids = blocks.tolist()
    assert blocks.dtype == tokens.dtype == torch.long
    assert ids == sorted(set(ids)) and all(0 <= b < m for b in ids)
    forced = set(range(min(sink, m))) | set(range(max(0, m - local), m))
    assert forced <= set(ids)
    # the selected tokens: k distinct, ascending, none outscored by a token left out
    assert tokens.numel() == k and tokens.tolist() == sorted(set(tokens.tolist()))
    left_out = torch.ones(n, dtype=torch.bool)
    left_out[tokens] = False
    if left_out.any():
        assert scores[tokens].min() >= scores[left_out].max()
    holders = set((tokens // block_tokens).tolist())
    taken = set(ids) - forced
    assert taken <= holders  # no block is loaded for nothing
    if mode == "cover":
        assert set(ids) == holders | forced
    else:
        loaded = loaded_tokens(blocks, n, block_tokens)
        forced_tokens = loaded_tokens(torch.tensor(sorted(forced), dtype=torch.long), n, block_tokens)
        assert loaded >= k or holders <= set(ids)  # reaches the budget unless nothing is left to take
        assert loaded <= max(k - 1, forced_tokens) + block_tokens  # stops once the budget is reached
        assert taken or holders <= forced  # at least one block by importance when there is one
