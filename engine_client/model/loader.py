"""Load a local Hugging Face checkpoint (``config.json`` + safetensors) into a ``Decoder``.

Accepted layouts: one ``model.safetensors``, or shards listed by
``model.safetensors.index.json`` (``{"weight_map": {tensor name: file}}``).
Every tensor the config implies must be present with the right shape; other
tensors (e.g. a redundant ``lm_head.weight`` of a tied model) are ignored.

The model fingerprint is computed here: SHA-256 over each expected tensor's
name, on-disk dtype, shape and bytes in name order (so sharding does not
change it), combined with the canonical config by ``model_fingerprint``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open

from .config import ModelConfig, model_fingerprint
from .decoder import Decoder, DecoderWeights, LayerWeights

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)


class CheckpointError(ValueError):
    """The checkpoint directory is incomplete or inconsistent with its config."""


class MissingCheckpointFile(CheckpointError, FileNotFoundError):
    """A file the checkpoint needs (config, weights, a shard) does not exist."""


def expected_tensors(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape for every tensor the decoder needs."""
    c = config
    hidden, d = c.hidden_size, c.head_dim
    q_out, kv_out = c.num_attention_heads * d, c.num_key_value_heads * d
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, hidden), "model.norm.weight": (hidden,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, hidden)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        for proj, out in (("q", q_out), ("k", kv_out), ("v", kv_out)):
            shapes[p + f"self_attn.{proj}_proj.weight"] = (out, hidden)
            if c.attention_bias:
                shapes[p + f"self_attn.{proj}_proj.bias"] = (out,)
        shapes[p + "self_attn.o_proj.weight"] = (hidden, q_out)
        shapes[p + "mlp.gate_proj.weight"] = (c.intermediate_size, hidden)
        shapes[p + "mlp.up_proj.weight"] = (c.intermediate_size, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, c.intermediate_size)
        if c.gemma3:
            shapes[p + "self_attn.q_norm.weight"] = (d,)
            shapes[p + "self_attn.k_norm.weight"] = (d,)
            shapes[p + "pre_feedforward_layernorm.weight"] = (hidden,)
            shapes[p + "post_feedforward_layernorm.weight"] = (hidden,)
    return shapes


def load_config(path) -> ModelConfig:
    """Parse ``<path>/config.json``; raise ``MissingCheckpointFile`` if it is absent."""
    cfg = Path(path) / CONFIG_FILE
    if not cfg.is_file():
        raise MissingCheckpointFile(f"no {CONFIG_FILE} in checkpoint directory {path}")
    return ModelConfig.from_json_file(cfg)


def load_checkpoint(path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> Decoder:
    """Load the checkpoint in directory ``path`` as a ``Decoder`` computing in ``dtype``."""
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype must be torch.float32 or torch.bfloat16, got {dtype}")
    root = Path(path)
    config = load_config(root)
    shapes = expected_tensors(config)
    files = _tensor_files(root)
    missing = [name for name in shapes if name not in files]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"checkpoint {path} is missing tensor {missing[0]!r}{more}")

    digest = hashlib.sha256()
    tensors: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for name in shapes:
        by_file.setdefault(files[name], []).append(name)
    raw: dict[str, torch.Tensor] = {}
    for file, names in by_file.items():
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in names:
                got = tuple(f.get_slice(name).get_shape())
                if got != shapes[name]:
                    raise CheckpointError(f"tensor {name!r} in {file.name} has shape {list(got)}, expected {list(shapes[name])}")
                raw[name] = f.get_tensor(name)
    for name in sorted(shapes):  # digest in name order, independent of sharding
        t = raw[name]
        digest.update(f"{name}\0{t.dtype}\0{list(t.shape)}\0".encode())
        digest.update(t.contiguous().view(torch.uint8).numpy())
        # copy=True: safetensors hands out views of its file mapping; owning the
        # memory keeps RSS at the weights' size and survives the file changing.
        tensors[name] = t.to(device=device, dtype=dtype, copy=True)
        del raw[name]
    weights = _assemble(config, tensors)
    return Decoder(config, weights, fingerprint=model_fingerprint(config, digest.digest()))


def _tensor_files(root: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file that holds it."""
    index = root / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index} is not a safetensors index with a weight_map: {exc}") from None
        out = {}
        for name, file in weight_map.items():
            shard = root / file
            if not shard.is_file():
                raise MissingCheckpointFile(f"shard {file} listed in {INDEX_FILE} for {name!r} does not exist in {root}")
            out[name] = shard
        return out
    single = root / SINGLE_FILE
    if not single.is_file():
        raise MissingCheckpointFile(f"no {SINGLE_FILE} or {INDEX_FILE} in checkpoint directory {root}")
    with safe_open(str(single), framework="pt", device="cpu") as f:
        return {name: single for name in f.keys()}


def _assemble(config: ModelConfig, t: dict[str, torch.Tensor]) -> DecoderWeights:
    """Fuse HF tensors into the decoder's layout, releasing the originals as it goes."""
    # Gemma's norms scale by 1 + w in float32 (transformers' Gemma3RMSNorm): the decoder keeps that sum.
    norm = (lambda name: 1.0 + t.pop(name).float()) if config.gemma3 else t.pop
    layers = []
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        attn = [t.pop(p + f"self_attn.{x}_proj.weight") for x in "qkv"]
        bias = torch.cat([t.pop(p + f"self_attn.{x}_proj.bias") for x in "qkv"]) if config.attention_bias else None
        gemma = {}
        if config.gemma3:  # HF Gemma's post_attention_layernorm is the sandwich norm; the MLP's input norm is pre_feedforward
            gemma = dict(
                q_norm=norm(p + "self_attn.q_norm.weight"),
                k_norm=norm(p + "self_attn.k_norm.weight"),
                attn_out_norm=norm(p + "post_attention_layernorm.weight"),
                mlp_out_norm=norm(p + "post_feedforward_layernorm.weight"),
            )
        layers.append(
            LayerWeights(
                input_norm=norm(p + "input_layernorm.weight"),
                qkv_weight=torch.cat(attn),
                qkv_bias=bias,
                o_weight=t.pop(p + "self_attn.o_proj.weight"),
                post_norm=norm(p + ("pre_feedforward_layernorm.weight" if config.gemma3 else "post_attention_layernorm.weight")),
                gate_up_weight=torch.cat([t.pop(p + "mlp.gate_proj.weight"), t.pop(p + "mlp.up_proj.weight")]),
                down_weight=t.pop(p + "mlp.down_proj.weight"),
                **gemma,
            )
        )
    embed = t.pop("model.embed_tokens.weight")
    lm_head = embed if config.tie_word_embeddings else t.pop("lm_head.weight")
    return DecoderWeights(embed=embed, layers=layers, norm=norm("model.norm.weight"), lm_head=lm_head)
