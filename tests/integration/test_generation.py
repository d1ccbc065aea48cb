"""Generation after Re-Prefill on SmolLM2-135M (30 layers) through a real daemon."""

import numpy as np
import pytest
import torch
from helpers import flat_config
from pretrained import needs_smollm2

from engine_client.client import KVStoreClient
from engine_client.generation import answer_margins, dense_generate
from engine_client.model import zoo
from engine_client.prefill import chunked_prefill
from engine_client.reprefill import ModelRunner
from kvstore.contract.errors import InvalidArgument
from kvstore_tools.tasks import text

pytestmark = needs_smollm2


@pytest.fixture(scope="module")
def smollm2():
    torch.set_num_threads(1)  # decoding is latency-bound; 2 threads on a shared CPU spin
    return zoo.load("smollm2-135m", dtype=torch.float32)


@pytest.fixture
def runner(daemon, smollm2):
    with KVStoreClient(daemon.target) as client:
        yield ModelRunner(smollm2.decoder, client, group_layers=4, probe_bits=0)  # 30 layers: 8 groups, the last of 2 layers


def test_full_budget_generation_equals_the_dense_reference_on_every_period_shape(runner, smollm2):
    ex = text.examples("passkey", smollm2.tokenizer, 1, 160, depths=[0.5])[0]
    handle = runner.store_prefix(ex.prefix_tokens)
    ref = dense_generate(smollm2.decoder, ex.prefix_tokens, ex.suffix_tokens, 8, tokenizer=smollm2.tokenizer)
    assert ex.is_correct(ref.text), ref.text  # the reference answers this short prompt
    # the dense prefill of prefix + suffix in one pass agrees on the first token (other sums, same argmax)
    whole, _ = chunked_prefill(smollm2.decoder, torch.from_numpy(np.concatenate([ex.prefix_tokens, ex.suffix_tokens])))
    torch.testing.assert_close(whole, ref.first_logits, atol=2e-3, rtol=1e-3)
    # 8 -> periods of 8, 8, 8, 6 layers (the last group has 2); 12 -> 12, 12, 6; 32 -> one period of 30
    for period in (8, 12, 32):
        gen = runner.generate(
            handle.prefix_id, ex.suffix_tokens, flat_config(budget=1.0, period_layers=period), 8, tokenizer=smollm2.tokenizer
        )
        assert gen.tokens == ref.tokens, period
        torch.testing.assert_close(gen.first_logits, ref.first_logits, atol=0, rtol=0)
        assert gen.text == ref.text and len(gen.step_s) == len(gen.tokens) - 1
        assert len(gen.reprefill.selected) == -(-30 // period) and gen.rows_attended == [ex.num_prefix_tokens] * 30
        assert gen.ttft_s > 0 and gen.stop in ("eos", "length")


def test_sparse_generation_decodes_over_the_rows_each_period_loaded(runner, smollm2):
    ex = text.examples("niah", smollm2.tokenizer, 1, 250, depths=[0.3])[0]
    handle = runner.store_prefix(ex.prefix_tokens)
    gen = runner.generate(handle.prefix_id, ex.suffix_tokens, flat_config(budget=0.2, period_layers=8, selector="exact"), 3)
    res = gen.reprefill
    assert len(res.selected) == 4 and len(gen.tokens) == 3 and gen.text is None
    for layer, rows in enumerate(gen.rows_attended):
        chunks = res.selected[layer // 8]
        assert rows == sum(min(16, ex.num_prefix_tokens - 16 * int(c)) for c in chunks)
    assert res.layer_kv == []  # handed to decoding, not kept


def test_teacher_forced_margins_at_full_budget_equal_the_full_kvs_and_bad_ids_are_refused(runner, smollm2):
    ex = text.examples("passkey", smollm2.tokenizer, 1, 160, depths=[0.4])[0]
    handle = runner.store_prefix(ex.prefix_tokens)
    answer = smollm2.tokenizer.encode(" " + ex.answers[0])
    _, kv = chunked_prefill(smollm2.decoder, torch.from_numpy(ex.prefix_tokens))
    want = answer_margins(smollm2.decoder, kv, ex.suffix_tokens, answer)
    gen = runner.generate(handle.prefix_id, ex.suffix_tokens, flat_config(budget=1.0, period_layers=8), forced=answer)
    assert gen.tokens == answer and len(gen.answer_margins) == len(answer)
    np.testing.assert_allclose(gen.answer_margins, want, atol=2e-3)
    assert min(want) > 0  # the full KV answers this prompt: every answer token wins its step
    # a sparse set moves the margins; the first is read off the same first-token logits greedy decoding sees
    cfg = flat_config(budget=0.2, period_layers=8, selector="exact")
    sparse = runner.generate(handle.prefix_id, ex.suffix_tokens, cfg, forced=answer)
    greedy = runner.generate(handle.prefix_id, ex.suffix_tokens, cfg, 2)
    top2 = greedy.first_logits.topk(2).values
    first = float(greedy.first_logits[answer[0]] - (top2[1] if int(greedy.first_logits.argmax()) == answer[0] else top2[0]))
    assert sparse.answer_margins[0] == pytest.approx(first, abs=1e-4)
    vocab = smollm2.decoder.config.vocab_size
    for bad, match in (([], "must not be empty"), ([vocab], "token ids"), ([-1], "token ids")):
        with pytest.raises(InvalidArgument, match=match):
            runner.generate(handle.prefix_id, ex.suffix_tokens, cfg, forced=bad)
    with pytest.raises(InvalidArgument, match="reselect_every"):
        runner.generate(handle.prefix_id, ex.suffix_tokens, flat_config(budget=1.0, period_layers=8, reselect_every=1), forced=answer)


def test_period_not_a_multiple_of_the_stored_group_is_refused(runner, smollm2):
    handle = runner.store_prefix(np.arange(100, 164))
    with pytest.raises(InvalidArgument, match="multiple of the stored group"):
        runner.generate(handle.prefix_id, [5, 6], flat_config(budget=1.0, period_layers=6), 2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        runner.generate(handle.prefix_id, [5, 6], flat_config(budget=1.0), 0)


def test_generation_stops_at_eos(runner, smollm2):
    handle = runner.store_prefix(np.arange(100, 164))
    first = runner.generate(handle.prefix_id, [5, 6], flat_config(budget=1.0), 3)
    stop = runner.generate(handle.prefix_id, [5, 6], flat_config(budget=1.0), 3, eos_token_ids=[first.tokens[1]])
    assert stop.tokens == first.tokens[:2] and stop.stop == "eos"
