"""The client's edge: KV dtypes as torch dtypes or names, block ids of any integer type, and the buffers reads fill."""

import numpy as np
import pytest
import torch

from engine_client.client import to_torch
from engine_client.pages import PageFrames, gather_pages, scatter_pages
from engine_client.tensors import block_index, destination
from kvstore.contract.errors import InvalidArgument
from kvstore.contract.geometry import ModelSpec, StoreGeometry, dtype_name


@pytest.mark.parametrize(
    "dtype, name",
    [
        ("bfloat16", "bfloat16"),
        (torch.bfloat16, "bfloat16"),
        (torch.float16, "float16"),
        (torch.half, "float16"),
        (torch.float, "float32"),
        (np.float16, "float16"),
        (np.dtype("float32"), "float32"),
    ],
)
def test_a_dtype_is_a_torch_or_numpy_dtype_or_its_name(dtype, name):
    assert dtype_name(dtype) == name
    assert ModelSpec(2, 1, 4, dtype).dtype == name
    assert ModelSpec(2, 1, 4, dtype) == ModelSpec(2, 1, 4, name)


@pytest.mark.parametrize("dtype", ["bf16", torch.int16, np.uint16, None, 3, torch.float64])
def test_an_unknown_dtype_is_refused_naming_the_field(dtype):
    with pytest.raises(InvalidArgument, match=r"^dtype: must be one of \['bfloat16', 'float16', 'float32'\]"):
        ModelSpec(2, 1, 4, dtype)
    with pytest.raises(ValueError, match="^dtype: must be one of"):
        to_torch(np.zeros(2, np.uint16), dtype)


def test_to_torch_takes_the_torch_dtype_and_shares_the_array():
    values = torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16)
    raw = values.view(torch.int16).numpy().view(np.uint16).copy()
    for dtype in ("bfloat16", torch.bfloat16):
        t = to_torch(raw, dtype)
        assert t.dtype == torch.bfloat16 and torch.equal(t, values)
        assert t.data_ptr() == raw.ctypes.data  # no copy
    f = np.arange(3, dtype=np.float16)
    assert to_torch(f, torch.float16).dtype == torch.float16
    with pytest.raises(ValueError, match=r"^arr: a float32 tensor is made from float32 items, got float16"):
        to_torch(f, torch.float32)
    with pytest.raises(ValueError, match=r"^arr: a bfloat16 tensor is made from uint16 items, got float32"):
        to_torch(np.zeros(2, np.float32), torch.bfloat16)


@pytest.mark.parametrize(
    "ids",
    [
        [5, 0, 3],
        (5, 0, 3),
        np.array([5, 0, 3], np.int32),
        np.array([5, 0, 3], np.uint8),
        torch.tensor([5, 0, 3]),
        torch.tensor([5, 0, 3], dtype=torch.int32),
    ],
    ids=["list", "tuple", "np-int32", "np-uint8", "tensor-int64", "tensor-int32"],
)
def test_block_ids_of_any_integer_type_gather_and_scatter_alike(ids):
    caches = _caches()
    pages = gather_pages(caches, ids)
    assert torch.equal(pages, gather_pages(caches, torch.tensor([5, 0, 3])))
    fresh = [torch.zeros_like(c) for c in caches]
    scatter_pages(pages, fresh, ids)
    for c, f in zip(caches, fresh):
        assert torch.equal(f[:, [5, 0, 3]], c[:, [5, 0, 3]]) and not f[:, [1, 2, 4, 6]].any()
    assert block_index(range(3), 7).tolist() == [0, 1, 2] and block_index([], 7).numel() == 0


@pytest.mark.parametrize(
    "ids, message",
    [
        ([1.0, 2.0], r"^block_ids: must be integers, got float64"),
        (torch.tensor([True]), r"^block_ids: must be integers, got torch.bool"),
        ([[1, 2]], r"^block_ids: must be one id per page \(1-D\), got shape \(1, 2\)"),
        ([0, 7], r"^block_ids: must be in \[0, 7\), got 7"),
        ([-1, 2], r"^block_ids: must be in \[0, 7\), got -1"),
        ([2, 2], r"^block_ids: a block is named twice"),
    ],
)
def test_bad_block_ids_are_refused_and_change_no_cache(ids, message):
    caches = _caches()
    before = [c.clone() for c in caches]
    pages = torch.ones(len(ids) if not isinstance(ids, list) or not isinstance(ids[0], list) else 1, 3, 2, 2, 4, 1)
    with pytest.raises(ValueError, match=message):
        scatter_pages(pages, caches, ids)
    assert all(torch.equal(a, b) for a, b in zip(caches, before))
    if "twice" not in message:
        with pytest.raises(ValueError, match=message):
            gather_pages(caches, ids)


