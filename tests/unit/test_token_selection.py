"""Token-level baseline selection (AS+H2O, IMPRESS) and its 64-token block mapping."""

import math

import pytest
import torch

from engine_client.model import load_checkpoint
from engine_client.runner import chunked_prefill
from engine_client.selection.tokens import h2o_token_scores, impress_token_scores, select_blocks_for_tokens
from kvstore.errors import InvalidArgument
from tools.make_checkpoint import make_checkpoint


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = make_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny", seed=3, dtype="float32", overrides={"num_hidden_layers": 4})
    return load_checkpoint(path, dtype=torch.float32)


def reference_window_mass(model, tokens, layer, window):
    """Dense forward of every token, capturing the window's attention at ``layer``."""
    n = tokens.numel()
    hidden = model.embed(tokens)
    positions = torch.arange(n)
    for l in range(layer):
        hidden, _ = model.layer_forward(l, hidden, positions, None)
    q = model.layer_queries(layer, hidden, positions)  # [Hq, n, d]
    _, kv = model.layer_forward(layer, hidden, positions, None)
    k = kv[0].repeat_interleave(q.shape[0] // kv.shape[1], dim=0)
    logits = q @ k.transpose(1, 2) / math.sqrt(q.shape[2])
    logits = logits.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
    return torch.softmax(logits, -1)[:, n - window :].sum(dim=(0, 1))


def test_h2o_scores_equal_a_dense_forward(model):
    tokens = torch.randint(0, model.config.vocab_size, (200,), generator=torch.Generator().manual_seed(1))
    _, kv = chunked_prefill(model, tokens, block_tokens=64)
    got = h2o_token_scores(model, kv, tokens, period_layers=2, window=48)
    assert got.shape == (2, 200)
    for p, layer in enumerate((0, 2)):
        torch.testing.assert_close(got[p], reference_window_mass(model, tokens, layer, 48), rtol=1e-4, atol=1e-4)
    assert torch.allclose(got.sum(dim=1), torch.full((2,), 4.0 * 48))  # one unit per (head, query)


def test_impress_scores_are_the_softmax_mass():
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(4, 3, 8, generator=g), torch.randn(2, 50, 8, generator=g)
    ref = torch.softmax(q @ k.repeat_interleave(2, 0).transpose(1, 2) / math.sqrt(8), -1).sum(dim=(0, 1))
    torch.testing.assert_close(impress_token_scores(q, k), ref, rtol=1e-5, atol=1e-5)


def test_planted_heavy_hitter_is_selected_in_both_modes():
    scores = torch.rand(640, generator=torch.Generator().manual_seed(0))
    scores[300] = 50.0
    for mode in ("cover", "dense"):
        blocks, tokens = select_blocks_for_tokens(scores, 5, mode=mode)
        assert 300 in tokens.tolist() and 4 in blocks.tolist()


def test_cover_and_dense_modes():
    scores = torch.zeros(1000)
    scores[[70, 75, 80, 500, 900]] = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])
    blocks, tokens = select_blocks_for_tokens(scores, 5, mode="cover")
    assert tokens.tolist() == [70, 75, 80, 500, 900]
    assert blocks.tolist() == [0, 1, 7, 14, 15]  # every holder of a selected token + sink + local
    blocks, _ = select_blocks_for_tokens(scores, 5, mode="dense")
    assert blocks.tolist() == [0, 1, 15]  # block 1 holds the most mass (12): a 5-token budget beside sink/local
    blocks, tokens = select_blocks_for_tokens(scores, 0.2, mode="dense")  # 200 tokens
    assert tokens.numel() == 200 and blocks.tolist() == sorted(set(blocks.tolist()))
    in_forced = int(((tokens < 64) | (tokens >= 960)).sum())
    assert (len(blocks) - 2) * 64 >= 200 - in_forced > (len(blocks) - 3) * 64
    for bad in (0, 0.0, 1.5, 1001, True, "x"):
        with pytest.raises(InvalidArgument) as err:
            select_blocks_for_tokens(scores, bad)
        assert err.value.field == "budget"
    with pytest.raises(InvalidArgument) as err:
        select_blocks_for_tokens(scores, 5, mode="sparse")
    assert err.value.field == "mode"
