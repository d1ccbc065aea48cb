"""Recompute, full load, or sparse Re-Prefill: the cheapest path for one request (pure).

Given a model's shape, a profile of the machine (``compute_model``: a
measured ``file:`` profile from ``kvstore-bench calibrate`` knows the disk
rate and the storage path's fixed cost per Period) and a request's shape,
``predict`` gives each path's time and ``choose`` the cheapest, with why:

* recompute: prefill of prefix + suffix through every layer, then the
  first token's logits; nothing is read;
* full load: every stored byte of the prefix read from disk and copied to
  the device, every layer computing the suffix over every prefix row, one
  storage round trip per Period;
* both loading paths: a model with sliding-window layers (Gemma 3) stores
  their last window as the prefix's tail (fetched once, then resident),
  and a sliding layer computes over that window alone, as its recompute
  does (``compute_model.model_seconds``);
* sparse at the budget: that fraction of the bytes, the per-request state
  (key summaries, probe keys) when not resident, each Period's selection
  (the first layer's queries and scoring), every layer computing the suffix
  over the selected rows, one round trip per Period.

Reads and compute overlap Period by Period: a loading path costs the larger
of its I/O and its compute, plus the smaller spread over the Periods (the
first Period's wait is not hidden).  A path whose cost the profile cannot
say (no disk rate) is left out of the choice, and the reason says so.

Speculation (the daemon reading Period i's set for Period i+1 as soon as
it is known) pays only where a Period's compute outlasts the read of one
Period's set: then the guess is read while the worker computes.  Where
compute is the shorter (a small model at GPU speed), the guessed chunks are
read beside the ones the Period needs and only delay them: the choice turns
it off for the sparse path (``speculation``; measured in the trace replay,
docs/serving.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from .compute_model import AcceleratorProfile, h2d_seconds, lm_head_seconds, model_seconds, query_seconds, score_seconds
from .model.config import ModelConfig

PATHS = ("recompute", "full-load", "sparse")


@dataclass(frozen=True)
class RequestShape:
    """One Re-Prefill request, as the choice needs it."""

    prefix_tokens: int
    suffix_tokens: int
    kv_bytes: int  # the prefix's stored KV, every layer (what a full load reads)
    num_periods: int  # storage round trips of a loading path
    budget: float  # fraction of the prefix's chunks the sparse path loads, in (0, 1]
    state_bytes: int = 0  # per-request state the sparse path fetches (0 when resident)
    scored_rows: int = 0  # key rows a Period's selection scores (0: none)
    tail_bytes: int = 0  # the prefix's tail pages both loading paths fetch (a window tail; 0 when resident)

    def __post_init__(self):
        for name in ("prefix_tokens", "suffix_tokens", "num_periods"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        for name in ("kv_bytes", "state_bytes", "scored_rows", "tail_bytes"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {getattr(self, name)!r}")
        if not 0 < self.budget <= 1:
            raise ValueError(f"budget must be a fraction in (0, 1], got {self.budget!r}")


@dataclass(frozen=True)
class Choice:
    path: str  # one of PATHS
    seconds: float  # its predicted time to first token
    predicted: dict  # path -> seconds, for every path the profile could cost
    reason: str
    speculate: bool | None = None  # the sparse path's speculation (``speculation``); None: not costed
    modelled: dict | None = None  # path -> seconds from the profile alone, before ``measured`` scaled them


@dataclass(frozen=True)
class Speculation:
    pays: bool
    period_compute_s: float  # one Period's modelled compute on the sparse path
    period_read_s: float  # the read of one Period's set (its bytes at the disk rate, plus the per-Period cost)


class PathHistory:
    """What each path measured against its prediction on one runner: the choice's correction of the profile.

    A profile prices the paths from rates (FLOP/s, bytes/s, a fixed cost per Period); what it leaves out
    (host work, read latency on a disk busy with small reads, the selection's synchronisation) shows up as
    a ratio of measured to predicted time.  Each path keeps its ratio per profile and request class (the prefix's
    length to a power of two and, for the sparse path, its budget), as an even mix of the last value and
    the new one.  A path the choice underpriced is taken, measured and priced up, so the next request of
    that class goes to the path that is cheaper in fact; a path overpriced and never taken keeps its
    modelled price (the choice does not explore).
    """

    def __init__(self):
        self.ratios: dict[tuple, float] = {}

    @staticmethod
    def _key(profile: AcceleratorProfile, path: str, shape: RequestShape) -> tuple:
        budget = round(shape.budget, 4) if path == "sparse" else None
        return (profile.name, profile.source, path, shape.prefix_tokens.bit_length(), budget)

    def ratios_for(self, profile: AcceleratorProfile, shape: RequestShape) -> dict[str, float]:
        """path -> the ratio measured against ``profile`` for ``shape``'s class (paths without one are absent)."""
        out = {}
        for path in PATHS:
            ratio = self.ratios.get(self._key(profile, path, shape))
            if ratio is not None:
                out[path] = ratio
        return out

    def record(self, profile: AcceleratorProfile, path: str, shape: RequestShape, predicted_s: float, measured_s: float) -> None:
        """One request of ``shape`` on ``path``: ``predicted_s`` by ``profile`` alone (unscaled), ``measured_s``."""
        if not predicted_s > 0 or not measured_s > 0:
            return
        key, ratio = self._key(profile, path, shape), measured_s / predicted_s
        old = self.ratios.get(key)
        self.ratios[key] = ratio if old is None else 0.5 * (old + ratio)


def speculation(config: ModelConfig, profile: AcceleratorProfile, shape: RequestShape) -> Speculation | None:
    """Whether the sparse path's speculation pays on this machine (module docstring); None without a disk rate."""
    if profile.disk_bytes_per_s is None:
        return None
    periods = shape.num_periods
    rows = max(1, round(shape.budget * shape.prefix_tokens))
    compute = model_seconds(config, shape.suffix_tokens, rows, profile, sliding_rows=shape.prefix_tokens)
    if config.sliding_layers:  # a Period computes its stored layers and the sliding ones after them
        compute /= periods
    else:
        compute *= -(-config.num_hidden_layers // periods) / config.num_hidden_layers
    if shape.budget < 1 and shape.scored_rows:
        compute += query_seconds(config, shape.suffix_tokens, profile) + score_seconds(
            config, shape.suffix_tokens, shape.scored_rows, profile
        )
    read = shape.budget * shape.kv_bytes / periods / profile.disk_bytes_per_s + (profile.period_overhead_s or 0.0)
    return Speculation(compute >= read, compute, read)


def recompute_seconds(config: ModelConfig, profile: AcceleratorProfile, shape: RequestShape) -> float:
    tokens = shape.prefix_tokens + shape.suffix_tokens
    return model_seconds(config, tokens, 0, profile) + lm_head_seconds(config, profile)


def load_seconds(config: ModelConfig, profile: AcceleratorProfile, shape: RequestShape, fraction: float) -> float | None:
    """A loading path over ``fraction`` of the prefix; None without a disk rate in the profile."""
    if profile.disk_bytes_per_s is None:
        return None
    nbytes = fraction * shape.kv_bytes + shape.tail_bytes
    state = shape.state_bytes if fraction < 1 else 0
    io = (nbytes + state) / profile.disk_bytes_per_s + shape.num_periods * (profile.period_overhead_s or 0.0)
    rows = max(1, round(fraction * shape.prefix_tokens))
    compute = h2d_seconds(nbytes, profile) + model_seconds(config, shape.suffix_tokens, rows, profile, sliding_rows=shape.prefix_tokens)
    if fraction < 1 and shape.scored_rows:
        compute += shape.num_periods * (
            query_seconds(config, shape.suffix_tokens, profile) + score_seconds(config, shape.suffix_tokens, shape.scored_rows, profile)
        )
    hidden = min(io, compute)
    return max(io, compute) + hidden / shape.num_periods + lm_head_seconds(config, profile)


def predict(config: ModelConfig, profile: AcceleratorProfile, shape: RequestShape) -> dict[str, float]:
    """Each path's predicted seconds; a path the profile cannot cost is absent."""
    out = {"recompute": recompute_seconds(config, profile, shape)}
    for path, fraction in (("full-load", 1.0), ("sparse", shape.budget)):
        seconds = load_seconds(config, profile, shape, fraction)
        if seconds is not None:
            out[path] = seconds
    return out


def choose(config: ModelConfig, profile: AcceleratorProfile, shape: RequestShape, measured: dict | None = None) -> Choice:
    """The cheapest path; a tie goes to the simpler one, in ``PATHS`` order (a sparse budget of the whole
    prefix costs what a whole load does, and the whole load selects nothing).  ``measured`` (path -> the
    ratio of measured to predicted time on this machine, ``PathHistory``) scales each path's prediction."""
    modelled = predict(config, profile, shape)
    scale = {p: measured[p] for p in modelled if measured and measured.get(p)}
    predicted = {p: s * scale.get(p, 1.0) for p, s in modelled.items()}
    path = min(predicted, key=predicted.get)
    others = ", ".join(f"{p} {s * 1e3:.2f} ms" for p, s in predicted.items() if p != path)
    missing = [p for p in PATHS if p not in predicted]
    why = f"{path} {predicted[path] * 1e3:.2f} ms predicted, against {others}"
    if scale:
        why += " (" + ", ".join(f"{p}: {modelled[p] * 1e3:.2f} ms modelled x {r:.2f} measured" for p, r in scale.items()) + ")"
    if missing:
        why += f"; {' and '.join(missing)} not costed (the profile has no disk rate: kvstore-bench calibrate)"
    spec = speculation(config, profile, shape)
    if spec is not None and path == "sparse":
        verb = "speculating" if spec.pays else "no speculation"
        rel = ">=" if spec.pays else "<"
        why += f"; {verb}: a Period's compute {spec.period_compute_s * 1e3:.2f} ms {rel} its read {spec.period_read_s * 1e3:.2f} ms"
    return Choice(path, predicted[path], predicted, why, None if spec is None else spec.pays, modelled)
