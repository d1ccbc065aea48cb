"""Streaming heads (LServe, after DuoAttention): the KV heads that can see only the sink and a recent window.

Most attention heads of a trained model put nearly all their mass on the
first tokens (the attention sink) and the last ones; a few - the retrieval
heads - read far back.  A streaming head needs the KV of ``sink_tokens`` +
``recent_tokens`` prefix rows whatever the prefix's length, so its storage
and loading stop growing with the context.

Calibration (``calibrate``): real prompts are run densely; for each layer
and KV head, the attention its query heads pay from the prompt's question
(the suffix) to the sink rows, the last ``recent_tokens`` prefix rows and
the question itself is averaged over the question's positions and the
prompts, taking the least local of the KV head's query heads (``local_mass``).  A KV head is
streaming when that mass is at least ``threshold``; of those, at most
``target_fraction`` of all heads are converted, the most local first
(LServe converts half).

``StreamingHeads`` is that classification with how it was made; it is kept
next to the model's checkpoint (``PROFILE_FILE``, JSON, ``version``ed) and
refused for a model whose fingerprint differs.  ``row_mask`` turns it into
the rows each KV head of a layer may attend to: a streaming head sees the
rows at positions below ``sink_tokens`` or at least ``n - recent_tokens``,
and every token after the prefix (the request's own and the generated ones).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .profile_file import ProfileError, read_profile_text, write_text_atomic

PROFILE_FILE = "streaming_heads.json"
PROFILE_VERSION = 1
# Chosen on SmolLM2-135M's tuning prompts (README, "Streaming heads"): at 0.6
# 40% of its KV heads stream and pass key / NIAH keep every answer; at 0.55
# (50%) the pass key loses half of them.
DEFAULT_THRESHOLD = 0.6
DEFAULT_TARGET_FRACTION = 0.5


@dataclass(frozen=True)
class StreamingHeads:
    model_fingerprint: str
    sink_tokens: int
    recent_tokens: int
    threshold: float
    target_fraction: float
    mass: tuple[tuple[float, ...], ...]  # [layer][kv head]: the calibrated local mass
    streaming: tuple[tuple[bool, ...], ...]  # [layer][kv head]
    calibration: dict = field(default_factory=dict)  # how it was made: prompts, seeds, lengths
    version: int = PROFILE_VERSION

    @property
    def num_streaming(self) -> int:
        return sum(sum(layer) for layer in self.streaming)

    @property
    def fraction(self) -> float:
        """Streaming KV heads over all KV heads."""
        return self.num_streaming / sum(len(layer) for layer in self.streaming)

    def stored_fraction(self, num_tokens: int) -> float:
        """KV a prefix of ``num_tokens`` needs with streaming heads keeping only sink + recent rows, over the full KV."""
        kept = min(num_tokens, self.sink_tokens + self.recent_tokens) / num_tokens
        return 1.0 - self.fraction * (1.0 - kept)

    def row_mask(self, layer: int, row_positions: torch.Tensor, num_prefix: int) -> torch.Tensor | None:
        """``[Hkv, r]`` bool, True where KV head ``h`` of ``layer`` may attend to the row at ``row_positions[j]``.

        None when the layer has no streaming head (every row visible).
        """
        heads = self.streaming[layer]
        if not any(heads):
            return None
        pos = torch.as_tensor(row_positions, dtype=torch.long)
        local = (pos < self.sink_tokens) | (pos >= num_prefix - self.recent_tokens)
        mask = torch.ones(len(heads), pos.numel(), dtype=torch.bool)
        for h, is_streaming in enumerate(heads):
            if is_streaming:
                mask[h] = local
        return mask

    # ------------------------------------------------------------------ file
    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    def save(self, path) -> Path:
        """Write atomically (temporary file, fsync, rename)."""
        return write_text_atomic(path, self.to_json())

    @classmethod
    def from_json(cls, text: str, *, model_fingerprint: str | None = None, num_layers: int | None = None, num_kv_heads: int | None = None):
        try:
            raw = json.loads(text)
            if raw.get("version") != PROFILE_VERSION:
                raise ProfileError(f"streaming heads file version {raw.get('version')!r}, this reader knows {PROFILE_VERSION}")
            prof = cls(
                model_fingerprint=str(raw["model_fingerprint"]),
                sink_tokens=int(raw["sink_tokens"]),
                recent_tokens=int(raw["recent_tokens"]),
                threshold=float(raw["threshold"]),
                target_fraction=float(raw["target_fraction"]),
                mass=tuple(tuple(float(x) for x in layer) for layer in raw["mass"]),
                streaming=tuple(tuple(bool(x) for x in layer) for layer in raw["streaming"]),
                calibration=dict(raw.get("calibration", {})),
            )
        except ProfileError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ProfileError(f"streaming heads file is malformed: {exc}") from None
        _check_profile(prof, model_fingerprint, num_layers, num_kv_heads)
        return prof

    @classmethod
    def load(cls, path, *, model=None) -> StreamingHeads:
        """Read ``path``; with ``model`` (a ``Decoder``), refuse a file made for another model or shape."""
        text = read_profile_text(path, "streaming heads")
        kw = {}
        if model is not None:
            kw = {"model_fingerprint": model.fingerprint, "num_layers": model.num_layers, "num_kv_heads": model.config.num_key_value_heads}
        return cls.from_json(text, **kw)


def _check_profile(prof: StreamingHeads, fingerprint, num_layers, num_kv_heads) -> None:
    if prof.sink_tokens < 0 or prof.recent_tokens < 0:
        raise ProfileError("streaming heads file: sink_tokens and recent_tokens must be >= 0")
    shape = [len(layer) for layer in prof.streaming]
    if shape != [len(layer) for layer in prof.mass]:
        raise ProfileError("streaming heads file: mass and streaming differ in shape")
    if fingerprint is not None and fingerprint and prof.model_fingerprint != fingerprint:
        raise ProfileError(
            f"streaming heads were calibrated for model {prof.model_fingerprint[:12]}, not this one ({fingerprint[:12]}); calibrate again"
        )
    if num_layers is not None and len(shape) != num_layers:
        raise ProfileError(f"streaming heads file has {len(shape)} layers, the model {num_layers}")
    if num_kv_heads is not None and any(n != num_kv_heads for n in shape):
        raise ProfileError(f"streaming heads file needs {num_kv_heads} KV heads per layer")


# ---------------------------------------------------------------- calibration


@torch.inference_mode()
def local_mass(model, prefix_kv: torch.Tensor, suffix: torch.Tensor, *, sink_tokens: int, recent_tokens: int) -> torch.Tensor:
    """``[L, Hkv]`` float32: the attention the suffix's queries pay to the sink, the recent prefix rows and the suffix.

    Averaged over the suffix positions; of a KV head's query heads, the least
    local one's (a KV head is streaming only if all its query heads can be).

    ``prefix_kv [L, 2, Hkv, n, d]`` is the dense prefill of the prefix
    (``prefill.chunked_prefill``); the suffix is run over all of it, as a
    full-KV request is.
    """
    c = model.config
    c.require_full_attention("streaming-heads calibration")  # its scores assume every key visible at scale 1/sqrt(d)
    n = prefix_kv.shape[3]
    s = suffix.numel()
    hkv, g, d = c.num_key_value_heads, c.num_query_groups, c.head_dim
    positions = torch.arange(n, n + s)
    pos = torch.arange(n)
    local_rows = (pos < sink_tokens) | (pos >= n - recent_tokens)
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    hidden = model.embed(suffix)
    out = torch.empty(model.num_layers, hkv)
    for layer in range(model.num_layers):
        q = model.layer_queries(layer, hidden, positions).float().reshape(hkv, g, s, d)
        hidden, suffix_kv = model.layer_forward(layer, hidden, positions, prefix_kv[layer])
        keys = torch.cat([prefix_kv[layer, 0], suffix_kv[0]], dim=1).float()  # [Hkv, n+s, d]
        scores = torch.einsum("hgsd,htd->hgst", q, keys) / math.sqrt(d)
        scores[..., n:].masked_fill_(~causal, float("-inf"))
        p = scores.softmax(-1)
        local = p[..., :n][..., local_rows].sum(-1) + p[..., n:].sum(-1)  # [Hkv, g, s]
        out[layer] = local.mean(dim=2).amin(dim=1)  # a KV head serves all its query heads: the least local decides
    return out


def classify(mass: torch.Tensor, threshold: float, target_fraction: float) -> list[list[bool]]:
    """Streaming = local mass >= ``threshold``, at most ``target_fraction`` of all heads, the most local first."""
    if not 0.0 <= threshold <= 1.0 or math.isnan(threshold):
        raise ValueError(f"threshold must be in [0, 1], got {threshold!r}")
    if not 0.0 <= target_fraction <= 1.0 or math.isnan(target_fraction):
        raise ValueError(f"target_fraction must be in [0, 1], got {target_fraction!r}")
    flat = mass.flatten()
    limit = math.floor(round(target_fraction * flat.numel(), 9))
    order = sorted(range(flat.numel()), key=lambda i: (-float(flat[i]), i))
    chosen = {i for i in order[:limit] if float(flat[i]) >= threshold}
    cols = mass.shape[1]
    return [[r * cols + h in chosen for h in range(cols)] for r in range(mass.shape[0])]


def calibrate(
    model,
    prompts: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    sink_tokens: int = 16,
    recent_tokens: int = 64,
    threshold: float = DEFAULT_THRESHOLD,
    target_fraction: float = DEFAULT_TARGET_FRACTION,
    calibration: dict | None = None,
    progress=None,
) -> StreamingHeads:
    """Measure ``local_mass`` over ``(prefix_tokens, suffix_tokens)`` prompts and classify (module docstring)."""
    from ..prefill import chunked_prefill

    total, count = None, 0
    for prefix, suffix in prompts:
        prefix = torch.as_tensor(prefix, dtype=torch.long).reshape(-1)
        suffix = torch.as_tensor(suffix, dtype=torch.long).reshape(-1)
        _, kv = chunked_prefill(model, prefix)
        m = local_mass(model, kv, suffix, sink_tokens=sink_tokens, recent_tokens=recent_tokens)
        total = m if total is None else total + m
        count += 1
        if progress is not None:
            progress(1)
    if not count:
        raise ValueError("calibration needs at least one prompt")
    mass = total / count
    return StreamingHeads(
        model_fingerprint=model.fingerprint,
        sink_tokens=sink_tokens,
        recent_tokens=recent_tokens,
        threshold=threshold,
        target_fraction=target_fraction,
        mass=tuple(tuple(round(float(x), 6) for x in row) for row in mass),
        streaming=tuple(tuple(row) for row in classify(mass, threshold, target_fraction)),
        calibration={**(calibration or {}), "prompts": count},
    )


def row_masks(profile: StreamingHeads | None, rows: Sequence[torch.Tensor], num_prefix: int) -> list[torch.Tensor | None]:
    """Per layer, ``row_mask`` for the prefix rows at positions ``rows[layer]`` (all None without a profile)."""
    if profile is None:
        return [None] * len(rows)
    return [profile.row_mask(layer, pos, num_prefix) for layer, pos in enumerate(rows)]
