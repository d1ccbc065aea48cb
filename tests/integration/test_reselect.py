"""Decoding with progressive re-selection (engine_client.reselect) on a tiny checkpoint and a real daemon."""

import numpy as np
import pytest
import torch
from helpers import flat_config

from engine_client.generation import LayerKV, dense_generate
from engine_client.prefill import chunked_prefill
from engine_client.reselect import WorkingSet, decode_reselecting
from kvstore.contract.errors import InvalidArgument


@pytest.fixture
def runner(tiny_runner):
    return tiny_runner


def _prompt(seed=0, n=301, s=9):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 500, (n,), generator=gen), torch.randint(0, 500, (s,), generator=gen)


def test_layer_kv_replace_head_keeps_the_tail_and_the_spare_room():
    kv = LayerKV([torch.arange(2 * 1 * 5 * 2, dtype=torch.float32).reshape(2, 1, 5, 2)], extra=3)
    kv.append(0, torch.full((2, 1, 1, 2), -1.0))
    tail = kv.view(0)[:, :, 3:].clone()
    head = torch.full((2, 1, 4, 2), 7.0)
    kv.replace_head(0, 3, head)
    assert kv.rows(0) == 4 + 3
    torch.testing.assert_close(kv.view(0)[:, :, :4], head)
    torch.testing.assert_close(kv.view(0)[:, :, 4:], tail)
    kv.append(0, torch.zeros(2, 1, 2, 2))  # the two spare rows are still there
    with pytest.raises(ValueError, match="no room"):
        kv.append(0, torch.zeros(2, 1, 1, 2))
    with pytest.raises(ValueError, match="old_rows"):
        kv.replace_head(0, 10, head)


def test_reselecting_everything_decodes_exactly_as_the_full_kv(tiny_model):
    """From a 3-chunk set, a re-selection of every chunk at the first step gives dense decoding's tokens."""
    prefix, suffix = _prompt()
    n, m = prefix.numel(), 19
    _, full_kv = chunked_prefill(tiny_model, prefix)  # [L, 2, Hkv, n, d]
    ref = dense_generate(tiny_model, prefix, suffix, 12, prefix_kv=full_kv)
    start = [0, 9, 18]
    tokens = [min(16, n - 16 * c) for c in start]
    keep = torch.cat([torch.arange(16 * c, 16 * c + t) for c, t in zip(start, tokens)])
    layers = [
        torch.cat([full_kv[layer].index_select(2, keep), ref_kv], dim=2)
        for layer, ref_kv in enumerate(_suffix_kv(tiny_model, full_kv, n, suffix))
    ]
    periods = [(layer, 1, 3) for layer in range(tiny_model.num_layers)]
    fetched = []

    def fetch(l0, num_layers, chunks):
        fetched.append((l0, list(chunks)))
        rows = {l0: {c: full_kv[l0][:, :, 16 * c : 16 * c + min(16, n - 16 * c)] for c in chunks}}
        return rows, 0, 0

    sets = [list(start) for _ in periods]
    ws = WorkingSet.from_loaded(layers, [(l0, 1) for l0, _, _ in periods], sets, [tokens] * len(periods))
    out, steps, _, stats = decode_reselecting(
        tiny_model,
        ref.first_logits,
        LayerKV(layers, 12),
        periods=periods,
        sets=sets,
        working=ws,
        select=lambda p, l0, q, count: torch.arange(m),  # every chunk, whatever the count
        fetch=fetch,
        num_chunks=m,
        next_position=n + suffix.numel(),
        max_new_tokens=12,
        every=1,
    )
    assert out == ref.tokens and len(steps) == 11
    # each layer fetched the 16 chunks it lacked once; later selections changed nothing
    assert sorted(fetched) == [(layer, [c for c in range(m) if c not in start]) for layer in range(tiny_model.num_layers)]
    assert stats.reselections == 11 * tiny_model.num_layers and stats.sets_changed == tiny_model.num_layers
    assert stats.chunks_fetched == 16 * tiny_model.num_layers and sets == [list(range(m))] * len(periods)


def _suffix_kv(model, full_kv, n, suffix):
    from engine_client.generation import suffix_over_prefix

    _, layers = suffix_over_prefix(model, full_kv, n, suffix)
    return [kv[:, :, n:] for kv in layers]


