"""GGUF loading against checkpoints written the way llama.cpp's converter writes them.

``write_llama_gguf`` is this test's own statement of llama.cpp's layout: HF
tensors renamed (``blk.N.attn_q``...), q/k rows of each head reordered from
halves ``[2, d/2]`` to pairs ``[d/2, 2]``, dims listed innermost first, and a
byte-level BPE vocabulary in the ``tokenizer.ggml.*`` keys.  Loading it back
must give the HF tensors (exactly for F32, up to the gguf package's own
dequantization for block formats) and the same model outputs.
"""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

gguf = pytest.importorskip("gguf", reason="needs the gguf package: pip install gguf")

from engine_client.model import load_checkpoint  # noqa: E402
from engine_client.model.config import UnsupportedModel  # noqa: E402
from engine_client.model.gguf_file import read_gguf, unpermute_rope_rows  # noqa: E402
from engine_client.model.loader import CheckpointError, MissingCheckpointFile  # noqa: E402
from engine_client.model.tokenizer import Tokenizer  # noqa: E402
from engine_client.model.zoo import export_gguf  # noqa: E402
from kvstore_tools.make_checkpoint import make_checkpoint  # noqa: E402

Q = gguf.GGMLQuantizationType
_GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LETTERS = "etaoinshr"
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
# head dim 32: Q4_1 and Q8_0 quantize rows in blocks of 32 values
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "hidden_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
}


def permute_rope_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: each head's rows [2, d/2] (halves) -> [d/2, 2] (pairs)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each of the 256 bytes."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def vocab() -> tuple[list[str], list[str]]:
    merges = [f"{a} {b}" for a in LETTERS for b in LETTERS] + [f"Ġ {a}" for a in LETTERS]
    tokens = CONTROL + byte_alphabet() + [m.replace(" ", "") for m in merges]
    return tokens, merges


