"""Workload generators: seeded, Zipf-shaped, ShareGPT-like conversations."""

import numpy as np
import pytest

from kvstore.contract.errors import InvalidArgument
from kvstore_tools.workloads import conversation_trace, zipf_probabilities, zipf_requests


def zipf(seed, **kw):
    args = dict(alpha=1.0, seed=seed, suffix_tokens=(8, 16), vocab_size=100) | kw
    return zipf_requests(20, 4000, **args)


def test_zipf_requests_are_seeded():
    a, b, c = zipf(3), zipf(3), zipf(4)
    assert [(r.index, r.prefix, r.rank, r.suffix.tolist()) for r in a] == [(r.index, r.prefix, r.rank, r.suffix.tolist()) for r in b]
    assert [r.prefix for r in a] != [r.prefix for r in c]
    assert [r.suffix.tolist() for r in a[:50]] != [r.suffix.tolist() for r in c[:50]]
    assert [r.index for r in a] == list(range(4000))
    assert all(8 <= r.suffix.size <= 16 and 0 <= r.suffix.min() and r.suffix.max() < 100 and r.suffix.dtype == np.int64 for r in a)
    assert {r.suffix.size for r in a} == set(range(8, 17))
    assert {r.suffix.size for r in zipf(3, suffix_tokens=5)} == {5}


def test_zipf_rank_frequencies_follow_the_law():
    reqs = zipf(7)
    rank_of = {}
    for r in reqs:
        assert rank_of.setdefault(r.prefix, r.rank) == r.rank  # one rank per prefix
    assert sorted(rank_of.values()) == sorted(set(rank_of.values()))
    assert sorted(rank_of) != [rank_of[p] - 1 for p in sorted(rank_of)]  # ranks are permuted, not prefix order
    freq = np.bincount([r.rank - 1 for r in reqs], minlength=20) / len(reqs)
    p = zipf_probabilities(20, 1.0)
    assert np.all(np.abs(freq - p) < 4 * np.sqrt(p * (1 - p) / len(reqs)))
    assert np.all(np.diff(freq[:4]) < 0)  # the head decreases rank by rank
    assert np.corrcoef(np.arange(20), freq)[0, 1] < -0.5 and freq[0] > 3 * freq[9]
    flat = np.bincount([r.rank - 1 for r in zipf(7, alpha=0.0)], minlength=20) / len(reqs)
    assert np.all(np.abs(flat - 0.05) < 4 * np.sqrt(0.05 * 0.95 / len(reqs)))


def test_zipf_probabilities():
    p = zipf_probabilities(4, 2.0)
    np.testing.assert_allclose(p, np.array([1, 1 / 4, 1 / 9, 1 / 16]) / (1 + 1 / 4 + 1 / 9 + 1 / 16))
    np.testing.assert_allclose(zipf_probabilities(5, 0.0), 0.2)
    assert zipf_probabilities(1, 1.5).tolist() == [1.0]


def by_conversation(events):
    out: dict = {}
    for e in events:
        out.setdefault(e.conversation, []).append(e)
    return out


def test_conversation_trace_is_seeded_and_shaped_like_sharegpt():
    ev = conversation_trace(400, turns=(2, 6), concurrency=4, mean_gap_s=10.0, seed=1)
    assert ev == conversation_trace(400, turns=(2, 6), concurrency=4, mean_gap_s=10.0, seed=1)
    assert ev != conversation_trace(400, turns=(2, 6), concurrency=4, mean_gap_s=10.0, seed=2)
    ratios = np.array([e.output_tokens / e.input_tokens for e in ev])
    assert 6.0 < ratios.mean() < 7.0
    assert 6.0 < sum(e.output_tokens for e in ev) / sum(e.input_tokens for e in ev) < 7.0
    assert np.median(ratios) < ratios.mean() and ratios.std() > 1.0  # a lognormal spread, not a constant
    assert [e.time_s for e in ev] == sorted(e.time_s for e in ev)
    convs = by_conversation(ev)
    assert sorted(convs) == list(range(400))
    for turns in convs.values():
        assert 2 <= len(turns) <= 6 and [e.turn for e in turns] == list(range(len(turns)))
        assert turns[0].history_tokens == 0 and 64 <= turns[0].input_tokens <= 512
        for prev, cur in zip(turns, turns[1:]):
            assert cur.history_tokens == prev.history_tokens + prev.input_tokens + prev.output_tokens
            assert cur.time_s > prev.time_s and 16 <= cur.input_tokens <= 128
    capped = conversation_trace(50, max_output_tokens=100, seed=1)
    assert max(e.output_tokens for e in capped) == 100


@pytest.mark.parametrize("concurrency", [1, 3])
def test_conversation_trace_respects_the_concurrency_bound(concurrency):
    ev = conversation_trace(60, turns=(1, 5), concurrency=concurrency, mean_gap_s=2.0, seed=5)
    spans = [(t[0].time_s, t[-1].time_s) for t in by_conversation(ev).values()]
    active = [sum(1 for a, b in spans if a <= t <= b) for t, _ in spans]
    assert max(active) == concurrency  # reached, never exceeded


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: zipf_requests(0, 5, seed=0, vocab_size=10), "num_prefixes"),
        (lambda: zipf_requests(3, 0, seed=0, vocab_size=10), "num_requests"),
        (lambda: zipf_requests(3, 5, seed=0, vocab_size=0), "vocab_size"),
        (lambda: zipf_requests(3, 5, seed=0, vocab_size=10, suffix_tokens=(9, 2)), "suffix_tokens"),
        (lambda: zipf_requests(3, 5, seed=0, vocab_size=10, suffix_tokens="long"), "suffix_tokens"),
        (lambda: zipf_requests(3, 5, seed=0, vocab_size=10, alpha=-1), "alpha"),
        (lambda: zipf_requests(3, 5, seed=0, vocab_size=10, alpha=float("nan")), "alpha"),
        (lambda: zipf_requests(3, 5, seed=None, vocab_size=10), "seed"),
        (lambda: zipf_probabilities(0, 1.0), "n"),
        (lambda: conversation_trace(0, seed=0), "num_conversations"),
        (lambda: conversation_trace(3, turns=(0, 2), seed=0), "turns"),
        (lambda: conversation_trace(3, concurrency=0, seed=0), "concurrency"),
        (lambda: conversation_trace(3, output_ratio=0, seed=0), "output_ratio"),
        (lambda: conversation_trace(3, ratio_sigma=-0.1, seed=0), "ratio_sigma"),
        (lambda: conversation_trace(3, mean_gap_s=0, seed=0), "mean_gap_s"),
        (lambda: conversation_trace(3, first_input_tokens=(5,), seed=0), "first_input_tokens"),
        (lambda: conversation_trace(3, max_output_tokens=0, seed=0), "max_output_tokens"),
        (lambda: conversation_trace(3, seed=-1), "seed"),
    ],
)
def test_bad_arguments_name_the_field(call, field):
    with pytest.raises(InvalidArgument) as err:
        call()
    assert err.value.field == field
