"""Arrays and tensors at the client's edge: KV dtypes, block ids, and the buffers reads are written into (no I/O).

- ``as_numpy_kv`` / ``to_torch``: a KV array as numpy (bfloat16 as raw
  uint16) and back, with no copy on the host; a dtype is a torch dtype or
  its name, everywhere (``kvstore.contract.geometry.dtype_name``).
- ``block_index``: block ids (a list, range, numpy array or tensor) as the
  one type the paged-cache helpers index with, checked against the cache.
- ``Destination``: a caller's buffer (numpy array, or torch tensor on the
  host, pinned or not, or on a CUDA device) that a read fills piece by
  piece: host memory in place, a device through a pinned staging window.
"""

from __future__ import annotations

import math

import numpy as np

from kvstore.contract.geometry import dtype_name

STAGING_BYTES = 32 << 20  # a CUDA destination is filled through a pinned host window of this size (at least one page)


def as_numpy_kv(kv) -> np.ndarray:
    """numpy view of a KV array or torch tensor (bfloat16 as raw uint16)."""
    if isinstance(kv, np.ndarray):
        return kv
    try:
        import torch
    except ImportError:  # pragma: no cover
        raise TypeError(f"kv must be a numpy array or torch tensor, got {type(kv).__name__}") from None
    if isinstance(kv, torch.Tensor):
        t = kv.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16)
        return t.numpy()
    raise TypeError(f"kv must be a numpy array or torch tensor, got {type(kv).__name__}")


def numpy_dtype(dtype) -> np.dtype:
    """The numpy dtype holding a KV dtype bit-exactly (bfloat16: uint16)."""
    name = dtype_name(dtype)
    return np.dtype(np.uint16) if name == "bfloat16" else np.dtype(name)


def torch_dtype(dtype):
    import torch

    return getattr(torch, dtype_name(dtype))


def to_torch(arr: np.ndarray, dtype):
    """A torch tensor over ``arr`` (no copy) in ``dtype``: a torch dtype or its name (``torch.bfloat16`` or
    ``"bfloat16"``, which reinterprets the raw uint16 bits).  ValueError for another dtype, or an array
    whose items are not that dtype's."""
    import torch

    name = dtype_name(dtype)
    want = numpy_dtype(name)
    if arr.dtype != want and not (name == "bfloat16" and arr.dtype == np.int16):
        raise ValueError(f"arr: a {name} tensor is made from {want} items, got {arr.dtype}")
    if name == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def block_index(block_ids, num_blocks: int, device=None, *, unique: bool = False):
    """``block_ids`` (a list, range, numpy array or tensor of integers) as a 1-D int64 tensor on ``device``.

    ValueError naming ``block_ids`` for floats or booleans, another shape, an id outside
    ``[0, num_blocks)`` (a negative id would wrap around), or, with ``unique``, an id named twice.
    """
    import torch

    if isinstance(block_ids, torch.Tensor):
        ids = block_ids.detach()
        if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
            raise ValueError(f"block_ids: must be integers, got {ids.dtype}")
    else:
        arr = np.asarray(block_ids)
        if arr.size == 0:
            arr = arr.astype(np.int64)
        if arr.dtype.kind not in "iu":
            raise ValueError(f"block_ids: must be integers, got {arr.dtype}")
        ids = torch.from_numpy(arr.astype(np.int64))
    if ids.dim() != 1:
        raise ValueError(f"block_ids: must be one id per page (1-D), got shape {tuple(ids.shape)}")
    ids = ids.to(dtype=torch.int64)
    if ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= num_blocks:
            raise ValueError(f"block_ids: must be in [0, {num_blocks}), got {lo if lo < 0 else hi}")
        if unique and torch.unique(ids).numel() != ids.numel():
            raise ValueError("block_ids: a block is named twice; each page goes to its own block")
    return ids.to(device) if device is not None else ids


