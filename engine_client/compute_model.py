"""Accelerator compute model: the seconds one decoder layer would take on a GPU.

Replaying a recorded Re-Prefill request against a real daemon, the client's
CPU compute is replaced by the time an accelerator would need per layer.
This module gives that time for one Llama/Qwen2/Gemma 3 decoder layer
(``ModelConfig``) running ``new_tokens`` tokens over ``context_rows`` loaded
KV rows, a sliding layer's queries each seeing at most its ``window`` rows
(``model_seconds``: every layer of a model, each with its own kind):

* ``layer_flops``: matmul FLOPs (2 per multiply-add) of the q/k/v/o
  projections, of attention (``q . k`` and ``p x v``, causal over the new
  tokens) and of the MLP (gate, up, down);
* ``layer_bytes``: HBM traffic of the same three parts (weights once, K/V
  rows read, new K/V written, matmul activations read and written once);
* ``layer_seconds``: a roofline per part, ``max(flops / (peak x eff),
  bytes / (bandwidth x mem_eff))``, summed, plus a fixed launch overhead;
* ``h2d_seconds``: a host-to-device copy (loaded KV crossing PCIe);
* for a replayed request's other steps: ``query_seconds`` (one layer's
  query projection, what a selection scores with), ``score_seconds``
  (``q . k`` over the key rows a selector scores, and reading them) and
  ``lm_head_seconds`` (the first token's logits), each a roofline plus a
  quarter of the layer overhead (one or two launches).

Left out of ``layer_seconds``: RMSNorm, RoPE, softmax, SiLU and the residual adds (a few FLOPs
and one activation pass each), bias adds, the embedding and the LM head,
overlap between parts or with copies, caches (L2 reuse), tensor/pipeline
parallelism and any quantization (weights and KV are ``dtype_bytes`` each).
The named profiles' rates are vendor datasheet peaks; the efficiencies and
the overhead applied to them are stated assumptions, not measurements.  A
``file:PATH`` profile is measured instead (``kvstore-bench calibrate``:
achieved matmul and copy rates with efficiency 1, the project's own layer's
fixed cost, pinned and pageable host-to-device copies, the disk's O_DIRECT
rate and the storage path's fixed cost per Period), and says where and how.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass, fields

from engine_client.model.config import ModelConfig
from kvstore.contract import InvalidArgument

_EFFICIENCIES = ("matmul_efficiency", "mem_efficiency")
_OPTIONAL = ("pageable_h2d_bytes_per_s", "disk_bytes_per_s", "period_overhead_s")


@dataclass(frozen=True)
class AcceleratorProfile:
    """Rates of one accelerator: datasheet peaks times stated efficiencies (assumptions)."""

    name: str
    peak_flops: float  # dense bf16/fp16 tensor-core FLOP/s (no sparsity)
    mem_bytes_per_s: float  # HBM bandwidth
    h2d_bytes_per_s: float  # effective host-to-device copy rate over PCIe
    matmul_efficiency: float = 0.6  # fraction of peak_flops a GEMM reaches (assumption)
    mem_efficiency: float = 0.8  # fraction of HBM bandwidth a streaming kernel reaches (assumption)
    layer_overhead_s: float = 30e-6  # ~12 kernel launches of ~2.5 us per layer (assumption)
    dtype_bytes: int = 2  # bf16/fp16 weights, activations and KV
    # measured profiles only (None: not known)
    pageable_h2d_bytes_per_s: float | None = None  # a copy from pageable host memory (the arena is pageable)
    disk_bytes_per_s: float | None = None  # O_DIRECT reads of the store's disk
    period_overhead_s: float | None = None  # the storage path's fixed cost per Period (a set's round trip, client and daemon work)
    source: str = "datasheet peaks x assumed efficiencies"  # or where and how it was measured

    def __post_init__(self):
        for key in ("name", "source"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise InvalidArgument(key, f"must be a non-empty string, got {getattr(self, key)!r}")
        for f in fields(self):
            if f.name in ("name", "source") or (f.name in _OPTIONAL and getattr(self, f.name) is None):
                continue
            problem = _problem(f.name, getattr(self, f.name))
            if problem:
                raise InvalidArgument(f.name, problem)

    @property
    def flops_per_s(self) -> float:
        return self.peak_flops * self.matmul_efficiency

    @property
    def bytes_per_s(self) -> float:
        return self.mem_bytes_per_s * self.mem_efficiency


def _problem(field: str, value: object) -> str | None:
    """Why ``value`` is not valid for ``field`` of ``AcceleratorProfile``, or None."""
    if field == "dtype_bytes":
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            return f"must be a positive integer, got {value!r}"
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        return f"must be a positive finite number, got {value!r}"
    if field in _EFFICIENCIES and value > 1:
        return f"must be in (0, 1], got {value!r}"
    return None


# PCIe theoretical rate per direction, x16: Gen4 16 GT/s, Gen5 32 GT/s, 128b/130b encoding.
_PCIE4_X16 = 16e9 * 16 * 128 / 130 / 8  # ~31.5 GB/s
_PCIE5_X16 = 32e9 * 16 * 128 / 130 / 8  # ~63.0 GB/s
_PCIE_EFFICIENCY = 0.8  # pinned-memory cudaMemcpy reaches roughly this fraction (assumption)

PROFILES: dict[str, AcceleratorProfile] = {
    # NVIDIA H100 SXM5 datasheet: BF16 tensor core 1,979 TFLOPS *with sparsity* -> 989 TFLOPS dense;
    # GPU memory bandwidth 3.35 TB/s (HBM3); interconnect PCIe Gen5 (128 GB/s bidirectional).
    "h100": AcceleratorProfile("h100", 989e12, 3.35e12, _PCIE_EFFICIENCY * _PCIE5_X16),
    # NVIDIA A100 80GB SXM datasheet: BF16 tensor core 312 TFLOPS (624 with sparsity);
    # GPU memory bandwidth 2,039 GB/s (HBM2e); PCIe Gen4 (64 GB/s bidirectional).
    "a100": AcceleratorProfile("a100", 312e12, 2.039e12, _PCIE_EFFICIENCY * _PCIE4_X16),
    # NVIDIA A800 80GB SXM4 datasheet: BF16 312 TFLOPS, 2,039 GB/s HBM2e (as the A100; only NVLink
    # is cut to 400 GB/s, not modelled); PCIe Gen4 (64 GB/s bidirectional).
    "a800": AcceleratorProfile("a800", 312e12, 2.039e12, _PCIE_EFFICIENCY * _PCIE4_X16),
}

# custom:key=value keys -> AcceleratorProfile fields (the first three are required).
_CUSTOM_KEYS = {
    "flops": "peak_flops",
    "bw": "mem_bytes_per_s",
    "h2d": "h2d_bytes_per_s",
    "eff": "matmul_efficiency",
    "mem_eff": "mem_efficiency",
    "overhead": "layer_overhead_s",
}
_CUSTOM_REQUIRED = ("flops", "bw", "h2d")


def profile_to_json(profile: AcceleratorProfile) -> str:
    """The text of a ``file:`` profile."""
    return json.dumps({f.name: getattr(profile, f.name) for f in fields(profile)}, indent=2, sort_keys=True) + "\n"


def read_profile_file(path: str) -> AcceleratorProfile:
    """A measured profile written by ``kvstore-bench calibrate``; ``InvalidArgument`` names the file and the key."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as exc:
        raise InvalidArgument("profile", f"file:{path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise InvalidArgument("profile", f"file:{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise InvalidArgument("profile", f"file:{path}: expected a JSON object")
    known = {f.name for f in fields(AcceleratorProfile)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise InvalidArgument(f"profile.{unknown[0]}", f"file:{path}: unknown key (known: {', '.join(sorted(known))})")
    for key in ("name", "peak_flops", "mem_bytes_per_s", "h2d_bytes_per_s"):
        if key not in data:
            raise InvalidArgument(f"profile.{key}", f"file:{path}: is required")
    try:
        return AcceleratorProfile(**data)
    except InvalidArgument as exc:
        raise InvalidArgument(f"profile.{exc.field}", f"file:{path}: {str(exc).split(': ', 1)[1]}") from None


def parse_profile(text: str) -> AcceleratorProfile:
    """A profile from ``h100``/``a100``/``a800``, ``custom:flops=..,bw=..,h2d=..[,eff=..,mem_eff=..,overhead=..]``
    or ``file:PATH`` (a measured profile, ``kvstore-bench calibrate``).

    Numbers take any ``float`` spelling (``1e12``, ``2.5e-5``); ``InvalidArgument``
    names ``profile`` or ``profile.<key>`` for an unknown name, key or bad number.
    """
    if not isinstance(text, str):
        raise InvalidArgument("profile", f"must be a string, got {type(text).__name__}")
    if text.strip().startswith("file:"):
        return read_profile_file(text.strip()[len("file:") :])
    name = text.strip().lower()
    if name in PROFILES:
        return PROFILES[name]
    if not name.startswith("custom:"):
        raise InvalidArgument(
            "profile", f"unknown profile {text!r} (known: {', '.join(PROFILES)}, custom:flops=...,bw=...,h2d=..., or file:PATH)"
        )
    values: dict[str, float] = {}
    for item in name[len("custom:") :].split(","):
        key, sep, raw = (part.strip() for part in item.partition("="))
        if key not in _CUSTOM_KEYS:
            raise InvalidArgument(f"profile.{key}", f"unknown key (known: {', '.join(_CUSTOM_KEYS)})")
        if not sep:
            raise InvalidArgument(f"profile.{key}", "needs key=value")
        if key in values:
            raise InvalidArgument(f"profile.{key}", "given twice")
        try:
            values[key] = float(raw)
        except ValueError:
            raise InvalidArgument(f"profile.{key}", f"not a number: {raw!r}") from None
        problem = _problem(_CUSTOM_KEYS[key], values[key])
        if problem:
            raise InvalidArgument(f"profile.{key}", problem)
    for key in _CUSTOM_REQUIRED:
        if key not in values:
            raise InvalidArgument(f"profile.{key}", "is required in a custom profile")
    return AcceleratorProfile("custom", **{_CUSTOM_KEYS[k]: v for k, v in values.items()})


@dataclass(frozen=True)
class LayerCost:
    """FLOPs or bytes of one layer, by part."""

    projections: float  # q/k/v and output projections
    attention: float  # q . k^T and p x v (FLOPs); K/V rows and q/out (bytes)
    mlp: float  # gate, up, down

    @property
    def total(self) -> float:
        return self.projections + self.attention + self.mlp


def _check_shape(config: ModelConfig, new_tokens: int, context_rows: int) -> None:
    if not isinstance(config, ModelConfig):
        raise InvalidArgument("config", f"must be a ModelConfig, got {type(config).__name__}")
    for field, value, low in (("new_tokens", new_tokens, 1), ("context_rows", context_rows, 0)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
            raise InvalidArgument(field, f"must be an int >= {low}, got {value!r}")


def attention_pairs(new_tokens: int, context_rows: int, window: int | None = None) -> int:
    """Query-key pairs per query head: new token ``i`` sees ``context_rows + i + 1`` rows, at most ``window``
    of them in a sliding layer."""
    if window is None:
        return new_tokens * context_rows + new_tokens * (new_tokens + 1) // 2
    k = max(0, min(new_tokens, window - context_rows))  # the tokens that see fewer rows than the window
    return k * context_rows + k * (k + 1) // 2 + (new_tokens - k) * window


def _window(window) -> int | None:
    if window is not None and (isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1):
        raise InvalidArgument("window", f"must be a positive int or None, got {window!r}")
    return window


def layer_flops(config: ModelConfig, new_tokens: int, context_rows: int, window: int | None = None) -> LayerCost:
    """Matmul FLOPs of one layer (2 per multiply-add); norms, RoPE, softmax, SiLU and bias adds excluded."""
    _check_shape(config, new_tokens, context_rows)
    window = _window(window)
    c, s = config, new_tokens
    hq, hkv, d, h = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size
    projections = 2 * s * h * (hq + 2 * hkv) * d + 2 * s * hq * d * h
    attention = 4 * hq * d * attention_pairs(s, context_rows, window)  # 2 for q . k, 2 for p x v, per pair and head dim
    mlp = 2 * s * 3 * h * c.intermediate_size
    return LayerCost(float(projections), float(attention), float(mlp))


def layer_bytes(config: ModelConfig, new_tokens: int, context_rows: int, dtype_bytes: int = 2, window: int | None = None) -> LayerCost:
    """HBM bytes of one layer: weights once, K/V read and written, matmul activations read and written once.

    Approximation: every matmul reads its input and writes its output once
    (no fusion, no cache reuse); attention reads q and the
    ``context_rows + new_tokens`` K/V rows of every KV head once (a fused
    kernel; GQA query heads share the read), writes its output, and writes
    the new tokens' K/V into the cache; a sliding layer reads no row older
    than its ``window``.  Elementwise passes (norms, RoPE, SiLU, residual
    adds) are not counted.
    """
    _check_shape(config, new_tokens, context_rows)
    if _window(window) is not None:
        context_rows = min(context_rows, window - 1)
    if isinstance(dtype_bytes, bool) or not isinstance(dtype_bytes, numbers.Integral) or dtype_bytes < 1:
        raise InvalidArgument("dtype_bytes", f"must be a positive integer, got {dtype_bytes!r}")
    c, s = config, new_tokens
    hq, hkv, d, h, inter = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size, c.intermediate_size
    qkv = (hq + 2 * hkv) * d
    proj_weights = h * qkv + hq * d * h + (qkv if c.attention_bias else 0) + h  # + input norm
    proj_acts = s * (h + qkv) + s * (hq * d + h)  # qkv: in, out; o: in, out
    kv_rows = (context_rows + s) * hkv * d * 2  # K and V
    attention = 2 * s * hq * d + kv_rows + s * hkv * d * 2  # q in, out; K/V read; new K/V written
    mlp_weights = 3 * h * inter + h  # + post-attention norm
    mlp_acts = s * (h + 2 * inter) + s * (inter + h)  # gate/up: in, out; down: in, out
    b = dtype_bytes
    return LayerCost(float((proj_weights + proj_acts) * b), float(attention * b), float((mlp_weights + mlp_acts) * b))


@dataclass(frozen=True)
class PartTime:
    """Roofline of one part: the larger of its compute and memory times."""

    compute_s: float
    memory_s: float

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


@dataclass(frozen=True)
class LayerTime:
    """Seconds of one layer on an accelerator, by part."""

    projections: PartTime
    attention: PartTime
    mlp: PartTime
    overhead_s: float

    @property
    def total(self) -> float:
        return self.projections.seconds + self.attention.seconds + self.mlp.seconds + self.overhead_s


def layer_seconds(
    config: ModelConfig, new_tokens: int, context_rows: int, profile: AcceleratorProfile, window: int | None = None
) -> LayerTime:
    """Roofline time of one layer: per part ``max(flops / (peak x eff), bytes / (bw x mem_eff))``, plus the overhead."""
    if not isinstance(profile, AcceleratorProfile):
        raise InvalidArgument("profile", f"must be an AcceleratorProfile, got {type(profile).__name__}")
    flops = layer_flops(config, new_tokens, context_rows, window)
    nbytes = layer_bytes(config, new_tokens, context_rows, profile.dtype_bytes, window)
    parts = [
        PartTime(getattr(flops, part) / profile.flops_per_s, getattr(nbytes, part) / profile.bytes_per_s)
        for part in ("projections", "attention", "mlp")
    ]
    return LayerTime(*parts, overhead_s=profile.layer_overhead_s)


def model_seconds(
    config: ModelConfig, new_tokens: int, context_rows: int, profile: AcceleratorProfile, *, sliding_rows: int | None = None
) -> float:
    """Every layer of the model computing ``new_tokens``: each global layer over ``context_rows``, each
    sliding layer over ``sliding_rows`` (default ``context_rows``) within its window (Gemma 3's 5 of 6)."""
    sliding = len(config.sliding_layers)
    total = (config.num_hidden_layers - sliding) * layer_seconds(config, new_tokens, context_rows, profile).total
    if sliding:
        rows = context_rows if sliding_rows is None else sliding_rows
        total += sliding * layer_seconds(config, new_tokens, rows, profile, config.sliding_window).total
    return total


def h2d_seconds(nbytes: int | float, profile: AcceleratorProfile) -> float:
    """Seconds to copy ``nbytes`` from host to device at the profile's effective PCIe rate."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Real) or not math.isfinite(nbytes) or nbytes < 0:
        raise InvalidArgument("nbytes", f"must be a finite number >= 0, got {nbytes!r}")
    if not isinstance(profile, AcceleratorProfile):
        raise InvalidArgument("profile", f"must be an AcceleratorProfile, got {type(profile).__name__}")
    return nbytes / profile.h2d_bytes_per_s


def _roofline(flops: float, nbytes: float, profile: AcceleratorProfile) -> float:
    return max(flops / profile.flops_per_s, nbytes / profile.bytes_per_s)


def query_seconds(config: ModelConfig, new_tokens: int, profile: AcceleratorProfile) -> float:
    """One layer's query projection for ``new_tokens`` (what a selection scores with), plus one launch."""
    _check_shape(config, new_tokens, 0)
    c, b = config, profile.dtype_bytes
    width = c.num_attention_heads * c.head_dim
    flops = 2 * new_tokens * c.hidden_size * width
    nbytes = (c.hidden_size * width + new_tokens * (c.hidden_size + width)) * b
    return _roofline(flops, nbytes, profile) + profile.layer_overhead_s / 4


def score_seconds(
    config: ModelConfig,
    new_tokens: int,
    rows: int,
    profile: AcceleratorProfile,
    *,
    head_fraction: float = 1.0,
    channel_fraction: float = 1.0,
    row_bytes: float | None = None,
) -> float:
    """Scoring ``rows`` key rows against the new tokens' queries: ``q . k`` FLOPs and the rows read.

    ``head_fraction``/``channel_fraction``: the share of query heads and of
    channels scored (IMPRESS's partial probe); ``row_bytes``: bytes of one
    row of every KV head scored (default ``kv_heads x head_dim x dtype``).
    0 rows cost nothing; otherwise one launch (``layer_overhead_s / 4``) for
    the scoring and top-k kernels.
    """
    _check_shape(config, new_tokens, rows)
    if rows == 0:
        return 0.0
    c = config
    d = c.head_dim * channel_fraction
    flops = 2 * c.num_attention_heads * head_fraction * new_tokens * rows * d
    per_row = c.num_key_value_heads * head_fraction * d * profile.dtype_bytes if row_bytes is None else row_bytes
    nbytes = rows * per_row + new_tokens * c.num_attention_heads * head_fraction * d * profile.dtype_bytes
    return _roofline(flops, nbytes, profile) + profile.layer_overhead_s / 4


def lm_head_seconds(config: ModelConfig, profile: AcceleratorProfile) -> float:
    """The first token's logits: one ``hidden x vocab`` matrix-vector product (the weights read once)."""
    c = config
    flops = 2 * c.hidden_size * c.vocab_size
    return _roofline(flops, c.hidden_size * c.vocab_size * profile.dtype_bytes, profile) + profile.layer_overhead_s / 4
