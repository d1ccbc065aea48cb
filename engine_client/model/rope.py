"""RoPE for the decoder: the cos/sin tables of one base, and a request's positions checked once on the host.

``Decoder.position_range`` makes ``Positions``; every layer call given them reads nothing back from the
device and looks the request's RoPE rows up once per table (``Positions.rope``), not once per layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

ROPE_PREALLOC_POSITIONS = 65536  # rows each table starts with (up to the model's max_position_embeddings)


@dataclass(frozen=True)
class Positions:
    """Positions ``start .. start + count - 1``: ``tensor [count]`` int64 on the model's device, the bounds on the host.

    Made by ``Decoder.position_range``, which checks them and sizes the RoPE tables once; the layer calls
    take them in place of a positions tensor and then read nothing back from the device."""

    tensor: torch.Tensor
    start: int
    count: int
    # cos, sin per (RoPE table, dtype): looked up by the first layer that asks, reused by every other layer
    rope: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def top(self) -> int:
        return self.start + self.count - 1


class RopeTable:
    """cos/sin ``[P, d]`` float32 of one RoPE base, grown on demand."""

    def __init__(self, theta: float, head_dim: int, num_positions: int, device):
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))  # [d/2]
        self.cos = self.sin = torch.empty(0, head_dim, device=device)
        self.grow(num_positions)

    def grow(self, num_positions: int) -> None:
        t = torch.arange(num_positions, device=self.inv_freq.device, dtype=torch.float32)
        freqs = torch.outer(t, self.inv_freq)  # [P, d/2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [P, d]
        self.cos, self.sin = emb.cos(), emb.sin()

    def reserve(self, top: int) -> None:
        """Room for positions up to ``top``."""
        if top >= self.cos.shape[0]:
            self.grow(max(top + 1, 2 * self.cos.shape[0]))

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype, top: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of ``positions``; ``top``: their largest, when the caller knows it (nothing read back)."""
        if positions.numel():
            self.reserve(int(positions.max()) if top is None else top)
        return self.cos[positions].to(dtype), self.sin[positions].to(dtype)
