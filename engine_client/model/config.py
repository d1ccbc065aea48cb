"""Model configuration parsed from a Hugging Face ``config.json``.

Only the decoder families the worker implements are accepted:
``LlamaForCausalLM`` and ``Qwen2ForCausalLM`` (RMSNorm, RoPE, GQA, SwiGLU),
and ``Gemma3ForCausalLM`` (text-only Gemma 3: q/k RMSNorm, sandwich norms
with Gemma's ``(1 + weight)`` scale, GeGLU, embeddings scaled by
``sqrt(hidden)``, and per-layer attention kinds: sliding-window layers with
their own RoPE base between full-attention ones).  Anything the decoder
would compute differently (rope scaling, a sliding window on Llama/Qwen2,
MLP bias, another activation, logit soft-capping) is refused here rather
than silently producing different KV.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

GEMMA3 = "Gemma3ForCausalLM"
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", GEMMA3)
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gemma3_text": GEMMA3}
# HF defaults differ per family where a field is absent from config.json.
_DEFAULT_MAX_POSITIONS = {"LlamaForCausalLM": 2048, "Qwen2ForCausalLM": 32768, GEMMA3: 131072}
FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
# Gemma 3's defaults (transformers' Gemma3TextConfig) where config.json leaves a field out.
_GEMMA3_SLIDING_PATTERN = 6  # every 6th layer is full attention, the 5 before it sliding
_GEMMA3_LOCAL_THETA = 10000.0
# Fields added after the first fingerprint version, with the values that mean "a Llama/Qwen2 layer".
# canonical_json leaves a field out while it holds this value, so those models' fingerprints do not change.
_LATER_FIELDS = {"hidden_act": "silu", "layer_types": None, "sliding_window": None, "rope_local_theta": None, "query_pre_attn_scalar": None}


class UnsupportedModel(ValueError):
    """The checkpoint is of an architecture or variant the decoder does not implement."""


class ConfigError(ValueError):
    """A ``config.json`` field is missing or malformed; ``field`` names it."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"config.json field {field!r}: {message}")


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a Llama/Qwen2/Gemma 3 decoder."""

    architecture: str  # "LlamaForCausalLM" | "Qwen2ForCausalLM" | "Gemma3ForCausalLM"
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
    hidden_act: str = "silu"  # MLP gate activation: "silu" (SwiGLU) or "gelu_pytorch_tanh" (GeGLU, Gemma)
    # per layer FULL_ATTENTION or SLIDING_ATTENTION; None: every layer full
    layer_types: tuple[str, ...] | None = None
    sliding_window: int | None = None  # positions a sliding layer's query sees, its own included
    rope_local_theta: float | None = None  # RoPE base of the sliding layers (Gemma 3: 10000)
    query_pre_attn_scalar: float | None = None  # softmax scale is this ** -0.5; None: head_dim ** -0.5

    def __post_init__(self) -> None:
        if isinstance(self.layer_types, list):  # from JSON
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
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
        self._check_gemma3_fields()

    def _check_gemma3_fields(self) -> None:
        if self.hidden_act not in ACTIVATIONS:
            raise UnsupportedModel(f"hidden_act={self.hidden_act!r} is not supported (supported: {', '.join(ACTIVATIONS)})")
        if not self.gemma3:
            for name, default in _LATER_FIELDS.items():
                if getattr(self, name) != default:
                    raise UnsupportedModel(f"{self.architecture} with {name}={getattr(self, name)!r} is not supported")
            return
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_hidden_layers:
                raise ConfigError("layer_types", f"has {len(self.layer_types)} entries for num_hidden_layers={self.num_hidden_layers}")
            bad = sorted(set(self.layer_types) - {FULL_ATTENTION, SLIDING_ATTENTION})
            if bad:
                raise UnsupportedModel(f"layer type {bad[0]!r} is not supported (supported: {FULL_ATTENTION}, {SLIDING_ATTENTION})")
        if self.sliding_layers:
            w = self.sliding_window
            if isinstance(w, bool) or not isinstance(w, int) or w < 1:
                raise ConfigError("sliding_window", f"must be a positive integer when a layer slides, got {w!r}")
        for name in ("rope_local_theta", "query_pre_attn_scalar"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
                raise ConfigError(name, f"must be a positive number, got {value!r}")

    @property
    def num_query_groups(self) -> int:
        """Query heads per KV head (the GQA ratio)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def gemma3(self) -> bool:
        """Gemma 3 numerics: q/k norms, sandwich norms scaled by ``1 + weight``, GeGLU, embeddings times ``sqrt(hidden)``."""
        return self.architecture == GEMMA3

    @property
    def sliding_layers(self) -> tuple[int, ...]:
        """Indices of the sliding-window layers (empty for Llama/Qwen2)."""
        return tuple(i for i, kind in enumerate(self.layer_types or ()) if kind == SLIDING_ATTENTION)

    def window_of(self, layer: int) -> int | None:
        """Positions ``layer``'s queries see (their own included), or None for full attention."""
        return self.sliding_window if self.layer_types is not None and self.layer_types[layer] == SLIDING_ATTENTION else None

    def rope_theta_of(self, layer: int) -> float:
        """RoPE base of ``layer``: ``rope_local_theta`` on a sliding layer, else ``rope_theta``."""
        if self.rope_local_theta is not None and self.window_of(layer) is not None:
            return self.rope_local_theta
        return self.rope_theta

    @property
    def attention_scale(self) -> float | None:
        """Softmax scale ``query_pre_attn_scalar ** -0.5``; None means the kernels' default ``head_dim ** -0.5``."""
        return None if self.query_pre_attn_scalar is None else float(self.query_pre_attn_scalar) ** -0.5

    def unsupported_features(self) -> list[str]:
        """What this model needs beyond a Llama/Qwen2 decoder, in words (empty for Llama/Qwen2).

        A component that only implements full attention on every layer (one RoPE base, keys visible
        for ever) refuses a model with ``require_full_attention``, which names these.
        """
        out = []
        if self.sliding_layers:
            out.append(
                f"sliding-window attention ({len(self.sliding_layers)} of {self.num_hidden_layers} layers, window {self.sliding_window})"
            )
        if self.rope_local_theta is not None and self.rope_local_theta != self.rope_theta and self.sliding_layers:
            out.append(f"a second RoPE base on those layers ({self.rope_local_theta:g})")
        return out

    def require_full_attention(self, what: str) -> None:
        """Raise ``UnsupportedModel`` (one line naming ``what`` and the features) if any layer is not full attention."""
        features = self.unsupported_features()
        if features:
            raise UnsupportedModel(f"{what} does not support {self.architecture}: {'; '.join(features)}")

    @classmethod
    def from_dict(cls, raw: dict) -> ModelConfig:
        """Parse the dict of a HF ``config.json``; raise ``UnsupportedModel`` or ``ConfigError``."""
        if not isinstance(raw, dict):
            raise ConfigError("<root>", f"must be a JSON object, got {type(raw).__name__}")
        arch = _architecture(raw)
        if arch == GEMMA3:
            extra = _gemma3_fields(raw)
        else:
            _refuse_variants(raw, arch)
            extra = {}

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
        if arch == GEMMA3:
            theta = extra.pop("rope_theta")
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
            tie_word_embeddings=raw.get("tie_word_embeddings", arch == GEMMA3),
            attention_bias=bias,
            **extra,
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
        """Sorted, whitespace-free JSON of every field: the config part of the fingerprint.

        Fields added after the first version are left out while they hold their Llama/Qwen2 value
        (``_LATER_FIELDS``), so a Llama or Qwen2 model keeps the fingerprint it always had.
        ``ModelConfig(**json.loads(canonical_json()))`` gives the config back.
        """
        fields = dataclasses.asdict(self)
        for name, default in _LATER_FIELDS.items():
            if fields[name] == default:
                del fields[name]
        return json.dumps(fields, sort_keys=True, separators=(",", ":"))


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


