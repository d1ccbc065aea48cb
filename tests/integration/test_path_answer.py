"""``ModelRunner.answer``: a request on its cheapest path (recompute, whole load, sparse) through a real daemon."""

import dataclasses

import pytest
import torch

from engine_client.client import KVStoreClient
from engine_client.compute_model import AcceleratorProfile
from engine_client.reprefill import ModelRunner, parse_system
from kvstore.contract.errors import InvalidArgument

PREFIX = torch.arange(5, 305)  # 19 chunks
SUFFIX = [3, 4, 5]
# a machine whose compute is nearly free and whose disk is slow: recompute is cheapest
FAST_COMPUTE = AcceleratorProfile("fast-compute", 1e18, 1e16, 1e12, disk_bytes_per_s=1e3, period_overhead_s=1.0)
# compute dear, storage free: a loading path is cheapest
SLOW_COMPUTE = AcceleratorProfile("slow-compute", 1e5, 1e5, 1e15, layer_overhead_s=1e-9, disk_bytes_per_s=1e15, period_overhead_s=1e-9)


@pytest.fixture
def runner(daemon, tiny_model):
    with KVStoreClient(daemon.target) as client:
        yield ModelRunner(tiny_model, client)


def test_a_prefix_not_stored_is_recomputed_then_stored(runner):
    dense, _ = runner.full_recompute(PREFIX, SUFFIX)
    ans = runner.answer(PREFIX, SUFFIX, profile=SLOW_COMPUTE)
    assert ans.path == "recompute" and "not stored (0 of its 19 chunks" in ans.reason and ans.choice is None
    assert torch.allclose(ans.logits, dense, atol=1e-4) and ans.ttft_s > 0
    assert ans.prefix is not None and not ans.prefix.cache_hit and ans.prefix.num_chunks == 19
    again = runner.store_prefix(PREFIX)  # what answer stored is what the runner stores: a hit
    assert again.cache_hit and again.prefix_id == ans.prefix.prefix_id


def test_a_stored_prefix_takes_the_path_the_profile_makes_cheapest(runner):
    handle = runner.store_prefix(PREFIX)
    dense, _ = runner.full_recompute(PREFIX, SUFFIX)

    fast = runner.answer(PREFIX, SUFFIX, profile=FAST_COMPUTE)
    assert fast.path == "recompute" and fast.choice.path == "recompute" and fast.reprefill is None
    assert set(fast.choice.predicted) == {"recompute", "full-load", "sparse"} and fast.reason.startswith("recompute ")
    assert torch.allclose(fast.logits, dense, atol=1e-4)

    slow = runner.answer(PREFIX, SUFFIX, profile=SLOW_COMPUTE)
    assert (
        slow.path == "sparse" and slow.choice.predicted["sparse"] < slow.choice.predicted["full-load"] < slow.choice.predicted["recompute"]
    )
    direct = runner.reprefill(handle.prefix_id, SUFFIX)  # the configuration's own run, on the same stored prefix
    assert torch.equal(slow.logits, direct.logits) and slow.reprefill.kv_fraction == direct.kv_fraction < 1

    # a budget of the whole prefix costs what a whole load does; the tie goes to the load that selects nothing
    whole = runner.answer(PREFIX, SUFFIX, runner_cfg(1.0), profile=SLOW_COMPUTE)
    assert whole.path == "full-load" and whole.reprefill.kv_fraction == 1.0
    assert torch.equal(whole.logits, runner.reprefill(handle.prefix_id, SUFFIX, parse_system("full", warn=False)).logits)


# compute cheap beside a Period's storage round trip, yet a 300-token prefill dearer than loading: the sparse
# path, where a Period's compute cannot hide a read, so without speculation
SHORT_PERIODS = AcceleratorProfile("short-periods", 1e9, 1e9, 1e12, layer_overhead_s=1e-9, disk_bytes_per_s=1e12, period_overhead_s=0.01)


def test_the_sparse_path_runs_without_speculation_where_a_periods_compute_cannot_hide_a_read(runner):
    handle = runner.store_prefix(PREFIX)
    cfg = runner_cfg(0.3)
    got = runner.answer(PREFIX, SUFFIX, cfg, profile=SHORT_PERIODS)
    assert got.path == "sparse" and got.choice.speculate is False and "no speculation" in got.reason
    assert got.reprefill.spec_bytes_used + got.reprefill.spec_bytes_wasted == 0
    direct = runner.reprefill(handle.prefix_id, SUFFIX, cfg)  # the configuration as given: it speculates
    assert direct.spec_bytes_used + direct.spec_bytes_wasted > 0
    assert torch.equal(got.logits, direct.logits)  # speculation moves bytes earlier, never changes them
    slow = runner.answer(PREFIX, SUFFIX, cfg, profile=SLOW_COMPUTE)
    assert slow.path == "sparse" and slow.choice.speculate is True and "speculating" in slow.reason