def test_reselecting_through_the_daemon_fetches_only_what_the_working_set_lacks(runner):
    prefix, suffix = _prompt(1)
    handle = runner.store_prefix(prefix)
    cfg = flat_config(budget=0.3, period_layers=1, selector="exact", head_aggregation="max", probe_bits=4, reselect_every=2)
    gen = runner.generate(handle.prefix_id, suffix, cfg, 9)
    st = gen.reselect
    geo = runner.geometry
    # 8 decode steps; re-selection at 2, 4, 6 and 8 generated tokens in each of the 2 one-layer Periods
    assert len(gen.tokens) == 9 and st.every == 2 and st.reselections == 4 * 2
    assert st.sets_changed <= st.reselections and st.chunks_fetched <= st.chunks_swapped_in
    # every chunk a Period fetched arrived whole: its extent bytes, counted by the daemon's reply
    full_chunk = geo.extent_bytes(0, 16)
    assert st.bytes_fetched >= st.chunks_fetched * geo.extent_bytes(0, 13) and st.bytes_fetched <= st.chunks_fetched * full_chunk
    assert st.working_set_bytes > 0
    # decoding without re-selection over the same prefix gives the same first token
    plain = runner.generate(handle.prefix_id, suffix, cfg.replace(reselect_every=0), 9)
    assert plain.tokens[0] == gen.tokens[0] and plain.reselect is None


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"selector": "recent", "reselect_every": 2}, "reselect_every.*'recent'"),
        ({"selector": "exact", "reselect_every": 2}, "reselect_every.*without probe_bits"),
        ({"selector": "summary", "reselect_every": -1}, "reselect_every.*>= 0"),
        ({"selector": "summary", "reselect_every": True}, "reselect_every.*>= 0"),
    ],
)
def test_bad_reselect_settings_are_refused_before_any_work(runner, fields, match):
    prefix, suffix = _prompt(2, n=64)
    handle = runner.store_prefix(prefix)
    before = runner.client.stats()
    with pytest.raises(InvalidArgument, match=match):
        runner.generate(handle.prefix_id, suffix, flat_config(budget=0.5, period_layers=1, **fields), 4)
    after = runner.client.stats()
    assert (after.bytes_read, after.tier_hit_units) == (before.bytes_read, before.tier_hit_units)  # refused before any read


def test_reselect_cannot_follow_a_caller_choice(runner):
    prefix, suffix = _prompt(3, n=64)
    handle = runner.store_prefix(prefix)
    cfg = flat_config(budget=0.5, period_layers=1, selector="summary", reselect_every=1)
    with pytest.raises(InvalidArgument, match="reselect_every.*choose"):
        runner.generate(handle.prefix_id, suffix, cfg, 4, choose=lambda p, l0, q, m: np.arange(m))


def test_lserve_style_pages_with_reused_selection_through_the_daemon(runner):
    """Summary scores, 4-chunk physical pages, a selection reused for 4 tokens: each set is whole pages."""
    prefix, suffix = _prompt(4, n=640)  # 40 chunks, 10 pages
    handle = runner.store_prefix(prefix)
    cfg = flat_config(budget=0.25, period_layers=1, selector="summary", head_aggregation="max", page_chunks=4, reselect_every=4)
    gen = runner.generate(handle.prefix_id, suffix, cfg, 9)
    assert gen.reselect.reselections == 2 * 2  # at 4 and 8 generated tokens, 2 Periods
    for chunks in gen.reprefill.selected:
        free = sorted(set(chunks.tolist()) - {0, 39})  # sink and local are forced
        pages = {c // 4 for c in free}
        assert len(free) == 8 and len(pages) <= 3  # 10 chunks - 2 forced: two whole pages (a page holding 0 or 39 gives 3)
        assert sum(1 for p in pages if all(c in free for c in range(4 * p, 4 * p + 4) if c not in (0, 39))) >= len(pages) - 1
    with pytest.raises(InvalidArgument, match="page_chunks.*follow"):
        runner.generate(handle.prefix_id, suffix, flat_config(budget=0.25, selector="summary", page_chunks=4, follow=1, period_layers=1), 2)


def test_first_token_full_loads_everything_then_decodes_at_the_budget(runner):
    """LServe's split: the first token over every chunk (dense logits), decoding over budget-sized sets of loaded rows."""
    prefix, suffix = _prompt(5, n=640)  # 40 chunks
    handle = runner.store_prefix(prefix)
    lserve = dict(budget=0.25, period_layers=1, selector="summary", head_aggregation="max", page_chunks=4, reselect_every=4)
    gen = runner.generate(handle.prefix_id, suffix, flat_config(**lserve, first_token_full=True), 9)
    dense = runner.generate(handle.prefix_id, suffix, flat_config(budget=1.0, selector="full", period_layers=1), 1)
    torch.testing.assert_close(gen.reprefill.logits, dense.reprefill.logits, atol=1e-5, rtol=0)
    assert all(chunks.tolist() == list(range(40)) for chunks in gen.reprefill.selected)
    st = gen.reselect
    assert st.reselections == 3 * 2  # at the first decoding step, then at 4 and 8 generated tokens, 2 Periods
    assert st.sets_changed >= 2 and st.chunks_fetched == 0 == st.bytes_fetched  # every chosen row was loaded already
    # from the first decoding step on, each layer attends to a quarter of the prefix (10 chunks of 16 rows) and the rest
    hkv, s = runner.model.config.num_key_value_heads, suffix.numel()
    want = [2 * hkv * (10 * 16 + s + t) for t in range(1, 9)]  # 2 one-layer Periods
    assert gen.step_kv_rows == want
    sparse = runner.generate(handle.prefix_id, suffix, flat_config(**lserve), 9)
    assert sparse.reprefill.kv_fraction == pytest.approx(0.25) and gen.reprefill.kv_fraction == 1.0
    for fields, match in (
        ({**lserve, "reselect_every": 0}, "first_token_full.*reselect_every"),
        ({**lserve, "per_head": True}, "first_token_full.*per_head"),
        ({**lserve, "first_token_full": 1}, "first_token_full.*bool"),
    ):
        with pytest.raises(InvalidArgument, match=match):
            runner.generate(handle.prefix_id, suffix, flat_config(**{"first_token_full": True, **fields}), 2)
