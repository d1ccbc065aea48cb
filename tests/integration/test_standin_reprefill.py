"""Stand-in rows through a real daemon: the runner's wiring against an in-process computation."""

import pytest
import torch
from helpers import calibrated_layers, flat_config

from engine_client.prefill import chunked_prefill
from engine_client.selection.probes import quantize_keys
from engine_client.standin import standin_kv, value_sum
from kvstore.contract.errors import InvalidArgument

CFG = flat_config(budget=0.25, period_layers=1, selector="exact", probe_bits=4, head_aggregation="max", report_attention=False)


@pytest.fixture
def stored(tiny_runner):
    gen = torch.Generator().manual_seed(7)
    prefix = torch.randint(0, 500, (301,), generator=gen)  # 19 chunks, the last one short
    suffix = torch.randint(0, 500, (9,), generator=gen)
    return tiny_runner, tiny_runner.store_prefix(prefix), prefix, suffix


def _reference(model, prefix_kv, n, suffix, selected, standin_layers):
    """The suffix over each layer's selected rows, a stand-in layer also over every other row (4-bit keys)."""
    positions = torch.arange(n, n + suffix.numel())
    hidden = model.embed(suffix)
    for layer, chunks in enumerate(selected):
        pos = torch.cat([torch.arange(c * 16, min(c * 16 + 16, n)) for c in chunks.tolist()])
        rows = prefix_kv[layer][:, :, pos]
        if layer in standin_layers:
            keys = quantize_keys(prefix_kv[layer, 0], 4).dequantize(model.dtype)
            rows = standin_kv(rows, pos, keys, value_sum(prefix_kv[layer, 1]))
        hidden, _ = model.layer_forward(layer, hidden, positions, rows)
    return model.final_logits(hidden)


def test_stand_in_rows_match_an_in_process_computation_and_their_sums_stay_resident(stored):
    runner, handle, prefix, suffix = stored
    _, prefix_kv = chunked_prefill(runner.model, prefix)
    plain = runner.reprefill(handle.prefix_id, suffix, CFG)
    resident = runner.resident_bytes()
    res = runner.reprefill(handle.prefix_id, suffix, CFG.replace(standin_layers=(1,)))
    assert [c.tolist() for c in res.selected] == [c.tolist() for c in plain.selected]  # the same sets
    loaded = sum(min(16, 301 - c * 16) for c in res.selected[1].tolist())
    assert res.standin_rows == 301 - loaded and res.tokens_loaded == plain.tokens_loaded
    geo = runner.geometry
    assert res.state_bytes_fetched == sum(geo.extent_bytes(1, min(16, 301 - c * 16)) for c in range(19))  # layer 1, once
    assert runner.resident_bytes() - resident == 2 * 16 * 4  # the tiny model's value sum: 2 KV heads x 16 dims
    torch.testing.assert_close(res.logits, _reference(runner.model, prefix_kv, 301, suffix, res.selected, (1,)), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(res.logits, plain.logits, atol=1e-3)  # the stand-ins change the answer's logits
    again = runner.reprefill(handle.prefix_id, suffix, CFG.replace(standin_layers=(1,)))
    assert again.state_bytes_fetched == 0 and torch.equal(again.logits, res.logits)
    runner.forget(handle.prefix_id)
    assert runner.reprefill(handle.prefix_id, suffix, CFG.replace(standin_layers=(1,))).state_bytes_fetched > 0
    # decoding attends to the same rows: the first generated token is the Re-Prefill's argmax
    gen = runner.generate(handle.prefix_id, suffix, CFG.replace(standin_layers=(0, 1)), max_new_tokens=3, eos_token_ids=[])
    assert gen.tokens[0] == int(gen.reprefill.logits.argmax()) and len(gen.tokens) == 3
    assert gen.rows_attended == [301, 301]  # every prefix row, loaded or standing in, at both layers


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(standin_layers=(2,)), r"distinct layers in \[0, 2\)"),
        (dict(standin_layers=(1, 1)), "distinct"),
        (dict(standin_layers=("1",)), "tuple of layer indices"),
        (dict(standin_layers=1), "tuple of layer indices"),
        (dict(standin_layers="all"), 'or "calibrated"'),
        (dict(standin_layers="calibrated"), "calibrate-standins"),  # a runner without a calibration file
        (dict(standin_layers=(1,), probe_bits=0), "probe_bits"),
        (dict(standin_layers=(1,), selector="summary", probe_bits=0), "exact"),
        (dict(standin_layers=(0,), period_layers=2), "1-layer Periods"),
        (dict(standin_layers=(1,), reselect_every=1), "reselect_every"),
        (dict(standin_layers=(1,), prefill_alpha=0.5), "prefill_alpha"),
    ],
)
def test_bad_stand_in_requests_are_refused_before_any_read(stored, change, match):
    runner, handle, _, suffix = stored
    before = runner.resident_bytes()
    with pytest.raises(InvalidArgument, match=match) as err:
        runner.reprefill(handle.prefix_id, suffix, CFG.replace(**change))
    assert "standin_layers" in str(err.value) and "\n" not in str(err.value)
    assert runner.resident_bytes() == before  # nothing fetched, nothing kept


def test_calibrated_layers_are_the_runners_calibration_file(stored):
    runner, handle, _, suffix = stored
    with calibrated_layers(runner, (1,)):
        calibrated = runner.reprefill(handle.prefix_id, suffix, CFG.replace(standin_layers="calibrated"))
    explicit = runner.reprefill(handle.prefix_id, suffix, CFG.replace(standin_layers=(1,)))
    assert calibrated.standin_rows == explicit.standin_rows > 0
    assert torch.equal(calibrated.logits, explicit.logits)
