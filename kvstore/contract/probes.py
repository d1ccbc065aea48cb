"""Quantized probe keys: the one format the store writes and the client scores with.

Symmetric absmax per (KV head, token): the row's scale is its largest
magnitude over ``qmax = 2**(bits-1) - 1`` (float32), each code
``round_half_even(k / scale)`` clamped to ``[-qmax, qmax]``, so every key is
within ``scale / 2`` of its code times the scale.  8 bits: int8 two's
complement, one code per byte.  4 bits: offset binary (``code + 8``, in
``[1, 15]``), two codes per byte, the even channel in the low nibble.

Packed, a row is ``[codes (d * bits / 8 bytes) | scale (float32 little-endian)]``:
a group's probe keys are ``[kv_heads, tokens, row_bytes]`` uint8, sliced by
token as the full-precision keys are (``StoreGeometry.probe_bits``).  The
daemon writes its segments' probe regions with ``quantize_probe_rows``; the
client quantizes with ``quantize_probe_keys`` too (``engine_client.selection.probes``),
so keys quantized on either side are the same bytes.
"""

from __future__ import annotations

import numpy as np

from .errors import InvalidArgument
from .geometry import PROBE_SCALE_BYTES, quantized_row_bytes

QUANTIZED_BITS = (4, 8)
_SCALE_DTYPE = np.dtype("<f4")
_TINY = np.finfo(np.float32).tiny


def _check_bits(bits) -> int:
    if isinstance(bits, bool) or bits not in QUANTIZED_BITS:
        raise InvalidArgument("probe_bits", f"keys quantize to 4 or 8 bits, got {bits!r}")
    return int(bits)


def quantize_probe_keys(keys: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """``keys [Hkv, n, d]`` (float32, or any float widening to it exactly) ->
    ``(codes uint8 [Hkv, n, d * bits // 8], scales float32 [Hkv, n, 1])``."""
    bits = _check_bits(bits)
    if keys.ndim != 3 or (bits == 4 and keys.shape[-1] % 2):
        raise InvalidArgument("probe_keys", f"expected [kv_heads, tokens, {'even ' if bits == 4 else ''}head_dim], got {keys.shape}")
    k = np.asarray(keys, dtype=np.float32)
    qmax = 2 ** (bits - 1) - 1
    scales = np.abs(k).max(axis=-1, keepdims=True, initial=np.float32(0)) / np.float32(qmax)  # [Hkv, n, 1]
    q = np.clip(np.rint(k / np.maximum(scales, _TINY)), -qmax, qmax).astype(np.int16)
    if bits == 8:
        codes = q.astype(np.int8).view(np.uint8)
    else:
        u = (q + 8).astype(np.uint8)  # [-7, 7] -> [1, 15]
        codes = u[..., 0::2] | (u[..., 1::2] << 4)
    return np.ascontiguousarray(codes), scales.astype(np.float32, copy=False)


def pack_probe_rows(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """``[Hkv, n, code_bytes]`` uint8 and ``[Hkv, n, 1]`` float32 -> rows ``[Hkv, n, code_bytes + 4]`` uint8."""
    scale_bytes = np.ascontiguousarray(scales, dtype=_SCALE_DTYPE).view(np.uint8)  # [Hkv, n, 4]
    return np.concatenate([codes, scale_bytes], axis=-1)


def quantize_probe_rows(keys: np.ndarray, bits: int) -> np.ndarray:
    """``keys [Hkv, n, d]`` as packed rows ``[Hkv, n, row_bytes]`` uint8 (what a quantized probe region holds)."""
    return pack_probe_rows(*quantize_probe_keys(keys, bits))


def unpack_probe_rows(rows: np.ndarray, bits: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Packed rows ``[Hkv, n, row_bytes]`` uint8 -> ``(codes [Hkv, n, d * bits // 8], scales float32 [Hkv, n, 1])``, copies."""
    bits = _check_bits(bits)
    row_bytes = quantized_row_bytes(head_dim, bits)
    if rows.dtype != np.uint8 or rows.ndim != 3 or rows.shape[-1] != row_bytes:
        raise InvalidArgument(
            "probe_keys", f"expected packed {bits}-bit rows [kv_heads, tokens, {row_bytes}] uint8, got {rows.shape} {rows.dtype}"
        )
    code_bytes = row_bytes - PROBE_SCALE_BYTES
    codes = np.ascontiguousarray(rows[..., :code_bytes])
    scales = np.ascontiguousarray(rows[..., code_bytes:]).view(_SCALE_DTYPE).astype(np.float32)  # [Hkv, n, 1]
    return codes, scales


def dequantize_probe_rows(rows: np.ndarray, bits: int, head_dim: int) -> np.ndarray:
    """The keys packed rows stand for: ``[Hkv, n, d]`` float32 (the client's torch ``dequantize`` is the fast one)."""
    codes, scales = unpack_probe_rows(rows, bits, head_dim)
    if bits == 8:
        q = codes.view(np.int8).astype(np.float32)
    else:
        q = np.stack([(codes & 0x0F).astype(np.float32) - 8, (codes >> 4).astype(np.float32) - 8], axis=-1)
        q = q.reshape(*codes.shape[:-1], head_dim)
    return q * scales
