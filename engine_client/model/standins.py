"""Stand-in layers: the layers of a model at which the rows a Re-Prefill did not load stand in.

At a stand-in layer (``ReprefillConfig.standin_layers``, ``engine_client.standin``)
every prefix row left out of the selected chunks still joins the attention,
with its resident probe key and the mean value of the rows left out.  Which
layers need that is a property of the model: on SmolLM2-135M at a 5% budget,
loading layer 19 or layer 8 in full restores most of the answer margin the
sparse sets lose, and every other layer adds little; at 4096 tokens layer 8
takes margin away, so one layer is kept by default (README, "Rows that stand
in for the prefix").

Calibration (``python -m kvstore_tools.models calibrate-standins NAME``) measures it
on tuning prompts: per layer, how much loading that one layer in full raises
the answer's weakest teacher-forced margin over the sparse sets
(``gains``, logits, averaged over the prompts).  ``choose_layers`` keeps at
most ``max_layers`` layers whose gain is at least ``min_gain``, the largest
first.  ``StandinLayers`` is that choice with the gains and how they were
made, kept next to the model's checkpoint (``PROFILE_FILE``, JSON,
``version``ed) and refused for a model whose fingerprint or layer count
differs, as the streaming heads are (``model.streaming``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .profile_file import ProfileError, packaged_path, read_profile_text, write_text_atomic

PROFILE_FILE = "standin_layers.json"
PROFILE_VERSION = 1
# On SmolLM2-135M's NIAH tuning stream (seeds 0-59, 2048 tokens, 5%) layers 19 and 8
# gain the most (README).  At 4096 tokens (tuning seeds 0-19) layer 8's stand-ins take
# weakest-margin away (2.19 logits alone, 2.80 with 19, against 2.82 with none) and
# layer 19 alone gives the most (3.50), while at 2048 tokens it keeps what both keep
# (2.68 against 2.72): one layer, and one layer's value sums per prefix.
DEFAULT_MAX_LAYERS = 1
DEFAULT_MIN_GAIN = 0.2


def choose_layers(gains: Sequence[float], max_layers: int, min_gain: float) -> tuple[int, ...]:
    """At most ``max_layers`` layers whose gain is at least ``min_gain``, the largest gains first, in layer order."""
    if max_layers < 0:
        raise ValueError(f"max_layers must be >= 0, got {max_layers}")
    ranked = sorted((i for i, g in enumerate(gains) if g >= min_gain), key=lambda i: (-gains[i], i))
    return tuple(sorted(ranked[:max_layers]))


@dataclass(frozen=True)
class StandinLayers:
    model_fingerprint: str
    layers: tuple[int, ...]
    gains: tuple[float, ...]  # [layer]: mean gain of the weakest answer margin with that layer whole
    max_layers: int
    min_gain: float
    calibration: dict = field(default_factory=dict)  # how it was made: task, seeds, tokens, budget, selection
    version: int = PROFILE_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    def save(self, path) -> Path:
        """Write atomically (temporary file, fsync, rename)."""
        return write_text_atomic(path, self.to_json())

    @classmethod
    def from_json(cls, text: str, *, model_fingerprint: str | None = None, num_layers: int | None = None) -> StandinLayers:
        try:
            raw = json.loads(text)
            if raw.get("version") != PROFILE_VERSION:
                raise ProfileError(f"stand-in layers file version {raw.get('version')!r}, this reader knows {PROFILE_VERSION}")
            prof = cls(
                model_fingerprint=str(raw["model_fingerprint"]),
                layers=tuple(_layer(x) for x in raw["layers"]),
                gains=tuple(float(x) for x in raw["gains"]),
                max_layers=int(raw["max_layers"]),
                min_gain=float(raw["min_gain"]),
                calibration=dict(raw.get("calibration", {})),
            )
        except ProfileError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ProfileError(f"stand-in layers file is malformed: {exc}") from None
        _check(prof, model_fingerprint, num_layers)
        return prof

    @classmethod
    def load(cls, path, *, model=None) -> StandinLayers:
        """Read ``path``; with ``model`` (a ``Decoder``), refuse a file made for another model or depth."""
        text = read_profile_text(path, "stand-in layers")
        kw = {} if model is None else {"model_fingerprint": model.fingerprint, "num_layers": model.num_layers}
        return cls.from_json(text, **kw)


def _layer(x) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise ValueError(f"layers must be integers, got {x!r}")
    return x


def _check(prof: StandinLayers, fingerprint, num_layers) -> None:
    if not all(math.isfinite(g) for g in prof.gains):
        raise ProfileError("stand-in layers file: gains must be finite")
    depth = len(prof.gains)
    if len(set(prof.layers)) != len(prof.layers) or not all(0 <= x < depth for x in prof.layers):
        raise ProfileError(f"stand-in layers file: layers {prof.layers} must be distinct, in [0, {depth})")
    if len(prof.layers) > prof.max_layers:
        raise ProfileError(f"stand-in layers file: {len(prof.layers)} layers, more than its max_layers {prof.max_layers}")
    if fingerprint and prof.model_fingerprint != fingerprint:
        raise ProfileError(
            f"stand-in layers were calibrated for model {prof.model_fingerprint[:12]}, not this one ({fingerprint[:12]}); calibrate again"
        )
    if num_layers is not None and depth != num_layers:
        raise ProfileError(f"stand-in layers file has gains for {depth} layers, the model {num_layers}")


def packaged_standins(model) -> StandinLayers | None:
    """The stand-in layers shipped for ``model`` (a ``Decoder``, matched by fingerprint), or None.

    A model whose calibration ships with the package (SmolLM2-135M in float32,
    ``calibrate-standins`` on NIAH at 2048 tokens) gets the accurate default
    with nothing to run first.
    """
    path = packaged_path("*.standin_layers.json", model.fingerprint)
    return None if path is None else StandinLayers.load(path, model=model)
