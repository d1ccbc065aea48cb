"""A request checked against the runner and the stored prefix, before any work.

A ``ReprefillConfig`` checks its own fields when it is made; what is left
depends on the runner (its stored group, its calibrated layers, its
streaming heads) and on the prefix (stored for this model and layout, its
probe-key form, the context length).  Every refusal is one
``InvalidArgument`` naming the field (``NotFound`` for an unknown prefix).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from kvstore.contract import InvalidArgument, NotFound
from kvstore.contract.geometry import StoreGeometry

from ..model.selection_profile import calibrated_probe_bits
from ..rpc import KVStoreRpcError
from ..selection import PROBE_KEYS, SELECTORS
from .config import AUTO, CALIBRATED, ReprefillConfig


@dataclass(frozen=True)
class Layers:
    """A request's calibrated choices resolved for one runner: stand-in layers and layers loaded whole."""

    standins: tuple[int, ...] = ()
    whole: tuple[int, ...] = ()
    missing_calibration: bool = False  # "auto" asked for stand-ins and the runner has no calibration file


def resolve_selection(cfg: ReprefillConfig, profile) -> ReprefillConfig:
    """``cfg`` with its "auto" probe-key width and local chunks read from ``profile``
    (``model.selection_profile.SelectionProfile`` or None: 4 bits and one chunk), and no probe keys for a
    selector that reads none.  A runner resolves every request with it first, so nothing below it sees
    "auto" there (``follow_top`` is read where a Period selects)."""
    if not isinstance(cfg, ReprefillConfig):
        raise InvalidArgument("cfg", f"must be a ReprefillConfig, got {type(cfg).__name__}")

    sel, changes = cfg.selection, {}
    if sel.probe_bits == AUTO:
        changes["probe_bits"] = calibrated_probe_bits(None, profile) if PROBE_KEYS in SELECTORS[sel.selector].needs else 0
    if sel.local_chunks == AUTO:
        changes["local_chunks"] = 1 if profile is None or profile.local_chunks is None else profile.local_chunks
    return cfg.replace(**changes) if changes else cfg


def resolve_layers(cfg: ReprefillConfig, profile, num_layers: int, group_layers: int) -> Layers:
    """``standin_layers`` and ``whole_layers`` of ``cfg`` with "calibrated" / "auto" read from ``profile``
    (``model.standins.StandinLayers`` or None), checked against the runner."""
    whole = _calibrated(cfg.schedule.whole_layers, "whole_layers", profile)
    value = cfg.attention.standin_layers
    if value == AUTO:
        usable = not cfg.standin_conflict() and not whole and group_layers == 1
        return Layers(tuple(profile.layers) if usable and profile is not None else (), whole, usable and profile is None)
    standins = _calibrated(value, "standin_layers", profile)
    if standins:
        if not all(0 <= x < num_layers for x in standins):
            raise InvalidArgument("standin_layers", f"must be distinct layers in [0, {num_layers}), got {standins}")
        if group_layers != 1:
            raise InvalidArgument(
                "standin_layers",
                f"stand-in keys are each layer's probe keys: 1-layer Periods and stored groups, not {group_layers}-layer groups",
            )
    both = set(whole) & set(standins)
    if both:
        raise InvalidArgument("whole_layers", f"layers {sorted(both)} are loaded whole; they need no stand-in rows")
    return Layers(standins, whole)


def _calibrated(value, name: str, profile) -> tuple[int, ...]:
    if value != CALIBRATED:
        return tuple(value)
    if profile is None:
        raise InvalidArgument(
            name,
            "this runner has no calibrated stand-in layers (ModelRunner(standin_layers=...); python -m kvstore_tools.models calibrate-standins)",
        )
    return tuple(profile.layers)


def check_runner(cfg: ReprefillConfig, geometry: StoreGeometry, streaming_heads) -> None:
    """What the runner's layout and profiles allow."""
    g = geometry.group_layers
    if cfg.schedule.period_layers % g:
        raise InvalidArgument("period_layers", f"must be a positive multiple of the stored group ({g} layers)")
    if cfg.attention.streaming and streaming_heads is None:
        raise InvalidArgument(
            "streaming",
            "this runner has no streaming heads (ModelRunner(streaming_heads=...); python -m kvstore_tools.models calibrate-heads)",
        )
    if geometry.streaming_heads and not cfg.attention.streaming:
        raise InvalidArgument(
            "streaming", "this runner's prefixes keep only the sink and recent rows of their streaming heads; ask with streaming=True"
        )


def token_tensor(tokens, field_name: str = "tokens") -> torch.Tensor:
    t = torch.as_tensor(np.asarray(tokens), dtype=torch.long).reshape(-1)
    if t.numel() == 0:
        raise InvalidArgument(field_name, "must not be empty")
    return t


def describe(client, prefix_id: str):
    """The prefix's description; ``NotFound`` naming ``prefix_id`` when the daemon has none."""
    try:
        return client.describe(prefix_id)
    except KVStoreRpcError as exc:
        if exc.code.name == "NOT_FOUND":
            raise NotFound(f"prefix_id: {exc.message}") from None
        raise


def check_prefix(desc, cfg: ReprefillConfig, geometry: StoreGeometry, model, suffix: torch.Tensor) -> None:
    """The stored prefix against the runner and the request: model, layout, probe-key form, context."""
    stored = desc.geometry
    # how a prefix keeps its probe keys decides only which requests it serves (check_probe_form)
    if replace(stored, probe_bits=0) != replace(geometry, probe_bits=0) or desc.model_fingerprint != model.fingerprint:
        raise InvalidArgument(
            "prefix_id",
            f"stored for another model or layout (fingerprint {desc.model_fingerprint[:12] or '-'}, {stored}); "
            f"this runner is {model.fingerprint[:12] or '-'}, {geometry}",
        )
    check_probe_form(stored, cfg)
    limit = model.config.max_position_embeddings
    if desc.num_tokens + suffix.numel() > limit:
        raise InvalidArgument(
            "suffix_tokens", f"prefix {desc.num_tokens} + suffix {suffix.numel()} tokens exceed the model's context of {limit}"
        )


def check_probe_form(stored: StoreGeometry, cfg: ReprefillConfig) -> None:
    """A prefix storing quantized probe keys serves selection over probe keys at its own width only."""
    bits = cfg.selection.probe_bits
    if PROBE_KEYS not in SELECTORS[cfg.selection.selector].needs or not stored.probe_bits or bits == stored.probe_bits:
        return
    asked = f"{bits}-bit" if bits else "full-precision"
    raise InvalidArgument(
        "probe_bits",
        f"the prefix stores its probe keys quantized to {stored.probe_bits} bits, not the {asked} keys "
        f"probe_bits={bits} scores with; ask with probe_bits={stored.probe_bits}",
    )
