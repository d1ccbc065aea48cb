"""Streaming heads in Re-Prefill through a real daemon: the same answer as the in-process reference, the right rows hidden."""

import pytest
import torch
from helpers import flat_config
from pretrained import needs_smollm2

from engine_client.generation import dense_generate
from engine_client.model.streaming import StreamingHeads
from kvstore.contract.errors import InvalidArgument


def profile(model, streaming, *, sink=16, recent=16):
    hkv = model.config.num_key_value_heads
    rows = tuple(tuple(bool(streaming(layer, h)) for h in range(hkv)) for layer in range(model.num_layers))
    mass = tuple(tuple(0.9 if x else 0.1 for x in row) for row in rows)
    return StreamingHeads(model.fingerprint, sink, recent, 0.5, 0.5, mass, rows)


def test_full_budget_with_streaming_heads_equals_the_dense_reference(tiny_runner, tiny_model):
    prof = profile(tiny_model, lambda layer, h: layer == 0 or h == 0)
    tiny_runner.streaming_heads = prof
    prefix, suffix = torch.arange(5, 105), torch.tensor([7, 8, 9])
    handle = tiny_runner.store_prefix(prefix)
    cfg = flat_config(budget=1.0, period_layers=1, selector="exact", streaming=True)
    gen = tiny_runner.generate(handle.prefix_id, suffix, cfg, 6)
    ref = dense_generate(tiny_model, prefix, suffix, 6, streaming=prof)
    plain = dense_generate(tiny_model, prefix, suffix, 6)
    assert gen.tokens == ref.tokens
    torch.testing.assert_close(gen.first_logits, ref.first_logits, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ref.first_logits, plain.first_logits)  # the mask hid something


def test_sparse_streaming_hides_the_loaded_rows_outside_the_sink_and_recent_window(tiny_runner, tiny_model):
    tiny_runner.streaming_heads = profile(tiny_model, lambda layer, h: h == 0)
    prefix, suffix = torch.arange(5, 165), torch.tensor([7, 8])  # 10 chunks
    handle = tiny_runner.store_prefix(prefix)
    cfg = flat_config(budget=0.5, period_layers=1, selector="exact", streaming=True)
    res = tiny_runner.generate(handle.prefix_id, suffix, cfg, 2).reprefill
    for layer, chunks in enumerate(res.selected):
        mask = res.row_masks[layer]
        rows = torch.cat([torch.arange(16 * int(c), 16 * int(c) + 16) for c in chunks])
        assert mask.shape == (tiny_model.config.num_key_value_heads, rows.numel())
        assert mask[0].tolist() == ((rows < 16) | (rows >= 160 - 16)).tolist()
        assert mask[1:].all()


def test_streaming_is_refused_without_heads_or_as_a_non_bool(tiny_runner):
    handle = tiny_runner.store_prefix(torch.arange(5, 69))
    with pytest.raises(InvalidArgument, match="streaming"):
        tiny_runner.generate(handle.prefix_id, [3], flat_config(budget=0.5, period_layers=1, streaming=True), 2)
    tiny_runner.streaming_heads = profile(tiny_runner.model, lambda layer, h: True)
    with pytest.raises(InvalidArgument, match="streaming"):
        tiny_runner.generate(handle.prefix_id, [3], flat_config(budget=0.5, period_layers=1, streaming=1), 2)


def test_re_selection_gives_the_streaming_heads_each_new_sets_sink_and_recent_rows(tiny_runner, tiny_model):
    """LServe's pairing while decoding: every re-selected set is masked again; the rows read per step say so."""
    prof = profile(tiny_model, lambda layer, h: h == 0)  # sink 16 + recent 16: the forced sink and local chunks
    calls = []

    class Spy:  # the profile, recording which rows each mask is asked for
        streaming = prof.streaming  # which heads the selection leaves unscored

        def row_mask(self, layer, rows, n):
            calls.append((layer, rows.tolist()))
            return prof.row_mask(layer, rows, n)

    tiny_runner.streaming_heads = Spy()
    prefix, suffix = torch.arange(5, 325), torch.tensor([7, 8, 9])  # 20 chunks
    handle = tiny_runner.store_prefix(prefix)
    cfg = flat_config(budget=0.3, period_layers=1, selector="summary", head_aggregation="max", streaming=True, reselect_every=1)
    gen = tiny_runner.generate(handle.prefix_id, suffix, cfg, 6)
    assert gen.reselect.sets_changed > 0
    # one mask per layer at the first token, one as decoding starts, one per re-selection (1-layer Periods)
    assert len(calls) == 2 * tiny_model.num_layers + gen.reselect.reselections
    assert len({tuple(rows) for _, rows in calls}) > 1  # the masks follow the sets
    hkv, count, s = tiny_model.config.num_key_value_heads, 6, 3  # floor(0.3 x 20) chunks per layer
    for t, rows in enumerate(gen.step_kv_rows, start=1):  # head 0 sees sink + local only, the others the whole set
        assert rows == tiny_model.num_layers * ((hkv - 1) * (16 * count + s + t) + (32 + s + t))