def test_scatter_takes_pages_as_get_pages_returns_them_and_refuses_another_dtype():
    """numpy pages (bfloat16 as raw uint16) go into bfloat16 caches; a float32 tensor into them is refused, changing nothing."""
    caches = [c.to(torch.bfloat16) for c in _caches()]
    pages = gather_pages(caches, [4, 1])
    raw = pages.view(torch.int16).numpy().view(np.uint16)  # what get_pages returns
    fresh = [torch.zeros_like(c) for c in caches]
    scatter_pages(raw, fresh, np.array([4, 1]))
    assert all(torch.equal(f[:, [4, 1]], c[:, [4, 1]]) for f, c in zip(fresh, caches))
    with pytest.raises(ValueError, match=r"^pages: dtype must be the caches' torch.bfloat16, got torch.float32"):
        scatter_pages(pages.float(), [torch.zeros_like(c) for c in caches], [4, 1])
    with pytest.raises(ValueError, match=r"^pages: shape must be \(1, 3, 2, 2, 4, 1\)"):
        scatter_pages(pages, fresh, [4])


GEO = StoreGeometry(ModelSpec(5, 1, 2, "float32"), chunk_tokens=2, group_layers=2)  # groups of layers 0-1, 2-3, 4


def _pages(n: int) -> np.ndarray:
    return np.arange(n * 5 * 2 * 1 * 2 * 2, dtype=np.float32).reshape(n, 5, 2, 1, 2, 2)


@pytest.mark.parametrize("layers", [range(0, 5), range(1, 4), range(3, 4), range(4, 5), range(2, 4)])
@pytest.mark.parametrize("frame_bytes", [4, 12, 1 << 20])
def test_frames_of_whole_group_extents_fill_exactly_the_layers_asked_for(layers, frame_bytes):
    pages = _pages(3)
    groups = [g for g in range(GEO.num_groups) if set(GEO.group_layer_range(g)) & set(layers)]
    out = np.full((3, len(layers), 2, 1, 2, 2), -1, np.float32)
    frames = PageFrames(GEO, groups, layers, 3, destination(out, out.shape, "float32"))
    for i in (2, 0, 1):  # any page order
        for g in groups:
            span = GEO.group_layer_range(g)
            ext = np.ascontiguousarray(pages[i, span.start : span.stop]).view(np.uint8).reshape(-1)
            for off in range(0, ext.size, frame_bytes):
                frames.take(g, i, off, ext[off : off + frame_bytes])
    frames.finish()
    np.testing.assert_array_equal(out, pages[:, layers.start : layers.stop])


def test_a_stream_that_ends_short_is_an_error_not_a_partly_filled_buffer():
    out = np.zeros((1, 5, 2, 1, 2, 2), np.float32)
    frames = PageFrames(GEO, [0, 1, 2], range(5), 1, destination(out, out.shape, "float32"))
    frames.take(0, 0, 0, np.zeros(16, np.uint8))
    with pytest.raises(ValueError, match="GetPages ended with 16 of the 160 bytes asked for"):
        frames.finish()


def test_a_destination_refuses_a_wrong_buffer_in_one_line():
    shape = (2, 5, 2, 1, 2, 2)
    cases = [
        (r"^out: must be a numpy array or a torch tensor, got list", []),
        (r"^out: shape must be \(2, 5, 2, 1, 2, 2\)", np.zeros((2, 4, 2, 1, 2, 2), np.float32)),
        (r"^out: dtype must be float32, got float16", np.zeros(shape, np.float16)),
        (r"^out: must be contiguous", np.zeros((2, 5, 2, 1, 2, 4), np.float32)[..., ::2]),
        (r"^out: dtype must be torch.float32, got torch.bfloat16", torch.zeros(shape, dtype=torch.bfloat16)),
        (r"^out: must be contiguous", torch.zeros((5, 2, 2, 1, 2, 2)).transpose(0, 1)),
    ]
    for message, out in cases:
        with pytest.raises(ValueError, match=message):
            destination(out, shape, "float32")
    ro = np.zeros(shape, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="^out: the array is read-only"):
        destination(ro, shape, "float32")
    for ok in (np.zeros(shape, np.float32), torch.zeros(shape)):
        destination(ok, shape, torch.float32)


@pytest.mark.gpu
def test_a_cuda_destination_gets_every_byte_through_its_staging_window(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from engine_client import tensors

    monkeypatch.setattr(tensors, "STAGING_BYTES", 2 * 5 * 2 * 2 * 4)  # a window of two pages
    pages = _pages(5)
    out = torch.full((5, 5, 2, 1, 2, 2), -1.0, device="cuda")
    frames = PageFrames(GEO, [0, 1, 2], range(5), 5, destination(out, tuple(out.shape), "float32"))
    for i in (0, 1, 2, 4, 3):  # page 3 after 4: before the window, copied on its own
        for g in range(GEO.num_groups):
            span = GEO.group_layer_range(g)
            frames.take(g, i, 0, np.ascontiguousarray(pages[i, span.start : span.stop]).view(np.uint8).reshape(-1))
    frames.finish()
    assert torch.equal(out.cpu(), torch.from_numpy(pages))


def _caches():
    layers, blocks, block_size, heads, dim = 3, 7, 4, 2, 1
    return [
        torch.arange(2 * blocks * block_size * heads * dim, dtype=torch.float32).reshape(2, blocks, block_size, heads, dim) + 1000 * l
        for l in range(layers)
    ]
