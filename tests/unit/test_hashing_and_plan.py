import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstore.contract.errors import InvalidArgument
from kvstore.contract.geometry import ModelSpec, StoreGeometry
from kvstore.hashing import chunk_hashes, validate_tokens
from kvstore.io.plan import coalesce

GEO = StoreGeometry(ModelSpec(2, 1, 4, "float16"), chunk_tokens=4, group_layers=1)


def test_chain_shares_leading_chunks_only():
    a = np.arange(10)
    b = np.concatenate([np.arange(8), [99, 98, 97]])
    ha, hb = chunk_hashes(a, GEO, "", "m"), chunk_hashes(b, GEO, "", "m")
    assert len(ha) == 3 and len(hb) == 3
    assert ha[:2] == hb[:2] and ha[2] != hb[2]


def test_hash_depends_on_namespace_fingerprint_geometry_and_earlier_tokens():
    t = np.arange(8)
    base = chunk_hashes(t, GEO, "tenant-a", "m")
    assert chunk_hashes(t, GEO, "tenant-b", "m")[0] != base[0]
    assert chunk_hashes(t, GEO, "tenant-a", "m2")[0] != base[0]
    other_geo = StoreGeometry(ModelSpec(2, 1, 4, "float16"), chunk_tokens=4, group_layers=2)
    assert chunk_hashes(t, other_geo, "tenant-a", "m")[0] != base[0]
    changed = t.copy()
    changed[0] = 7
    assert chunk_hashes(changed, GEO, "tenant-a", "m")[1] != base[1]
    # no ambiguity between namespace and fingerprint boundaries
    assert chunk_hashes(t, GEO, "ab", "c") != chunk_hashes(t, GEO, "a", "bc")


def test_partial_last_chunk_differs_from_full_chunk():
    assert chunk_hashes(np.arange(6), GEO, "", "")[1] != chunk_hashes(np.arange(8), GEO, "", "")[1]


@pytest.mark.parametrize(
    "tokens, msg",
    [([], "empty"), ([[1, 2]], "one-dimensional"), ([1, -1], r"\[0,"), ([1.5], "integers"), ([2**32], r"\[0,")],
)
def test_bad_tokens_name_field(tokens, msg):
    with pytest.raises(InvalidArgument, match=msg) as err:
        validate_tokens(tokens, max_tokens=100)
    assert err.value.field == "tokens"


def test_too_many_tokens():
    with pytest.raises(InvalidArgument, match="limit"):
        validate_tokens(np.zeros(101, dtype=int), max_tokens=100)


def test_coalesce_adjacent_runs():
    ext = [(8192, 4096), (0, 4096), (4096, 4096), (16384, 4096), (20480, 8192)]
    runs = coalesce(ext, max_run_bytes=1 << 20)
    assert [(r.offset, r.length) for r in runs] == [(0, 12288), (16384, 12288)]
    assert [sorted(r.members) for r in runs] == [[0, 1, 2], [3, 4]]
    assert len(coalesce(ext, max_run_bytes=1 << 20, enabled=False)) == 5


def test_coalesce_respects_max_run_bytes():
    ext = [(i * 4096, 4096) for i in range(10)]
    runs = coalesce(ext, max_run_bytes=3 * 4096)
    assert [r.length for r in runs] == [12288, 12288, 12288, 4096]


@given(st.sets(st.integers(0, 200), min_size=1), st.integers(1, 8))
def test_coalesce_covers_each_extent_once(idx, max_blocks):
    ext = [(i * 4096, 4096) for i in sorted(idx)]
    runs = coalesce(ext, max_run_bytes=max_blocks * 4096)
    members = sorted(m for r in runs for m in r.members)
    assert members == list(range(len(ext)))
    for r in runs:
        assert r.length <= max_blocks * 4096
        assert r.length == sum(ext[m][1] for m in r.members)
        assert r.offset == min(ext[m][0] for m in r.members)
