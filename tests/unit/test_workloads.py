"""Workload generators: seeded, Zipf-shaped, ShareGPT-like conversations."""

import numpy as np
import pytest

from engine_client.workloads import conversation_trace, zipf_probabilities, zipf_requests
from kvstore.errors import InvalidArgument


def test_zipf_requests_are_seeded_and_follow_the_popularity_law():
    a = zipf_requests(20, 4000, alpha=1.0, seed=3, suffix_tokens=(8, 16), vocab_size=100)
    b = zipf_requests(20, 4000, alpha=1.0, seed=3, suffix_tokens=(8, 16), vocab_size=100)
    c = zipf_requests(20, 4000, alpha=1.0, seed=4, suffix_tokens=(8, 16), vocab_size=100)
    assert [(r.prefix, r.suffix.tolist()) for r in a] == [(r.prefix, r.suffix.tolist()) for r in b]
    assert [r.prefix for r in a] != [r.prefix for r in c]
    assert all(8 <= r.suffix.size <= 16 and r.suffix.max() < 100 and r.suffix.dtype == np.int64 for r in a)
    counts = np.sort(np.bincount([r.prefix for r in a], minlength=20))[::-1] / len(a)
    p = zipf_probabilities(20, 1.0)
    assert np.all(np.abs(counts - p) < 4 * np.sqrt(p * (1 - p) / len(a)) + 1e-3)
    assert counts[0] > 3 * counts[9]
    uniform = zipf_probabilities(5, 0.0)
    np.testing.assert_allclose(uniform, 0.2)


def test_conversation_trace_ratio_growth_and_concurrency():
    ev = conversation_trace(300, turns=(2, 6), concurrency=4, mean_gap_s=10.0, seed=1)
    assert ev == conversation_trace(300, turns=(2, 6), concurrency=4, mean_gap_s=10.0, seed=1)
    ratio = sum(e.output_tokens for e in ev) / sum(e.input_tokens for e in ev)
    assert 5.5 < ratio < 7.5
    by_conv: dict = {}
    for e in ev:
        by_conv.setdefault(e.conversation, []).append(e)
    assert len(by_conv) == 300
    spans = []
    for turns in by_conv.values():
        turns.sort(key=lambda e: e.turn)
        assert 2 <= len(turns) <= 6 and [e.turn for e in turns] == list(range(len(turns)))
        for prev, cur in zip(turns, turns[1:]):
            assert cur.history_tokens == prev.history_tokens + prev.input_tokens + prev.output_tokens
            assert cur.time_s >= prev.time_s
        spans.append((turns[0].time_s, turns[-1].time_s))
    times = sorted({t for s in spans for t in s})
    assert max(sum(1 for a, b in spans if a <= t <= b) for t in times) <= 4 + 1  # touching ends may meet
    assert [e.time_s for e in ev] == sorted(e.time_s for e in ev)


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: zipf_requests(0, 5, seed=0, vocab_size=10), "num_prefixes"),
        (lambda: zipf_requests(3, 5, seed=0, vocab_size=10, suffix_tokens=(9, 2)), "suffix_tokens"),
        (lambda: zipf_requests(3, 5, seed=0, vocab_size=10, alpha=-1), "alpha"),
        (lambda: conversation_trace(3, concurrency=0, seed=0), "concurrency"),
        (lambda: conversation_trace(3, output_ratio=0, seed=0), "output_ratio"),
        (lambda: conversation_trace(3, mean_gap_s=0, seed=0), "mean_gap_s"),
    ],
)
def test_bad_arguments_name_the_field(call, field):
    with pytest.raises(InvalidArgument) as err:
        call()
    assert err.value.field == field