def _gemma3_fields(raw: dict) -> dict:
    """The Gemma 3 fields of a ``gemma3_text`` config.json (transformers' defaults where absent); refuses variants.

    Returns the ``ModelConfig`` keywords beyond the Llama ones, plus ``rope_theta`` (the global base).
    """
    act = raw.get("hidden_activation", raw.get("hidden_act", "gelu_pytorch_tanh"))
    if act != "gelu_pytorch_tanh":
        raise UnsupportedModel(f"{GEMMA3} with hidden_activation={act!r} is not supported (only 'gelu_pytorch_tanh')")
    for name in ("final_logit_softcapping", "attn_logit_softcapping"):
        if raw.get(name) is not None:
            raise UnsupportedModel(f"{GEMMA3} with {name}={raw[name]!r} is not supported")
    if raw.get("use_bidirectional_attention"):
        raise UnsupportedModel(f"{GEMMA3} with use_bidirectional_attention=true is not supported")
    if raw.get("mlp_bias", False) or raw.get("attention_bias", False):
        raise UnsupportedModel(f"{GEMMA3} with biases is not supported")
    rope = raw.get("rope_parameters") or {}
    full, local = rope.get(FULL_ATTENTION) or {}, rope.get(SLIDING_ATTENTION) or {}
    for params in (raw.get("rope_scaling"), full, local):
        kind = (params or {}).get("rope_type", (params or {}).get("type", "default"))
        if params and kind != "default":
            raise UnsupportedModel(f"{GEMMA3} with rope scaling {kind!r} is not supported")
    layers = raw.get("num_hidden_layers")
    types = raw.get("layer_types")
    if types is None and isinstance(layers, int):
        pattern = raw.get("sliding_window_pattern", _GEMMA3_SLIDING_PATTERN)
        types = [SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION for i in range(layers)]
    theta = raw.get("rope_theta", full.get("rope_theta", 1_000_000.0))
    local_theta = raw.get("rope_local_base_freq", local.get("rope_theta", _GEMMA3_LOCAL_THETA))
    return {
        "rope_theta": float(theta) if isinstance(theta, int) and not isinstance(theta, bool) else theta,
        "hidden_act": act,
        "layer_types": None if types is None else tuple(types),
        "sliding_window": raw.get("sliding_window", 4096),
        "rope_local_theta": float(local_theta) if isinstance(local_theta, int) and not isinstance(local_theta, bool) else local_theta,
        "query_pre_attn_scalar": raw.get("query_pre_attn_scalar", 256),
    }
