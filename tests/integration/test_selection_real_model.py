"""The layerwise selection on SmolLM2-135M through a real daemon: pass key answered at a 5% budget."""

import pytest
import torch

from engine_client.client import KVStoreClient
from engine_client.runner import ModelRunner, ReprefillConfig
from engine_client.selection.systems import LAYERWISE_GROUP_LAYERS, system_fields

zoo = pytest.importorskip("engine_client.model.zoo")
text = pytest.importorskip("engine_client.tasks.text")


@pytest.fixture(scope="module")
def smollm2():
    torch.set_num_threads(2)
    try:
        return zoo.load("smollm2-135m", dtype=torch.float32)
    except zoo.ModelNotInstalled as exc:
        pytest.skip(str(exc))


def test_layerwise_keeps_the_pass_key_at_five_percent(daemon, smollm2):
    examples = text.examples("passkey", smollm2.tokenizer, 2, 1000, stream="tune", depths=[0.2, 0.6])
    cfg = ReprefillConfig(budget=0.05, report_attention=False, **system_fields("layerwise"))
    with KVStoreClient(daemon.target) as client:
        runner = ModelRunner(smollm2.decoder, client, group_layers=LAYERWISE_GROUP_LAYERS)
        for ex in examples:
            handle = runner.store_prefix(ex.prefix_tokens)
            gen = runner.generate(handle.prefix_id, ex.suffix_tokens, cfg, 8, tokenizer=smollm2.tokenizer)
            res = gen.reprefill
            assert ex.is_correct(gen.text), (ex.depth, gen.text)
            assert len(res.selected) == 15  # a selection per 2-layer Period
            assert 0 < res.kv_fraction <= 0.05  # everything loaded, all layers, within the budget
            needle = set(ex.needle_chunks(16).tolist())
            late = [set(sel.tolist()) & needle for sel in res.selected[7:12]]  # layers 14-23
            assert all(late), (ex.depth, late)