# ------------------------------------------------------------ destinations
def destination(out, shape: tuple[int, ...], dtype, field: str = "out"):
    """A ``Destination`` over the caller's buffer, or ValueError naming ``field`` (type, shape, dtype, layout)."""
    if isinstance(out, np.ndarray):
        want = numpy_dtype(dtype)
        _check(field, tuple(out.shape), shape, out.dtype, want, out.flags.c_contiguous)
        if not out.flags.writeable:
            raise ValueError(f"{field}: the array is read-only")
        return HostDestination(out.reshape(-1).view(np.uint8), _row_bytes(shape, want.itemsize))
    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    if torch is None or not isinstance(out, torch.Tensor):
        raise ValueError(f"{field}: must be a numpy array or a torch tensor, got {type(out).__name__}")
    want = torch_dtype(dtype)
    _check(field, tuple(out.shape), shape, out.dtype, want, out.is_contiguous())
    if out.requires_grad:
        raise ValueError(f"{field}: the tensor requires grad; pass a plain buffer (out.detach())")
    row = _row_bytes(shape, want.itemsize)
    if out.device.type == "cpu":  # pinned or not: the same host bytes
        return HostDestination(out.detach().view(-1).view(torch.uint8).numpy(), row)
    if out.device.type == "cuda":
        return CudaDestination(out.detach().view(-1).view(torch.uint8), row)
    raise ValueError(f"{field}: a tensor on {out.device.type} is not supported (host memory or CUDA)")


def _check(field, got_shape, shape, got_dtype, want_dtype, contiguous) -> None:
    if got_shape != shape:
        raise ValueError(f"{field}: shape must be {shape} [pages, layers, 2, kv_heads, chunk_tokens, head_dim], got {got_shape}")
    if got_dtype != want_dtype:
        raise ValueError(f"{field}: dtype must be {want_dtype}, got {got_dtype}")
    if not contiguous:
        raise ValueError(f"{field}: must be contiguous (C order)")


def _row_bytes(shape: tuple[int, ...], itemsize: int) -> int:
    return math.prod(shape[1:]) * itemsize


class HostDestination:
    """Host memory (numpy, or a torch CPU tensor pinned or not): pieces are written in place."""

    def __init__(self, flat: np.ndarray, page_bytes: int):
        self.flat = flat  # [pages * page_bytes] uint8 over the caller's buffer
        self.page_bytes = page_bytes

    def write(self, page: int, offset: int, src: np.ndarray) -> None:
        """Bytes ``[offset, offset + len(src))`` of ``page``."""
        at = page * self.page_bytes + offset
        self.flat[at : at + src.size] = src

    def finish(self) -> None:
        pass


class CudaDestination:
    """Device memory, filled through a pinned host window of whole pages, one copy per window.

    Pieces of pages inside the window land in it; a piece past it sends the window to the device
    and moves it there; a piece before it (a read out of page order) is copied on its own.
    """

    def __init__(self, flat, page_bytes: int):
        import torch

        self._torch = torch
        self.flat = flat  # [pages * page_bytes] uint8 on the device
        self.page_bytes = page_bytes
        self.num_pages = flat.numel() // page_bytes if page_bytes else 0
        self.window = max(1, min(self.num_pages, STAGING_BYTES // max(page_bytes, 1)))
        self.staging = torch.empty(self.window * page_bytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        self.host = self.staging.numpy()
        self.first = 0  # the window's first page
        self.dirty = False
        self.copied = None  # the event of the window's last copy: the staging is reused only after it

    def write(self, page: int, offset: int, src: np.ndarray) -> None:
        if page < self.first:
            at = page * self.page_bytes + offset
            self.flat[at : at + src.size].copy_(self._torch.from_numpy(np.ascontiguousarray(src)))
            return
        if page >= self.first + self.window:
            self._flush()
            self.first = page
        if self.copied is not None:
            self.copied.synchronize()
            self.copied = None
        at = (page - self.first) * self.page_bytes + offset
        self.host[at : at + src.size] = src
        self.dirty = True

    def _flush(self) -> None:
        if not self.dirty:
            return
        torch = self._torch
        last = min(self.first + self.window, self.num_pages)
        n = (last - self.first) * self.page_bytes
        with torch.cuda.device(self.flat.device):
            self.flat[self.first * self.page_bytes : last * self.page_bytes].copy_(self.staging[:n], non_blocking=True)
            self.copied = torch.cuda.Event()
            self.copied.record(torch.cuda.current_stream(self.flat.device))
        self.dirty = False

    def finish(self) -> None:
        """Every piece is on the device when this returns."""
        self._flush()
        if self.copied is not None:
            self.copied.synchronize()
            self.copied = None
