"""The transformers prefix cache's decisions and refusals on toy models (no daemon, no file: nothing is read or stored).

Every refusal is one line naming what is wrong; the config, fingerprint and geometry of a
transformers model equal what the project's loader gives the same checkpoint.
"""

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="needs the test extra: pip install -e '.[test]' (transformers)")

from engine_client.integrations.hf_model import gguf_float, hf_fingerprint, hf_geometry, hf_model_config  # noqa: E402
from engine_client.integrations.transformers_cache import KVStorePrefixCache, cache_kv, rows_to_load  # noqa: E402
from engine_client.model.config import UnsupportedModel  # noqa: E402
from kvstore.contract import InvalidArgument  # noqa: E402

TOY = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)


class NoClient:
    """Stands where a KVStoreClient goes: the checks under test never reach the daemon."""

    def __getattr__(self, name):
        raise AssertionError(f"the daemon was asked ({name}) before the input was checked")


def toy_llama(**overrides):
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**TOY, **overrides})).eval()


def one_line(exc_info, *words):
    text = str(exc_info.value)
    assert "\n" not in text and all(w in text for w in words), text


def test_rows_to_load_keeps_the_last_token_to_compute():
    assert rows_to_load(0, 10) == 0
    assert rows_to_load(32, 50) == 32
    assert rows_to_load(50, 50) == 49  # the whole prompt is stored: its last token still runs
    assert rows_to_load(48, 48) == 47
    assert rows_to_load(16, 1) == 0


def test_gguf_float_is_the_shortest_decimal_of_a_float32_only():
    assert gguf_float(9.999999747378752e-06) == 1e-05  # GGUF's float32 1e-5, widened by transformers
    assert gguf_float(1e-05) == 1e-05 and gguf_float(1e-06) == 1e-06  # written in a config.json: not float32 values
    assert gguf_float(100000.0) == 100000.0 and gguf_float(0.5) == 0.5
    assert gguf_float(3) == 3


def test_the_config_fingerprint_and_geometry_are_the_loaders_and_the_runners(tmp_path):
    from engine_client.model.loader import load_checkpoint
    from engine_client.reprefill.runner import model_geometry
    from kvstore_tools.make_checkpoint import make_checkpoint

    for dtype in ("float32", "bfloat16"):
        path = make_checkpoint(tmp_path / dtype, "tiny", 3, dtype, 2)  # two shards: the digest is by name, not by file
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
        decoder = load_checkpoint(str(path), dtype=getattr(torch, dtype))
        config = hf_model_config(model)
        assert config == decoder.config
        assert hf_fingerprint(model) == decoder.fingerprint
        assert hf_geometry(config, model.dtype) == model_geometry(decoder, group_layers=1, probe_bits=4)
        cache = KVStorePrefixCache(NoClient(), model)
        assert cache.model_fingerprint == decoder.fingerprint and cache.geometry.model.dtype == dtype
        assert KVStorePrefixCache(NoClient(), model, model_fingerprint="mine").model_fingerprint == "mine"
    with torch.no_grad():  # other weights, another fingerprint
        model.model.norm.weight.add_(1.0)
    assert hf_fingerprint(model) != decoder.fingerprint


