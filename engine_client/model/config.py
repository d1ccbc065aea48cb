"""Model configuration parsed from a Hugging Face ``config.json``.

Only the decoder families the worker implements are accepted:
``LlamaForCausalLM`` and ``Qwen2ForCausalLM`` (RMSNorm, RoPE, GQA, SwiGLU).
Anything the decoder would compute differently (rope scaling, sliding
windows, MLP bias, another activation) is refused here rather than silently
producing different KV.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
# HF defaults differ per family where a field is absent from config.json.
_DEFAULT_MAX_POSITIONS = {"LlamaForCausalLM": 2048, "Qwen2ForCausalLM": 32768}


class UnsupportedModel(ValueError):
    """The checkpoint is of an architecture or variant the decoder does not implement."""


class ConfigError(ValueError):
    """A ``config.json`` field is missing or malformed; ``field`` names it."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"config.json field {field!r}: {message}")


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a Llama/Qwen2-style decoder."""

    architecture: str  # "LlamaForCausalLM" | "Qwen2ForCausalLM"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias (always for Qwen2)

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModel(f"architecture {self.architecture!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(name, f"must be a positive integer, got {value!r}")
        for name in ("rope_theta", "rms_norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(name, f"must be a positive number, got {value!r}")
        for name in ("tie_word_embeddings", "attention_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, f"must be true or false, got {getattr(self, name)!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                "num_key_value_heads",
                f"{self.num_key_value_heads} does not divide num_attention_heads={self.num_attention_heads}",
            )

    @property
    def num_query_groups(self) -> int:
        """Query heads per KV head (the GQA ratio)."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, raw: dict) -> ModelConfig:
        """Parse the dict of a HF ``config.json``; raise ``UnsupportedModel`` or ``ConfigError``."""
        if not isinstance(raw, dict):
            raise ConfigError("<root>", f"must be a JSON object, got {type(raw).__name__}")
        arch = _architecture(raw)
        _refuse_variants(raw, arch)

        def need(name):
            if name not in raw:
                raise ConfigError(name, "is missing")
            return raw[name]

        hidden = need("hidden_size")
        heads = need("num_attention_heads")
        head_dim = raw.get("head_dim")
        if head_dim is None:
            if not isinstance(hidden, int) or not isinstance(heads, int) or heads < 1 or hidden % heads:
                raise ConfigError("head_dim", f"absent and hidden_size={hidden!r} is not a multiple of num_attention_heads={heads!r}")
            head_dim = hidden // heads
        rope = raw.get("rope_parameters") or {}  # transformers v5 moves rope_theta here
        theta = raw.get("rope_theta", rope.get("rope_theta", 10000.0))
        if arch == "Qwen2ForCausalLM":
            bias = True
        else:
            bias = raw.get("attention_bias", False)
        kv_heads = raw.get("num_key_value_heads")
        return cls(
            architecture=arch,
            vocab_size=need("vocab_size"),
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            num_hidden_layers=need("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=heads if kv_heads is None else kv_heads,
            head_dim=head_dim,
            rope_theta=float(theta) if isinstance(theta, int) and not isinstance(theta, bool) else theta,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            max_position_embeddings=raw.get("max_position_embeddings", _DEFAULT_MAX_POSITIONS[arch]),
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            attention_bias=bias,
        )

    @classmethod
    def from_json_file(cls, path) -> ModelConfig:
        with open(path, encoding="utf-8") as f:
            try:
                raw = json.load(f)
            except json.JSONDecodeError as exc:
                raise ConfigError("<root>", f"{path} is not valid JSON: {exc}") from None
        return cls.from_dict(raw)

    def canonical_json(self) -> str:
        """Sorted, whitespace-free JSON of every field: the config part of the fingerprint."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))


def model_fingerprint(config: ModelConfig, weights_digest: bytes) -> str:
    """Hex SHA-256 over the canonical config and a digest of the weights.

    The store keys prefixes by it (``model_fingerprint``): two workers share
    cached KV only if they run the same architecture with the same weights.
    """
    h = hashlib.sha256(b"kvstore.model-fingerprint.v1\0")
    h.update(config.canonical_json().encode())
    h.update(b"\0")
    h.update(weights_digest)
    return h.hexdigest()


def _architecture(raw: dict) -> str:
    archs = raw.get("architectures")
    if archs is None:
        model_type = raw.get("model_type")
        if model_type in _MODEL_TYPES:
            return _MODEL_TYPES[model_type]
        raise UnsupportedModel(f"config.json names no architectures and model_type {model_type!r} is not supported")
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise ConfigError("architectures", f"must be a non-empty list of names, got {archs!r}")
    for arch in archs:
        if arch in SUPPORTED_ARCHITECTURES:
            return arch
    raise UnsupportedModel(f"architecture {', '.join(archs)} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")


def _refuse_variants(raw: dict, arch: str) -> None:
    """Reject options that change the math the decoder implements."""
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModel(f"{arch} with hidden_act={act!r} is not supported (only 'silu')")
    if raw.get("mlp_bias", False):
        raise UnsupportedModel(f"{arch} with mlp_bias=true is not supported")
    scaling = raw.get("rope_scaling")
    rope_type = (raw.get("rope_parameters") or {}).get("rope_type", "default")
    if scaling or rope_type != "default":
        raise UnsupportedModel(f"{arch} with rope scaling {scaling or rope_type!r} is not supported")
    if raw.get("use_sliding_window", False):
        raise UnsupportedModel(f"{arch} with use_sliding_window=true is not supported")
