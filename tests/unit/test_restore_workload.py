"""``kvstore-bench restore --workload sharegpt``: the histories' lengths come from the ShareGPT-shaped trace."""

import argparse

from kvstore_tools.bench.restore import MIN_SHAREGPT_TOKENS, sharegpt_lengths
from kvstore_tools.tasks.text import seeds
from kvstore_tools.workloads import conversation_trace


def test_sharegpt_lengths_are_the_traces_returns_capped_and_floored_and_held_out_by_default():
    args = argparse.Namespace(examples=40, tokens=3000, stream="eval", start=0)
    lengths = sharegpt_lengths(args)
    assert len(lengths) == 40 and lengths == sharegpt_lengths(args)  # seeded
    assert all(MIN_SHAREGPT_TOKENS <= n <= 3000 for n in lengths) and len(set(lengths)) > 20
    assert 3000 in lengths  # long returns are capped, not dropped
    events = conversation_trace(40, seed=seeds(1, "eval")[0])  # the first returns of the eval stream's trace, in order
    returns = [e.history_tokens + e.input_tokens for e in events if e.turn > 0]
    assert lengths[:5] == [min(3000, max(MIN_SHAREGPT_TOKENS, n)) for n in returns[:5]]
    tuned = sharegpt_lengths(argparse.Namespace(examples=40, tokens=3000, stream="tune", start=0))
    assert tuned != lengths  # the tuning stream is another trace
