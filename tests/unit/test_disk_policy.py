"""Disk eviction and compaction policies: exact choices, and brute force over small stores."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.policy.disk import PrefixCost, SegmentUse, choose_victims, segments_to_compact


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
