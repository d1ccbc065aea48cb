"""kvstore as a transformers prefix cache (``engine_client.integrations``), on the real package and a real daemon.

SmolLM2-135M is loaded by transformers 5.23 from its GGUF (its own dequantizer and Llama model),
in float32 and bfloat16; a Qwen2-shaped random checkpoint (``kvstore_tools.make_checkpoint``, size
``small``) from safetensors and ``config.json``.  For each, greedy generation through the cache
is token-identical to ``model.generate`` without it, on a miss (nothing stored), on a hit (a
longer prompt: only the tokens after the stored whole chunks run through the model, counted at
the embedding layer) and on a prompt stored in full (one token runs).  The entries are
``ModelRunner``'s: same geometry and fingerprint, a prefix stored by either is a full hit for the
other with the same prefix id, and the rows the runner stored equal transformers' own cache.
"""

import contextlib
import warnings

import pytest
import torch

from engine_client.client import KVStoreClient

transformers = pytest.importorskip("transformers", reason="needs the test extra: pip install -e '.[test]' (transformers)")
pytest.importorskip("accelerate", reason="transformers loads GGUF files only with accelerate: pip install -e '.[test]'")

from pretrained import hf_smollm2, installed, real_text  # noqa: E402

from engine_client.integrations.transformers_cache import KVStorePrefixCache  # noqa: E402
from engine_client.model import zoo  # noqa: E402
from engine_client.reprefill import ModelRunner  # noqa: E402

NEW_TOKENS = 8
CHUNK = 16
SYSTEM = "You are a careful assistant who answers questions about the sea, ships and the weather in plain words."
QUESTIONS = ["Describe the sea in two sentences.", "Why is the sea salty?"]
MORE = " Think about it step by step, then answer."
needs_smollm2 = pytest.mark.skipif(not installed("smollm2-135m"), reason=f"needs {zoo.MODELS['smollm2-135m'].install_command}")


@contextlib.contextmanager
def counted(model):
    """Token counts of each forward the model runs (at its embedding layer): the first is the prompt's."""
    counts: list[int] = []
    hook = model.get_input_embeddings().register_forward_hook(lambda module, args, out: counts.append(args[0].shape[-1]))
    try:
        yield counts
    finally:
        hook.remove()


