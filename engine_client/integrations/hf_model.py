"""What the store needs to know of a Hugging Face ``transformers`` model: its ``ModelConfig``, fingerprint and geometry.

Pure functions over what any ``transformers`` causal LM exposes (``model.config.to_dict()``,
``model.state_dict()``, ``model.dtype``); ``transformers`` itself is not imported.  Each value is
the one the project's own loader and ``ModelRunner`` derive for the same checkpoint, so a prefix
stored by either side is a hit for the other:

- the config is ``ModelConfig.from_dict`` of the model's config, with the float fields a GGUF file
  holds as float32 (``rms_norm_eps``, ``rope_theta``) written as that float32's shortest decimal,
  as ``model.gguf_file`` writes them (transformers keeps the widened float32, ``9.99999974e-06``
  for ``1e-5``);
- the fingerprint is ``model_fingerprint`` over that config and the SHA-256 of every tensor the
  decoder needs (``loader.expected_tensors``), by name, dtype, shape and bytes in name order: the
  loader's digest of a checkpoint that holds the weights in the dtype the model holds them in
  (what ``zoo`` exports per dtype, and what ``save_pretrained`` writes);
- the geometry is ``runner.model_geometry`` with ``ModelRunner``'s defaults.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from kvstore.contract import InvalidArgument
from kvstore.contract.geometry import StoreGeometry

from ..model.config import ModelConfig, UnsupportedModel, model_fingerprint
from ..model.loader import expected_tensors
from ..reprefill.runner import model_geometry

# transformers' model_type of the decoders the store's layout and the project's runner share
MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
KV_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# ModelRunner's defaults: 16-token chunks, 1-layer stored groups, 4-bit probe keys
CHUNK_TOKENS, GROUP_LAYERS, PROBE_BITS = 16, 1, 4


def hf_model_config(model) -> ModelConfig:
    """The ``ModelConfig`` of a transformers Llama or Qwen2 causal LM; one-line errors for anything else.

    ``InvalidArgument("model")``: not a transformers causal LM; ``UnsupportedModel``: another
    architecture, or a variant the decoder does not compute (rope scaling, sliding windows, ...).
    """
    config = getattr(model, "config", None)
    if not hasattr(config, "to_dict") or not callable(getattr(model, "generate", None)):
        raise InvalidArgument("model", f"must be a transformers causal language model (AutoModelForCausalLM), got {type(model).__name__}")
    raw = config.to_dict()
    model_type = raw.get("model_type")
    if model_type not in MODEL_TYPES:
        names = ", ".join(MODEL_TYPES)
        raise UnsupportedModel(f"the kvstore prefix cache takes model_type {names}; {type(model).__name__} is model_type {model_type!r}")
    if model.get_output_embeddings() is None:
        raise InvalidArgument("model", f"must have a language-model head (AutoModelForCausalLM), got {type(model).__name__}")
    parsed = ModelConfig.from_dict({**raw, "architectures": [MODEL_TYPES[model_type]]})
    parsed.require_full_attention("the kvstore prefix cache")
    return dataclasses.replace(parsed, rms_norm_eps=gguf_float(parsed.rms_norm_eps), rope_theta=gguf_float(parsed.rope_theta))


def gguf_float(value):
    """``value`` as ``model.gguf_file`` writes a float32 field: the shortest decimal of that float32.

    Only a float that is exactly a float32 changes (``9.999999747378752e-06`` becomes ``1e-05``);
    a value written by hand in a ``config.json`` (``1e-05``, ``1e-06``) is not one and stays.
    """
    if isinstance(value, float) and float(np.float32(value)) == value:
        return float(str(np.float32(value)))
    return value


def weights_digest(model, config: ModelConfig) -> bytes:
    """SHA-256 over the decoder's tensors as the model holds them, as ``loader.load_checkpoint`` digests a checkpoint."""
    state = model.state_dict()
    digest = hashlib.sha256()
    for name, shape in sorted(expected_tensors(config).items()):
        t = state.get(name)
        if t is None or tuple(t.shape) != shape:
            got = "absent" if t is None else f"of shape {list(t.shape)}"
            raise InvalidArgument("model", f"tensor {name!r} is {got}, the config implies {list(shape)}")
        t = t.detach().cpu().contiguous()
        digest.update(f"{name}\0{t.dtype}\0{list(t.shape)}\0".encode())
        digest.update(t.view(torch.uint8).numpy())
    return digest.digest()


def hf_fingerprint(model, config: ModelConfig | None = None) -> str:
    """The model fingerprint the project's loader gives the checkpoint of these weights in this dtype."""
    config = hf_model_config(model) if config is None else config
    return model_fingerprint(config, weights_digest(model, config))


@dataclass(frozen=True)
class KVShape:
    """What ``model_geometry`` reads of a model: its ``config`` and the ``dtype`` of its KV."""

    config: ModelConfig
    dtype: torch.dtype


def hf_geometry(
    config: ModelConfig,
    dtype: torch.dtype,
    *,
    chunk_tokens: int = CHUNK_TOKENS,
    group_layers: int = GROUP_LAYERS,
    probe_bits: int = PROBE_BITS,
) -> StoreGeometry:
    """The store geometry ``ModelRunner`` (same keywords, same defaults) uses for a model of ``config`` computing in ``dtype``."""
    if dtype not in KV_DTYPES:
        raise InvalidArgument("model", f"must compute in float32, bfloat16 or float16 to share its KV, got {dtype}")
    return model_geometry(KVShape(config, dtype), chunk_tokens=chunk_tokens, group_layers=group_layers, probe_bits=probe_bits)
