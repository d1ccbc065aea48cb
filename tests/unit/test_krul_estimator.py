"""Krul's estimator: the sketch fed by the model's own passes in a background thread equals the whole maps pooled."""

import math

import pytest
import torch

from engine_client.generation import dense_generate
from engine_client.krul import AttentionEstimator, AttentionSketch
from engine_client.model.loader import load_checkpoint
from engine_client.prefill import prefill_with_attention
from kvstore.contract import InvalidArgument
from kvstore_tools.make_checkpoint import make_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    make_checkpoint(str(path), "tiny", 0, "float32", 1)
    return load_checkpoint(str(path), dtype=torch.float32)


def whole_maps(model, tokens: torch.Tensor, grid, stride: int = 1) -> AttentionSketch:
    """Each layer's full causal map of ``tokens`` computed at once, pooled (the reference); every ``stride``-th row."""
    c = model.config
    n = tokens.numel()
    positions = torch.arange(n)
    group = c.num_attention_heads // c.num_key_value_heads
    sketch = AttentionSketch(c.num_hidden_layers, c.num_attention_heads, grid=grid)
    hidden = model.embed(tokens)
    for layer in range(c.num_hidden_layers):
        q = model.layer_queries(layer, hidden, positions).float()
        hidden, kv = model.layer_forward(layer, hidden, positions, None)
        keys = kv[0].float().repeat_interleave(group, dim=0)
        scores = (q @ keys.transpose(1, 2) / math.sqrt(c.head_dim)).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        rows = torch.arange(stride - 1, n, stride)
        sketch.add_rows(layer, scores.softmax(-1)[:, rows], rows)
    return sketch


@pytest.mark.parametrize("decode_batch, block_rows", [(1, 7), (3, 16), (64, 1000)])
def test_generation_feeds_the_rows_of_prefill_suffix_and_decoding_in_order(tiny, decode_batch, block_rows):
    gen = torch.Generator().manual_seed(decode_batch)
    prefix = torch.randint(0, tiny.config.vocab_size, (70,), generator=gen)
    suffix = torch.randint(0, tiny.config.vocab_size, (5,), generator=gen)
    plain = dense_generate(tiny, prefix, suffix, 12)
    with AttentionEstimator(tiny, grid=8, decode_batch=decode_batch, block_rows=block_rows) as est:
        observed = dense_generate(tiny, prefix, suffix, 12, observe=est.observe)
        stats = est.stats()
    assert observed.tokens == plain.tokens  # observing changes nothing the model computes
    fed = torch.cat([prefix, suffix, torch.tensor(observed.tokens[:-1])])  # the last token is never run
    assert all(est.sketch.num_rows(layer) == fed.numel() for layer in range(tiny.config.num_hidden_layers))
    ref = whole_maps(tiny, fed, 8).stats()
    torch.testing.assert_close(stats.maps, ref.maps, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(stats.edge_mass, ref.edge_mass, rtol=1e-4, atol=1e-6)
    assert est.jobs_done >= tiny.config.num_hidden_layers and est.busy_s > 0 and est.queued_peak_bytes > 0


def test_a_prefill_in_blocks_feeds_the_same_maps(tiny):
    tokens = torch.randint(0, tiny.config.vocab_size, (90,), generator=torch.Generator().manual_seed(7))
    with AttentionEstimator(tiny, grid=(4, 16)) as est:
        prefill_with_attention(tiny, tokens, (), block_tokens=32, observe=est.observe)
        stats = est.stats()
    torch.testing.assert_close(stats.maps, whole_maps(tiny, tokens, (4, 16)).stats().maps, rtol=1e-4, atol=1e-6)


def test_rows_out_of_order_are_refused_and_a_failure_in_the_thread_is_reported(tiny):
    c = tiny.config
    hidden = torch.zeros(2, c.hidden_size)
    keys = torch.zeros(c.num_key_value_heads, 10, c.head_dim)
    with AttentionEstimator(tiny) as est:
        with pytest.raises(InvalidArgument, match="positions"):
            est.observe(0, hidden, torch.tensor([3, 4]), keys)  # layer 0 has no rows yet
        with pytest.raises(InvalidArgument, match="keys"):
            est.observe(0, hidden, torch.tensor([0, 1]), keys[:, :1])
        est.observe(0, hidden, torch.tensor([0, 1]), keys.fill_(float("nan")))  # the sketch refuses NaN maps
        with pytest.raises(RuntimeError, match="estimator failed"):
            est.stats()
    with pytest.raises(ValueError, match="full KV"):
        dense_generate(tiny, [1, 2], [3], 2, keep_rows=torch.tensor([0]), observe=est.observe)


def test_a_deferred_estimator_computes_nothing_until_stats_and_a_closed_one_refuses(tiny):
    tokens = torch.randint(0, tiny.config.vocab_size, (40,), generator=torch.Generator().manual_seed(3))
    est = AttentionEstimator(tiny, grid=8, defer=True)
    prefill_with_attention(tiny, tokens, (), block_tokens=16, observe=est.observe)
    assert est.jobs_done == 0 and est.queued_peak_bytes == 40 * tiny.config.hidden_size * 4 * tiny.config.num_hidden_layers
    stats = est.stats()
    assert est.jobs_done == 3 * tiny.config.num_hidden_layers
    torch.testing.assert_close(stats.maps, whole_maps(tiny, tokens, 8).stats().maps, rtol=1e-4, atol=1e-6)
    est.close()
    with pytest.raises(InvalidArgument, match="^estimator: is closed"):
        est.stats()
    with pytest.raises(InvalidArgument, match="^estimator: is closed"):
        est.observe(0, torch.zeros(1, tiny.config.hidden_size), torch.tensor([40]), torch.zeros(1, 41, 1))


@pytest.mark.parametrize("stride", [2, 3, 8])
def test_a_row_stride_folds_exactly_the_sampled_rows_of_prefill_and_decoding(tiny, stride):
    gen = torch.Generator().manual_seed(stride)
    prefix = torch.randint(0, tiny.config.vocab_size, (61,), generator=gen)
    suffix = torch.randint(0, tiny.config.vocab_size, (4,), generator=gen)
    with AttentionEstimator(tiny, grid=8, decode_batch=4, block_rows=5, row_stride=stride) as est:
        observed = dense_generate(tiny, prefix, suffix, 9, observe=est.observe)
        stats = est.stats()
    fed = torch.cat([prefix, suffix, torch.tensor(observed.tokens[:-1])])
    assert est.sketch.num_rows(0) == fed.numel() and est.sketch.num_folded(0) == fed.numel() // stride
    ref = whole_maps(tiny, fed, 8, stride).stats()
    torch.testing.assert_close(stats.maps, ref.maps, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(stats.edge_mass, ref.edge_mass, rtol=1e-4, atol=1e-6)
    exact = whole_maps(tiny, fed, 8).stats()  # an estimate: near the whole map's, not equal
    assert not torch.allclose(stats.maps, exact.maps, atol=1e-6)
    assert float((stats.edge_mass - exact.edge_mass).abs().max()) < 0.2
