"""MiniCache-style merge of two layers' KV into one shared form, and its restoration.

Both layers' KV ``[2, heads, tokens, d]`` (K and V at the same positions)
are split per vector into a magnitude ``|x|`` and a direction ``x / |x|``.
A merged token stores one direction, ``SLERP(dir_a, dir_b, t)`` (spherical
interpolation on the unit sphere: the angle ``theta`` between the two is
cut at ``t``), and both layers' magnitudes; restoring scales the merged
direction by each layer's magnitude, so every restored vector keeps its
original length and is off by an angle of ``t x theta`` (layer a) or
``(1 - t) x theta`` (layer b).

Retention: a token is kept unmerged, both layers' original K and V, when
the angle between the layers' vectors exceeds ``retain_threshold`` (radians)
for **any** of its vectors (K or V, any head).  One decision per token keeps
one index list for the pair, the same for K and V and every head, and it
bounds the angular error of every merged vector by the threshold.

Edge cases: a zero vector takes the other layer's direction (its magnitude
0 restores it exactly, and the angle counts as 0); directions closer than
``1e-6`` rad fall back to the normalized linear interpolation (SLERP's
``sin(theta)`` divisor vanishes); opposite directions (within ``1e-6`` rad of
pi, reachable only with a threshold near pi) take layer a's direction when
``t <= 0.5``, else layer b's.  The arithmetic runs in float64; directions are
stored in the KV dtype, magnitudes in float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvstore.contract import InvalidArgument

from ._checks import check_real, check_tensor

_PARALLEL_SIN = 1e-6  # below this sin(theta) SLERP divides by ~0: interpolate linearly instead


@dataclass(frozen=True)
class MergedPair:
    """The shared form of two layers' KV (``merge_pair``).

    The ``m`` merged tokens are the ones not in ``retained``, ascending.
    """

    direction: torch.Tensor  # [2, heads, m, d] unit merged directions (K, V), KV dtype
    magnitude_a: torch.Tensor  # [2, heads, m] float32, layer a's vector lengths
    magnitude_b: torch.Tensor  # [2, heads, m] float32, layer b's
    retained: torch.Tensor  # [r] int64 ascending token indices kept unmerged
    retained_a: torch.Tensor  # [2, heads, r, d] layer a's original K, V at those tokens
    retained_b: torch.Tensor  # [2, heads, r, d] layer b's
    num_tokens: int
    t: float
    retain_threshold: float

    @property
    def merged_tokens(self) -> torch.Tensor:
        """Indices of the merged tokens, ``[m]`` int64 ascending."""
        keep = torch.ones(self.num_tokens, dtype=torch.bool)
        keep[self.retained] = False
        return keep.nonzero().flatten()

    @property
    def nbytes(self) -> int:
        """Bytes of the merged form: directions once, both magnitudes, retained indices and vectors."""
        parts = (self.direction, self.magnitude_a, self.magnitude_b, self.retained, self.retained_a, self.retained_b)
        return sum(p.numel() * p.element_size() for p in parts)

    @property
    def raw_nbytes(self) -> int:
        """Bytes of the two layers' KV as they were: ``2 x [2, heads, tokens, d]`` in the KV dtype."""
        two, heads, _, d = self.retained_a.shape
        return 2 * two * heads * self.num_tokens * d * self.direction.element_size()


