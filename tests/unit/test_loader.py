"""Loading HF-format checkpoints written by kvstore_tools.make_checkpoint."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine_client.model import (
    CheckpointError,
    ConfigError,
    MissingCheckpointFile,
    ModelConfig,
    UnsupportedModel,
    load_checkpoint,
)
from kvstore_tools.make_checkpoint import config_dict, main, make_checkpoint

TOKENS = torch.arange(0, 500, 37)  # 14 tokens


@pytest.fixture
def tiny(tmp_path):
    return make_checkpoint(tmp_path / "tiny", "tiny", seed=3)


def edit_config(ckpt, **changes):
    path = ckpt / "config.json"
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw))


def edit_tensors(ckpt, fn):
    path = str(ckpt / "model.safetensors")
    tensors = load_file(path)
    fn(tensors)
    save_file(tensors, path)


def test_checkpoint_layout_and_config(tiny):
    assert sorted(p.name for p in tiny.iterdir()) == ["config.json", "model.safetensors"]
    raw = json.loads((tiny / "config.json").read_text())
    assert raw["architectures"] == ["Qwen2ForCausalLM"] and raw["model_type"] == "qwen2"
    assert raw["torch_dtype"] == "bfloat16"
    assert load_file(str(tiny / "model.safetensors"))["model.embed_tokens.weight"].dtype == torch.bfloat16
    cfg = ModelConfig.from_dict(raw)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (2, 64, 4, 2, 16)
    assert cfg.attention_bias and not cfg.tie_word_embeddings


def test_load_is_deterministic(tiny, tmp_path):
    a, b = load_checkpoint(tiny), load_checkpoint(tiny)
    assert torch.equal(a.forward_full(TOKENS), b.forward_full(TOKENS))
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 64
    # The same seed writes the same weights; another seed other weights.
    again = load_checkpoint(make_checkpoint(tmp_path / "again", "tiny", seed=3))
    other = load_checkpoint(make_checkpoint(tmp_path / "other", "tiny", seed=4))
    assert again.fingerprint == a.fingerprint
    assert other.fingerprint != a.fingerprint
    assert not torch.equal(other.forward_full(TOKENS), a.forward_full(TOKENS))


def test_sharded_checkpoint_loads_the_same_weights(tiny, tmp_path):
    sharded = make_checkpoint(tmp_path / "sharded", "tiny", seed=3, shards=2)
    names = sorted(p.name for p in sharded.iterdir())
    assert names == ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    single, split = load_checkpoint(tiny), load_checkpoint(sharded)
    assert split.fingerprint == single.fingerprint
    assert torch.equal(split.forward_full(TOKENS), single.forward_full(TOKENS))


def test_missing_tensor_is_named(tiny):
    edit_tensors(tiny, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'model\.layers\.1\.mlp\.up_proj\.weight'"):
        load_checkpoint(tiny)


def test_wrong_shape_is_named_with_both_shapes(tiny):
    def shrink(t):
        t["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, 64, dtype=torch.bfloat16)

    edit_tensors(tiny, shrink)
    with pytest.raises(CheckpointError, match=r"'model\.layers\.0\.self_attn\.k_proj\.weight'.*shape \[16, 64\], expected \[32, 64\]"):
        load_checkpoint(tiny)


@pytest.mark.parametrize("arch", ["MistralForCausalLM", "GPT2LMHeadModel"])
def test_unsupported_architecture_is_named(tiny, arch):
    edit_config(tiny, architectures=[arch])
    with pytest.raises(UnsupportedModel, match=arch):
        load_checkpoint(tiny)


def test_missing_config_json(tiny):
    (tiny / "config.json").unlink()
    with pytest.raises(MissingCheckpointFile, match="config.json"):
        load_checkpoint(tiny)


def test_missing_weights_and_shard(tiny, tmp_path):
    (tiny / "model.safetensors").unlink()
    with pytest.raises(MissingCheckpointFile, match="model.safetensors"):
        load_checkpoint(tiny)
    sharded = make_checkpoint(tmp_path / "sharded", "tiny", seed=3, shards=2)
    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(MissingCheckpointFile, match="model-00002-of-00002.safetensors"):
        load_checkpoint(sharded)


@pytest.mark.parametrize(
    "changes,field",
    [
        ({"hidden_size": -64}, "hidden_size"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"rope_theta": "big"}, "rope_theta"),
        ({"vocab_size": None}, "vocab_size"),
    ],
)
def test_bad_config_field_is_named(changes, field):
    raw = config_dict("tiny")
    raw.update(changes)
    with pytest.raises(ConfigError, match=f"'{field}'"):
        ModelConfig.from_dict(raw)


@pytest.mark.parametrize("changes", [{"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, {"hidden_act": "gelu"}])
def test_variants_the_decoder_does_not_implement_are_refused(changes):
    raw = config_dict("tiny")
    raw.update(changes)
    with pytest.raises(UnsupportedModel):
        ModelConfig.from_dict(raw)


def test_llama_config_loads(tiny):
    qwen = load_checkpoint(tiny)
    # Llama with attention_bias true is the same math as Qwen2.
    edit_config(tiny, architectures=["LlamaForCausalLM"], model_type="llama", attention_bias=True)
    llama_bias = load_checkpoint(tiny)
    assert llama_bias.config.architecture == "LlamaForCausalLM"
    assert torch.equal(llama_bias.forward_full(TOKENS), qwen.forward_full(TOKENS))
    # Without it the q/k/v biases in the file are ignored; head_dim defaults to hidden/heads.
    edit_config(tiny, attention_bias=False)
    llama = load_checkpoint(tiny)
    assert not llama.config.attention_bias and llama.weights.layers[0].qkv_bias is None
    assert llama.config.head_dim == 16
    assert llama.fingerprint != qwen.fingerprint
    assert not torch.equal(llama.forward_full(TOKENS), qwen.forward_full(TOKENS))


def test_tied_embeddings_have_no_lm_head(tmp_path):
    ckpt = make_checkpoint(tmp_path, "tiny", seed=1, overrides={"tie_word_embeddings": True})
    assert "lm_head.weight" not in load_file(str(ckpt / "model.safetensors"))
    model = load_checkpoint(ckpt, dtype=torch.bfloat16)
    assert model.weights.lm_head is model.weights.embed
    assert model.prefill(TOKENS)[0].shape == (512,)


def test_cli_writes_a_loadable_checkpoint(tmp_path, capsys):
    assert main(["--size", "tiny", "--out", str(tmp_path), "--seed", "5", "--dtype", "float32", "--shards", "3"]) == 0
    assert "wrote tiny checkpoint" in capsys.readouterr().out
    assert len(list(tmp_path.glob("model-*-of-00003.safetensors"))) == 3
    assert load_checkpoint(tmp_path).weights.embed.dtype == torch.float32
