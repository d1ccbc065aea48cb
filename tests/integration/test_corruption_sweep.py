"""Flip random bytes anywhere in a segment file: never a wrong byte served.

Each trial stores two prefixes (the second shares the first's leading chunks,
so one segment serves both), flips one random byte of a segment file (three in four inside a checksummed
region: extents, key summaries, probe keys; the rest anywhere, padding and
trailer included), reopens the store
and reads everything back through every read path: extents, summaries and
probe keys.  Each read either returns exactly what was stored or fails with
DATA_LOSS; a flip inside a checksummed region is always detected by some
read.  A flip in padding changes no byte anyone can read.  The trial's
outcome is reported as a record, so the sweep also counts what it tried.
The same sweep runs over a geometry whose probe keys are stored quantized
(8-bit packed rows), and over page batches, read page by page through the
page API.
"""

import os
from dataclasses import replace

import numpy as np
import pytest
from helpers import GEOMETRIES, make_kv, make_tokens

from kvstore.config import StoreConfig
from kvstore.contract.errors import DataLoss, NotFound
from kvstore.contract.geometry import StoreGeometry
from kvstore.contract.kv_values import keys_as_float32
from kvstore.contract.probes import quantize_probe_rows
from kvstore.store import ChunkStore

GEO = GEOMETRIES[0]  # 5 layers in groups of 2, one head, head dim 1, bf16: small files, odd sizes
QUANTIZED = replace(GEO, probe_bits=8)  # the same, probe keys stored as 8-bit rows (head dim 1: 1 code + a scale)
TOKENS = 70


def _store(data: str, geo: StoreGeometry = GEO) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """prefix id -> (kv, tokens) of the trial's two prefixes."""
    t_a, kv_a = make_tokens(TOKENS, 1), make_kv(geo, TOKENS, 1)
    t_b, kv_b = make_tokens(TOKENS, 2), make_kv(geo, TOKENS, 2)
    t_b[:32], kv_b[:, :, :, :32] = t_a[:32], kv_a[:, :, :, :32]
    with ChunkStore(StoreConfig(data_dir=data, min_free_bytes=0)) as store:
        return {store.put(t, kv, geo).prefix_id: (kv, t) for t, kv in [(t_a, kv_a), (t_b, kv_b)]}


def _probe_expected(geo: StoreGeometry, kv: np.ndarray, group: int) -> np.ndarray:
    """What an intact store returns for the group's probe keys."""
    keys = kv[group * geo.group_layers, 0]
    return quantize_probe_rows(keys_as_float32(keys, geo.model.dtype), geo.probe_bits) if geo.probe_bits else keys


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0x5A]))


def _read_back(store: ChunkStore, stored: dict, geo: StoreGeometry) -> tuple[int, int]:
    """(reads refused with DATA_LOSS, reads returning exact bytes); a wrong byte fails the test."""
    refused = exact = 0
    for pid, (kv, _) in stored.items():
        n = geo.num_chunks(TOKENS)
        attempts = [
            (lambda: store.read(pid, range(n)).to_kv(), kv),
            (lambda: store.read_summaries(pid), None),
            *[(lambda g=g: store.read_probe_keys(pid, g), _probe_expected(geo, kv, g)) for g in range(geo.num_groups)],
        ]
        for read, expected in attempts:
            try:
                got = read()
            except DataLoss:
                refused += 1
                continue
            if expected is not None:
                np.testing.assert_array_equal(got, expected)
            exact += 1
    return refused, exact


def corruption_trial(tmp_path, seed: int, geo: StoreGeometry = GEO) -> dict:
    """One random flip; returns what was flipped and what the reads did."""
    data = str(tmp_path / f"c{seed}-{geo.probe_bits}")
    stored = _store(data, geo)
    rng = np.random.default_rng(seed)
    with ChunkStore(StoreConfig(data_dir=data, min_free_bytes=0)) as store:
        pid = next(iter(stored))
        seg_id = int(rng.choice(store.describe(pid).segment_ids))
        info = store.catalogue.segment_info(seg_id)
        path = store.files.path(seg_id)
        checksummed = [(off, off + length) for _, off, length, _ in info.regions()]
        summaries_ok = store.read_summaries(pid)  # what an intact store returns
    if rng.random() < 0.75:  # most flips land in data: padding dominates a small segment
        lo, hi = checksummed[int(rng.integers(len(checksummed)))]
        offset = int(rng.integers(lo, hi))
    else:
        offset = int(rng.integers(os.path.getsize(path)))
    in_region = any(lo <= offset < hi for lo, hi in checksummed)
    _flip(path, offset)
    with ChunkStore(StoreConfig(data_dir=data, min_free_bytes=0)) as store:
        refused, exact = _read_back(store, stored, geo)
        if refused == 0:
            np.testing.assert_array_equal(store.read_summaries(pid), summaries_ok)
        verified = all(r["ok"] for r in store.verify())
    if in_region:
        assert refused > 0 and not verified, f"a flip at {offset} inside a checksummed region went unnoticed"
    return {"offset": offset, "checksummed": in_region, "refused": refused, "exact": exact}


