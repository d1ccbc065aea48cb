"""Disk eviction, compaction and merge policies: exact choices, and brute force over small stores."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.policy.disk import (
    MergeCandidate,
    PrefixCost,
    SegmentUse,
    choose_victims,
    segments_to_compact,
    segments_to_merge,
    small_segments_by_group,
)


def cost(pid, nbytes, score=0.0, created=0.0, in_use=False):
    return PrefixCost(pid, nbytes, score, created, in_use)


def test_lowest_score_per_byte_goes_first_and_only_as_many_as_needed():
    # per byte: warm 0.5, big 0.05, small 0.1 -- big goes first though its total score is higher
    cands = [cost("warm", 100, score=50.0), cost("big", 400, score=20.0), cost("small", 100, score=10.0)]
    assert choose_victims(cands, 100) == ["big"]
    assert choose_victims(cands, 450) == ["big", "small"]
    assert choose_victims(cands, 10_000) == ["big", "small", "warm"]


def test_oldest_first_among_unscored_and_in_use_never_chosen():
    cands = [cost("new", 100, created=3.0), cost("old", 100, created=1.0, in_use=True), cost("mid", 100, created=2.0)]
    assert choose_victims(cands, 150) == ["mid", "new"]
    assert choose_victims([cost("only", 100, in_use=True)], 10) == []


def test_nothing_freeing_returns_the_cheapest_sharer_to_unlock_shared_segments():
    cands = [cost("a", 0, score=5.0), cost("b", 0, score=1.0), cost("c", 0, in_use=True)]
    assert choose_victims(cands, 10) == ["b"]
    assert choose_victims(cands, 0) == []


prefixes = st.lists(st.tuples(st.integers(1, 50), st.integers(0, 20), st.booleans()), min_size=1, max_size=7)


@settings(max_examples=300, deadline=None)
@given(prefixes, st.integers(1, 200))
def test_victims_match_brute_force(rows, need):
    cands = [cost(f"p{i}", b, float(s), created=float(i), in_use=u) for i, (b, s, u) in enumerate(rows)]
    before = list(cands)
    chosen = choose_victims(cands, need)
    assert cands == before  # no side effects
    by_id = {c.prefix_id: c for c in cands}
    assert not any(by_id[p].in_use for p in chosen)
    evictable = [c for c in cands if not c.in_use]
    feasible = [
        set(s)
        for r in range(len(evictable) + 1)
        for s in itertools.combinations([c.prefix_id for c in evictable], r)
        if sum(by_id[p].bytes_freed for p in s) >= need
    ]
    freed = sum(by_id[p].bytes_freed for p in chosen)
    if not feasible:  # cannot reach it: everything evictable goes
        assert set(chosen) == {c.prefix_id for c in evictable}
        return
    assert freed >= need
    # the highest score per byte evicted is the least any sufficient set must reach
    worst = max(by_id[p].score_per_byte for p in chosen)
    assert worst == min(max(by_id[p].score_per_byte for p in s) for s in feasible if s)
    # and no victim is superfluous at the margin: without the last one it would not suffice
    assert freed - by_id[chosen[-1]].bytes_freed < need


def test_compaction_picks_segments_whose_live_span_is_small():
    uses = [
        SegmentUse(1, 16, ((0, 4),), False),  # 4/16 live
        SegmentUse(2, 16, ((0, 4), (12, 16)), False),  # span 0..16: nothing to gain
        SegmentUse(3, 16, ((2, 5),), True),  # in use: later
        SegmentUse(4, 16, ((0, 8),), False),  # exactly half: kept
        SegmentUse(5, 8, (), False),  # unreferenced: the delete path frees it
    ]
    assert [u.segment_id for u in segments_to_compact(uses, 0.5)] == [1]
    assert [u.segment_id for u in segments_to_compact(uses, 0.6)] == [1, 4]


def cand(seg, group="a", nbytes=100, pages_only=True, in_use=False):
    return MergeCandidate(seg, group, nbytes, pages_only, in_use)


def merge(cands, small=1000, min_segments=3, max_bytes=10_000):
    return segments_to_merge(cands, small_bytes=small, min_segments=min_segments, max_bytes=max_bytes)


def test_a_group_merges_once_it_has_min_segments_small_ones():
    assert merge([cand(i) for i in range(2)]) == []
    assert merge([cand(i) for i in range(3)]) == [(0, 1, 2)]
    assert merge([cand(i) for i in (5, 1, 3)]) == [(1, 3, 5)]  # oldest first


def test_only_small_idle_page_only_segments_count_and_groups_never_mix():
    cands = [
        cand(0),
        cand(1, nbytes=1000),  # not small (the threshold is exclusive)
        cand(2, pages_only=False),  # a prefix shares it
        cand(3, in_use=True),
        cand(4),
        cand(5, group="b"),
        cand(6, group="b"),
        cand(7, group="b"),
        cand(8),
    ]
    assert merge(cands) == [(0, 4, 8), (5, 6, 7)]
    assert merge(cands, min_segments=4) == []
    assert small_segments_by_group(cands, 1000) == {"a": 4, "b": 3}


def test_runs_stop_at_the_size_cap_and_a_run_of_one_stays():
    cands = [cand(i, nbytes=400) for i in range(6)]
    assert merge(cands, max_bytes=1200) == [(0, 1, 2), (3, 4, 5)]
    assert merge(cands, max_bytes=1000) == [(0, 1), (2, 3), (4, 5)]
    assert merge(cands[:5], max_bytes=1200) == [(0, 1, 2), (3, 4)]
    assert merge(cands[:4], max_bytes=1200) == [(0, 1, 2)]  # segment 3 alone: nothing to merge it with


def test_zero_min_segments_never_merges():
    assert merge([cand(i) for i in range(50)], min_segments=0) == []


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("ab"), st.integers(1, 600), st.booleans(), st.booleans()), max_size=12),
    st.integers(0, 5),
    st.integers(500, 2000),
)
def test_merge_runs_are_disjoint_within_the_cap_and_of_one_group(rows, min_segments, max_bytes):
    cands = [cand(i, g, n, pages_only=p, in_use=u) for i, (g, n, p, u) in enumerate(rows)]
    runs = merge(cands, small=500, min_segments=min_segments, max_bytes=max_bytes)
    by_id = {c.segment_id: c for c in cands}
    seen = [s for run in runs for s in run]
    assert len(seen) == len(set(seen))
    for run in runs:
        members = [by_id[s] for s in run]
        assert len(run) >= 2 and list(run) == sorted(run)
        assert len({c.group for c in members}) == 1
        assert all(c.pages_only and not c.in_use and c.total_bytes < 500 for c in members)
        assert sum(c.total_bytes for c in members) <= max_bytes
        eligible = [c for c in cands if c.group == members[0].group and c.pages_only and not c.in_use and c.total_bytes < 500]
        assert min_segments and len(eligible) >= min_segments
