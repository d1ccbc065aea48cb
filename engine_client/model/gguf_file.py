"""Read a llama.cpp GGUF checkpoint as Hugging Face config and tensors.

``read_gguf`` returns what an HF ``LlamaForCausalLM`` (GGUF architecture
``llama``) or ``Gemma3ForCausalLM`` (``gemma3``) checkpoint holds: the
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
  ``[h, d/2, 2]``.  ``unpermute_rope_rows`` applies the inverse.  (Gemma's
  rotation is llama.cpp's NEOX kind, the HF layout: its rows are not
  reordered.)

Gemma 3 adds three differences:

* **Norm weights.** HF Gemma stores ``w`` and scales by ``1 + w``; llama.cpp's
  converter writes ``w + 1`` (every ``*norm.weight``, F32), so 1 is
  subtracted here, as transformers' GGUF loader does.
* **Metadata it leaves implicit.** llama.cpp hard-codes what the file does
  not say: every 6th layer full attention and the 5 before it sliding
  (``gemma3.attention.sliding_window_pattern`` overrides, an int period or
  a per-layer bool list, true = sliding), RoPE base 10000 on sliding layers
  (``gemma3.rope.freq_base_swa`` overrides), softmax scale
  ``key_length ** -0.5``.
* **More tensors**: ``attn_q_norm``/``attn_k_norm`` (per head dim) and the
  sandwich norms ``post_attention_norm``, ``ffn_norm`` (before the MLP) and
  ``post_ffw_norm``.
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
_GEMMA3_LAYER_NAMES = {
    **_LAYER_NAMES,
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}
_LAYER_NAMES_BY_ARCH = {"llama": _LAYER_NAMES, "gemma3": _GEMMA3_LAYER_NAMES}
SUPPORTED_GGUF_ARCHITECTURES = tuple(_LAYER_NAMES_BY_ARCH)
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")
_GEMMA3_SLIDING_PATTERN = 6
_GEMMA3_LOCAL_THETA = 10000.0


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
    """The HF ``config.json`` dict of a llama or gemma3 GGUF; ``UnsupportedModel`` for anything else."""
    arch = meta.get(ARCHITECTURE_KEY)
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        supported = ", ".join(repr(a) for a in SUPPORTED_GGUF_ARCHITECTURES)
        raise UnsupportedModel(f"GGUF architecture {arch!r} is not supported (supported: {supported})")

    def need(key):
        full = f"{arch}.{key}"
        if full not in meta:
            raise CheckpointError(f"GGUF metadata {full!r} is missing")
        return meta[full]

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
    rotary = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    if rotary != head_dim:
        raise UnsupportedModel(f"partial rotary embeddings (rope.dimension_count={rotary}, head dim {head_dim}) are not supported")
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling != "none" or "rope_freqs.weight" in tensor_names:
        raise UnsupportedModel(f"{arch} GGUF with rope scaling {scaling!r} is not supported")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if meta.get(f"{arch}.{key}"):
            raise UnsupportedModel(f"{arch} GGUF with {key}={meta[f'{arch}.{key}']} is not supported")
    vocab = meta.get(f"{arch}.vocab_size", len(meta.get("tokenizer.ggml.tokens", ())))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rope_theta": _float32_value(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        "rms_norm_eps": _float32_value(need("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(need("context_length")),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "hidden_act": "silu",
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    if arch == "gemma3":
        del config["hidden_act"]  # Gemma names it hidden_activation
        config.update(_gemma3_config(meta, config["num_hidden_layers"], head_dim, int(need("attention.sliding_window"))))
    return config


def _gemma3_config(meta: dict, num_layers: int, head_dim: int, window: int) -> dict:
    """The HF ``gemma3_text`` fields llama.cpp reads from the file or hard-codes (see the module docstring)."""
    config = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": window,
        "rope_local_base_freq": _float32_value(meta.get("gemma3.rope.freq_base_swa", _GEMMA3_LOCAL_THETA)),
        "query_pre_attn_scalar": head_dim,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
    }
    pattern = meta.get("gemma3.attention.sliding_window_pattern", _GEMMA3_SLIDING_PATTERN)
    if isinstance(pattern, list):
        if len(pattern) != num_layers:
            raise CheckpointError(f"gemma3.attention.sliding_window_pattern has {len(pattern)} entries for {num_layers} layers")
        sliding = [bool(x) for x in pattern]
    else:
        sliding = [bool((i + 1) % int(pattern)) for i in range(num_layers)]
    config["layer_types"] = ["sliding_attention" if s else "full_attention" for s in sliding]
    return config


def _float32_value(value) -> float:
    """The shortest decimal that reads back as the stored float32 (GGUF stores 1e-5 as 9.99999974e-06)."""
    return float(str(np.float32(value)))


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """HF tensor name of a llama.cpp tensor name of a GGUF of ``arch``, or None for one the decoder does not use."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    names = _LAYER_NAMES_BY_ARCH[arch]
    match = _LAYER_RE.fullmatch(gguf_name)
    if match and match.group(2) in names:
        return f"model.layers.{match.group(1)}.{names[match.group(2)]}"
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
    """``(hf config dict, {HF tensor name: tensor in dtype}, metadata)`` of the llama or gemma3 GGUF at ``path``.

    An unsupported architecture or a malformed file raises one line that names ``path``.
    """
    reader = open_gguf(path)
    meta = metadata(reader)
    names = {t.name for t in reader.tensors}
    try:
        config = hf_config(meta, names)
    except UnsupportedModel as exc:
        raise UnsupportedModel(f"{path}: {exc}") from None
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    arch = meta[ARCHITECTURE_KEY]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    tensors: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name, arch)
        if name is None:
            continue
        if arch == "gemma3" and name.endswith("norm.weight"):
            # llama.cpp stored w + 1 (float32); HF keeps w.  Subtract before the dtype cast, as transformers does.
            value = dequantize(tensor, torch.float32).sub_(1.0).to(dtype)
        else:
            value = dequantize(tensor, dtype)
        if arch == "llama" and ".q_proj." in name:
            value = unpermute_rope_rows(value, heads)
        elif arch == "llama" and ".k_proj." in name:
            value = unpermute_rope_rows(value, kv_heads)
        tensors[name] = value
    return config, tensors, meta