def test_models_it_does_not_take_are_refused_in_one_line():
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2))
    with pytest.raises(UnsupportedModel) as e:
        KVStorePrefixCache(NoClient(), gpt2)
    one_line(e, "GPT2LMHeadModel", "'gpt2'", "llama, qwen2")
    with pytest.raises(InvalidArgument) as e:
        KVStorePrefixCache(NoClient(), transformers.LlamaModel(transformers.LlamaConfig(**TOY)))  # no language-model head
    one_line(e, "model:", "LlamaModel", "AutoModelForCausalLM")
    with pytest.raises(InvalidArgument) as e:
        KVStorePrefixCache(NoClient(), object())
    one_line(e, "model:", "object")
    scaled = toy_llama(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    with pytest.raises(UnsupportedModel) as e:
        KVStorePrefixCache(NoClient(), scaled)
    one_line(e, "rope scaling")
    with pytest.raises(InvalidArgument) as e:
        KVStorePrefixCache(NoClient(), toy_llama().to(torch.float64))
    one_line(e, "model:", "float64")


def tokenizer_of(vocab: int, eos: str):
    """A transformers tokenizer of ``vocab`` tokens ``t0``, ``t1``, ... (a word-level model, no file)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=eos)


def test_a_tokenizer_of_another_model_is_refused_in_one_line():
    model = toy_llama(eos_token_id=2)
    KVStorePrefixCache(NoClient(), model, tokenizer_of(64, "t2"))  # its own: accepted
    with pytest.raises(InvalidArgument) as e:
        KVStorePrefixCache(NoClient(), model, tokenizer_of(100, "t2"))
    one_line(e, "tokenizer:", "100 tokens", "64")
    with pytest.raises(InvalidArgument) as e:
        KVStorePrefixCache(NoClient(), model, tokenizer_of(64, "t5"))
    one_line(e, "tokenizer:", "token 5", "[2]")
    with pytest.raises(InvalidArgument) as e:
        KVStorePrefixCache(NoClient(), model, "not a tokenizer")
    one_line(e, "tokenizer:", "str")


def test_prompts_are_one_sequence_of_the_models_token_ids():
    cache = KVStorePrefixCache(NoClient(), toy_llama(), tokenizer_of(64, "t2"))
    assert cache.token_ids([3, 4, 5]).tolist() == [3, 4, 5]
    assert cache.token_ids(torch.tensor([[3, 4]])).tolist() == [3, 4]
    assert cache.token_ids("t7 t8").tolist() == [7, 8]
    assert cache.token_ids(cache.tokenizer("t7 t9")).tolist() == [7, 9]  # a tokenizer's output (BatchEncoding)
    assert cache.token_ids(cache.tokenizer("t7 t9", return_tensors="pt")).tolist() == [7, 9]
    for bad, words in (
        ([], ["input_ids:", "empty"]),
        (torch.zeros(1, 0, dtype=torch.long), ["input_ids:", "empty"]),
        (torch.zeros(2, 4, dtype=torch.long), ["input_ids:", "[2, 4]"]),
        ([1.5, 2.0], ["input_ids:", "float"]),
        ([3, 64], ["input_ids:", "64", "[0, 64)"]),
        ([-1, 3], ["input_ids:", "-1"]),
        ({"input_ids": [[3, 4]], "attention_mask": [[0, 1]]}, ["input_ids:", "padding"]),
        ({"ids": [3, 4]}, ["input_ids:", "without input_ids"]),
        (object(), ["input_ids:", "token ids", "object"]),
    ):
        with pytest.raises(InvalidArgument) as e:
            cache.token_ids(bad)
        one_line(e, *words)
    with pytest.raises(InvalidArgument) as e:
        KVStorePrefixCache(NoClient(), toy_llama()).token_ids("text")
    one_line(e, "input_ids:", "no tokenizer")
    with pytest.raises(InvalidArgument) as e:
        cache.generate([1, 2], max_new_tokens=2, past_key_values=None)
    one_line(e, "past_key_values:", "set by the prefix cache")
    with pytest.raises(InvalidArgument) as e:
        cache.generate([1, 2], max_new_tokens=2, num_beams=3)
    one_line(e, "num_beams:", "must be 1")


def test_cache_kv_takes_the_prompts_rows_of_a_layered_cache():
    model = toy_llama()
    config = hf_model_config(model)
    with torch.no_grad():
        cache = model(torch.tensor([[1, 2, 3, 4, 5]]), use_cache=True).past_key_values
    kv = cache_kv(cache, 3, config, torch.float32)  # [layers, 2, kv_heads, tokens, head_dim]
    assert kv.shape == (2, 2, 1, 3, 8)
    assert torch.equal(kv[1, 0], cache.layers[1].keys[0, :, :3]) and torch.equal(kv[0, 1], cache.layers[0].values[0, :, :3])
    with pytest.raises(InvalidArgument) as e:
        cache_kv(cache, 6, config, torch.float32)
    one_line(e, "past_key_values:", "layer 0", ">= 6")
    with pytest.raises(InvalidArgument) as e:
        cache_kv(cache, 3, config, torch.bfloat16)
    one_line(e, "past_key_values:", "bfloat16")
    with pytest.raises(InvalidArgument) as e:
        cache_kv(object(), 3, config, torch.float32)
    one_line(e, "past_key_values:", "no layers")


# ------------------------------------------------------------------ the sparse path's own pieces


def test_the_sparse_paths_queries_are_the_attentions():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from engine_client.integrations.transformers_sparse import rotated_queries

    model = toy_llama()
    attn = model.model.layers[1].self_attn
    hidden = torch.randn(1, 5, 16)
    positions = torch.arange(40, 45)[None]  # after a prefix: not the rows' own count
    cos, sin = model.model.rotary_emb(hidden, positions)
    with torch.no_grad():
        q = attn.q_proj(hidden).view(1, 5, 2, 8).transpose(1, 2)
        want, _ = apply_rotary_pos_emb(q, q, cos, sin)
        got = rotated_queries(attn, hidden, (cos, sin))
    assert got.shape == (2, 5, 8) and torch.equal(got, want[0])


def test_the_suffix_sees_every_loaded_row_and_itself_causally():
    from engine_client.integrations.transformers_sparse import suffix_mask

    mask = suffix_mask(2, 3, torch.float32, "cpu")  # [1, 1, s, rows + s]
    visible = (mask[0, 0] == 0).tolist()
    assert visible == [[True, True, True, False, False], [True, True, True, True, False], [True, True, True, True, True]]
    assert mask.min() == torch.finfo(torch.float32).min


def test_the_sparse_path_names_what_it_does_not_run():
    from engine_client.integrations.transformers_sparse import SparseReprefill, unsupported
    from engine_client.reprefill import ReprefillConfig

    assert unsupported(ReprefillConfig()) is None
    for field, value in (("per_head", True), ("streaming", True), ("prefill_alpha", 0.9), ("reselect_every", 4)):
        assert unsupported(ReprefillConfig().replace(**{field: value}))[0] == field
    model = toy_llama()
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(InvalidArgument) as e:
        SparseReprefill(KVStorePrefixCache(NoClient(), model))
    one_line(e, "model:", "flex_attention", "sdpa")


def test_long_reads_are_cut_into_whole_groups_of_about_32_mib():
    from engine_client.integrations.transformers_cache import layer_batches
    from kvstore.contract.geometry import ModelSpec, StoreGeometry

    smol = ModelSpec(30, 3, 64, "float32")  # 3 MiB per layer of 2048 tokens
    assert layer_batches(StoreGeometry(smol, group_layers=1), 2048, 0, 30) == [(0, 10), (10, 20), (20, 30)]
    assert layer_batches(StoreGeometry(smol, group_layers=4), 2048, 0, 30) == [(0, 8), (8, 16), (16, 24), (24, 30)]
    assert layer_batches(StoreGeometry(smol, group_layers=4), 1 << 20, 0, 30)[:2] == [(0, 4), (4, 8)]  # one group at least
    assert layer_batches(StoreGeometry(smol, group_layers=1), 100, 8, 16) == [(8, 16)]  # a Period's layers
    assert layer_batches(StoreGeometry(smol, group_layers=1), 2048, 0, 30, max_bytes=1) == [(i, i + 1) for i in range(30)]
