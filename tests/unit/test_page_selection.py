"""Hierarchical pages (LServe): physical pages of several chunks scored by their best chunk."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_client.selection import budget_count, select_chunks
from engine_client.selection.budget import page_scores
from kvstore.contract import InvalidArgument


def _brute_force(scores: list[float], count: int, page: int, sink: int, local: int) -> list[int]:
    """The rule written out: forced chunks, then whole pages by their best chunk (ties: lower page), in page order."""
    m = len(scores)
    forced = set(range(min(sink, m))) | set(range(m - min(local, m), m))
    pages = [list(range(p, min(m, p + page))) for p in range(0, m, page)]
    best = [max(scores[c] for c in chunks) for chunks in pages]
    ranked = sorted(range(len(pages)), key=lambda p: (-best[p], p))
    taken = [c for p in ranked for c in pages[p] if c not in forced][: count - len(forced)]
    return sorted(forced | set(taken))


@settings(max_examples=200, deadline=None)
@given(
    scores=st.lists(st.integers(0, 6), min_size=1, max_size=40),
    page=st.integers(2, 6),
    frac=st.floats(0.01, 1.0),
    sink=st.integers(0, 2),
    local=st.integers(0, 2),
)
def test_page_selection_equals_the_brute_force_rule(scores, page, frac, sink, local):
    t = torch.tensor(scores, dtype=torch.float32)  # small integers: many ties, which the rule breaks by page index
    got = select_chunks(t, frac, sink_chunks=sink, local_chunks=local, page_chunks=page).tolist()
    count = budget_count(len(scores), frac, sink, local)
    assert len(got) == count
    assert got == _brute_force(scores, count, page, sink, local)


def test_page_scores_are_the_max_of_each_page_and_a_short_last_page_counts():
    s = torch.tensor([0.1, 0.9, 0.2, 0.3, 0.05, 0.4, 0.7])
    torch.testing.assert_close(page_scores(s, 3), torch.tensor([0.9, 0.4, 0.7]))
    torch.testing.assert_close(page_scores(s, 1), s)


def test_a_page_brings_its_weaker_chunks_before_the_next_page():
    # chunk 5 is the best; its page (4-7) comes whole before chunk 1 (the next best), sink and local aside
    s = torch.tensor([0, 0.5, 0, 0, 0, 0.9, 0, 0, 0, 0, 0, 0], dtype=torch.float32)
    assert select_chunks(s, 6, sink_chunks=1, local_chunks=1, page_chunks=4).tolist() == [0, 4, 5, 6, 7, 11]
    assert select_chunks(s, 6, sink_chunks=1, local_chunks=1).tolist() == [0, 1, 2, 3, 5, 11]  # chunk-wise: ties to lower index


def test_page_chunks_is_validated_and_does_not_combine_with_follow():
    s = torch.rand(10)
    with pytest.raises(InvalidArgument, match="page_chunks"):
        select_chunks(s, 0.5, page_chunks=0)
    with pytest.raises(InvalidArgument, match="page_chunks.*follow"):
        select_chunks(s, 0.5, page_chunks=4, follow=1)
