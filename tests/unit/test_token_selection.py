"""The baselines' token policies: H2O's accumulated attention and compacted
retained tokens, IMPRESS's partial probe keys and block choice, one budget."""

import io
import math
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_client.model import load_checkpoint
from engine_client.prefill import chunked_prefill, prefill_with_attention
from engine_client.selection.tokens import (
    h2o_chunks,
    impress_blocks,
    impress_token_scores,
    partial_probe_scores,
    probe_subset,
    storage_order,
    token_budget,
    token_cap,
)
from kvstore import progress as bars
from kvstore.contract.errors import InvalidArgument
from kvstore_tools.make_checkpoint import make_checkpoint


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # 4 layers; GQA 4 query heads over 2 KV heads, head dim 16
    path = make_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny", seed=3, dtype="float32", overrides={"num_hidden_layers": 4})
    return load_checkpoint(path, dtype=torch.float32)


def random_tokens(n: int, seed: int, vocab: int = 512) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def reference_cumulative_mass(model, tokens, layer):
    """The straightforward computation: a dense forward, every query's causal attention at ``layer``, summed."""
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
    return torch.softmax(logits, -1).sum(dim=(0, 1))  # [n]


# ---------------------------------------------------------------- H2O


@pytest.mark.parametrize("block_tokens", [64, 1024])
def test_h2o_scores_accumulate_every_prefill_query(model, block_tokens):
    tokens = random_tokens(200, seed=1)
    logits, kv, mass = prefill_with_attention(model, tokens, [0, 2], block_tokens=block_tokens)
    ref_logits, ref_kv = chunked_prefill(model, tokens)
    torch.testing.assert_close(kv, ref_kv, rtol=1e-4, atol=1e-4)  # the prefill itself is unchanged
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    assert mass.shape == (2, 200) and mass.dtype == torch.float32
    for row, layer in enumerate((0, 2)):
        torch.testing.assert_close(mass[row], reference_cumulative_mass(model, tokens, layer), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(mass.sum(dim=1), torch.full((2,), 4.0 * 200))  # one unit per (query head, query)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_prefill_progress_counts_every_block_and_layer_on_a_terminal_only(model, capsys, monkeypatch):
    tokens = random_tokens(150, seed=4)
    ref_logits, ref_kv = chunked_prefill(model, tokens, block_tokens=64)
    logits, kv = chunked_prefill(model, tokens, block_tokens=64, progress=bars.progress)  # stderr is captured: no terminal
    assert torch.equal(kv, ref_kv) and torch.equal(logits, ref_logits)
    assert capsys.readouterr().err == ""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    _, kv, _ = prefill_with_attention(model, tokens, [1], block_tokens=64, progress=bars.progress)
    assert torch.equal(kv, ref_kv)
    assert "prefill 150 tokens" in terminal.getvalue() and " 0/12 " in terminal.getvalue()  # 3 blocks x 4 layers
    quiet = _Terminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    monkeypatch.setattr(bars, "_enabled", True)
    bars.set_enabled(False)  # --no-progress
    chunked_prefill(model, tokens, block_tokens=64, progress=bars.progress)
    assert quiet.getvalue() == ""


def test_storage_order_puts_sink_local_then_most_accumulated():
    scores = torch.tensor([9.0, 1.0, 5.0, 5.0, 7.0, 0.0, 3.0, 8.0])
    assert storage_order(scores, sink_tokens=1, local_tokens=2).tolist() == [0, 6, 7, 4, 2, 3, 1, 5]
    assert storage_order(scores, sink_tokens=0, local_tokens=0).tolist() == [0, 7, 4, 2, 3, 6, 1, 5]
    assert storage_order(torch.ones(3), sink_tokens=16, local_tokens=16).tolist() == [0, 1, 2]


def test_token_cap_is_the_chunk_budget_in_tokens():
    assert token_cap(2048, 0.05) == 6 * 16  # floor(0.05 x 128) chunks: what the runner's plan loads per layer
    assert token_cap(2048, 0.25) == 512
    assert token_cap(301, 1.0) == 301  # the last chunk is short
    assert token_cap(100, 0.01) == 32  # raised to sink + local
    assert token_budget(100, 0.05) == 5


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 600), fraction=st.floats(0.001, 1.0), seed=st.integers(0, 2**16))
def test_h2o_loads_exactly_its_retained_tokens(n, fraction, seed):
    scores = torch.rand(n, generator=torch.Generator().manual_seed(seed))
    order = storage_order(scores)
    assert sorted(order.tolist()) == list(range(n))
    cap = token_cap(n, fraction)
    chunks = h2o_chunks(n, fraction)
    rows = torch.cat([torch.arange(c * 16, min(n, c * 16 + 16)) for c in chunks.tolist()])
    assert rows.tolist() == list(range(cap))  # the first cap stored rows, no more
    retained = set(order[:cap].tolist())
    assert set(range(min(16, n))) <= retained and set(range(max(0, n - 16), n)) <= retained
    rest = torch.tensor(sorted(set(range(16, max(16, n - 16))) - retained), dtype=torch.long)
    kept = torch.tensor(sorted(retained - set(range(16)) - set(range(n - 16, n))), dtype=torch.long)
    if rest.numel() and kept.numel():  # no token left out outscores a retained one
        assert scores[kept].min() >= scores[rest].max()