def write_llama_gguf(hf_dir, path, types: dict[str, Q] | None = None, drop: tuple[str, ...] = (), arch="llama"):
    """Write the HF checkpoint in ``hf_dir`` as llama.cpp would; ``types``: GGUF tensor name suffix -> type."""
    config = json.loads((hf_dir / "config.json").read_text())
    hf = {k: v.float().numpy() for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    tokens, merges = vocab()
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_rope_freq_base(config["rope_theta"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_rope_dimension_count(config["head_dim"])
    w.add_vocab_size(config["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(CONTROL) + [1] * (len(tokens) - len(CONTROL)))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_chat_template(CHAT_TEMPLATE)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
    for name, value in hf.items():
        if name.startswith("model.layers."):
            layer, rest = name.removeprefix("model.layers.").split(".", 1)
            target = f"blk.{layer}.{_GGUF_NAMES[rest]}"
        else:
            target = names[name]
        if target.endswith(drop):
            continue
        if target.endswith("attn_q.weight"):
            value = permute_rope_rows(value, config["num_attention_heads"])
        elif target.endswith("attn_k.weight"):
            value = permute_rope_rows(value, config["num_key_value_heads"])
        qtype = next((t for suffix, t in (types or {}).items() if target.endswith(suffix)), Q.F32)
        data = gguf.quants.quantize(np.ascontiguousarray(value), qtype) if qtype != Q.F32 else value
        w.add_tensor(target, data, raw_dtype=qtype)  # shape from the (byte-)shape of data
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    """A tiny llama HF checkpoint with tied embeddings, and its GGUF (all F32)."""
    root = tmp_path_factory.mktemp("tied")
    hf = make_checkpoint(
        root / "hf", "tiny", seed=3, dtype="float32", overrides={**LLAMA, "vocab_size": len(vocab()[0]), "tie_word_embeddings": True}
    )
    return hf, write_llama_gguf(hf, root / "model.gguf")


def test_unpermute_inverts_llama_cpp_row_order():
    heads, d, cols = 3, 8, 5
    w = torch.arange(heads * d * cols, dtype=torch.float32).reshape(heads * d, cols)
    permuted = torch.from_numpy(permute_rope_rows(w.numpy(), heads))
    assert not torch.equal(permuted, w)
    assert torch.equal(unpermute_rope_rows(permuted, heads), w)
    bias = torch.arange(heads * d, dtype=torch.float32)
    assert torch.equal(unpermute_rope_rows(torch.from_numpy(permute_rope_rows(bias.numpy(), heads)), heads), bias)
    # head 0's rows in GGUF order: pairs (0, d/2), (1, d/2 + 1), ...
    assert permuted[:4, 0].tolist() == [w[0, 0], w[4, 0], w[1, 0], w[5, 0]]


def test_f32_gguf_reads_back_the_hf_tensors_and_config(tied):
    hf_dir, path = tied
    config, tensors, meta = read_gguf(path)
    want = load_file(str(hf_dir / "model.safetensors"))
    assert config["tie_word_embeddings"] is True and "lm_head.weight" not in tensors
    assert set(tensors) == set(want) - {"lm_head.weight"}
    for name, value in tensors.items():
        assert torch.equal(value, want[name]), name
    ref = json.loads((hf_dir / "config.json").read_text())
    for key in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rope_theta",
        "max_position_embeddings",
    ):
        assert config[key] == ref[key], key
    assert meta["tokenizer.ggml.pre"] == "smollm"


def test_exported_gguf_runs_like_the_hf_checkpoint(tied, tmp_path):
    hf_dir, path = tied
    out = export_gguf(path, tmp_path / "export")
    tokens = torch.tensor([5, 17, 300, 2, 9, 41, 77, 8, 8, 120, 3])
    ours, ref = load_checkpoint(out), load_checkpoint(hf_dir)
    # a float32 export carries the weights bit for bit ...
    assert torch.equal(ours.weights.embed, ref.weights.embed) and torch.equal(ours.weights.lm_head, ref.weights.lm_head)
    for a, b in zip(ours.weights.layers, ref.weights.layers):
        assert all(
            torch.equal(getattr(a, f), getattr(b, f)) for f in ("qkv_weight", "o_weight", "gate_up_weight", "down_weight", "input_norm")
        )
    # ... and runs the same; not asserted bit for bit: a BLAS kernel may pick another path for another buffer alignment
    torch.testing.assert_close(ours.forward_full(tokens), ref.forward_full(tokens), rtol=1e-5, atol=1e-5)
    bf16 = load_checkpoint(export_gguf(path, tmp_path / "bf16", "bfloat16"), dtype=torch.bfloat16)
    assert bf16.weights.embed.dtype == torch.bfloat16


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0, Q.F16, Q.BF16])
def test_block_formats_dequantize_with_the_gguf_kernels(tmp_path, qtype):
    hf = make_checkpoint(tmp_path / "hf", "tiny", seed=5, dtype="float32", overrides={**LLAMA, "vocab_size": len(vocab()[0])})
    path = write_llama_gguf(hf, tmp_path / "q.gguf", types={".weight": qtype})
    config, tensors, _ = read_gguf(path)
    assert config["tie_word_embeddings"] is False and "lm_head.weight" in tensors
    want = load_file(str(hf / "model.safetensors"))
    q = want["model.layers.1.self_attn.q_proj.weight"].numpy()
    stored = gguf.quants.quantize(permute_rope_rows(q, 2), qtype)
    expect = unpermute_rope_rows(torch.from_numpy(gguf.quants.dequantize(stored, qtype).reshape(q.shape).astype(np.float32)), 2)
    assert torch.equal(tensors["model.layers.1.self_attn.q_proj.weight"], expect)
    for name, value in tensors.items():  # each within its format's rounding of the original
        ref = want[name]
        scale = ref.abs().max().item()
        tol = {Q.Q4_1: 0.1, Q.Q8_0: 0.01, Q.F16: 1e-3, Q.BF16: 1e-2}[qtype]
        assert (value - ref).abs().max().item() <= tol * scale, name


def test_tokenizer_from_gguf_metadata(tied, tmp_path):
    out = export_gguf(tied[1], tmp_path / "export")
    tok = Tokenizer.load(out)
    text = "the rain in spain stays on the shore 12 times\n<|im_start|>héé"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.token_id("<|im_start|>") in ids  # a control token stays whole
    assert tok.encode("ee") == [tok.token_id("ee")]  # merges applied
    assert tok.encode(" 12") == [tok.token_id("Ġ"), tok.token_id("1"), tok.token_id("2")]  # 'smollm' splits digits
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2)
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n"


def test_refusals_are_one_line(tmp_path, tied):
    hf_dir = tied[0]
    with pytest.raises(UnsupportedModel, match="architecture 'gpt2'"):
        read_gguf(write_llama_gguf(hf_dir, tmp_path / "gpt2.gguf", arch="gpt2"))
    with pytest.raises(MissingCheckpointFile, match="does not exist"):
        read_gguf(tmp_path / "absent.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(CheckpointError, match="not a readable GGUF"):
        read_gguf(junk)