def reference(model, prompt: list[int]) -> list[int]:
    """Greedy tokens of ``model.generate`` without any cache given."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, len(prompt) :].tolist()


def expected_match(prompt: list[int], stored: list[list[int]]) -> int:
    """Tokens of ``prompt`` the store holds, brute force: whole shared chunks, or the whole prompt if it was stored as is."""
    best = 0
    for s in stored:
        if s == prompt:
            return len(prompt)
        common = next((i for i, (a, b) in enumerate(zip(prompt, s)) if a != b), min(len(prompt), len(s)))
        best = max(best, min(common, len(s)) // CHUNK * CHUNK)
    return best


def check_generations(cache: KVStorePrefixCache, model, prompts: list[list[int]]) -> list[tuple[int, int]]:
    """Each prompt through the cache, twice: tokens equal the reference's, the loaded/computed split the store's.

    Returns (loaded, computed) of each first call."""
    stored: list[list[int]] = []
    splits = []
    for prompt in prompts:
        want = reference(model, prompt)
        for again in (False, True):
            matched = expected_match(prompt, stored)
            with counted(model) as counts:
                out = cache.generate(prompt, max_new_tokens=NEW_TOKENS)
            loaded = min(matched, len(prompt) - 1)
            assert (out.loaded_tokens, out.computed_tokens) == (loaded, len(prompt) - loaded)
            assert counts[0] == out.computed_tokens and counts[1:] == [1] * (len(counts) - 1)  # the prompt's rest, then one per token
            assert out.new_tokens == want, (prompt, out.new_tokens, want)
            assert torch.equal(out.sequences[0, : len(prompt)], torch.tensor(prompt))
            if again:
                assert out.stored is None and out.computed_tokens == 1  # stored in full: the last token runs for its logits
            else:
                assert out.stored is not None and out.stored.reused_chunks == matched // CHUNK
                splits.append((out.loaded_tokens, out.computed_tokens))
            stored.append(prompt)
    return splits


# ------------------------------------------------------------------ SmolLM2 from its GGUF, both dtypes


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def smollm2(request):
    """(transformers model, transformers tokenizer, the project's PretrainedModel) of one dtype."""
    if not installed("smollm2-135m"):
        pytest.skip(f"needs {zoo.MODELS['smollm2-135m'].install_command}")
    torch.set_num_threads(min(2, torch.get_num_threads()))
    model, tok = hf_smollm2(request.param)
    return model, tok, zoo.load("smollm2-135m", dtype=getattr(torch, request.param))


def chat(pm, question: str, more: str = "") -> list[int]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return pm.tokenizer.encode_chat(messages) + (pm.tokenizer.encode(more) if more else [])


@needs_smollm2
def test_smollm2_generation_is_token_identical_and_computes_only_the_rest(daemon, smollm2):
    model, tok, pm = smollm2
    prompts = [p for q in QUESTIONS for p in (chat(pm, q), chat(pm, q, MORE))]
    with KVStoreClient(daemon.target) as client:
        cache = KVStorePrefixCache(client, model, tok)
        splits = check_generations(cache, model, prompts)
    print(f"{model.dtype}: (loaded, computed) prompt tokens of each first call: {splits}")
    assert splits[0][0] == 0  # a miss on an empty store: the whole prompt runs
    assert all(loaded >= 32 for loaded, _ in splits[1::2])  # each longer prompt loads its question's whole chunks


@needs_smollm2
def test_smollm2_entries_are_the_runners_both_ways(daemon, smollm2):
    model, tok, pm = smollm2
    with KVStoreClient(daemon.target) as client:
        cache = KVStorePrefixCache(client, model, tok)
        runner = ModelRunner(pm.decoder, client)
        assert cache.geometry == runner.geometry and cache.model_fingerprint == pm.decoder.fingerprint

        # the runner stores, the cache hits: same prefix id, the runner's rows equal transformers' own cache
        by_runner = chat(pm, QUESTIONS[0])
        handle = runner.store_prefix(by_runner)
        hit = cache.lookup(by_runner)
        assert (hit.matched_chunks, hit.num_chunks, hit.prefix_id) == (handle.num_chunks, handle.num_chunks, handle.prefix_id)
        load = cache.prepare(by_runner)
        assert load.loaded_tokens == len(by_runner) - 1 and load.lookup.prefix_id == handle.prefix_id
        with torch.no_grad():
            own = model(torch.tensor([by_runner]), use_cache=True).past_key_values
        n = load.loaded_tokens
        diff = max(
            (mine - theirs[:, :, :n]).abs().max().item()
            for a, b in zip(load.past_key_values.layers, own.layers)
            for mine, theirs in ((a.keys, b.keys), (a.values, b.values))
        )
        print(f"{model.dtype}: max |runner's stored KV - transformers' cache| over {n} tokens x 30 layers: {diff:.3g}")
        assert diff <= (1e-4 if model.dtype == torch.float32 else 0.0625)  # float32 rounding; bf16: a few ulps of |kv| < 32
        out = cache.generate(by_runner + tok.encode(MORE), max_new_tokens=NEW_TOKENS)
        assert out.loaded_tokens == len(by_runner) // CHUNK * CHUNK and out.stored.reused_chunks == len(by_runner) // CHUNK
        assert out.new_tokens == reference(model, by_runner + tok.encode(MORE))

        # the cache stores, the runner hits: same prefix id, nothing written
        by_cache = chat(pm, QUESTIONS[1])
        out = cache.generate(by_cache, max_new_tokens=NEW_TOKENS)
        again = runner.store_prefix(by_cache)
        assert again.cache_hit and again.prefix_id == out.prefix_id == out.stored.prefix_id and again.bytes_written == 0


@needs_smollm2
def test_smollm2_a_prefix_larger_than_the_arenas_lease_space_loads(daemon, smollm2):
    """400 tokens of prose are 18 MiB of float32 KV (9 MiB in bfloat16), more than the test daemon's shared-memory
    lease space (8 MiB of its 32 MiB arena): the rows come in reads of whole layers, with the bytes in the stream."""
    model, tok, pm = smollm2
    prose = pm.tokenizer.encode(real_text())[:400]
    question = tok.encode(" In one word, this text is a")
    with KVStoreClient(daemon.target) as client:
        cache = KVStorePrefixCache(client, model, tok)
        assert cache.generate(prose, max_new_tokens=1).stored.bytes_written > 8 << 20
        out = cache.generate(prose + question, max_new_tokens=NEW_TOKENS)
    assert (out.loaded_tokens, out.computed_tokens) == (400, len(question)) and out.new_tokens == reference(model, prose + question)


# ------------------------------------------------------------------ a Qwen2-shaped checkpoint


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def qwen2(request, tmp_path_factory):
    """(transformers model, the project's decoder) of a seeded random ``small`` Qwen2 checkpoint written in that dtype."""
    from engine_client.model.loader import load_checkpoint
    from kvstore_tools.make_checkpoint import make_checkpoint

    path = tmp_path_factory.mktemp("qwen2") / request.param
    make_checkpoint(str(path), "small", 0, request.param, 1)
    dtype = getattr(torch, request.param)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    model.eval()
    return model, load_checkpoint(str(path), dtype=dtype)


def test_qwen2_generation_is_token_identical_and_shares_the_runners_entries(daemon, qwen2):
    model, decoder = qwen2
    assert type(model).__name__ == "Qwen2ForCausalLM" and decoder.config.attention_bias
    gen = torch.Generator().manual_seed(7)
    prompts = []
    for _ in range(3):
        head = torch.randint(0, 4096, (37,), generator=gen).tolist()
        prompts += [head, head + torch.randint(0, 4096, (29,), generator=gen).tolist()]
    with KVStoreClient(daemon.target) as client:
        cache = KVStorePrefixCache(client, model)
        runner = ModelRunner(decoder, client)
        assert cache.geometry == runner.geometry and cache.model_fingerprint == decoder.fingerprint
        splits = check_generations(cache, model, prompts)
        assert splits == [(0, 37), (32, 34)] * 3
        for prompt in prompts:  # every prompt the cache stored is the runner's full hit
            h = runner.store_prefix(prompt)
            assert h.cache_hit and h.prefix_id == cache.lookup(prompt).prefix_id
        out = cache.generate(prompts[1], max_new_tokens=NEW_TOKENS, return_dict_in_generate=True, output_scores=True)
        assert out.new_tokens == reference(model, prompts[1]) and out.computed_tokens == 1
