"""Krul restoration through a real daemon: recompute each layer's first chunks while the rest loads."""

import numpy as np
import pytest
import torch

from engine_client.client import KVStoreClient, as_numpy_kv
from engine_client.krul import (
    AttentionEstimator,
    HardwareProfile,
    Strategy,
    choose_strategy,
    make_plan,
    plan_restore,
    recompute_flops,
    record_strategy,
)
from engine_client.krul.pyramid import RestoreCosts
from engine_client.krul.restoration import bytes_per_token_layer, measure_profile, restore_kv
from engine_client.prefill import chunked_prefill
from engine_client.runner import model_geometry
from kvstore.contract.errors import InvalidArgument

N = 70  # four whole chunks and a short one


def _plan(model, geo, counts):
    f, f_att = recompute_flops(model.config)
    costs = RestoreCosts(N, f, f_att, (bytes_per_token_layer(geo, N),) * model.num_layers, HardwareProfile(1e9, 1e9))
    return make_plan(costs, counts)


def _stored(geo, kv):
    """The KV as the store gives it back (dequantized when the geometry quantizes)."""
    arr = as_numpy_kv(kv)
    c, out = geo.chunk_tokens, np.empty_like(arr)
    for g in range(geo.num_groups):
        layers = geo.group_layer_range(g)
        for j in range(geo.num_chunks(N)):
            ext = np.ascontiguousarray(arr[layers.start : layers.stop, :, :, j * c : (j + 1) * c])
            out[layers.start : layers.stop, :, :, j * c : (j + 1) * c] = geo.extent_array(geo.extent_payload(ext), g, ext.shape[3])
    return torch.from_numpy(out)


