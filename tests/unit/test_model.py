"""The decoder's layer-level Re-Prefill API against dense forwards.

A naive float64 reference (written from the HF tensor files, pairs rotated
explicitly, per-head softmax) runs the whole prefix+suffix with an arbitrary
boolean mask; masking out unselected prefix columns for the suffix rows is
exactly what a sparse Re-Prefill must compute.
"""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from engine_client.model import load_checkpoint
from kvstore_tools.make_checkpoint import make_checkpoint

# (name, config overrides, n prefix tokens, s suffix tokens)
GEOMETRIES = [
    ("gqa2", {}, 37, 5),  # tiny: 4 q heads / 2 kv heads, head dim 16
    ("gqa1", {"num_key_value_heads": 4}, 29, 3),
    ("gqa7", {"num_attention_heads": 14, "num_key_value_heads": 2, "head_dim": 8}, 23, 6),
    # one KV head, head dim 4, no bias, untied, RoPE tables grown past max positions
    (
        "mqa",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "attention_bias": False,
            "num_attention_heads": 3,
            "num_key_value_heads": 1,
            "head_dim": 4,
            "max_position_embeddings": 16,
        },
        19,
        4,
    ),
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for name, overrides, _, _ in GEOMETRIES:
        out[name] = make_checkpoint(tmp_path_factory.mktemp(name), "tiny", seed=7, dtype="float32", overrides=overrides)
    return out


def tokens_for(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed))


def reference(ckpt, tokens: torch.Tensor, mask: torch.Tensor):
    """float64 dense forward with attention ``mask [T, T]`` (True = attend).

    Returns ``(logits [T, vocab], keys per layer [Hkv, T, d] post-RoPE, probs per layer [Hq, T, T])``.
    """
    cfg = json.loads((ckpt / "config.json").read_text())
    w = {k: v.double() for k, v in load_file(str(ckpt / "model.safetensors")).items()}
    hq, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim", cfg["hidden_size"] // hq)
    eps = cfg["rms_norm_eps"]
    bias = cfg["model_type"] == "qwen2" or cfg.get("attention_bias", False)
    T = tokens.numel()
    inv = 1.0 / cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]  # [T, d/2]

    def norm(x, weight):
        return weight * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)

    def rope(x):  # [H, T, d]: rotate the pair (i, i + d/2) by angle[t, i]
        a, b = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat([a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin()], -1)

    h = w["model.embed_tokens.weight"][tokens]
    keys, probs = [], []
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = norm(h, w[p + "input_layernorm.weight"])

        def proj(name, heads):
            y = x @ w[p + f"self_attn.{name}_proj.weight"].T
            if bias:
                y = y + w[p + f"self_attn.{name}_proj.bias"]
            return y.view(T, heads, d).transpose(0, 1)

        q, k, v = rope(proj("q", hq)), rope(proj("k", hkv)), proj("v", hkv)
        keys.append(k)
        out, layer_probs = [], []
        for head in range(hq):
            kv_head = head // (hq // hkv)
            scores = (q[head] @ k[kv_head].T / math.sqrt(d)).masked_fill(~mask, float("-inf"))
            pr = scores.softmax(-1)
            layer_probs.append(pr)
            out.append(pr @ v[kv_head])
        probs.append(torch.stack(layer_probs))
        h = h + torch.cat(out, -1) @ w[p + "self_attn.o_proj.weight"].T
        x = norm(h, w[p + "post_attention_layernorm.weight"])
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    head_w = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return norm(h, w["model.norm.weight"]) @ head_w.T, keys, probs


def sparse_mask(n: int, s: int, selected: torch.Tensor) -> torch.Tensor:
    """Causal ``[n+s, n+s]`` mask whose suffix rows see only ``selected`` prefix columns."""
    mask = torch.ones(n + s, n + s, dtype=torch.bool).tril()
    mask[n:, :n] = False
    mask[n:, selected] = True
    return mask


def reprefill(model, kv, suffix, n, selected):
    """Layer-by-layer Re-Prefill of ``suffix`` over prefix rows ``selected`` of ``kv``."""
    positions = torch.arange(n, n + suffix.numel())
    hidden = model.embed(suffix)
    suffix_kv, masses = [], []
    for layer in range(model.num_layers):
        prefix_kv = kv[layer][:, :, selected]  # [2, Hkv, r, d]
        q = model.layer_queries(layer, hidden, positions)
        hidden, skv = model.layer_forward(layer, hidden, positions, prefix_kv)
        suffix_kv.append(skv)
        masses.append(model.attention_mass(q, prefix_kv[0], skv[0]))
    return model.final_logits(hidden), torch.stack(suffix_kv), masses


