"""``generation.answer_margins``: teacher-forced margins of an answer under the full KV."""

import pytest
import torch

from engine_client.generation import answer_margins, dense_generate
from engine_client.model.loader import load_checkpoint
from engine_client.prefill import chunked_prefill
from kvstore_tools.make_checkpoint import make_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    make_checkpoint(str(path), "tiny", 0, "float32", 1)
    return load_checkpoint(str(path), dtype=torch.float32)


def test_margins_are_the_dense_forward_logit_gaps_and_their_sign_is_greedys_choice(tiny):
    gen = torch.Generator().manual_seed(3)
    vocab = tiny.config.vocab_size
    prefix = torch.randint(0, vocab, (70,), generator=gen)
    suffix = torch.randint(0, vocab, (5,), generator=gen)
    _, kv = chunked_prefill(tiny, prefix)
    greedy = dense_generate(tiny, prefix, suffix, 4, eos_token_ids=()).tokens
    margins = answer_margins(tiny, kv, suffix, greedy)
    assert len(margins) == 4 and all(m >= 0 for m in margins)  # greedy's own tokens win at every step
    # the same gaps from one dense forward over prefix + suffix + answer
    logits = tiny.forward_full(torch.cat([prefix, suffix, torch.tensor(greedy)]))[prefix.numel() + suffix.numel() - 1 : -1]
    for row, token, margin in zip(logits, greedy, margins):
        top2 = row.topk(2).values
        assert margin == pytest.approx(float(top2[0] - top2[1]), abs=1e-3)
        assert int(row.argmax()) == token
    # a token greedy did not choose has a negative margin: how far it is from being produced
    other = [(greedy[0] + 1) % vocab, *greedy[1:]]
    wrong = answer_margins(tiny, kv, suffix, other)
    assert wrong[0] == pytest.approx(float(logits[0][other[0]] - logits[0].max()), abs=1e-3) and wrong[0] < 0


def test_empty_inputs_are_refused(tiny):
    _, kv = chunked_prefill(tiny, torch.arange(8))
    for suffix, answer in (([], [1]), ([1], [])):
        with pytest.raises(ValueError, match="must not be empty"):
            answer_margins(tiny, kv, suffix, answer)
