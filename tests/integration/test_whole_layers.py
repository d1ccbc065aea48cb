"""Whole layers through a real daemon: calibrated layers loaded in full on top of the budget, the other sets unchanged."""

import pytest
import torch
from helpers import calibrated_layers, flat_config

from engine_client.prefill import chunked_prefill
from kvstore.contract.errors import InvalidArgument

CFG = flat_config(budget=0.25, period_layers=1, selector="exact", probe_bits=4, head_aggregation="max", report_attention=False)
N = 301  # 19 chunks, the last one short


@pytest.fixture
def stored(tiny_runner):
    gen = torch.Generator().manual_seed(11)
    prefix = torch.randint(0, 500, (N,), generator=gen)
    suffix = torch.randint(0, 500, (9,), generator=gen)
    return tiny_runner, tiny_runner.store_prefix(prefix), prefix, suffix


def _tokens(chunks) -> int:
    return sum(min(16, N - c * 16) for c in chunks.tolist())


def test_a_whole_layer_loads_every_row_and_leaves_the_other_sets_as_they_were(stored):
    runner, handle, prefix, suffix = stored
    _, prefix_kv = chunked_prefill(runner.model, prefix)
    plain = runner.reprefill(handle.prefix_id, suffix, CFG)
    res = runner.reprefill(handle.prefix_id, suffix, CFG.replace(whole_layers=(1,)))
    assert res.selected[0].tolist() == plain.selected[0].tolist() and len(plain.selected[1]) < 19
    assert res.selected[1].tolist() == list(range(19))
    assert res.tokens_loaded == plain.tokens_loaded - _tokens(plain.selected[1]) + N  # on top of the budget
    assert res.kv_fraction > plain.kv_fraction > 0
    # the first layer over its selected rows, the second over the whole prefix, as computed in process
    positions = torch.arange(N, N + suffix.numel())
    hidden = runner.model.embed(suffix)
    pos = torch.cat([torch.arange(c * 16, min(c * 16 + 16, N)) for c in res.selected[0].tolist()])
    hidden, _ = runner.model.layer_forward(0, hidden, positions, prefix_kv[0][:, :, pos])
    hidden, _ = runner.model.layer_forward(1, hidden, positions, prefix_kv[1])
    torch.testing.assert_close(res.logits, runner.model.final_logits(hidden), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(res.logits, plain.logits, atol=1e-3)
    gen = runner.generate(handle.prefix_id, suffix, CFG.replace(whole_layers=(1,)), max_new_tokens=3, eos_token_ids=[])
    assert gen.tokens[0] == int(gen.reprefill.logits.argmax()) and len(gen.tokens) == 3
    assert gen.rows_attended == [_tokens(res.selected[0]), N]  # decoding keeps the whole layer


def test_calibrated_whole_layers_are_the_runners_calibration_file(stored):
    runner, handle, _, suffix = stored
    with pytest.raises(InvalidArgument, match="calibrate-standins"):  # a runner without a calibration file
        runner.reprefill(handle.prefix_id, suffix, CFG.replace(whole_layers="calibrated"))
    with calibrated_layers(runner, (1,)):
        calibrated = runner.reprefill(handle.prefix_id, suffix, CFG.replace(whole_layers="calibrated"))
    explicit = runner.reprefill(handle.prefix_id, suffix, CFG.replace(whole_layers=(1,)))
    assert [c.tolist() for c in calibrated.selected] == [c.tolist() for c in explicit.selected]
    assert torch.equal(calibrated.logits, explicit.logits)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(whole_layers=(2,)), r"in \[0, 2\), got \(2,\)"),
        (dict(whole_layers=(1, 1)), "distinct"),
        (dict(whole_layers=("1",)), "tuple of layer indices"),
        (dict(whole_layers="all"), 'or "calibrated"'),
        (dict(whole_layers=(1,), standin_layers=(1,)), r"layers \[1\] are loaded whole"),
        (dict(whole_layers=(1,), reselect_every=1), "reselect_every"),
        (dict(whole_layers=(1,), per_head=True), "per_head"),
    ],
)
def test_bad_whole_layer_requests_are_refused_before_any_read(stored, change, match):
    runner, handle, _, suffix = stored
    before = runner.resident_bytes()
    with pytest.raises(InvalidArgument, match=match) as err:
        runner.reprefill(handle.prefix_id, suffix, CFG.replace(**change))
    assert "whole_layers" in str(err.value) and "\n" not in str(err.value)
    assert runner.resident_bytes() == before
