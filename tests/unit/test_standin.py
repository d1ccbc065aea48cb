"""Stand-in rows (engine_client.standin): what the rows not loaded become, checked by brute force."""

import pytest
import torch

from engine_client.standin import standin_kv, value_sum


def _attend(q, kv):
    """One query per KV head over rows ``kv [2, H, r, d]``: ``[H, d]``."""
    w = torch.softmax(torch.einsum("hd,hrd->hr", q, kv[0]) / q.shape[-1] ** 0.5, dim=-1)
    return torch.einsum("hr,hrd->hd", w, kv[1])


def _case(seed=0, h=2, n=40, d=8):
    g = torch.Generator().manual_seed(seed)
    full = torch.randn(2, h, n, d, generator=g)
    pos = torch.tensor([0, 1, 2, 3, 17, 18, 36, 37, 38, 39])
    return g, full, pos


def test_rows_not_loaded_get_their_own_key_and_the_mean_value_of_the_rest():
    _, full, pos = _case()
    rows = standin_kv(full[:, :, pos], pos, full[0], value_sum(full[1]))
    left = torch.ones(40, dtype=torch.bool)
    left[pos] = False
    assert rows.shape == (2, 2, 40, 8)
    torch.testing.assert_close(rows[:, :, :10], full[:, :, pos])  # the loaded rows first, as loaded
    torch.testing.assert_close(rows[0, :, 10:], full[0][:, left])  # each other row once, its own key
    mean = full[1][:, left].mean(dim=1)  # [H, d]
    torch.testing.assert_close(rows[1, :, 10:], mean[:, None].expand(2, 30, 8))


def test_attention_over_stand_ins_is_the_left_out_mass_times_their_mean_value():
    g, full, pos = _case(1)
    q = torch.randn(2, 8, generator=g)
    rows = standin_kv(full[:, :, pos], pos, full[0], value_sum(full[1]))
    w = torch.softmax(torch.einsum("hd,hnd->hn", q, full[0]) / 8**0.5, dim=-1)  # the full KV's weights
    left = torch.ones(40, dtype=torch.bool)
    left[pos] = False
    want = torch.einsum("hr,hrd->hd", w[:, pos], full[1][:, pos]) + w[:, left].sum(1, keepdim=True) * full[1][:, left].mean(1)
    torch.testing.assert_close(_attend(q, rows), want)
    # the loaded rows alone answer differently: the stand-ins carry the left-out mass
    assert not torch.allclose(_attend(q, full[:, :, pos]), want, atol=1e-3)


def test_when_the_rows_left_out_share_one_value_stand_ins_are_exact():
    g, full, pos = _case(2)
    left = torch.ones(40, dtype=torch.bool)
    left[pos] = False
    full[1][:, left] = torch.randn(2, 1, 8, generator=g)  # one value per head for every row not loaded
    q = torch.randn(2, 8, generator=g)
    rows = standin_kv(full[:, :, pos], pos, full[0], value_sum(full[1]))
    torch.testing.assert_close(_attend(q, rows), _attend(q, full))


def test_everything_loaded_leaves_the_rows_as_they_are():
    _, full, _ = _case(3)
    pos = torch.arange(40).flip(0)
    rows = standin_kv(full[:, :, pos], pos, full[0], value_sum(full[1]))
    assert rows.shape == (2, 2, 40, 8) and torch.equal(rows, full[:, :, pos])


def test_bad_shapes_and_positions_are_refused():
    _, full, pos = _case(4)
    loaded, keys, sums = full[:, :, pos], full[0], value_sum(full[1])
    with pytest.raises(ValueError, match="repeat"):
        standin_kv(full[:, :, [0, 0]], torch.tensor([0, 0]), keys, sums)
    with pytest.raises(ValueError, match="loaded_pos"):
        standin_kv(loaded, pos + 1, keys, sums)  # 40 is past the prefix
    with pytest.raises(ValueError, match="probe_keys"):
        standin_kv(loaded, pos, keys[:1], sums)
    with pytest.raises(ValueError, match="values_sum"):
        standin_kv(loaded, pos, keys, sums[:, :4])
    with pytest.raises(ValueError, match="loaded"):
        standin_kv(loaded[0], pos, keys, sums)
    with pytest.raises(ValueError, match="values"):
        value_sum(full[1][0])


def test_the_selection_study_stands_in_per_head_as_the_runner_does_or_per_chunk():
    from engine_client.selection.probes import quantize_keys
    from kvstore_tools.selection_study import standin_rows

    g = torch.Generator().manual_seed(3)
    full = torch.randn(2, 2, 40, 8, generator=g)  # 16-token chunks 0, 1 and a short chunk 2 (rows 32-39)
    pos = torch.arange(16, 32)  # chunk 1 selected
    loaded = full[:, :, pos]
    probe = quantize_keys(full[0], 4).dequantize(full.dtype)
    by_head = standin_rows(loaded, pos, full[0], full[1], "head")
    torch.testing.assert_close(by_head, standin_kv(loaded, pos, probe, value_sum(full[1])))
    by_chunk = standin_rows(loaded, pos, full[0], full[1], "chunk")
    assert by_chunk.shape == (2, 2, 40, 8)
    torch.testing.assert_close(by_chunk[:, :, :16], loaded)
    torch.testing.assert_close(by_chunk[0, :, 16:], probe[:, list(range(16)) + list(range(32, 40))])  # 4-bit keys
    torch.testing.assert_close(by_chunk[1, :, 16:32], full[1][:, :16].mean(1, keepdim=True).expand(2, 16, 8))  # chunk 0's mean
    torch.testing.assert_close(by_chunk[1, :, 32:], full[1][:, 32:].mean(1, keepdim=True).expand(2, 8, 8))  # the short chunk's
    with pytest.raises(ValueError, match="'head' or 'chunk'"):
        standin_rows(loaded, pos, full[0], full[1], "row")
