"""``SegmentImage.put_extents`` (a run of chunks at once) builds the same image as ``put_extent`` one by one."""

import numpy as np
import pytest
from helpers import GEOMETRIES, ids, make_kv

from kvstore.contract.errors import InvalidArgument
from kvstore.contract.geometry import ModelSpec, StoreGeometry
from kvstore.contract.layout import SegmentLayout, split_extents
from kvstore.writer import SegmentImage

CASES = [
    *GEOMETRIES,
    StoreGeometry(ModelSpec(6, 3, 64, "float32"), chunk_tokens=16, group_layers=2, probe_bits=4),
    StoreGeometry(ModelSpec(4, 2, 32, "bfloat16"), chunk_tokens=16, group_layers=1, probe_bits=8),
    StoreGeometry(ModelSpec(4, 2, 32, "float16"), chunk_tokens=16, group_layers=2, kv_quant="kv8"),
    StoreGeometry(ModelSpec(3, 2, 8, "bfloat16"), chunk_tokens=16, group_layers=2, streaming_heads=((0,), (), (1,))),
]


def extents_of(geo, kv):
    return {(g, j): ext for g, j, ext in split_extents(geo, kv)}


def payload(geo, g, ext):
    return geo.extent_payload(ext, g)


def _extent_by_extent(geo, tokens: int, seed: int):
    """``(layout, extents by (group, chunk), the image built by put_extent of each)``: the reference image."""
    layout = SegmentLayout(geo, tokens)
    ext = extents_of(geo, make_kv(geo, tokens, seed))
    one = SegmentImage(layout, 0)
    for (g, j), e in ext.items():
        one.put_extent(g, j, payload(geo, g, e))
    return layout, ext, one


@pytest.mark.parametrize("geo", CASES, ids=ids)
@pytest.mark.parametrize("tokens", [16 * 9, 16 * 9 + 5], ids=["whole-chunks", "short-last-chunk"])
def test_a_run_of_extents_builds_the_image_extent_by_extent_does(geo, tokens):
    kv = make_kv(geo, tokens, 3)
    layout = SegmentLayout(geo, tokens)
    one, run = SegmentImage(layout, 0), SegmentImage(layout, 0)
    ext = extents_of(geo, kv)
    chunks = range(geo.num_chunks(tokens))
    for (g, j), e in ext.items():
        one.put_extent(g, j, payload(geo, g, e))
    for g in range(geo.num_groups):
        run.put_extents(g, chunks[:4], [payload(geo, g, ext[g, j]) for j in chunks[:4]])  # two runs per group
        run.put_extents(g, chunks[4:], [payload(geo, g, ext[g, j]) for j in chunks[4:]])
    assert run.missing == 0 and one.missing == 0
    assert bytes(run.buffer) == bytes(one.buffer)  # extents, summaries and probe keys alike
    assert run.checksums() == one.checksums()


def test_a_bad_run_is_refused_whole_and_changes_nothing():
    geo = GEOMETRIES[2]
    kv = make_kv(geo, 64, 1)
    image = SegmentImage(SegmentLayout(geo, 64), 0)
    ext = extents_of(geo, kv)
    good = [payload(geo, 0, ext[0, j]) for j in range(4)]
    with pytest.raises(InvalidArgument, match="consecutive"):
        image.put_extents(0, [0, 2, 3, 1], good)
    with pytest.raises(InvalidArgument, match="chunk 3 must be"):
        image.put_extents(0, range(4), [*good[:3], good[3][:-1]])
    assert image.missing == geo.num_groups * 4 and not np.frombuffer(image.buffer, np.uint8).any()
    image.put_extents(0, range(4), good)
    with pytest.raises(InvalidArgument, match="already sent"):
        image.put_extents(0, range(2), good[:2])


@pytest.mark.parametrize("geo", CASES, ids=ids)
def test_copies_then_derives_on_other_threads_build_the_same_image(geo):
    """A fill copies one batch while a pool thread derives the one before: copied, not derived, is missing."""
    from concurrent.futures import ThreadPoolExecutor

    layout, ext, one = _extent_by_extent(geo, 16 * 9 + 5, 4)
    split = SegmentImage(layout, 0)
    n = layout.num_chunks
    batches = [range(0, 3), range(3, n // 2), range(n // 2, n)]
    with ThreadPoolExecutor(2) as pool:
        derives = []
        for batch in batches:
            copied = [split.copy_extents(g, batch, [payload(geo, g, ext[g, j]) for j in batch]) for g in range(geo.num_groups)]
            assert split.missing >= geo.num_groups * len(batch)  # copied, not derived yet
            derives += [pool.submit(split.derive_extents, g, chunks) for g, chunks in enumerate(copied)]
        for d in derives:
            d.result()
    assert split.missing == 0
    assert bytes(split.buffer) == bytes(one.buffer)


def test_extents_are_derived_only_once_copied():
    geo = GEOMETRIES[2]
    image = SegmentImage(SegmentLayout(geo, 64), 0)
    ext = extents_of(geo, make_kv(geo, 64, 2))
    with pytest.raises(InvalidArgument, match="before copy_extents"):
        image.derive_extents(0, [0, 1])
    image.copy_extents(0, [0, 1], [payload(geo, 0, ext[0, j]) for j in (0, 1)])
    with pytest.raises(InvalidArgument, match="before copy_extents"):
        image.derive_extents(0, [1, 2])
    image.derive_extents(0, [0, 1])
    assert image.missing == geo.num_groups * 4 - 2


@pytest.mark.parametrize("geo", CASES, ids=ids)
def test_extents_received_in_place_build_the_same_image(geo):
    """A fill's fetch writes payloads straight into ``extent_views``; ``received_in_place`` takes them as copied."""
    layout, ext, one = _extent_by_extent(geo, 16 * 9 + 5, 5)
    placed = SegmentImage(layout, 0)
    n = layout.num_chunks
    for batch in (range(0, 4), range(4, n)):
        for g in range(geo.num_groups):
            for j, view in zip(batch, placed.extent_views(g, batch)):
                view[:] = np.ascontiguousarray(payload(geo, g, ext[g, j])).view(np.uint8).reshape(-1)
            placed.derive_extents(g, placed.received_in_place(g, batch))
    assert placed.missing == 0
    assert bytes(placed.buffer) == bytes(one.buffer)
    with pytest.raises(InvalidArgument, match="already sent"):
        placed.received_in_place(0, [1, 2])
    with pytest.raises(InvalidArgument, match="consecutive"):
        SegmentImage(layout, 0).received_in_place(0, [0, 2])
    with pytest.raises(InvalidArgument, match="extent.chunk"):
        SegmentImage(layout, 0).extent_views(0, [n])
