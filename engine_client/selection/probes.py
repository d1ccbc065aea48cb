"""Probe keys quantized to a few bits, kept resident by the client between requests.

Exact selection scores a layer's chunks with that layer's stored keys (the
probe keys): every key of the prefix, half of its KV bytes when every layer
selects.  Fetched per request, they would cost far more I/O than the 5% of
KV the selection loads.  Quantized per token and KV head (symmetric absmax,
``bits`` in {4, 8}) they are small enough to keep next to the key summaries:
at 4 bits a token's 64-dim key takes 32 bytes plus a 4-byte scale, against
512 bytes of float32 key and value (7%; 14% of a bfloat16 KV), fetched
once per prefix.

Measured on SmolLM2-135M (``python -m kvstore_tools.selection_study``, NIAH, 4096
tokens, ten tuning prompts, every layer selecting with ``follow=1`` at 5%):
4-bit probes kept the answer in 10 of 10, as the exact keys did; the min/max
summaries kept 3, a 16-of-64-channel subset 6.

The format is the store's (``kvstore.contract.probes``): a prefix stored with
``StoreGeometry.probe_bits`` hands its probe keys over already packed, and
``QuantizedKeys.from_packed`` takes them as they come.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kvstore.contract import InvalidArgument
from kvstore.contract.geometry import PROBE_BITS  # 0: full-precision probe keys fetched at every Period
from kvstore.contract.probes import quantize_probe_keys, unpack_probe_rows


def check_probe_bits(bits: object) -> int:
    if isinstance(bits, bool) or bits not in PROBE_BITS:
        raise InvalidArgument("probe_bits", f"must be one of {', '.join(map(str, PROBE_BITS))}, got {bits!r}")
    return int(bits)


# byte -> its two offset-binary 4-bit codes as signed values, low nibble first: [256, 2] float32
_BYTES = torch.arange(256, dtype=torch.int16)
_NIBBLES = torch.stack([(_BYTES & 0x0F) - 8, (_BYTES >> 4) - 8], dim=-1).to(torch.float32)
_NIBBLES_ON: dict[torch.device, torch.Tensor] = {torch.device("cpu"): _NIBBLES}


def _nibbles(device: torch.device) -> torch.Tensor:
    """The nibble table on ``device``, copied there once."""
    if device not in _NIBBLES_ON:
        _NIBBLES_ON[device] = _NIBBLES.to(device)
    return _NIBBLES_ON[device]


@dataclass(frozen=True)
class QuantizedKeys:
    """``[Hkv, n, d]`` keys as signed ``bits``-bit codes (two 4-bit codes per byte) and one scale per token and head."""

    codes: torch.Tensor  # uint8 [Hkv, n, d * bits // 8]
    scales: torch.Tensor  # float32 [Hkv, n, 1] (float16 would lose precision on small keys)
    bits: int
    head_dim: int

    @property
    def nbytes(self) -> int:
        return self.codes.numel() * self.codes.element_size() + self.scales.numel() * self.scales.element_size()

    @classmethod
    def from_packed(cls, rows: np.ndarray, bits: int, head_dim: int, device: torch.device | str = "cpu") -> QuantizedKeys:
        """Keys as a quantized probe region stores them: rows ``[Hkv, n, d * bits // 8 + 4]`` uint8, kept on ``device``."""
        codes, scales = unpack_probe_rows(rows, bits, head_dim)
        return cls(torch.from_numpy(codes).to(device), torch.from_numpy(scales).to(device), bits, head_dim)

    def to(self, device: torch.device | str) -> QuantizedKeys:
        """The same keys with codes and scales on ``device``."""
        return QuantizedKeys(self.codes.to(device), self.scales.to(device), self.bits, self.head_dim)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The keys the codes stand for: ``[Hkv, n, d]``, on the codes' device."""
        if self.bits == 8:
            q = self.codes.view(torch.int8).to(torch.float32)
        else:  # one table lookup per byte gives both of its codes (4x faster than unpacking with shifts, measured)
            table = _nibbles(self.codes.device)
            q = torch.nn.functional.embedding(self.codes.to(torch.int32), table).flatten(-2)  # [Hkv, n, d] in [-8, 7]
        return (q * self.scales).to(dtype)


def quantize_keys(keys: torch.Tensor, bits: int) -> QuantizedKeys:
    """Symmetric absmax quantization of ``keys [Hkv, n, d]`` per (head, token).

    Every element is within half a step (``scale / 2``) of its key, the step
    being the row's largest magnitude over ``2**(bits-1) - 1``.  The codes
    are ``kvstore.contract.probes``' (the store's), on the device of ``keys``.
    """
    if keys.dim() != 3:
        raise InvalidArgument("probe_keys", f"expected [kv_heads, tokens, even head_dim], got {tuple(keys.shape)}")
    codes, scales = quantize_probe_keys(keys.detach().to(device="cpu", dtype=torch.float32).numpy(), bits)
    return QuantizedKeys(torch.from_numpy(codes).to(keys.device), torch.from_numpy(scales).to(keys.device), bits, keys.shape[-1])