@pytest.mark.parametrize(("group_layers", "kv_quant"), [(2, ""), (1, "kv8"), (2, "kv4t")])
@pytest.mark.parametrize("counts", [(32, 16), (N, N), (0, 0), (64, 0)])
def test_restored_kv_is_recomputed_rows_then_stored_rows(daemon, tiny_model, group_layers, kv_quant, counts):
    geo = model_geometry(tiny_model, group_layers=group_layers, kv_quant=kv_quant)
    tokens = torch.arange(N) * 7 % 500
    _, kv = chunked_prefill(tiny_model, tokens)
    with KVStoreClient(daemon.target) as client:
        pid = client.put_prefix(tokens.numpy(), kv, geo).prefix_id
        got, timings = restore_kv(tiny_model, client, pid, tokens, geo, _plan(tiny_model, geo, counts))
    stored = _stored(geo, kv)
    for layer, k in enumerate(counts):
        torch.testing.assert_close(got[layer, :, :, :k], kv[layer, :, :, :k], rtol=1e-5, atol=1e-5)  # recomputed
        assert torch.equal(got[layer, :, :, k:], stored[layer, :, :, k:])  # loaded, as stored
    # the loader reads each group from its last layer's count: whole chunks, the short one included
    first = [-(-min(counts[layer] for layer in geo.group_layer_range(g)) // 16) for g in range(geo.num_groups)]
    want = sum(geo.extent_bytes(g, min(16, N - j * 16)) for g in range(geo.num_groups) for j in range(first[g], geo.num_chunks(N)))
    assert timings.bytes_useful == want
    assert timings.recompute_tokens == counts and timings.total_s >= max(timings.recompute_s, timings.compute_wait_s)


def test_plans_that_do_not_fit_are_refused(daemon, tiny_model):
    geo = model_geometry(tiny_model, group_layers=1)
    tokens = torch.arange(N)
    _, kv = chunked_prefill(tiny_model, tokens)
    with KVStoreClient(daemon.target) as client:
        pid = client.put_prefix(tokens.numpy(), kv, geo).prefix_id
        with pytest.raises(ValueError, match="whole chunks"):
            restore_kv(tiny_model, client, pid, tokens, geo, _plan(tiny_model, geo, (20, 10)))
        with pytest.raises(InvalidArgument, match="hidden states"):
            restore_kv(tiny_model, client, pid, tokens, geo, _plan(tiny_model, geo, (16, 32)))
        with pytest.raises(ValueError, match="restores"):
            restore_kv(tiny_model, client, pid, tokens[:64], geo, _plan(tiny_model, geo, (16, 16)))


def test_a_measured_profile_makes_a_balanced_plan(daemon, tiny_model):
    geo = model_geometry(tiny_model, group_layers=1, kv_quant="kv8")
    tokens = torch.arange(N)
    _, kv = chunked_prefill(tiny_model, tokens)
    with KVStoreClient(daemon.target) as client:
        pid = client.put_prefix(tokens.numpy(), kv, geo).prefix_id
        profile = measure_profile(tiny_model, client, pid, tokens, geo, sample_tokens=32)
        assert 0 < profile.flops_per_s < float("inf") and 0 < profile.load_bytes_per_s < float("inf")
        assert 0.0 <= profile.overlap <= 1.0
        f, f_att = recompute_flops(tiny_model.config)
        plan = plan_restore(
            2,
            N,
            recompute_flops_per_token_layer=f,
            attention_flops_per_token_pair=f_att,
            bytes_per_token_layer=bytes_per_token_layer(geo, N),
            profile=profile,
            step_tokens=16,
        )
        got, _ = restore_kv(tiny_model, client, pid, tokens, geo, plan)
    assert got.shape == kv.shape


def test_a_conversation_compressed_and_restored_through_the_daemon_answers_like_the_uncompressed_one(daemon, tiny_model):
    from engine_client.generation import suffix_over_prefix

    plain = model_geometry(tiny_model, group_layers=1)
    quant = model_geometry(tiny_model, group_layers=1, kv_quant="kv8")
    history, turn = torch.arange(N) * 5 % 500, torch.tensor([7, 8, 9, 10])
    with AttentionEstimator(tiny_model, grid=8) as estimator:  # the worker's sketch of the conversation, fed by its prefill
        _, kv = chunked_prefill(tiny_model, history, observe=estimator.observe)
        stats = estimator.stats()
    selected = choose_strategy(stats, gamma=0.6, ratio=0.5)
    with KVStoreClient(daemon.target) as client:
        client.append_turn("user-1", 0, client.put_prefix(history.numpy(), kv, plain).prefix_id)
        small = client.put_prefix(history.numpy(), kv, quant).prefix_id
        strategy = record_strategy(stats, selected, kv_quant="kv8", restore="pyramid")
        client.mark_inactive("user-1", compressed_prefix_id=small, format="kv8", strategy=strategy)
        info = client.get_conversation("user-1")
        assert info.state == "inactive" and info.compressed.prefix_id == small
        kept = info.compressed.strategy  # the statistics travel with the record
        assert kept["kv_quant"] == "kv8" and Strategy.from_dict(kept["selector"]) == selected
        assert kept["edge_mass"] == pytest.approx(stats.edge_mass.tolist(), abs=1e-4)
        assert info.compressed_bytes == quant.kv_bytes(N) < info.uncompressed_bytes / 3
        logits = {}
        for name, geo, pid, counts in (
            ("uncompressed", plain, info.turns[-1].prefix_id, (0, 0)),
            ("kv8", quant, info.compressed.prefix_id, (0, 0)),
            ("kv8-pyramid", quant, info.compressed.prefix_id, (32, 16)),
        ):
            restored, _ = restore_kv(tiny_model, client, pid, history, geo, _plan(tiny_model, geo, counts))
            logits[name], _ = suffix_over_prefix(tiny_model, restored, N, turn)
    reference, _ = suffix_over_prefix(tiny_model, kv, N, turn)
    torch.testing.assert_close(logits["uncompressed"], reference, rtol=0, atol=0)  # loaded bytes are the stored bytes
    for name in ("kv8", "kv8-pyramid"):  # 8-bit KV: the next turn's logits move by far less than their spread
        drift = float((logits[name] - reference).abs().max() / reference.std())
        assert drift < 0.05, drift
        assert logits[name].argmax() == reference.argmax()
