"""The daemon's tier manager over a real arena and a host-memory GPU stand-in."""

import numpy as np
import pytest

from kvstore.scores import ScoreTable
from kvstore.server.arena import Arena
from kvstore.server.tiers import TIER_SLOT, HostMemory, TierManager, gpu_memory

EXTENT = 3 * TIER_SLOT - 100  # an extent that is not a slot multiple


def data(i: int, n: int = EXTENT) -> np.ndarray:
    return np.full(n, i % 251, np.uint8)


def manager(cpu_units: int, gpu_units: int = 0, policy: str = "score", scores=None):
    slot = 3 * TIER_SLOT
    arena = Arena((cpu_units + 2) * slot, TIER_SLOT, tier_bytes=cpu_units * slot)
    gpu = HostMemory(gpu_units * slot) if gpu_units else None
    return TierManager(arena, scores if scores is not None else ScoreTable(), policy=policy, gpu=gpu), arena


def unit(i: int):
    return (1, i, 0)


def content(t: TierManager, u) -> np.ndarray:
    res = t.where(u)
    if res.tier == "cpu":
        return t.cpu_view(res).copy()
    out = np.empty(res.length, np.uint8)
    t.read_gpu(res, out)
    return out


def test_admitted_bytes_are_read_back_in_place_and_capacity_holds():
    t, arena = manager(cpu_units=4, policy="lru")
    for i in range(10):
        res = t.admit(unit(i), data(i))
        assert res is not None and res.tier == "cpu"
        np.testing.assert_array_equal(content(t, unit(i)), data(i))
        assert arena.tier_offset <= res.offset and res.offset + res.length <= arena.nbytes
        t.unpin([unit(i)])
        assert t.used("cpu") <= t.capacity("cpu")
    assert len(t) == 4 and [t.where(unit(i)) is not None for i in range(10)] == [False] * 6 + [True] * 4


def test_pinned_units_are_never_evicted_or_overwritten():
    t, _ = manager(cpu_units=3, policy="lru")
    for i in range(3):
        t.admit(unit(i), data(i))  # pinned, never unpinned
    assert t.admit(unit(9), data(9)) is None  # no room that is not pinned
    for i in range(3):
        np.testing.assert_array_equal(content(t, unit(i)), data(i))
    t.unpin([unit(1)])
    assert t.admit(unit(9), data(9)) is not None
    assert t.where(unit(1)) is None and t.pinned_units() == 3


def test_score_policy_keeps_high_attention_units_out_of_reach_of_cold_ones():
    scores = ScoreTable()
    t, _ = manager(cpu_units=2, policy="score", scores=scores)
    for i in range(2):
        scores.add_access([unit(i)])
        scores.add_attention([unit(i)], [5.0])
        t.admit(unit(i), data(i))
        t.unpin([unit(i)])
    scores.add_access([unit(7)])  # I = 0: S = 0 beats nothing
    assert t.admit(unit(7), data(7)) is None
    scores.add_attention([unit(7)], [50.0])
    scores.add_access([unit(7)])
    assert t.admit(unit(7), data(7)) is not None
    assert {u for u in map(unit, range(2)) if t.where(u)} in ({unit(0)}, {unit(1)})


def test_gpu_tier_first_then_demotion_to_cpu_by_score():
    scores = ScoreTable()
    t, _ = manager(cpu_units=2, gpu_units=1, policy="score", scores=scores)
    scores.add_access([unit(0)])
    scores.add_attention([unit(0)], [1.0])
    assert t.admit(unit(0), data(0)).tier == "gpu"
    t.unpin([unit(0)])
    scores.add_access([unit(1)])
    scores.add_attention([unit(1)], [9.0])
    assert t.admit(unit(1), data(1)).tier == "gpu"  # beats unit 0, which drops to the CPU tier
    assert t.where(unit(0)).tier == "cpu"
    np.testing.assert_array_equal(content(t, unit(0)), data(0))
    np.testing.assert_array_equal(content(t, unit(1)), data(1))


def test_gpu_memory_selection():
    assert gpu_memory(0, "host") is None
    assert isinstance(gpu_memory(1 << 20, "host"), HostMemory)
    try:
        import torch

        cuda = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        cuda = False
    if not cuda:
        assert gpu_memory(1 << 20, "auto") is None
        with pytest.raises(RuntimeError):
            gpu_memory(1 << 20, "cuda")


@pytest.mark.gpu
def test_cuda_tier_roundtrip():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    mem = gpu_memory(1 << 20, "cuda")
    src = np.arange(5000, dtype=np.uint8)
    mem.write(8192, src)
    out = np.empty_like(src)
    mem.read(8192, src.size, out)
    np.testing.assert_array_equal(out, src)