# ---------------------------------------------------------------- IMPRESS


@pytest.mark.parametrize("hq, hkv", [(4, 2), (3, 1), (2, 2)])
def test_impress_scores_are_the_softmax_mass(hq, hkv):
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(hq, 3, 8, generator=g), torch.randn(hkv, 50, 8, generator=g)
    ref = torch.softmax(q @ k.repeat_interleave(hq // hkv, 0).transpose(1, 2) / math.sqrt(8), -1).sum(dim=(0, 1))
    torch.testing.assert_close(impress_token_scores(q, k), ref, rtol=1e-5, atol=1e-5)
    # the whole probe through the partial path is the same computation
    every = partial_probe_scores(q, k, torch.arange(hkv), torch.arange(8), num_kv_heads=hkv)
    torch.testing.assert_close(every, ref, rtol=1e-5, atol=1e-5)


def test_partial_probe_uses_only_its_heads_and_channels():
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(4, 3, 8, generator=g), torch.randn(2, 40, 8, generator=g)
    k[1] *= 3  # KV head 1 is the louder one
    k[:, :, [2, 5]] *= 4  # and channels 2, 5 the loudest
    heads, channels = probe_subset(k, 1, 2)
    assert heads.tolist() == [1] and channels.tolist() == [2, 5]
    probe = k[heads][:, :, channels]  # [1, 40, 2]
    got = partial_probe_scores(q, probe, heads, channels, num_kv_heads=2)
    sub_q = q[[2, 3]][:, :, [2, 5]]  # query heads 2, 3 read KV head 1
    ref = torch.softmax(sub_q @ probe[0].T / math.sqrt(8), -1).sum(dim=(0, 1))  # the full head's 1/sqrt(d)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(InvalidArgument):
        partial_probe_scores(q, probe, heads, torch.arange(3), num_kv_heads=2)


def test_impress_blocks_by_important_tokens_within_the_budget():
    scores = torch.rand(320, generator=torch.Generator().manual_seed(1)) * 0.1  # 5 blocks of 64
    scores[192:256] = 1.0  # block 3 is all important
    scores[70:100] = 0.9  # block 1 holds 30 important rows
    assert impress_blocks(scores, 128, forced_tokens=32).tolist() == [0, 3]
    assert impress_blocks(scores, 191, forced_tokens=32).tolist() == [0, 3]  # a third block would exceed it
    assert impress_blocks(scores, 192, forced_tokens=32).tolist() == [0, 1, 3]
    assert impress_blocks(scores, 64, forced_tokens=32).tolist() == [0]
    with pytest.raises(InvalidArgument) as err:
        impress_blocks(scores, 63, forced_tokens=32)
    assert err.value.field == "budget_tokens"


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 700), block_tokens=st.integers(1, 80), forced=st.integers(0, 40), extra=st.integers(0, 700), seed=st.integers(0, 2**16)
)
def test_impress_blocks_never_exceed_the_budget(n, block_tokens, forced, extra, seed):
    scores = torch.rand(n, generator=torch.Generator().manual_seed(seed))
    m = -(-n // block_tokens)
    num_forced = -(-min(forced, n) // block_tokens)
    forced_rows = min(n, num_forced * block_tokens)
    cap = max(1, forced_rows + extra)
    blocks = impress_blocks(scores, cap, block_tokens=block_tokens, forced_tokens=forced)
    ids = blocks.tolist()
    assert ids == sorted(set(ids)) and all(0 <= b < m for b in ids)
    assert set(range(num_forced)) <= set(ids)
    loaded = sum(min(block_tokens, n - b * block_tokens) for b in ids)
    assert loaded <= cap


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 5000), fraction=st.floats(0.001, 1.0), layers=st.integers(1, 40))
def test_token_cap_is_what_the_runner_loads_per_layer(n, fraction, layers):
    from engine_client.selection import plan_periods

    m = -(-n // 16)
    per_layer = plan_periods(layers, m, fraction, period_layers=1).periods[0][2]
    assert token_cap(n, fraction) == min(n, per_layer * 16)
