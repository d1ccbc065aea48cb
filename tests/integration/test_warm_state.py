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
