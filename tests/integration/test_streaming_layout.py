"""LServe's second layout through a real daemon: extents without the streaming heads, their sink and
recent rows as per-prefix pages; the same answers as the full layout at a fraction of the bytes."""

import numpy as np
import pytest
import torch
from helpers import flat_config
from test_streaming_reprefill import profile

from engine_client.client import KVStoreClient, as_numpy_kv
from engine_client.model.loader import load_checkpoint
from engine_client.prefill import chunked_prefill
from engine_client.reprefill import ModelRunner
from engine_client.stream_tail import TailMissing, tail_keys
from kvstore.contract.errors import InvalidArgument
from kvstore_tools.make_checkpoint import make_checkpoint


@pytest.fixture(scope="module")
def model4(tmp_path_factory):
    """``tiny`` with 4 KV heads of 16 dims (8 query heads), float32: room for a layer with two streaming heads."""
    path = tmp_path_factory.mktemp("ckpt") / "tiny4"
    make_checkpoint(str(path), "tiny", 0, "float32", 1, {"num_attention_heads": 8, "num_key_value_heads": 4})
    return load_checkpoint(str(path), dtype=torch.float32)


@pytest.fixture
def runners(daemon, model4):
    """(full layout, streaming layout) runners of ``model4`` on one daemon, KV head 0 streaming in every layer
    and head 1 in layer 0, sink 16 + recent 32 rows."""
    prof = profile(model4, lambda layer, h: h == 0 or (layer == 0 and h == 1), recent=32)
    with KVStoreClient(daemon.target) as client:
        full = ModelRunner(model4, client, group_layers=1, probe_bits=0, streaming_heads=prof)
        yield full, ModelRunner(model4, client, group_layers=1, probe_bits=0, streaming_heads=prof, streaming_layout=True)


PREFIX = torch.arange(5, 205)  # 12.5 chunks: the last one short, the recent window across three chunks


@pytest.mark.parametrize(
    "cfg",
    [
        flat_config(budget=1.0, period_layers=1, selector="exact", streaming=True),
        flat_config(budget=0.5, period_layers=1, selector="exact", streaming=True),
        flat_config(budget=0.4, period_layers=1, selector="summary", head_aggregation="max", streaming=True, reselect_every=1),
    ],
    ids=["full-budget", "exact-half", "summary-reselecting"],
)
def test_the_streaming_layout_answers_as_the_full_layout_with_streaming_heads(runners, model4, cfg):
    full, small = runners
    suffix = torch.tensor([7, 8, 9])
    a, b = full.store_prefix(PREFIX), small.store_prefix(PREFIX)
    assert a.prefix_id != b.prefix_id  # another geometry, other chunks
    ga, gb = full.generate(a.prefix_id, suffix, cfg, 6), small.generate(b.prefix_id, suffix, cfg, 6)
    assert gb.tokens == ga.tokens
    torch.testing.assert_close(gb.first_logits, ga.first_logits, atol=1e-5, rtol=1e-5)
    assert [s.tolist() for s in gb.reprefill.selected] == [s.tolist() for s in ga.reprefill.selected]
    if cfg.decode.reselect_every:
        assert gb.reselect.chunks_fetched > 0  # chunks fetched while decoding got their tail rows too
        assert gb.reselect.chunks_fetched == ga.reselect.chunks_fetched


def test_loaded_rows_hold_the_tail_for_streaming_heads_and_nothing_else_of_them(runners, model4):
    full, small = runners
    b = small.store_prefix(PREFIX)
    cfg = flat_config(budget=1.0, period_layers=1, selector="exact", streaming=True)
    res = small.reprefill(b.prefix_id, [7, 8], cfg, keep_kv=True)
    _, kv = chunked_prefill(model4, PREFIX)  # [layers, 2, Hkv, n, d]
    n = PREFIX.numel()
    visible = (torch.arange(n) < 16) | (torch.arange(n) >= n - 32)
    for layer in range(model4.num_layers):
        rows = res.layer_kv[layer][:, :, :n]  # [2, Hkv, n, d]
        torch.testing.assert_close(rows[:, 2:], kv[layer][:, 2:])  # heads 2 and 3 are stored in every layer
        torch.testing.assert_close(rows[:, 0, visible], kv[layer][:, 0, visible])  # from the tail
        assert not rows[:, 0, ~visible].any()  # never stored, never read


def test_the_streaming_layout_stores_less_and_inspect_says_so(runners, model4):
    full, small = runners
    a, b = full.store_prefix(PREFIX), small.store_prefix(PREFIX)
    da, db = full.client.describe(a.prefix_id), small.client.describe(b.prefix_id)
    hkv, layers = model4.config.num_key_value_heads, model4.num_layers
    left_out = layers + 1  # head 0 everywhere, head 1 in layer 0
    assert db.geometry == small.geometry and db.geometry.streaming_heads == ((0, 1), (0,))
    kv_a, kv_b = da.geometry.kv_bytes(da.num_tokens), db.geometry.kv_bytes(db.num_tokens)
    assert kv_b == kv_a * (hkv * layers - left_out) // (hkv * layers)
    info = small.client.inspect(b.prefix_id)
    assert info["streaming_heads"] == left_out
    assert info["kv_bytes"] == kv_b < info["kv_bytes_full_layout"] == kv_a


