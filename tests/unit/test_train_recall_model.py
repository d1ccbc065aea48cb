"""The recall trainer's autograd forward computes what the worker's Decoder computes from the saved checkpoint."""

import numpy as np
import pytest
import torch

from engine_client.model import ModelConfig, load_checkpoint
from kvstore_tools import train_recall_model as trm


@pytest.fixture(scope="module")
def trained_like(tmp_path_factory):
    """Random parameters with non-trivial norms and biases, saved in float32."""
    raw = trm.model_config_dict(4)
    config = ModelConfig.from_dict(raw)
    params = trm.init_params(config, seed=3)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, t in params.items():
            if name.endswith(("bias", "norm.weight")):
                t.add_(0.2 * torch.randn(t.shape, generator=gen))
    out = trm.save_checkpoint(params, raw, tmp_path_factory.mktemp("recall"), dtype=torch.float32)
    return config, params, out


def test_training_forward_matches_decoder(trained_like):
    config, params, path = trained_like
    decoder = load_checkpoint(path)
    tokens = torch.randint(0, config.vocab_size, (2, 97), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = trm.forward(params, config, tokens)  # [2, 97, vocab]
        at = trm.forward(params, config, tokens, torch.tensor([[1, 96], [0, 5]]))
    for b in range(2):
        ref = decoder.forward_full(tokens[b])
        torch.testing.assert_close(ours[b], ref, rtol=1e-4, atol=2e-4)  # float32 summation order; logits ~10
    torch.testing.assert_close(at, torch.stack([ours[1, 96], ours[0, 5]]))


def test_config_is_qwen2_gqa_with_layers_in_groups_of_four():
    config = ModelConfig.from_dict(trm.model_config_dict(8))
    assert config.architecture == "Qwen2ForCausalLM" and config.attention_bias
    assert (config.num_attention_heads, config.num_key_value_heads, config.hidden_size) == (4, 2, 256)
    with pytest.raises(ValueError):
        trm.model_config_dict(6)


def test_schedule_warms_up_decays_and_grows_sequences():
    cfg = trm.TrainConfig(steps=1000, warmup_steps=100)
    lrs = [trm.lr_at(cfg, s) for s in range(cfg.steps)]
    assert lrs[0] < lrs[99] == pytest.approx(cfg.lr) and lrs[-1] == pytest.approx(cfg.lr * cfg.min_lr_fraction, rel=0.01)
    rng = np.random.default_rng(0)
    assert trm.sequence_length(cfg, 0, rng) == 256
    assert {trm.sequence_length(cfg, 999, rng) for _ in range(50)} == {1024, 2048}


def test_same_seed_same_weights(tmp_path):
    cfg = trm.TrainConfig(steps=2, tokens_per_step=512, warmup_steps=1, curriculum=[(1.0, [256])], threads=1)
    a = trm.train(cfg, tmp_path / "a", log=lambda s: None)
    b = trm.train(cfg, tmp_path / "b", log=lambda s: None)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert a["history"][-1]["loss"] == b["history"][-1]["loss"]


def test_layer0_first_kv_head_starts_as_previous_token_head():
    config = ModelConfig.from_dict(trm.model_config_dict(4))
    params = trm.init_params(config, seed=0)
    t, d = 200, config.head_dim
    tokens = torch.randint(16, config.vocab_size, (1, t), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        x = torch.nn.functional.embedding(tokens, params["model.embed_tokens.weight"])
        x = trm._rms_norm(x, params["model.layers.0.input_layernorm.weight"], config.rms_norm_eps)
        q = torch.nn.functional.linear(x, params["model.layers.0.self_attn.q_proj.weight"], params["model.layers.0.self_attn.q_proj.bias"])
        k = torch.nn.functional.linear(x, params["model.layers.0.self_attn.k_proj.weight"], params["model.layers.0.self_attn.k_proj.bias"])
        cos, sin = trm.rope_tables(config, t)
        q0 = trm._rope(q[0, :, :d], cos, sin)  # query head 0 -> KV head 0
        k0 = trm._rope(k[0, :, :d], cos, sin)
        scores = (q0 @ k0.T / d**0.5).masked_fill(torch.ones(t, t).triu(1).bool(), float("-inf"))
        probs = scores.softmax(-1)
    on_previous = probs[torch.arange(1, t), torch.arange(0, t - 1)]
    assert on_previous.mean() > 0.7


def test_seeded_circuit_copies_at_init():
    config = ModelConfig.from_dict(trm.model_config_dict(4))
    params = trm.init_params(config, seed=1)
    seq = trm.copy_sequence(np.random.default_rng(0), 200)
    tokens = torch.from_numpy(seq.tokens)[None]
    pos = torch.stack([torch.zeros(seq.answer_positions.size, dtype=torch.long), torch.from_numpy(seq.answer_positions)], 1)
    with torch.no_grad():
        logits = trm.forward(params, config, tokens, pos)
    assert (logits.argmax(-1) == tokens[0, pos[:, 1] + 1]).float().mean() > 0.5
