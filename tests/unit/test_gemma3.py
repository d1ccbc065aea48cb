"""Gemma 3 on a tiny random checkpoint: config, decoder against transformers, sliding windows, GGUF.

The reference is transformers' own ``Gemma3ForCausalLM`` loading the same HF
directory (config.json + safetensors): sandwich and q/k norms with the
``1 + weight`` scale, GeGLU, ``sqrt(hidden)`` embeddings, two RoPE bases and
the sliding-window mask are each computed there independently.  The window
is 4 positions and the inputs are longer, so every sliding layer masks.
"""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from engine_client.model import load_checkpoint
from engine_client.model.config import ConfigError, ModelConfig, UnsupportedModel
from engine_client.model.loader import expected_tensors

WINDOW = 4
GEMMA3 = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "query_pre_attn_scalar": 12,  # not head_dim: the scale must come from here
    "sliding_window": WINDOW,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "tie_word_embeddings": True,
    "attention_bias": False,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
}


def write_gemma3(root, raw=GEMMA3, seed=0):
    """A random HF Gemma 3 checkpoint in ``root``; norms are the HF ``w`` (scaled by ``1 + w``)."""
    root.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    shapes = expected_tensors(ModelConfig.from_dict(raw))
    tensors = {name: torch.randn(shape, generator=gen) * (0.3 if "norm" in name else 0.2) for name, shape in shapes.items()}
    save_file(tensors, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps(raw))
    return root


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_gemma3(tmp_path_factory.mktemp("gemma3") / "hf")


@pytest.fixture(scope="module")
def model(tiny):
    return load_checkpoint(tiny, dtype=torch.float32)


def tokens(n, seed=1):
    return torch.randint(0, GEMMA3["vocab_size"], (n,), generator=torch.Generator().manual_seed(seed))


def test_config_reads_the_layer_kinds_bases_and_scale(model):
    c = model.config
    assert c.gemma3 and c.sliding_layers == (0, 2) and c.window_of(1) is None and c.window_of(2) == WINDOW
    assert (c.rope_theta_of(0), c.rope_theta_of(1)) == (10000.0, 1000000.0)
    assert c.attention_scale == 12**-0.5 and c.hidden_act == "gelu_pytorch_tanh"
    assert ModelConfig(**json.loads(c.canonical_json())) == c
    # the v5 layout of the same config (rope_parameters per layer kind) reads the same
    v5 = {k: v for k, v in GEMMA3.items() if k not in ("rope_theta", "rope_local_base_freq")}
    v5["rope_parameters"] = {"full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 1e4}}
    assert ModelConfig.from_dict(v5) == c
    # transformers' defaults where the file says nothing: every 6th layer full, window 4096, scalar 256
    bare = {k: v for k, v in GEMMA3.items() if k not in ("layer_types", "sliding_window", "query_pre_attn_scalar")}
    d = ModelConfig.from_dict({**bare, "num_hidden_layers": 7})
    assert d.sliding_layers == (0, 1, 2, 3, 4, 6) and d.sliding_window == 4096 and d.query_pre_attn_scalar == 256


def test_llama_fingerprint_fields_are_unchanged():
    """A Llama/Qwen2 config serializes exactly the first version's fields, so its fingerprint stays."""
    c = ModelConfig("LlamaForCausalLM", 32, 64, 96, 1, 4, 2, 16, 10000.0, 1e-6, 512, False, False)
    assert sorted(json.loads(c.canonical_json())) == sorted(
        "architecture vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads num_key_value_heads "
        "head_dim rope_theta rms_norm_eps max_position_embeddings tie_word_embeddings attention_bias".split()
    )
    assert c.unsupported_features() == [] and c.attention_scale is None
    c.require_full_attention("anything")  # no error


@pytest.mark.parametrize(
    "change, message",
    [
        ({"rope_scaling": {"rope_type": "linear", "factor": 8.0}}, "rope scaling 'linear'"),
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0"),
        ({"final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0"),
        ({"hidden_activation": "gelu"}, "hidden_activation='gelu'"),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]}, "layer type 'chunked_attention'"),
    ],
)
def test_gemma3_variants_are_refused(change, message):
    with pytest.raises(UnsupportedModel, match=message):
        ModelConfig.from_dict({**GEMMA3, **change})


