"""Read a llama.cpp GGUF checkpoint as Hugging Face config and tensors.

``read_gguf`` returns what an HF ``LlamaForCausalLM`` checkpoint holds: the
``config.json`` dict and every tensor under its HF name, dequantized to the
requested dtype.  Writing those out (``zoo.export_gguf``) gives a directory that
``loader.load_checkpoint`` loads like any other, so the decoder, the
fingerprint and the store never see GGUF.

Three things differ from an HF checkpoint and are undone here:

* **Quantization.** Tensors are dequantized with the ``gguf`` package's own
  kernels (``gguf.quants.dequantize``: Q4_1, Q8_0, F16, BF16, F32 and the
  other block formats it implements) to float32, then cast.
* **Names.** llama.cpp's names (``token_embd``, ``blk.N.attn_q``, ...) map
  to HF's (``model.embed_tokens``, ``model.layers.N.self_attn.q_proj``, ...);
  an absent ``output.weight`` means tied embeddings.
* **RoPE row order.** llama.cpp's converter reorders each head's rows of the
  q and k projections from HF's rotate-half layout (first half / second half
  of the head dim) to interleaved pairs: rows ``[h, 2, d/2]`` become
  ``[h, d/2, 2]``.  ``unpermute_rope_rows`` applies the inverse.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from .config import UnsupportedModel
from .loader import CheckpointError, MissingCheckpointFile

try:
    import gguf
except ImportError:  # pragma: no cover - exercised only on a broken install
    gguf = None

ARCHITECTURE_KEY = "general.architecture"

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")


def open_gguf(path) -> gguf.GGUFReader:
    """A ``GGUFReader`` over ``path`` (memory-mapped); one-line errors for a missing or bad file."""
    if gguf is None:
        raise ImportError("reading GGUF files needs the 'gguf' package: pip install gguf")
    path = Path(path)
    if not path.is_file():
        raise MissingCheckpointFile(f"GGUF file {path} does not exist")
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, IndexError) as exc:
        raise CheckpointError(f"{path} is not a readable GGUF file: {exc}") from None


def metadata(reader) -> dict:
    """Every key-value field of the file as plain Python values (strings, numbers, lists)."""
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}


def hf_config(meta: dict, tensor_names: set[str]) -> dict:
    """The HF ``config.json`` dict of a llama GGUF; ``UnsupportedModel`` for anything else."""
    arch = meta.get(ARCHITECTURE_KEY)
    if arch != "llama":
        raise UnsupportedModel(f"GGUF architecture {arch!r} is not supported (supported: 'llama')")

    def need(key):
        full = f"llama.{key}"
        if full not in meta:
            raise CheckpointError(f"GGUF metadata {full!r} is missing")
        return meta[full]

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(meta.get("llama.attention.key_length", hidden // heads))
    rotary = int(meta.get("llama.rope.dimension_count", head_dim))
    if rotary != head_dim:
        raise UnsupportedModel(f"partial rotary embeddings (rope.dimension_count={rotary}, head dim {head_dim}) are not supported")
    scaling = meta.get("llama.rope.scaling.type", "none")
    if scaling != "none" or "rope_freqs.weight" in tensor_names:
        raise UnsupportedModel(f"llama GGUF with rope scaling {scaling!r} is not supported")
    vocab = meta.get("llama.vocab_size", len(meta.get("tokenizer.ggml.tokens", ())))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get("llama.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rope_theta": _float32_value(meta.get("llama.rope.freq_base", 10000.0)),
        "rms_norm_eps": _float32_value(need("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(need("context_length")),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "hidden_act": "silu",
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }


def _float32_value(value) -> float:
    """The shortest decimal that reads back as the stored float32 (GGUF stores 1e-5 as 9.99999974e-06)."""
    return float(str(np.float32(value)))


def hf_name(gguf_name: str) -> str | None:
    """HF tensor name of a llama.cpp tensor name, or None for one the decoder does not use."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_RE.fullmatch(gguf_name)
    if match and match.group(2) in _LAYER_NAMES:
        return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}"
    return None


def unpermute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row order: per head, rows ``[d/2, 2]`` (pairs) back to ``[2, d/2]`` (halves).

    ``weight`` is ``[num_heads * d, ...]`` (a projection weight or its bias).
    """
    rows = weight.shape[0]
    if rows % (2 * num_heads):
        raise CheckpointError(f"{rows} rows cannot be {num_heads} heads of an even head dim")
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape).contiguous()


def dequantize(tensor, dtype: torch.dtype) -> torch.Tensor:
    """One ``ReaderTensor`` as a torch tensor ``[rows, cols]`` (HF order) in ``dtype``."""
    try:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)  # float32 (or float16 view), HF order
    except NotImplementedError:
        raise CheckpointError(f"tensor {tensor.name!r} has GGUF type {tensor.tensor_type.name}, which cannot be dequantized") from None
    shape = tuple(int(x) for x in reversed(tensor.shape))  # GGUF lists dims innermost first
    values = np.ascontiguousarray(values, dtype=np.float32).reshape(shape)
    if not values.flags.writeable:  # an F32 tensor is a view of the read-only file mapping
        values = values.copy()
    return torch.from_numpy(values).to(dtype)


def read_gguf(path, dtype: torch.dtype = torch.float32) -> tuple[dict, dict[str, torch.Tensor], dict]:
    """``(hf config dict, {HF tensor name: tensor in dtype}, metadata)`` of the llama GGUF at ``path``."""
    reader = open_gguf(path)
    meta = metadata(reader)
    names = {t.name for t in reader.tensors}
    config = hf_config(meta, names)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    tensors: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue
        value = dequantize(tensor, dtype)
        if ".q_proj." in name:
            value = unpermute_rope_rows(value, heads)
        elif ".k_proj." in name:
            value = unpermute_rope_rows(value, kv_heads)
        tensors[name] = value
    return config, tensors, meta
