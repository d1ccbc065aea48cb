"""Choosing from the suffix's last tokens only (``ReprefillConfig.select_queries``), through a real daemon."""

import pytest
import torch
from helpers import flat_config

from kvstore.contract.errors import InvalidArgument

CFG = flat_config(budget=0.25, period_layers=1, selector="exact", probe_bits=4, head_aggregation="max", report_attention=False)
N = 301


@pytest.fixture
def stored(tiny_runner):
    gen = torch.Generator().manual_seed(5)
    prefix = torch.randint(0, 500, (N,), generator=gen)
    return tiny_runner, tiny_runner.store_prefix(prefix), gen


def _sets(res):
    return [c.tolist() for c in res.selected]


def test_only_the_last_tokens_choose_the_first_layers_chunks(stored):
    runner, handle, gen = stored
    tail = torch.randint(0, 500, (4,), generator=gen)
    a = torch.cat([torch.randint(0, 500, (8,), generator=gen), tail])
    b = torch.cat([torch.randint(0, 500, (8,), generator=gen), tail])  # another turn, the same last 4 tokens
    everything = [runner.reprefill(handle.prefix_id, s, CFG) for s in (a, b)]
    assert _sets(everything[0])[0] != _sets(everything[1])[0]  # every query chooses: the turns differ
    last = [runner.reprefill(handle.prefix_id, s, CFG.replace(select_queries=4)) for s in (a, b)]
    # layer 0's queries of the last 4 tokens are their embeddings at the same positions: the same set
    assert _sets(last[0])[0] == _sets(last[1])[0] != _sets(everything[0])[0]
    # a window as long as the suffix (or longer) is every query
    whole = runner.reprefill(handle.prefix_id, a, CFG.replace(select_queries=12))
    assert _sets(whole) == _sets(everything[0]) and torch.equal(whole.logits, everything[0].logits)
    assert _sets(runner.reprefill(handle.prefix_id, a, CFG.replace(select_queries=99))) == _sets(everything[0])


@pytest.mark.parametrize("value", [-1, True, 1.5, "16"])
def test_a_bad_select_queries_is_refused_before_any_read(stored, value):
    runner, handle, gen = stored
    before = runner.resident_bytes()
    with pytest.raises(InvalidArgument, match="select_queries") as err:
        runner.reprefill(handle.prefix_id, torch.randint(0, 500, (6,), generator=gen), CFG.replace(select_queries=value))
    assert "\n" not in str(err.value) and runner.resident_bytes() == before