def test_bad_gemma3_fields_are_named():
    with pytest.raises(ConfigError, match="layer_types"):
        ModelConfig.from_dict({**GEMMA3, "layer_types": ["full_attention"]})
    with pytest.raises(ConfigError, match="sliding_window"):
        ModelConfig.from_dict({**GEMMA3, "sliding_window": 0})
    with pytest.raises(UnsupportedModel, match="LlamaForCausalLM with layer_types"):
        ModelConfig("LlamaForCausalLM", 32, 64, 96, 1, 4, 2, 16, 1e4, 1e-6, 512, False, False, layer_types=("full_attention",))


def test_full_attention_only_components_refuse_in_one_line(model):
    with pytest.raises(UnsupportedModel) as exc:
        model.config.require_full_attention("the Re-Prefill runner")
    text = str(exc.value)
    assert "\n" not in text
    assert text == (
        "the Re-Prefill runner does not support Gemma3ForCausalLM: sliding-window attention (2 of 3 layers, window 4); "
        "a second RoPE base on those layers (10000)"
    )


def test_logits_match_transformers_past_the_window(tiny, model):
    transformers = pytest.importorskip("transformers", reason="needs the test extra (transformers)")
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32).eval()
    assert type(ref).__name__ == "Gemma3ForCausalLM"
    ids = tokens(19)
    with torch.no_grad():
        want = ref(ids[None]).logits[0]
    got = model.forward_full(ids)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    # the window matters here: without it the logits move
    windows, model._windows = model._windows, [None] * 3
    try:
        assert (model.forward_full(ids) - want).abs().max() > 1e-3
    finally:
        model._windows = windows


def run_suffix(model, kv, suffix, start, prefix_positions=None, rows=None):
    hidden = model.embed(suffix)
    positions = torch.arange(start, start + suffix.numel())
    for layer in range(model.num_layers):
        prefix = kv[layer] if rows is None or model.config.window_of(layer) is None else kv[layer][:, :, rows]
        pos = None if rows is None or model.config.window_of(layer) is None else prefix_positions
        hidden, _ = model.layer_forward(layer, hidden, positions, prefix, prefix_positions=pos)
    return model.position_logits(hidden)


def test_suffix_over_prefix_rows_sees_only_the_window(model):
    """Dense prefix then a suffix: equal to one dense forward; sliding layers given only their window's rows: equal too."""
    ids = tokens(17, seed=2)
    n = 11
    dense = model.forward_full(ids)[n:]
    _, kv = model.prefill(ids[:n])  # [L, 2, Hkv, n, d]
    torch.testing.assert_close(run_suffix(model, kv, ids[n:], n), dense, atol=2e-5, rtol=2e-5)
    # the rows a suffix starting at n can see in a sliding layer: n-W+1 .. n-1 (the default: right before the suffix)
    last = torch.arange(n - WINDOW + 1, n)
    torch.testing.assert_close(run_suffix(model, kv, ids[n:], n, None, last), dense, atol=2e-5, rtol=2e-5)
    # a sparse subset with its positions given: rows out of every window change nothing
    rows = torch.tensor([0, 3, 8, 9, 10])
    torch.testing.assert_close(run_suffix(model, kv, ids[n:], n, rows, rows), dense, atol=2e-5, rtol=2e-5)
    with pytest.raises(ValueError, match="prefix_positions must be \\[11\\]"):
        model.layer_forward(0, model.embed(ids[n:]), torch.arange(n, 17), kv[0], prefix_positions=torch.arange(3))


def test_token_by_token_decoding_matches_the_dense_forward(model):
    """One token at a time over the growing KV (the decode path, one query row per layer) crosses the window."""
    ids = tokens(14, seed=3)
    dense = model.forward_full(ids)
    _, kv = model.prefill(ids[:5])  # [L, 2, Hkv, 5, d]
    for t in range(5, 14):
        hidden, step = model.embed(ids[t : t + 1]), []
        for layer in range(model.num_layers):
            hidden, suffix_kv = model.layer_forward(layer, hidden, torch.tensor([t]), kv[layer])
            step.append(suffix_kv)
        torch.testing.assert_close(model.final_logits(hidden), dense[t], atol=2e-5, rtol=2e-5)
        kv = torch.cat([kv, torch.stack(step)], dim=3)