@needs_smollm2
def test_smollm2s_classification_keeps_a_pass_key_answer_and_calibration_runs_on_the_real_model():
    from pathlib import Path

    from engine_client.model import zoo
    from engine_client.model.streaming import calibrate, local_mass
    from engine_client.prefill import chunked_prefill
    from kvstore_tools.tasks import text

    torch.set_num_threads(1)
    pm = zoo.load("smollm2-135m", dtype=torch.float32)
    shipped = StreamingHeads.load(Path(__file__).parents[2] / "docs/figures/streaming-heads-smollm2-135m.json", model=pm.decoder)
    assert shipped.fraction == pytest.approx(0.4) and not any(shipped.streaming[0])  # docs/decode.md, "Streaming heads"
    ex = text.examples("passkey", pm.tokenizer, 1, 1024, stream="tune", start=7)[0]
    gen = dense_generate(pm.decoder, ex.prefix_tokens, ex.suffix_tokens, 8, tokenizer=pm.tokenizer, streaming=shipped)
    assert ex.is_correct(gen.text), gen.text
    prof = calibrate(pm.decoder, [(ex.prefix_tokens, ex.suffix_tokens)], threshold=0.6, target_fraction=0.5)
    assert len(prof.streaming) == 30 and all(len(layer) == 3 for layer in prof.streaming) and 0 < prof.fraction <= 0.5
    _, kv = chunked_prefill(pm.decoder, torch.from_numpy(ex.prefix_tokens))
    again = local_mass(pm.decoder, kv, torch.from_numpy(ex.suffix_tokens), sink_tokens=16, recent_tokens=64)
    torch.testing.assert_close(again, torch.tensor(prof.mass), atol=1e-5, rtol=0)


def test_per_head_sets_each_head_attends_to_its_own_chunks_the_period_loads_their_union(tiny_runner, tiny_model):
    prefix, suffix = torch.arange(5, 325), torch.tensor([7, 8, 9])  # 20 chunks; 30% = 6 per head
    handle = tiny_runner.store_prefix(prefix)
    hkv, s = tiny_model.config.num_key_value_heads, 3
    for extra in ({"selector": "exact"}, {"selector": "summary", "reselect_every": 1}):
        cfg = flat_config(budget=0.3, period_layers=1, head_aggregation="max", per_head=True, **extra)
        gen = tiny_runner.generate(handle.prefix_id, suffix, cfg, 5)
        res = gen.reprefill
        for layer, (chunks, sets) in enumerate(zip(res.selected, res.head_sets)):
            assert len(sets) == hkv and all(len(hs) == 6 and {0, 19} <= set(hs.tolist()) for hs in sets)
            assert chunks.tolist() == sorted(set().union(*(hs.tolist() for hs in sets)))  # loaded: the union
            rows = torch.cat([torch.arange(16 * int(c), 16 * int(c) + 16) for c in chunks])
            for h, hs in enumerate(sets):
                assert res.row_masks[layer][h].tolist() == torch.isin(rows // 16, hs).tolist()
        # each head reads its 6 chunks whatever the union (re-selected or not), the suffix and the generated rows
        assert gen.step_kv_rows == [tiny_model.num_layers * hkv * (16 * 6 + s + t) for t in range(1, 5)]
    with pytest.raises(InvalidArgument, match="per_head"):
        tiny_runner.generate(handle.prefix_id, suffix, flat_config(budget=0.3, period_layers=1, selector="recent", per_head=True), 2)
    with pytest.raises(InvalidArgument, match="per_head"):
        tiny_runner.generate(handle.prefix_id, suffix, flat_config(budget=0.3, period_layers=1, selector="exact", per_head=1), 2)