@pytest.mark.parametrize("name,overrides,n,s", GEOMETRIES, ids=[g[0] for g in GEOMETRIES])
def test_reprefill_with_all_rows_equals_forward_full(checkpoints, name, overrides, n, s):
    model = load_checkpoint(checkpoints[name])
    tokens = tokens_for(n + s)
    full = model.forward_full(tokens)  # [n+s, vocab]
    logits_last, kv = model.prefill(tokens[:n])
    torch.testing.assert_close(logits_last, full[n - 1], atol=1e-4, rtol=0)
    logits, suffix_kv, _ = reprefill(model, kv, tokens[n:], n, torch.arange(n))
    torch.testing.assert_close(logits, full[-1], atol=1e-4, rtol=0)
    # The suffix KV continues the prefix KV: together they are the dense prefill's KV.
    _, kv_all = model.prefill(tokens)
    torch.testing.assert_close(torch.cat([kv, suffix_kv], dim=3), kv_all, atol=1e-4, rtol=0)
    # And forward_full agrees with the independent reference.
    ref, _, _ = reference(checkpoints[name], tokens, sparse_mask(n, s, torch.arange(n)))
    torch.testing.assert_close(full, ref.float(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("name,overrides,n,s", GEOMETRIES, ids=[g[0] for g in GEOMETRIES])
def test_sparse_rows_equal_masked_dense_attention(checkpoints, name, overrides, n, s):
    model = load_checkpoint(checkpoints[name])
    tokens = tokens_for(n + s, seed=1)
    # Non-contiguous: a sink, a gap, a run, a single row, and the row just before the suffix.
    selected = torch.tensor([0, 1, 5, 6, 7, 12, n - 1])
    _, kv = model.prefill(tokens[:n])
    logits, _, masses = reprefill(model, kv, tokens[n:], n, selected)
    ref, ref_keys, ref_probs = reference(checkpoints[name], tokens, sparse_mask(n, s, selected))
    torch.testing.assert_close(logits, ref[-1].float(), atol=1e-4, rtol=0)
    dense, _, _ = reprefill(model, kv, tokens[n:], n, torch.arange(n))
    assert (logits - dense).abs().max() > 1e-2, "selection must change the output measurably"
    for layer in range(model.num_layers):
        # prefill's keys are post-RoPE at their own positions
        torch.testing.assert_close(kv[layer, 0], ref_keys[layer][:, :n].float(), atol=1e-5, rtol=0)
        want = ref_probs[layer][:, n:, selected].sum(dim=(0, 1))  # [r]
        torch.testing.assert_close(masses[layer], want.float(), atol=1e-5, rtol=0)


def test_attention_mass_of_all_rows_plus_suffix_is_one_per_query_and_head(checkpoints):
    model = load_checkpoint(checkpoints["gqa7"])
    n, s = 23, 6
    tokens = tokens_for(n + s, seed=2)
    _, kv = model.prefill(tokens[:n])
    positions = torch.arange(n, n + s)
    hidden = model.embed(tokens[n:])
    q = model.layer_queries(0, hidden, positions)
    _, skv = model.layer_forward(0, hidden, positions, kv[0])
    mass = model.attention_mass(q, kv[0, 0], skv[0])
    assert mass.shape == (n,)
    assert 0 < mass.sum() < 14 * s
    # with no prefix rows the suffix takes all the mass
    assert model.attention_mass(q, kv[0, 0, :, :0], skv[0]).shape == (0,)


def test_bfloat16_runs_and_is_close_to_float32(checkpoints):
    ckpt = checkpoints["gqa2"]
    f32, bf16 = load_checkpoint(ckpt), load_checkpoint(ckpt, dtype=torch.bfloat16)
    n, s = 37, 20  # s >= 16 takes the upcast-GEMM path on CPUs without native bf16
    tokens = tokens_for(n + s, seed=3)
    selected = torch.tensor([0, 3, 4, 20, 21, 36])
    want, _, _ = reprefill(f32, f32.prefill(tokens[:n])[1], tokens[n:], n, selected)
    logits_bf16, kv_bf16 = bf16.prefill(tokens[:n])
    assert kv_bf16.dtype == torch.bfloat16 and logits_bf16.dtype == torch.float32
    got, suffix_kv, _ = reprefill(bf16, kv_bf16, tokens[n:], n, selected)
    assert suffix_kv.dtype == torch.bfloat16
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    assert torch.nn.functional.cosine_similarity(got, want, dim=0) > 0.999


def test_rope_tables_are_preallocated_and_grow_on_demand(checkpoints):
    model = load_checkpoint(checkpoints["mqa"])  # max_position_embeddings 16
    assert model._rope_cos.shape == (16, 4)
    model.prefill(tokens_for(40))
    assert model._rope_cos.shape[0] >= 40


def test_positions_made_on_the_host_give_the_tensors_results_and_size_the_tables(checkpoints):
    model = load_checkpoint(checkpoints["mqa"])  # max_position_embeddings 16: the tables start at 16 rows
    n, s = 30, 5
    _, kv = model.prefill(tokens_for(n))
    hidden = model.embed(tokens_for(s, seed=1))
    ranged = model.position_range(n, s)
    assert model._rope_cos.shape[0] >= n + s  # sized by position_range, before any layer runs
    plain = torch.arange(n, n + s)
    assert torch.equal(model.layer_queries(0, hidden, ranged), model.layer_queries(0, hidden, plain))
    assert torch.equal(model.layer_keys(0, hidden, ranged), model.layer_keys(0, hidden, plain))
    a, b = model.layer_forward(0, hidden, ranged, kv[0]), model.layer_forward(0, hidden, plain, kv[0])
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    for start, count in ((-1, 2), (0, 0), (1.5, 2), (True, 1)):
        with pytest.raises(ValueError, match="^position_range (start|count) must be an integer"):
            model.position_range(start, count)
    with pytest.raises(ValueError, match="^positions must be 5 on cpu, got 4"):
        model.layer_queries(0, hidden, model.position_range(n, 4))


def test_bad_inputs_are_refused_with_clear_errors(checkpoints):
    model = load_checkpoint(checkpoints["gqa2"])
    hidden = model.embed(tokens_for(3))
    positions = torch.arange(10, 13)
    with pytest.raises(ValueError, match="layer must be in"):
        model.layer_forward(2, hidden, positions, None)
    with pytest.raises(ValueError, match="prefix_kv must be"):
        model.layer_forward(0, hidden, positions, torch.zeros(2, 4, 5, 16))
    with pytest.raises(ValueError, match="positions must be"):
        model.layer_queries(0, hidden, torch.arange(2))
    with pytest.raises(ValueError, match="token ids"):
        model.prefill(torch.tensor([0, 512]))
    with pytest.raises(ValueError, match="1-D integer"):
        model.embed(torch.zeros(2, 2, dtype=torch.long))