def test_attention_mass_refuses_a_sliding_layer(model):
    q = torch.zeros(4, 2, 16)
    k = torch.zeros(2, 3, 16)
    with pytest.raises(UnsupportedModel, match="attention_mass on a sliding-window layer"):
        model.attention_mass(q, k, torch.zeros(2, 2, 16), layer=0)
    with pytest.raises(UnsupportedModel, match="attention_mass"):
        model.attention_mass(q, k, torch.zeros(2, 2, 16))
    assert model.attention_mass(q, k, torch.zeros(2, 2, 16), layer=1).shape == (3,)


# ------------------------------------------------------------------ GGUF


gguf = pytest.importorskip("gguf", reason="needs the gguf package")


LETTERS = "abcdefgh"


def sentencepiece_vocab(size: int) -> tuple[list[str], list[int]]:
    """Gemma's layout in small: control tokens, a user-defined "\\n", a run of spaces, then pieces best-first."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "\n", "  ", "\u2581", *LETTERS]
    tokens += [f"\u2581{a}" for a in LETTERS] + [a + b for a in LETTERS for b in LETTERS]
    types = [3, 3, 3, 3, 4, 4] + [1] * (len(tokens) - 6)
    unused = size - len(tokens)  # Gemma's <unusedN> control tokens fill the vocabulary up
    return tokens + [f"<unused{i}>" for i in range(unused)], types + [3] * unused


def write_gemma3_gguf(hf_dir, path, arch="gemma3"):
    """The tiny checkpoint as llama.cpp's converter writes Gemma 3: norms stored as w + 1, no q/k row reorder."""
    from safetensors.torch import load_file

    config = json.loads((hf_dir / "config.json").read_text())
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_key_length(config["head_dim"])
    w.add_value_length(config["head_dim"])
    w.add_rope_freq_base(config["rope_theta"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_sliding_window(config["sliding_window"])
    w.add_array(f"{arch}.attention.sliding_window_pattern", [t == "sliding_attention" for t in config["layer_types"]])
    tokens, types = sentencepiece_vocab(config["vocab_size"])
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    names = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
        "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for name, value in load_file(str(hf_dir / "model.safetensors")).items():
        value = value.numpy()
        if name.endswith("norm.weight"):
            value = value + np.float32(1.0)
        if name.startswith("model.layers."):
            layer, rest = name.removeprefix("model.layers.").split(".", 1)
            target = f"blk.{layer}.{names[rest.removesuffix('.weight')]}.weight"
        else:
            target = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}[name]
        w.add_tensor(target, np.ascontiguousarray(value))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gemma3_gguf_reads_back_the_hf_checkpoint(tiny, model, tmp_path):
    from engine_client.model.gguf_file import read_gguf
    from engine_client.model.zoo import export_gguf

    path = write_gemma3_gguf(tiny, tmp_path / "tiny-gemma3.gguf")
    config, tensors, _ = read_gguf(path)
    parsed = ModelConfig.from_dict(config)
    assert parsed.sliding_layers == (0, 2) and parsed.rope_local_theta == 10000.0 and parsed.query_pre_attn_scalar == 16
    norm = tensors["model.layers.1.self_attn.k_norm.weight"]
    from safetensors.torch import load_file

    torch.testing.assert_close(norm, load_file(str(tiny / "model.safetensors"))["model.layers.1.self_attn.k_norm.weight"])
    export_gguf(path, tmp_path / "exported")
    again = load_checkpoint(tmp_path / "exported")
    assert again.config.sliding_layers == (0, 2)
    assert again.config.attention_scale == 16**-0.5  # the GGUF has no query_pre_attn_scalar: key_length, as llama.cpp
    assert torch.equal(again.weights.layers[1].k_norm, 1.0 + norm)  # the decoder keeps the 1 + w scale


def test_sentencepiece_tokenizer_from_gguf(tiny, tmp_path):
    from engine_client.model.tokenizer import Tokenizer
    from engine_client.model.zoo import export_gguf

    export_gguf(write_gemma3_gguf(tiny, tmp_path / "tok.gguf"), tmp_path / "exported")
    tok = Tokenizer.load(tmp_path / "exported")
    ids = tok.encode("ab ba\n  cd<eos>")
    pieces = [tok.backend.id_to_token(i) for i in ids]
    # merges by rank: "ab" whole; " b" takes "\u2581b" (ranked above "ba"); "\n" and <eos> whole; two spaces one piece
    assert pieces == ["ab", "\u2581b", "a", "\n", "\u2581\u2581", "cd", "<eos>"]
    assert tok.decode(ids) == "ab ba\n  cd<eos>"
    assert tok.encode_prompt("ab") == [2, tok.token_id("ab")] and tok.add_bos_token


def test_unsupported_gguf_architecture_names_the_file(tiny, tmp_path):
    from engine_client.model.gguf_file import read_gguf

    path = write_gemma3_gguf(tiny, tmp_path / "other.gguf", arch="qwen3")
    with pytest.raises(UnsupportedModel) as exc:
        read_gguf(path)
    text = str(exc.value)
    assert "\n" not in text and str(path) in text and "GGUF architecture 'qwen3' is not supported" in text


def test_streaming_heads_calibration_refuses_sliding_layers(model):
    from engine_client.model.streaming import local_mass

    _, kv = model.prefill(tokens(6))
    with pytest.raises(UnsupportedModel, match="^streaming-heads calibration does not support Gemma3ForCausalLM: sliding-window"):
        local_mass(model, kv, tokens(2), sink_tokens=1, recent_tokens=2)


def test_chunked_prefill_equals_the_dense_prefill(model):
    """Blocks over the KV before them (engine_client.prefill) see the window through the default prefix positions."""
    from engine_client.prefill import chunked_prefill

    ids = tokens(13, seed=4)
    logits, kv = model.prefill(ids)
    chunked_logits, chunked_kv = chunked_prefill(model, ids, block_tokens=5)
    torch.testing.assert_close(chunked_logits, logits, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(chunked_kv, kv, atol=2e-5, rtol=2e-5)


def test_the_re_prefill_runner_plans_the_sliding_layers_windows(model):
    """Sliding layers load their window's last chunks whatever the budget; a Period mixing the kinds is refused in one line."""
    from engine_client.reprefill import ModelRunner, ReprefillConfig
    from kvstore.contract.errors import InvalidArgument

    runner = ModelRunner(model, client=None)
    cfg = ReprefillConfig().replace(standin_layers=())
    plan = runner.plan(7, cfg, cfg.budget, num_tokens=100)  # the first query (100) sees 97..: the last chunk only
    assert plan.windowed == (0, 2) and [count for _, _, count in plan.periods] == [1, 2, 1]
    with pytest.raises(InvalidArgument, match="mix sliding-window and global layers"):
        runner.plan(7, cfg.replace(period_layers=2), cfg.budget, num_tokens=100)


def test_the_selection_study_gives_a_sliding_layer_its_window_and_it_gains_nothing(model):
    """The in-process sets behind the stand-in calibration: at a budget of every chunk the teacher-forced
    margins are the dense forward's (sliding layers over their window, at its positions)."""
    import numpy as np

    from kvstore_tools.selection_study import _teacher_forced, layer_gains

    prefix, question, answer = tokens(40, 2), tokens(5, 3), tokens(3, 4)
    kv = model.prefill(prefix)[1]
    _, loaded, margins = _teacher_forced(model, kv, question, answer, "P1+follow-exact", 1.0, np.array([0, 1]))
    logits = model.forward_full(torch.cat([prefix, question, answer]))[39 + 5 : 39 + 5 + 3]
    mine = logits.gather(1, answer[:, None])[:, 0]
    dense = mine - logits.scatter(1, answer[:, None], float("-inf")).amax(1)
    torch.testing.assert_close(torch.tensor(margins), dense, rtol=1e-4, atol=1e-4)
    assert loaded == [0.0, 1.0, 0.0]  # the needle's chunks 0 and 1 are out of the window (rows 36..39, chunk 2)
    gains = layer_gains(model, kv, question, answer, "P1+follow-exact", 0.3, np.array([0, 2]))
    assert gains[0] == gains[2] == 0.0 and len(gains) == 3
