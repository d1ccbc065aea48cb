"""Synthetic KV and chunk selections for the demo and the I/O benchmarks (no model)."""

from __future__ import annotations

import numpy as np

from kvstore.contract.geometry import DTYPE_BYTES


def synthetic_kv(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Random finite KV of ``shape`` in the stored numpy dtype (bf16 as uint16).

    Random bit patterns with the top exponent bit cleared: every value is
    finite (|x| < 2), and generating gigabytes stays cheap.
    """
    bits = DTYPE_BYTES[dtype] * 8
    raw = rng.integers(0, 1 << bits, size=shape, dtype=np.dtype(f"u{bits // 8}"))
    raw &= np.array(~(1 << (bits - 2)) & ((1 << bits) - 1), dtype=raw.dtype)
    return raw if dtype == "bfloat16" else raw.view(np.dtype(dtype))


def clustered_chunks(rng: np.random.Generator, num_chunks: int, num_selected: int, run_chunks: int = 4) -> np.ndarray:
    """A selection shaped like real attention: sink chunk 0, the last 2 chunks,
    the rest in runs of about ``run_chunks`` adjacent chunks at random places."""
    chosen = np.zeros(num_chunks, dtype=bool)
    for j in (0, num_chunks - 1, num_chunks - 2)[:num_selected]:
        chosen[max(j, 0)] = True
    while chosen.sum() < num_selected:
        start = int(rng.choice(np.flatnonzero(~chosen)))
        want = min(run_chunks, num_selected - int(chosen.sum()))
        end = start
        while end < num_chunks and end - start < want and not chosen[end]:
            end += 1
        chosen[start:end] = True
    return np.flatnonzero(chosen)


def token_indices(chunks: np.ndarray, chunk_tokens: int, num_tokens: int) -> np.ndarray:
    """Token positions covered by ``chunks`` (ascending)."""
    return np.concatenate([np.arange(j * chunk_tokens, min((j + 1) * chunk_tokens, num_tokens)) for j in chunks])
