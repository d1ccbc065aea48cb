"""SmolLM2-135M from its GGUF: the project's decoder and tokenizer against transformers.

transformers (test extra) loads the same GGUF file with its own dequantizer,
name mapping, RoPE un-permutation, tokenizer builder and Llama model: an
independent implementation of every step.  The text is the Apache-2.0 licence
shipped in grpcio's wheel (real English prose, always installed).
"""

import re

import pytest
import torch

from engine_client.model import zoo

transformers = pytest.importorskip("transformers", reason="needs the test extra: pip install -e '.[test]' (transformers)")
pytest.importorskip("accelerate", reason="transformers loads GGUF files only with accelerate: pip install -e '.[test]'")

from pretrained import hf_smollm2, needs_smollm2, real_text  # noqa: E402

pytestmark = needs_smollm2
NUM_TOKENS = 1024  # logits compared at every one of these positions
NEW_TOKENS = 10
# float32 on both sides; the residual difference is summation order in the
# GEMMs and attention kernels (about 1e-4 on logits of magnitude ~40).
LOGITS_ATOL = 5e-4


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(min(2, torch.get_num_threads()))
    ours = zoo.load("smollm2-135m", dtype=torch.float32)
    ref, ref_tok = hf_smollm2("float32")
    return ours, ref, ref_tok


def greedy(decoder, ids: list[int], steps: int) -> list[int]:
    """Greedy continuation through the layer-level API: prefill once, then one token at a time over the KV."""
    logits, kv = decoder.prefill(torch.tensor(ids))  # kv [L, 2, Hkv, n, d]
    out = []
    for _ in range(steps):
        token = int(logits.argmax())
        out.append(token)
        n = kv.shape[3]
        hidden = decoder.embed(torch.tensor([token]))
        step_kv = []
        for layer in range(decoder.num_layers):
            hidden, suffix_kv = decoder.layer_forward(layer, hidden, torch.tensor([n]), kv[layer])
            step_kv.append(suffix_kv)
        kv = torch.cat([kv, torch.stack(step_kv)], dim=3)
        logits = decoder.final_logits(hidden)
    return out


def test_tokenizer_ids_equal_the_reference(models):
    """Equal ids on the licence text without its digits.

    The file's ``tokenizer.ggml.pre`` is 'smollm': llama.cpp (and SmolLM2's own
    tokenizer.json) split every digit off before the GPT-2 regex, so in
    "\\n\\n   1." the last space does not join the digit.  transformers 5.23 has
    no 'smollm' entry and falls back to the plain GPT-2 regex, so digits after
    whitespace are where the two may legitimately differ.
    """
    ours, _, ref_tok = models
    text = re.sub(r"[0-9]", "", real_text())
    ids = ours.tokenizer.encode(text)
    assert len(ids) > 1000
    assert ids == ref_tok.encode(text, add_special_tokens=False)
    assert ours.tokenizer.encode("Section 12") == ours.tokenizer.encode("Section ") + [ours.tokenizer.token_id(c) for c in "12"]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    assert ours.tokenizer.apply_chat_template(messages) == ref_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_logits_on_real_text_match_the_reference(models):
    ours, ref, _ = models
    ids = ours.tokenizer.encode(real_text())[:NUM_TOKENS]
    assert len(ids) == NUM_TOKENS
    got = ours.decoder.forward_full(torch.tensor(ids))  # [n, vocab]
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].float()
    diff = (got - want).abs().max().item()
    print(f"max |logits - transformers| over {NUM_TOKENS} tokens: {diff:.3g} (max |logit| {want.abs().max().item():.1f})")
    assert diff < LOGITS_ATOL
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_greedy_generation_agrees(models):
    ours, ref, _ = models
    prompt = ours.tokenizer.encode_chat([{"role": "user", "content": "Describe the sea in two sentences."}])
    got = greedy(ours.decoder, prompt, NEW_TOKENS)
    with torch.no_grad():  # stops early only at <|im_end|>; the prompt asks for a longer answer
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(prompt) :].tolist()
    assert len(want) == NEW_TOKENS and ours.tokenizer.eos_token_id not in want
    assert got == want, (ours.tokenizer.decode(got), ours.tokenizer.decode(want))