def sweep(tmp_path, seeds, geo: StoreGeometry = GEO) -> list[dict]:
    return [corruption_trial(tmp_path, s, geo) for s in seeds]


@pytest.mark.parametrize("geo", [GEO, QUANTIZED], ids=["probes-kv-dtype", "probes-8bit"])
def test_random_byte_flips_are_detected_or_harmless(tmp_path, geo):
    trials = sweep(tmp_path, range(12), geo)
    assert any(t["checksummed"] for t in trials)  # the sweep reached checksummed data


@pytest.mark.slow
def test_random_byte_flips_are_detected_or_harmless_many(tmp_path):
    sweep(tmp_path, range(1000, 1200))


# ------------------------------------------------------------ pages
def _store_pages(data: str) -> list[tuple[list[bytes], np.ndarray]]:
    """Two page puts; the second repeats two of the first's pages (stored once)."""
    from test_pages import make_pages, page_keys

    keys_a, pages_a = page_keys(5, 1), make_pages(GEO, 5, 1)
    keys_b, pages_b = keys_a[:2] + page_keys(3, 2), np.concatenate([pages_a[:2], make_pages(GEO, 3, 2)])
    with ChunkStore(StoreConfig(data_dir=data, min_free_bytes=0)) as store:
        for keys, pages in [(keys_a, pages_a), (keys_b, pages_b)]:
            store.pages.put(keys, pages, GEO)
    return [(keys_a, pages_a), (keys_b, pages_b)]


def page_corruption_trial(tmp_path, seed: int) -> dict:
    """One random flip in a page batch's segment; every page read is exact or DATA_LOSS."""
    data = str(tmp_path / f"p{seed}")
    stored = _store_pages(data)
    rng = np.random.default_rng(seed)
    with ChunkStore(StoreConfig(data_dir=data, min_free_bytes=0)) as store:
        batch = sorted(p["prefix_id"] for p in store.list_prefixes())[int(rng.integers(2))]
        (seg_id,) = store.describe(batch).segment_ids
        regions = store.catalogue.segment_info(seg_id).regions()
        path = store.files.path(seg_id)
    extents = [(off, off + length) for name, off, length, _ in regions if name.startswith("extent")]
    checksummed = [(off, off + length) for _, off, length, _ in regions]
    if rng.random() < 0.75:
        lo, hi = extents[int(rng.integers(len(extents)))] if rng.random() < 0.8 else checksummed[int(rng.integers(len(checksummed)))]
        offset = int(rng.integers(lo, hi))
    else:
        offset = int(rng.integers(os.path.getsize(path)))
    _flip(path, offset)
    refused = exact = 0
    with ChunkStore(StoreConfig(data_dir=data, min_free_bytes=0)) as store:
        for keys, pages in stored:
            for i in range(len(keys)):  # page by page: a bad page must not hide a good one
                try:
                    got = store.pages.get([keys[i]], GEO).to_array()
                except DataLoss:
                    refused += 1
                    continue
                except NotFound:  # its batch was quarantined by an earlier read
                    refused += 1
                    continue
                np.testing.assert_array_equal(got[0], pages[i])
                exact += 1
        verified = all(r["ok"] for r in store.verify())
    in_extent = any(lo <= offset < hi for lo, hi in extents)
    if in_extent:
        assert refused > 0, f"a flip at {offset} inside a page's extent went unnoticed"
    if any(lo <= offset < hi for lo, hi in checksummed):
        assert not verified, f"a flip at {offset} inside a checksummed region passed verify"
    return {"offset": offset, "extent": in_extent, "refused": refused, "exact": exact}


def test_random_byte_flips_in_page_segments_are_detected_or_harmless(tmp_path):
    trials = [page_corruption_trial(tmp_path, s) for s in range(12)]
    assert any(t["extent"] for t in trials)