def runner_cfg(budget):
    from engine_client.reprefill import ReprefillConfig

    return ReprefillConfig().replace(budget=budget)


def test_bad_arguments_are_one_line_and_change_nothing(runner):
    with pytest.raises(InvalidArgument, match="^profile: must be a compute_model.AcceleratorProfile"):
        runner.answer(PREFIX, SUFFIX, profile="h100")
    with pytest.raises(InvalidArgument, match="^cfg: must be a ReprefillConfig"):
        runner.answer(PREFIX, SUFFIX, "ckv", profile=SLOW_COMPUTE)
    no_disk = dataclasses.replace(SLOW_COMPUTE, disk_bytes_per_s=None)
    runner.store_prefix(PREFIX)
    ans = runner.answer(PREFIX, SUFFIX, profile=no_disk)  # loading paths not costed: recompute, and the reason says why
    assert ans.path == "recompute" and "not costed" in ans.reason
    assert runner.client.stats().num_prefixes == 1


# prices every path at next to nothing, the sparse path least: whatever the sparse path measures reprices it
UNDERPRICED = AcceleratorProfile("underpriced", 1e18, 1e16, 1e16, layer_overhead_s=1e-12, disk_bytes_per_s=1e18, period_overhead_s=1e-12)


def test_a_path_that_measured_dearer_than_predicted_is_repriced_for_the_next_request(runner):
    runner.store_prefix(PREFIX)
    cfg = runner_cfg(0.3)
    first = runner.answer(PREFIX, SUFFIX, cfg, profile=UNDERPRICED)
    assert first.path == "sparse" and first.choice.predicted == first.choice.modelled
    # the TTFT it measured, over the profile's price, is the sparse path's price from now on (the price
    # itself moves a little: the state the first request fetched is resident for the second)
    second = runner.answer(PREFIX, SUFFIX, cfg, profile=UNDERPRICED)
    assert second.choice.predicted["sparse"] == pytest.approx(first.ttft_s, rel=1e-2)
    assert second.path != "sparse" and "sparse: " in second.reason and "measured" in second.reason
    third = runner.answer(PREFIX, SUFFIX, cfg, profile=SLOW_COMPUTE)  # another profile: its own prices
    assert third.choice.predicted == third.choice.modelled


def test_a_prefix_known_stored_is_not_looked_up_again_and_one_gone_is_found_out(runner):
    lookups = []
    real = runner.client.lookup
    runner.client.lookup = lambda *a, **k: lookups.append(1) or real(*a, **k)  # counts the round trips, answers as the daemon does
    handle = runner.store_prefix(PREFIX)
    lookups.clear()
    first = runner.answer(PREFIX, SUFFIX, runner_cfg(0.3), profile=SLOW_COMPUTE)
    second = runner.answer(PREFIX, SUFFIX, runner_cfg(0.3), profile=SLOW_COMPUTE)
    assert len(lookups) == 1 and first.path == second.path == "sparse"
    assert torch.equal(first.logits, second.logits)
    lookups.clear()
    runner.answer(torch.arange(7, 307), SUFFIX, profile=SLOW_COMPUTE)  # another prefix: its own look-up (not stored: recomputed, stored)
    assert lookups
    # deleted behind the runner's back: the load finds it gone, the request is looked up again and recomputed
    runner.client.delete(handle.prefix_id)
    lookups.clear()
    again = runner.answer(PREFIX, SUFFIX, runner_cfg(0.3), profile=SLOW_COMPUTE)
    assert lookups and again.path == "recompute" and "not stored" in again.reason
    assert again.prefix is not None and again.prefix.prefix_id == handle.prefix_id  # stored again, known again
    lookups.clear()
    assert runner.answer(PREFIX, SUFFIX, runner_cfg(0.3), profile=SLOW_COMPUTE).path == "sparse" and not lookups


def test_the_stored_prefixes_keep_the_newest_and_key_by_runner(runner):
    from engine_client.reprefill.choice import StoredPrefixes

    known = StoredPrefixes(limit=2)
    keys = [known.key(runner, torch.arange(i, i + 40)) for i in range(3)]
    assert len(set(keys)) == 3 and known.key(runner, torch.arange(0, 40)) == keys[0]
    for i, k in enumerate(keys):
        known.add(k, f"id{i}")
    assert [known.get(k) for k in keys] == [None, "id1", "id2"]
    known.forget(keys[1])
    assert known.get(keys[1]) is None
    runner.namespace = "other"  # another namespace: other keys for the same tokens
    assert known.key(runner, torch.arange(0, 40)) != keys[0]