def test_a_missing_tail_is_named_and_the_next_store_puts_it_back(runners, model4):
    _, small = runners
    _, kv = chunked_prefill(model4, PREFIX)
    put = small.client.put_prefix(PREFIX.numpy(), as_numpy_kv(kv), small.geometry, model_fingerprint=model4.fingerprint)
    cfg = flat_config(budget=0.5, period_layers=1, selector="exact", streaming=True)
    with pytest.raises(TailMissing, match="store the prefix again"):
        small.reprefill(put.prefix_id, [7, 8], cfg)
    again = small.store_prefix(PREFIX)  # the chunks are stored: only the tail is put
    assert again.prefix_id == put.prefix_id and not again.cache_hit and again.tail_batch_id
    assert small.reprefill(put.prefix_id, [7, 8], cfg).logits.numel()
    assert small.store_prefix(PREFIX).cache_hit
    sh = small.streaming_heads
    assert len(tail_keys(put.prefix_id, sh.sink_tokens, sh.recent_tokens, 16)) == 1 + 2


def test_a_streaming_layout_prefix_serves_streaming_requests_of_its_own_layout_only(runners):
    full, small = runners
    b = small.store_prefix(PREFIX)
    with pytest.raises(InvalidArgument, match="streaming=True"):
        small.reprefill(b.prefix_id, [7], flat_config(budget=0.5, period_layers=1, selector="exact"))
    with pytest.raises(InvalidArgument, match="another model or layout"):
        full.reprefill(b.prefix_id, [7], flat_config(budget=0.5, period_layers=1, selector="exact", streaming=True))
    with pytest.raises(InvalidArgument, match="streaming_layout"):
        ModelRunner(full.model, full.client, streaming_layout=True)


def test_kv4_with_streaming_heads_keeps_the_stored_heads_as_the_kv4_layout_does(daemon, model4):
    prof = profile(model4, lambda layer, h: h == 0, recent=32)
    cfg = flat_config(budget=1.0, period_layers=1, selector="exact", streaming=True)
    with KVStoreClient(daemon.target) as client:
        plain = ModelRunner(model4, client, group_layers=1, probe_bits=0, streaming_heads=prof, kv_quant="kv4")
        small = ModelRunner(model4, client, group_layers=1, probe_bits=0, streaming_heads=prof, kv_quant="kv4", streaming_layout=True)
        a, b = plain.store_prefix(PREFIX), small.store_prefix(PREFIX)
        ra = plain.reprefill(a.prefix_id, [7, 8], cfg, keep_kv=True)
        rb = small.reprefill(b.prefix_id, [7, 8], cfg, keep_kv=True)
        n = PREFIX.numel()
        for layer in range(model4.num_layers):  # stored heads dequantize to the same values
            torch.testing.assert_close(rb.layer_kv[layer][:, 1:, :n], ra.layer_kv[layer][:, 1:, :n])
        assert np.isfinite(rb.logits.numpy()).all()
        da, db = client.describe(a.prefix_id), client.describe(b.prefix_id)
        assert db.geometry.kv_bytes(db.num_tokens) < da.geometry.kv_bytes(da.num_tokens)


def test_chunks_re_selection_fetches_while_decoding_get_their_tail_rows(daemon, model4):
    """A recent window of 8 chunks: every chunk a re-selection fetches holds streaming heads' rows to fill."""
    prof = profile(model4, lambda layer, h: h == 0 or (layer == 0 and h == 1), recent=128)
    cfg = flat_config(budget=0.4, period_layers=1, selector="summary", head_aggregation="max", streaming=True, reselect_every=1)
    suffix = torch.tensor([7, 8, 9])
    with KVStoreClient(daemon.target) as client:
        full = ModelRunner(model4, client, group_layers=1, probe_bits=0, streaming_heads=prof)
        small = ModelRunner(model4, client, group_layers=1, probe_bits=0, streaming_heads=prof, streaming_layout=True)
        a, b = full.store_prefix(PREFIX), small.store_prefix(PREFIX)
        ga = full.generate(a.prefix_id, suffix, cfg, 8)
        gb = small.generate(b.prefix_id, suffix, cfg, 8)
    assert gb.reselect.chunks_fetched == ga.reselect.chunks_fetched > 0
    assert gb.tokens == ga.tokens
    assert gb.step_kv_rows == ga.step_kv_rows


def test_deleting_the_tail_batch_takes_the_tail_away(runners):
    _, small = runners
    b = small.store_prefix(PREFIX)
    cfg = flat_config(budget=0.5, period_layers=1, selector="exact", streaming=True)
    small.client.delete(b.tail_batch_id)
    small.forget(b.prefix_id)
    with pytest.raises(TailMissing):
        small.reprefill(b.prefix_id, [7, 8], cfg)
