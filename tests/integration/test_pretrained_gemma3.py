"""Gemma 3 270M from its GGUF: the project's decoder and tokenizer against transformers.

transformers (test extra) loads the same GGUF file with its own dequantizer,
name mapping, norm convention (it subtracts the 1 llama.cpp added), tokenizer
builder and ``Gemma3ForCausalLM`` with its own sliding-window masks: an
independent implementation of every step.  The long prompt (700 tokens of the
Apache-2.0 licence text shipped in grpcio's wheel) runs past the 512-position
window, so the sliding layers mask in the prefill and in decoding over the
prefix KV.
"""

import warnings

import pytest
import torch

from engine_client.model import zoo

transformers = pytest.importorskip("transformers", reason="needs the test extra: pip install -e '.[test]' (transformers)")
pytest.importorskip("accelerate", reason="transformers loads GGUF files only with accelerate: pip install -e '.[test]'")

from pretrained import needs_gemma3, real_text  # noqa: E402

# the real 270M model: its export (~40 s on a fresh machine) and the transformers reference (~70 s) cost more
# than the default suite can give; the tiny random Gemma 3 in tests/unit/test_gemma3.py runs by default
pytestmark = [needs_gemma3, pytest.mark.slow]
NAME = "gemma3-270m"
LONG_TOKENS = 700  # past the sliding window (512)
NEW_TOKENS = 16
# as for SmolLM2: float32 on both sides, differences only from summation order
LOGITS_ATOL = 5e-4
SHORT_PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "Water boils at 100 degrees Celsius, and"]


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(min(2, torch.get_num_threads()))
    ours = zoo.load(NAME, dtype=torch.float32)
    path = zoo.locate(NAME)
    with warnings.catch_warnings():  # the reference's own load-time warnings are not ours to fix
        warnings.simplefilter("ignore")
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        ref_tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ref.eval()
    return ours, ref, ref_tok


def long_prompt(tokenizer) -> list[int]:
    ids = tokenizer.encode_prompt(real_text())[:LONG_TOKENS]
    assert len(ids) == LONG_TOKENS
    return ids


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


def test_config_and_tokenizer_from_the_gguf(models):
    ours, _, ref_tok = models
    c = ours.config
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size) == (18, 4, 1, 256, 640)
    assert c.sliding_layers == tuple(i for i in range(18) if (i + 1) % 6) and c.sliding_window == 512
    assert (c.rope_local_theta, c.rope_theta, c.vocab_size, c.tie_word_embeddings) == (10000.0, 1e6, 262144, True)
    tok = ours.tokenizer
    texts = [*SHORT_PROMPTS, real_text(), "  two  spaces,\ttabs\n\n\nand newlines", "Café 日本語 🙂 <start_of_turn>user\nhi<end_of_turn>"]
    for text in texts:
        assert tok.encode_prompt(text) == ref_tok.encode(text), text[:40]
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode_prompt("Hi")[0] == tok.bos_token_id == 2 and tok.eos_token_id == 1
    # the pre-trained model's GGUF carries no chat template (transformers finds none either)
    assert tok.chat_template is None and ref_tok.chat_template is None
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "Hi"}])


def test_logits_match_the_reference(models):
    ours, ref, _ = models
    for text in SHORT_PROMPTS:
        ids = ours.tokenizer.encode_prompt(text)
        got = ours.decoder.forward_full(torch.tensor(ids))  # [n, vocab]
        with torch.no_grad():
            want = ref(torch.tensor([ids])).logits[0].float()
        diff = (got - want).abs().max().item()
        print(f"{len(ids)} tokens {text[:20]!r}: max |logits - transformers| {diff:.3g} (max |logit| {want.abs().max().item():.1f})")
        assert diff < LOGITS_ATOL
        assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_logits_past_the_window_match_the_reference(models):
    """Logits at positions on both sides of the window edge (a [700, 262144] head would cost more than the layers)."""
    ours, ref, _ = models
    ids = long_prompt(ours.tokenizer)
    keep = torch.tensor([0, 255, 510, 511, 512, 513, 600, 650, 698, 699])
    hidden, positions = ours.decoder.embed(torch.tensor(ids)), torch.arange(LONG_TOKENS)
    for layer in range(ours.decoder.num_layers):
        hidden, _ = ours.decoder.layer_forward(layer, hidden, positions, None)
    got = ours.decoder.position_logits(hidden[keep])
    with torch.no_grad():
        want = ref(torch.tensor([ids]), logits_to_keep=keep).logits[0].float()
    diff = (got - want).abs().amax(-1)
    print(f"{LONG_TOKENS} tokens: max |logits - transformers| per kept position {[round(x, 6) for x in diff.tolist()]}")
    assert diff.max().item() < LOGITS_ATOL
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("which", ["short", "long"])
def test_greedy_generation_agrees(models, which):
    ours, ref, _ = models
    ids = ours.tokenizer.encode_prompt(SHORT_PROMPTS[0]) if which == "short" else long_prompt(ours.tokenizer)
    got = greedy(ours.decoder, ids, NEW_TOKENS)
    with torch.no_grad():
        want = ref.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    want = want[0, len(ids) :].tolist()
    assert len(want) == NEW_TOKENS
    assert got == want, (ours.tokenizer.decode(got), ours.tokenizer.decode(want))
