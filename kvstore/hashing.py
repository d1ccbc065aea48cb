"""Content addressing of chunks: a SHA-256 chain over namespace, model and tokens.

``h_j = SHA-256(h_{j-1} || namespace || model fingerprint || geometry digest ||
tokens of chunk j)`` with ``h_{-1}`` a fixed domain tag.  Because each hash
covers every earlier token, equal hashes mean equal prefixes, so a stored
chunk can be reused by any request whose prefix starts the same way.  The
namespace keeps tenants apart; the geometry digest keeps prefixes stored
with different chunk sizes or period groups from being mixed.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .contract.errors import InvalidArgument
from .contract.geometry import StoreGeometry

MAX_TOKEN_ID = (1 << 32) - 1
MAX_NAMESPACE_BYTES = 256
MAX_FINGERPRINT_BYTES = 256
_ROOT = hashlib.sha256(b"kvstore.chunk-chain.v1").digest()
_PAGE_TAG = hashlib.sha256(b"kvstore.page.v1").digest()


def validate_tokens(tokens, max_tokens: int) -> np.ndarray:
    """Return ``tokens`` as a uint32 array, or raise naming the field."""
    try:
        arr = np.asarray(tokens)
    except Exception as exc:  # ragged lists and the like
        raise InvalidArgument("tokens", f"not a sequence of integers ({exc})") from None
    if arr.ndim != 1:
        raise InvalidArgument("tokens", f"must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        raise InvalidArgument("tokens", "must not be empty")
    if arr.size > max_tokens:
        raise InvalidArgument("tokens", f"{arr.size} tokens exceed the limit of {max_tokens}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise InvalidArgument("tokens", f"must be integers, got {arr.dtype}")
    if int(arr.min()) < 0 or int(arr.max()) > MAX_TOKEN_ID:
        raise InvalidArgument("tokens", f"token ids must be in [0, {MAX_TOKEN_ID}]")
    return arr.astype("<u4", copy=False)


def validate_label(field: str, value: str, limit: int) -> bytes:
    if not isinstance(value, str):
        raise InvalidArgument(field, f"must be a string, got {type(value).__name__}")
    raw = value.encode()
    if len(raw) > limit:
        raise InvalidArgument(field, f"longer than {limit} bytes")
    if "\0" in value:
        raise InvalidArgument(field, "must not contain NUL")
    return raw


def chunk_hashes(tokens: np.ndarray, geometry: StoreGeometry, namespace: str, model_fingerprint: str) -> list[bytes]:
    """Chained 32-byte hashes, one per chunk of ``tokens`` (uint32 array)."""
    salt = _salt(geometry, namespace, model_fingerprint)
    c = geometry.chunk_tokens
    raw = np.ascontiguousarray(tokens, dtype="<u4")
    out: list[bytes] = []
    prev = _ROOT
    for start in range(0, raw.size, c):
        h = hashlib.sha256(prev)
        h.update(salt)
        h.update(raw[start : start + c].tobytes())
        prev = h.digest()
        out.append(prev)
    return out


def page_hashes(keys: list[bytes], geometry: StoreGeometry, namespace: str, model_fingerprint: str) -> list[bytes]:
    """32-byte hashes of pages keyed by ``keys`` (validated by ``pages.validate_keys``)."""
    salt = _PAGE_TAG + _salt(geometry, namespace, model_fingerprint)
    return [hashlib.sha256(salt + len(k).to_bytes(1, "little") + k).digest() for k in keys]


def _salt(geometry: StoreGeometry, namespace: str, model_fingerprint: str) -> bytes:
    ns = validate_label("namespace", namespace, MAX_NAMESPACE_BYTES)
    fp = validate_label("model_fingerprint", model_fingerprint, MAX_FINGERPRINT_BYTES)
    # Length-prefix the variable fields so ("ab","c") never equals ("a","bc").
    return len(ns).to_bytes(2, "little") + ns + len(fp).to_bytes(2, "little") + fp + geometry.digest
