"""``ModelRunner.warm``: the per-prefix state a Re-Prefill reads, fetched ahead, so the first request fetches none."""

import pytest
import torch

from engine_client.client import KVStoreClient
from engine_client.reprefill import ModelRunner, parse_system
from kvstore.contract.errors import InvalidArgument, NotFound

SYSTEMS = {  # name: (runner keywords, configuration)
    "per-layer 4-bit probes": ({"group_layers": 1, "probe_bits": 4}, parse_system("ckv+int4-probes")),
    "key summaries": ({}, parse_system("summary").replace(period_layers=1)),
    "stand-in layers": ({"group_layers": 1, "probe_bits": 4}, parse_system("ckv+int4-probes+standins=1")),
}


@pytest.mark.parametrize("name", list(SYSTEMS))
def test_a_warmed_prefix_fetches_nothing_on_its_first_request_and_answers_the_same(daemon, tiny_model, name):
    kw, cfg = SYSTEMS[name]
    cfg = cfg.replace(budget=0.25, report_attention=False)
    gen = torch.Generator().manual_seed(7)
    prefix, suffix = torch.randint(0, 500, (301,), generator=gen), torch.randint(0, 500, (9,), generator=gen)
    with KVStoreClient(daemon.target) as client:
        cold, warm = ModelRunner(tiny_model, client, **kw), ModelRunner(tiny_model, client, **kw)
        pid = cold.store_prefix(prefix).prefix_id
        fetched = warm.warm(pid, cfg)
        assert fetched > 0 and warm.resident_bytes() > 0
        assert warm.warm(pid, cfg) == 0  # resident since
        a, b = cold.reprefill(pid, suffix, cfg), warm.reprefill(pid, suffix, cfg)
    assert a.state_bytes_fetched + a.probe_bytes == fetched  # what the cold runner's first request fetched
    assert b.state_bytes_fetched == b.probe_bytes == 0
    assert [s.tolist() for s in a.selected] == [s.tolist() for s in b.selected]
    torch.testing.assert_close(a.logits, b.logits, atol=0, rtol=0)


def test_warming_what_cannot_be_read_is_refused_and_keeps_nothing(daemon, tiny_model):
    with KVStoreClient(daemon.target) as client:
        runner = ModelRunner(tiny_model, client, group_layers=1, probe_bits=4)
        with pytest.raises(NotFound):
            runner.warm("ab" * 32)
        with pytest.raises(InvalidArgument, match="cfg"):
            runner.warm("ab" * 32, cfg="summary")
        assert runner.resident_bytes() == 0


def test_the_state_kept_stays_within_its_limit_dropping_the_least_recently_used_prefix(daemon, tiny_model):
    cfg = parse_system("ckv+int4-probes").replace(budget=0.25, report_attention=False)
    gen = torch.Generator().manual_seed(8)
    prefixes = [torch.randint(0, 500, (301,), generator=gen) for _ in range(3)]
    suffix = torch.randint(0, 500, (9,), generator=gen)
    with KVStoreClient(daemon.target) as client:
        unbounded = ModelRunner(tiny_model, client, state_limit_bytes=None)
        ids = [unbounded.store_prefix(p).prefix_id for p in prefixes]
        each = unbounded.warm(ids[0], cfg)
        bounded = ModelRunner(tiny_model, client, state_limit_bytes=2 * each)  # room for two prefixes' probe keys
        first = [bounded.reprefill(pid, suffix, cfg) for pid in ids]
        assert bounded.resident_bytes() == 2 * each and bounded.state.evicted == 1  # the first prefix's, dropped
        again = bounded.reprefill(ids[2], suffix, cfg)  # still resident: nothing fetched
        assert again.probe_bytes == 0
        back = bounded.reprefill(ids[0], suffix, cfg)  # dropped: fetched again, the same answer
        assert back.probe_bytes == each and bounded.state.evicted == 2  # prefix 1, now the least recently used
        torch.testing.assert_close(back.logits, first[0].logits, atol=0, rtol=0)
        lone = ModelRunner(tiny_model, client, state_limit_bytes=each // 2)  # one prefix alone passes it: kept
        lone.reprefill(ids[1], suffix, cfg)
        assert lone.resident_bytes() == each and lone.state.evicted == 0
        with pytest.raises(InvalidArgument, match="state_limit_bytes"):
            ModelRunner(tiny_model, client, state_limit_bytes=0)
