"""KV stored in 8 or 4 bits: one extent's quantized layout, its encoder and decoder (numpy, no I/O).

A geometry's ``kv_quant`` names the scheme (``KV_QUANT``); ``""`` stores
the KV dtype as it is.  Every scheme is asymmetric min/max quantization
with a float16 scale and zero point per group (``x ~ code * scale + zero``,
codes ``0 .. 2^bits - 1``), groups as KIVI and QServe choose them:

* **keys** per channel: one group per (head, channel) over the chunk's
  tokens (outlier channels get their own range), or with a name ending in
  ``t`` per token like the values (smaller, since a 16-token chunk is a
  short group for per-channel parameters);
* **values** per token: one group per (head, token, ``value_group``
  channels), ``value_group`` 64 when it divides ``head_dim``, else
  ``head_dim``;
* with a name ending in ``h`` (``kv8h``, ``kv4h``) keys and values per
  token as with ``t``, each token's head vector first rotated by a
  normalized Hadamard matrix (``rotation``, as QuaRot does before
  quantizing): an orthogonal map spreads an outlier channel's magnitude
  over all channels of its block, so a per-token group no longer spends
  its range on one channel.  The reader rotates back (the matrix is its
  own inverse).  The bytes are ``t``'s; only what the codes mean differs.

One layer of one extent is laid out, each part a C-contiguous array::

    K codes   [heads][tokens][dim]  uint8, 4-bit codes two to a byte (low nibble first)
    K scale   [heads][dim] float16, or [heads][tokens][dim / group] for per-token keys
    K zero    same shape as K scale
    V codes   [heads][tokens][dim]
    V scale   [heads][tokens][dim / group] float16
    V zero    same shape

and an extent is its layers one after the other.  The extent stays
chunk-local (a chunk decodes without any other), so selection, tiers,
checksums and read plans treat it as any extent; only its size differs
(``layer_bytes``).  The zero point is the group's minimum rounded down to
float16 and the scale its range over ``2^bits - 1`` rounded up, so every
value dequantizes within half a step (``scale / 2``) of itself, up to float32
arithmetic (``max_error`` gives the bound with ``2^-10 |x|`` of slack for
it); a reader in bfloat16 or float16 adds that dtype's own rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .errors import InvalidArgument

F16_MAX = float(np.finfo(np.float16).max)
PARAM_BYTES = 2  # float16 scale, float16 zero point
VALUE_GROUP = 64


@dataclass(frozen=True)
class Scheme:
    bits: int
    key_per_token: bool
    rotated: bool = False  # K and V rotated per token by ``rotation(dim)`` before quantizing


KV_QUANT = {
    "kv8": Scheme(8, False),
    "kv4": Scheme(4, False),
    "kv8t": Scheme(8, True),
    "kv4t": Scheme(4, True),
    "kv8h": Scheme(8, True, True),
    "kv4h": Scheme(4, True, True),
}


def check_name(name) -> str:
    """``name`` if it is "" or a scheme of ``KV_QUANT``, else InvalidArgument naming ``kv_quant``."""
    if not isinstance(name, str) or (name and name not in KV_QUANT):
        raise InvalidArgument("kv_quant", f"must be '' or one of {', '.join(KV_QUANT)}, got {name!r}")
    return name


def value_group(head_dim: int) -> int:
    return VALUE_GROUP if head_dim % VALUE_GROUP == 0 else head_dim


@lru_cache(maxsize=16)
def rotation(dim: int) -> np.ndarray:
    """The rotated schemes' ``[dim, dim]`` float32 matrix: block-diagonal normalized Hadamard (Sylvester),
    blocks of the largest power of two dividing ``dim``.  Symmetric and orthogonal, so its own inverse."""
    block = dim & -dim
    h = np.ones((1, 1), dtype=np.float64)
    while h.shape[0] < block:
        h = np.block([[h, h], [h, -h]])
    r = np.kron(np.eye(dim // block), h / np.sqrt(block)).astype(np.float32)
    r.setflags(write=False)
    return r


def rotate(x: np.ndarray) -> np.ndarray:
    """``x @ rotation(dim)`` on the last axis (float32), as a fast Walsh-Hadamard transform: adds and
    subtracts in a fixed order, so writer, daemon and reader get the same bits whatever the batch,
    strides or CPU (a BLAS product rounds differently per shape and kernel).

    A block of ``hi x lo`` channels is transformed over its high index bits, transposed, then over
    the low ones, so every add runs over ``lo`` or more contiguous floats: three times faster than
    butterflies on stride-2 pairs, and as fast as the float32 matmul, measured on 1.5 M values.
    """
    x = np.asarray(x, dtype=np.float32)
    dim = x.shape[-1]
    block = dim & -dim
    lo = 1 << ((block.bit_length() - 1) // 2)
    hi = block // lo
    a = np.array(x, dtype=np.float32, order="C").reshape(-1, hi, lo)
    a, b = _butterflies(a, np.empty_like(a), hi, lo)  # the channel index's high bits
    t = b.reshape(-1, lo, hi)
    t[...] = a.transpose(0, 2, 1)
    t, _ = _butterflies(t, a.reshape(-1, lo, hi), lo, hi)  # its low bits
    out = np.empty((t.shape[0], hi, lo), dtype=np.float32)
    np.multiply(t.transpose(0, 2, 1), np.float32(1 / np.sqrt(block)), out=out)
    return out.reshape(x.shape)


def _butterflies(src: np.ndarray, dst: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """The unnormalized Hadamard transform over axis 1 of ``[m, rows, cols]`` (``rows`` a power of two),
    ping-ponging between the two buffers: ``(result, the other buffer)``."""
    h = rows // 2
    while h >= 1:
        s = src.reshape(src.shape[0], rows // (2 * h), 2, h * cols)
        d = dst.reshape(s.shape)
        np.add(s[:, :, 0], s[:, :, 1], out=d[:, :, 0])
        np.subtract(s[:, :, 0], s[:, :, 1], out=d[:, :, 1])
        src, dst = dst, src
        h //= 2
    return src, dst


def layer_parts(name: str, heads: int, tokens: int, dim: int) -> list[tuple[str, tuple[int, ...], np.dtype]]:
    """The parts of one layer, in order: ``(name, shape, dtype)``; codes as uint8 bytes."""
    s = KV_QUANT[name]
    code_shape = (heads, tokens, dim * s.bits // 8)
    g = value_group(dim)
    token_params = (heads, tokens, dim // g)
    key_params = token_params if s.key_per_token else (heads, dim)
    f16, u8 = np.dtype(np.float16), np.dtype(np.uint8)
    return [
        ("k_codes", code_shape, u8),
        ("k_scale", key_params, f16),
        ("k_zero", key_params, f16),
        ("v_codes", code_shape, u8),
        ("v_scale", token_params, f16),
        ("v_zero", token_params, f16),
    ]


def layer_bytes(name: str, heads: int, tokens: int, dim: int) -> int:
    """Bytes of one layer's K and V over ``tokens`` tokens in scheme ``name``."""
    return sum(int(np.prod(shape)) * dt.itemsize for _, shape, dt in layer_parts(name, heads, tokens, dim))


