"""KV values as the store keeps them, and the key statistics derived from them.

bfloat16 is kept as raw uint16 (numpy has no bfloat16); ``keys_as_float32``
and ``float32_as_kv`` convert, and ``key_summary`` is the channel-wise
min/max of an extent's keys that every segment stores per chunk.
"""

from __future__ import annotations

import numpy as np


def keys_as_float32(keys: np.ndarray, dtype: str) -> np.ndarray:
    """Widen stored keys (bfloat16 as raw uint16) to float32 for statistics."""
    if dtype == "bfloat16":
        return (keys.astype(np.uint32) << 16).view(np.float32)
    return keys.astype(np.float32, copy=False)


def float32_as_kv(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values in the numpy KV dtype (bfloat16: raw uint16, rounded to nearest even)."""
    if dtype == "bfloat16":
        bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return values.astype(dtype, copy=False)


def key_summary(extent: np.ndarray, dtype: str) -> np.ndarray:
    """Channel-wise min/max of an extent's keys.

    ``extent``: ``[layers, 2, heads, tokens, dim]`` -> ``[layers, heads, 2, dim]``
    (index 0 = min, 1 = max), float32.
    """
    # widened with the tokens axis outermost: the min and max are then elementwise passes over whole
    # [layers, heads, dim] arrays, about 3x faster than reducing the short tokens axis in place
    by_token = extent[:, 0].transpose(2, 0, 1, 3)  # [tokens, layers, heads, dim]
    if dtype == "bfloat16":
        wide = np.empty(by_token.shape, dtype=np.uint32)
        wide[...] = by_token
        wide <<= 16
        keys = wide.view(np.float32)
    else:
        keys = np.empty(by_token.shape, dtype=np.float32)
        keys[...] = by_token
    return np.stack([np.minimum.reduce(keys, axis=0), np.maximum.reduce(keys, axis=0)], axis=2)
