"""MiniCache-style layer-pair merge: what restores exactly, what is bounded, and what it stores."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_client.krul import merge_pair, restore
from engine_client.krul.merge import angle, slerp
from kvstore.contract import InvalidArgument


def pair(heads: int, tokens: int, d: int, noise: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer a's KV ``[2, heads, tokens, d]`` and layer b's: a plus ``noise`` x Gaussian, each token's noise scaled differently."""
    gen = torch.Generator().manual_seed(seed)
    kv_a = torch.randn(2, heads, tokens, d, generator=gen) * 3
    scale = torch.rand(1, 1, tokens, 1, generator=gen) * noise
    return kv_a, kv_a + scale * torch.randn(2, heads, tokens, d, generator=gen) * 3


def angles(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Angle between the vectors of ``x`` and ``y`` ``[..., d]`` in float64."""
    x, y = x.double(), y.double()
    return angle(x / x.norm(dim=-1, keepdim=True), y / y.norm(dim=-1, keepdim=True))


def test_identical_layers_restore_exactly_in_about_half_the_bytes():
    kv, _ = pair(heads=3, tokens=40, d=64, noise=0.0, seed=0)
    merged = merge_pair(kv, kv.clone(), retain_threshold=0.0)
    assert merged.retained.numel() == 0
    a, b = restore(merged)
    torch.testing.assert_close(a, kv, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(b, kv, rtol=1e-6, atol=1e-6)
    raw = 2 * kv.numel() * 4
    # one float32 direction per vector plus two float32 magnitudes: (d + 2) / (2 d) of the raw bytes
    assert merged.raw_nbytes == raw
    assert merged.nbytes == kv.numel() * 4 + 2 * (kv.numel() // 64) * 4
    assert merged.nbytes / raw == pytest.approx((64 + 2) / 128)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    heads=st.integers(1, 3),
    tokens=st.integers(1, 33),
    d=st.sampled_from([1, 2, 4, 16]),
    noise=st.floats(0.0, 2.0),
    threshold=st.floats(0.0, math.pi),
    t=st.floats(0.0, 1.0),
)
def test_retained_tokens_exact_merged_ones_bounded_and_lengths_kept(seed, heads, tokens, d, noise, threshold, t):
    kv_a, kv_b = pair(heads, tokens, d, noise, seed)
    merged = merge_pair(kv_a, kv_b, t=t, retain_threshold=threshold)
    a, b = restore(merged)
    kept, mixed = merged.retained, merged.merged_tokens
    assert sorted(kept.tolist() + mixed.tolist()) == list(range(tokens))
    assert torch.equal(a[:, :, kept], kv_a[:, :, kept]) and torch.equal(b[:, :, kept], kv_b[:, :, kept])
    # the rule: a token is kept when any of its K, V vectors in any head turns by more than the threshold
    theta = angles(kv_a, kv_b)  # [2, heads, tokens]
    assert (theta[:, :, kept] > threshold).flatten(0, 1).any(0).all()
    assert (theta[:, :, mixed] <= threshold + 1e-9).all()
    # every restored vector keeps its length, and turns by t (a) or 1 - t (b) of the pair's angle at most
    torch.testing.assert_close(a.norm(dim=-1), kv_a.norm(dim=-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b.norm(dim=-1), kv_b.norm(dim=-1), rtol=1e-5, atol=1e-5)
    assert (angles(a, kv_a)[:, :, mixed] <= t * theta[:, :, mixed] + 1e-3).all()
    assert (angles(b, kv_b)[:, :, mixed] <= (1 - t) * theta[:, :, mixed] + 1e-3).all()
    assert (angles(a, kv_a)[:, :, mixed] <= threshold + 1e-3).all()


def test_slerp_endpoints_give_each_layer_its_own_direction():
    kv_a, kv_b = pair(heads=2, tokens=20, d=8, noise=0.5, seed=4)
    for t, exact in ((0.0, 0), (1.0, 1)):
        merged = merge_pair(kv_a, kv_b, t=t, retain_threshold=math.pi)
        assert merged.retained.numel() == 0
        restored = restore(merged)
        torch.testing.assert_close(restored[exact], (kv_a, kv_b)[exact], rtol=1e-5, atol=1e-5)
        assert angles(restored[1 - exact], (kv_a, kv_b)[1 - exact]).max() > 0.1  # the other layer took its partner's


def test_slerp_halfway_is_a_unit_vector_at_equal_angles():
    gen = torch.Generator().manual_seed(1)
    u, v = (x / x.norm(dim=-1, keepdim=True) for x in torch.randn(2, 50, 16, generator=gen, dtype=torch.float64))
    mid = slerp(u, v, 0.5)
    torch.testing.assert_close(mid.norm(dim=-1), torch.ones(50, dtype=torch.float64))
    torch.testing.assert_close(angle(u, mid), angle(v, mid))
    torch.testing.assert_close(angle(u, mid), angle(u, v) / 2)
    third = slerp(u, v, 1 / 3)  # along the arc, not the chord: the angle splits in the same proportion
    torch.testing.assert_close(angle(u, third), angle(u, v) / 3)


def test_zero_near_parallel_and_opposite_vectors_stay_finite():
    kv_a, kv_b = pair(heads=1, tokens=6, d=4, noise=0.0, seed=2)
    kv_b = kv_b.clone()
    kv_a[0, 0, 0] = 0.0  # a zero key in layer a: b keeps its own direction
    kv_a[1, 0, 1] = kv_b[1, 0, 1] = 0.0  # both zero
    kv_b[0, 0, 2] = kv_a[0, 0, 2] * (1 + 1e-7) + 1e-9  # near-parallel
    kv_b[0, 0, 3] = -kv_a[0, 0, 3]  # opposite: merged only under a threshold of pi
    merged = merge_pair(kv_a, kv_b, retain_threshold=math.pi)
    assert merged.retained.numel() == 0
    a, b = restore(merged)
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    assert torch.equal(a[0, 0, 0], torch.zeros(4)) and torch.equal(a[1, 0, 1], torch.zeros(4)) and torch.equal(b[1, 0, 1], torch.zeros(4))
    torch.testing.assert_close(b[0, 0, 0], kv_b[0, 0, 0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(a[0, 0, 2], kv_a[0, 0, 2], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(a[0, 0, 3], kv_a[0, 0, 3], rtol=1e-6, atol=1e-6)  # t = 0.5 keeps layer a's side
    assert merge_pair(kv_a, kv_b, retain_threshold=1.0).retained.tolist() == [3]  # a zero vector does not disagree


def test_half_precision_keeps_its_dtype_and_lengths():
    kv_a, kv_b = (x.to(torch.bfloat16) for x in pair(heads=2, tokens=16, d=32, noise=0.2, seed=5))
    merged = merge_pair(kv_a, kv_b, retain_threshold=0.3)
    a, b = restore(merged)
    assert a.dtype == b.dtype == merged.direction.dtype == torch.bfloat16
    assert merged.magnitude_a.dtype == torch.float32
    assert merged.raw_nbytes == 2 * kv_a.numel() * 2
    torch.testing.assert_close(a.float().norm(dim=-1), kv_a.float().norm(dim=-1), rtol=1e-2, atol=1e-2)
    kept = merged.retained
    assert torch.equal(a[:, :, kept], kv_a[:, :, kept]) and torch.equal(b[:, :, kept], kv_b[:, :, kept])


@pytest.mark.parametrize(
    "args,field",
    [
        ((torch.zeros(2, 1, 3, 4), torch.zeros(2, 1, 4, 4)), "kv_b"),
        ((torch.zeros(3, 1, 3, 4), torch.zeros(3, 1, 3, 4)), "kv_a"),
        ((torch.zeros(2, 1, 3, 4), torch.zeros(2, 1, 3, 4, dtype=torch.float64)), "kv_b"),
        ((torch.zeros(2, 3, 4), torch.zeros(2, 3, 4)), "kv_a"),
        ((torch.full((2, 1, 3, 4), float("inf")), torch.zeros(2, 1, 3, 4)), "kv_a"),
    ],
)
def test_bad_kv_names_its_field(args, field):
    with pytest.raises(InvalidArgument, match=f"^{field}: "):
        merge_pair(*args, retain_threshold=0.5)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"t": 1.5, "retain_threshold": 0.5}, "t"),
        ({"retain_threshold": 4.0}, "retain_threshold"),
        ({"retain_threshold": -0.1}, "retain_threshold"),
    ],
)
def test_bad_parameters_name_their_field(kwargs, field):
    kv = torch.ones(2, 1, 3, 4)
    with pytest.raises(InvalidArgument, match=f"^{field}: "):
        merge_pair(kv, kv, **kwargs)