def _unit(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(magnitude [...], direction [..., d])`` of the vectors ``x [..., d]``; a zero vector's direction is 0."""
    norm = x.norm(dim=-1)
    return norm, x / norm.clamp(min=torch.finfo(x.dtype).tiny).unsqueeze(-1)


def angle(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Angle in radians between the unit vectors ``u``, ``v`` ``[..., d]``: ``2 atan2(|u - v|, |u + v|)``, stable near 0 and pi."""
    return 2 * torch.atan2((u - v).norm(dim=-1), (u + v).norm(dim=-1))


def slerp(u: torch.Tensor, v: torch.Tensor, t: float) -> torch.Tensor:
    """Spherical interpolation from the unit vectors ``u`` (``t = 0``) to ``v`` (``t = 1``), ``[..., d]`` (module docstring)."""
    theta = angle(u, v).unsqueeze(-1)
    sin = torch.sin(theta)
    spherical = (torch.sin((1 - t) * theta) * u + torch.sin(t * theta) * v) / sin.clamp(min=_PARALLEL_SIN)
    linear = (1 - t) * u + t * v
    opposite = u if t <= 0.5 else v
    near = sin < _PARALLEL_SIN
    out = torch.where(near & (theta < math.pi / 2), linear, spherical)
    out = torch.where(near & (theta >= math.pi / 2), opposite, out)
    return _unit(out)[1]


def _check_pair(kv_a: object, kv_b: object) -> tuple[torch.Tensor, torch.Tensor]:
    kv_a = check_tensor("kv_a", kv_a, 4)
    kv_b = check_tensor("kv_b", kv_b, 4)
    if kv_a.shape[0] != 2 or 0 in kv_a.shape:
        raise InvalidArgument("kv_a", f"expected [2, heads, tokens, d] with every size >= 1, got {tuple(kv_a.shape)}")
    if kv_b.shape != kv_a.shape or kv_b.dtype != kv_a.dtype:
        raise InvalidArgument("kv_b", f"expected {tuple(kv_a.shape)} {kv_a.dtype} like kv_a, got {tuple(kv_b.shape)} {kv_b.dtype}")
    return kv_a, kv_b


def merge_pair(kv_a: torch.Tensor, kv_b: torch.Tensor, *, t: float = 0.5, retain_threshold: float) -> MergedPair:
    """Merge two layers' KV ``[2, heads, tokens, d]`` (module docstring); ``retain_threshold`` in radians, ``[0, pi]``."""
    kv_a, kv_b = _check_pair(kv_a, kv_b)
    t = check_real("t", t, 0.0, 1.0)
    retain_threshold = check_real("retain_threshold", retain_threshold, 0.0, math.pi)
    mag_a, dir_a = _unit(kv_a.double())  # [2, heads, n], [2, heads, n, d]
    mag_b, dir_b = _unit(kv_b.double())
    dir_a, dir_b = torch.where((mag_a > 0).unsqueeze(-1), dir_a, dir_b), torch.where((mag_b > 0).unsqueeze(-1), dir_b, dir_a)
    theta = angle(dir_a, dir_b)  # [2, heads, n]
    retain = (theta > retain_threshold).flatten(0, 1).any(dim=0)  # [n]: any of the token's K, V vectors in any head
    retained = retain.nonzero().flatten()
    merged = (~retain).nonzero().flatten()
    return MergedPair(
        direction=slerp(dir_a[:, :, merged], dir_b[:, :, merged], t).to(kv_a.dtype),
        magnitude_a=mag_a[:, :, merged].float(),
        magnitude_b=mag_b[:, :, merged].float(),
        retained=retained,
        retained_a=kv_a[:, :, retained].clone(),
        retained_b=kv_b[:, :, retained].clone(),
        num_tokens=int(kv_a.shape[2]),
        t=t,
        retain_threshold=retain_threshold,
    )


def restore(merged: MergedPair) -> tuple[torch.Tensor, torch.Tensor]:
    """Both layers' KV ``[2, heads, tokens, d]`` in the KV dtype: retained tokens exactly, merged ones rescaled."""
    if not isinstance(merged, MergedPair):
        raise InvalidArgument("merged", f"must be a MergedPair, got {type(merged).__name__}")
    two, heads, _, d = merged.retained_a.shape
    direction = merged.direction.float()  # [2, heads, m, d]
    tokens = merged.merged_tokens
    out = []
    for magnitude, retained in ((merged.magnitude_a, merged.retained_a), (merged.magnitude_b, merged.retained_b)):
        kv = torch.empty(two, heads, merged.num_tokens, d, dtype=merged.direction.dtype)
        kv[:, :, tokens] = (magnitude.unsqueeze(-1) * direction).to(kv.dtype)
        kv[:, :, merged.retained] = retained
        out.append(kv)
    return out[0], out[1]