def _grouped(x: np.ndarray, per_token: bool, dim: int) -> tuple[np.ndarray, int]:
    """``x [heads, tokens, dim]`` as groups on the last axis, and the axis to reduce for per-channel."""
    if per_token:
        g = value_group(dim)
        return x.reshape(x.shape[0], x.shape[1], dim // g, g), -1
    return x, 1  # per channel: reduce over tokens


def _quantize(x: np.ndarray, bits: int, per_token: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``x [heads, tokens, dim]`` float32 -> (codes [heads, tokens, dim] uint8, scale, zero float16)."""
    dim = x.shape[-1]
    grouped, axis = _grouped(x, per_token, dim)
    lo = grouped.min(axis=axis, keepdims=True)
    hi = grouped.max(axis=axis, keepdims=True)
    zero = lo.astype(np.float16)
    zero = np.where(zero.astype(np.float32) > lo, np.nextafter(zero, np.float16(-np.inf)), zero)  # round down
    levels = (1 << bits) - 1
    span = (hi - zero.astype(np.float32)) / levels
    scale = span.astype(np.float16)
    scale = np.where(scale.astype(np.float32) < span, np.nextafter(scale, np.float16(np.inf)), scale)  # round up
    scale = np.where(scale > 0, scale, np.float16(1.0))  # a constant group: every code 0
    codes = np.rint((grouped - zero.astype(np.float32)) / scale.astype(np.float32))
    codes = np.clip(codes, 0, levels).astype(np.uint8).reshape(x.shape)
    return codes, np.squeeze(scale, axis=axis), np.squeeze(zero, axis=axis)


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    flat = codes.reshape(codes.shape[0], codes.shape[1], -1)
    if bits == 8:
        return flat
    return flat[..., 0::2] | (flat[..., 1::2] << 4)


def _unpack(packed: np.ndarray, bits: int, dim: int) -> np.ndarray:
    """Codes ``[..., dim]`` from their packed bytes ``[..., dim * bits / 8]``."""
    if bits == 8:
        return packed
    out = np.empty(packed.shape[:-1] + (dim,), dtype=np.uint8)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = packed >> 4
    return out


def check_values(name: str, values: np.ndarray) -> np.ndarray:
    """``values`` as float32, or InvalidArgument naming ``kv`` if scheme ``name`` cannot hold them
    (not finite, or beyond half of float16's range, where a group's scale would overflow)."""
    x = np.asarray(values, dtype=np.float32)
    if not np.isfinite(x).all():
        raise InvalidArgument("kv", f"{name} stores finite values only")
    peak = float(np.abs(x).max()) if x.size else 0.0
    if KV_QUANT[name].rotated and x.size:
        block = x.shape[-1] & -x.shape[-1]  # a rotated value is at most sqrt(block) times the largest one
        if peak * np.sqrt(block) > F16_MAX / 2:  # only then is rotating worth its cost
            peak = max(peak, float(np.abs(rotate(x)).max()))
    if peak > F16_MAX / 2:
        raise InvalidArgument("kv", f"{name} stores values within +-{F16_MAX / 2:g} only, got {peak:g}")
    return x


def encode(name: str, extent: np.ndarray) -> np.ndarray:
    """``extent [layers, 2, heads, tokens, dim]`` float32 -> its quantized bytes (uint8, ``layers x layer_bytes``).

    Refuses (InvalidArgument naming ``kv``) values that are not finite or
    beyond float16's range, which the parameters could not hold.
    """
    s = KV_QUANT[name]
    x = check_values(name, extent)
    layers, _, heads, tokens, dim = x.shape
    if s.rotated:
        x = rotate(x)
    out = []
    for layer in range(layers):
        for kv, per_token in ((0, s.key_per_token), (1, True)):
            codes, scale, zero = _quantize(x[layer, kv], s.bits, per_token)
            out += [_pack(codes, s.bits).reshape(-1), scale.reshape(-1).view(np.uint8), zero.reshape(-1).view(np.uint8)]
    blob = np.concatenate(out) if out else np.zeros(0, dtype=np.uint8)
    assert blob.size == layers * layer_bytes(name, heads, tokens, dim)
    return blob


def decode(name: str, raw: np.ndarray, layers: int, heads: int, tokens: int, dim: int) -> np.ndarray:
    """The ``encode``d bytes back to ``[layers, 2, heads, tokens, dim]`` float32."""
    raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    return decode_many(name, raw.reshape(1, -1), layers, heads, tokens, dim)[:, :, :, 0]


def decode_many(name: str, raw: np.ndarray, layers: int, heads: int, tokens: int, dim: int, out: np.ndarray | None = None) -> np.ndarray:
    """``m`` extents of the same size at once: ``raw [m, extent bytes]`` uint8 ->
    ``[layers, 2, heads, m, tokens, dim]`` float32 (``out`` if given, any strides).

    Chunks sit next to each other on the token axis, so ``reshape(layers, 2,
    heads, m * tokens, dim)`` is the rows in order.  One numpy pass over all
    of them, written in place: decoding chunks one by one spends most of its
    time in per-call overhead (16-token extents are small), temporaries in
    copies.
    """
    s = KV_QUANT[name]
    parts = layer_parts(name, heads, tokens, dim)
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    expected = layers * layer_bytes(name, heads, tokens, dim)
    if raw.ndim != 2 or raw.shape[1] != expected:
        raise InvalidArgument("extent", f"{raw.shape[-1]} bytes, a {name} extent of {layers} layers x {tokens} tokens has {expected}")
    m = raw.shape[0]
    if out is None:
        out = np.empty((layers, 2, heads, m, tokens, dim), dtype=np.float32)
    g = value_group(dim)
    off = 0
    for layer in range(layers):
        arrays = {}
        for part, shape, dt in parts:
            n = int(np.prod(shape)) * dt.itemsize
            arrays[part] = raw[:, off : off + n].view(dt).reshape((m, *shape))
            off += n
        for kv, per_token, prefix in ((0, s.key_per_token, "k"), (1, True, "v")):
            codes = _unpack(arrays[f"{prefix}_codes"], s.bits, dim)  # [m, heads, tokens, dim]
            scale, zero = arrays[f"{prefix}_scale"].astype(np.float32), arrays[f"{prefix}_zero"].astype(np.float32)
            target = out[layer, kv].transpose(1, 0, 2, 3)  # [m, heads, tokens, dim], a view
            if not per_token:  # per channel: scale, zero [m, heads, dim]
                np.multiply(codes, scale[:, :, None, :], out=target)
                np.add(target, zero[:, :, None, :], out=target)
                continue
            for i in range(dim // g):  # per token: scale, zero [m, heads, tokens, dim / g]
                cols = target[..., i * g : (i + 1) * g]
                np.multiply(codes[..., i * g : (i + 1) * g], scale[..., i : i + 1], out=cols)
                np.add(cols, zero[..., i : i + 1], out=cols)
            if s.rotated:
                target[...] = rotate(target)
    return out


def max_error(name: str, extent: np.ndarray) -> np.ndarray:
    """The bound on ``|decode(encode(x)) - x|`` for each value of ``extent`` (float32, same shape)."""
    s = KV_QUANT[name]
    x = np.asarray(extent, dtype=np.float32)
    layers, _, heads, tokens, dim = x.shape
    q = rotate(x) if s.rotated else x  # what is quantized
    bound = np.empty_like(x)
    for layer in range(layers):
        for kv, per_token in ((0, s.key_per_token), (1, True)):
            _, scale, _ = _quantize(q[layer, kv], s.bits, per_token)
            grouped, axis = _grouped(np.zeros_like(q[layer, kv]), per_token, dim)
            half = np.broadcast_to(np.expand_dims(scale.astype(np.float32), axis) / 2, grouped.shape).reshape(q[layer, kv].shape)
            bound[layer, kv] = half
    bound += np.abs(q) * 2.0**-10 + 1e-6
    if not s.rotated:
        return bound
    # an error e in the rotated space comes back as e @ R: |(e @ R)_i| <= sum_j |e_j| |R_ji|, plus float32 rounding
    return bound @ np.abs(rotation(dim)) + (np.abs(q) @ np.abs(rotation(dim))) * 2.0**-16
