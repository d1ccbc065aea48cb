"""Krul's preemptive compression strategy: which layers of a conversation share one merged KV.

Chosen per conversation at turn end from its ``AttentionStats`` (``sketch``):

1. **Input-sensitive layers stay whole.** A layer whose edge mass (attention
   on the initial plus the recent 10% of the keys, ``sketch.edge_mass``, in
   ``[0, 2]``) is below ``gamma`` is non-I-R: its attention reaches into the
   middle of the context, where what the next turn asks about may lie, and it
   is never compressed.
2. **Closest pairs first, greedily.** Among the remaining (I-R) layers, every
   pair ``a < b`` is scored by the Euclidean distance of the two pooled maps
   (flattened over heads and cells); pairs are taken in ascending distance
   (ties: lower ``(a, b)`` first), skipping a pair if either layer is already
   paired, until ``2 x pairs`` would pass ``floor(N x ratio)`` of the ``N``
   layers (``rounding.fraction_floor``), or no pair is left.

The rule is greedy, as the paper's is: taking the closest pair first can
force a worse partner on its neighbours, so the total distance of the pairs
is not always the smallest possible (``tests/unit/test_krul_strategy.py``
has a four-layer case).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from kvstore.contract import InvalidArgument

from ..rounding import fraction_floor
from ._checks import check_int, check_real
from .sketch import AttentionSketch, AttentionStats, edge_mass, pooled_attention

GAMMA_RANGE = (0.0, 2.0)  # the edge mass is a sum of two fractions of a row's attention


@dataclass(frozen=True)
class Strategy:
    """One conversation's compression strategy, as stored next to its KV (``to_dict``).

    ``pairs``: the layer pairs ``(a, b)``, ``a < b``, in the order taken;
    ``distances``: each pair's map distance, same order; ``non_ir``: the
    input-sensitive layers, ascending.  Checked on construction: indices in
    range, no layer twice, no non-I-R layer in a pair, at most
    ``floor(num_layers x ratio)`` layers paired.
    """

    pairs: tuple[tuple[int, int], ...]
    non_ir: tuple[int, ...]
    gamma: float
    ratio: float
    distances: tuple[float, ...]
    num_layers: int

    def __post_init__(self):
        num_layers = check_int("strategy.num_layers", self.num_layers, 1)
        check_real("strategy.gamma", self.gamma, *GAMMA_RANGE)
        ratio = check_real("strategy.ratio", self.ratio, 0.0, 1.0)
        seen: set[int] = set()
        for pair in self.pairs:
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise InvalidArgument("strategy.pairs", f"a pair must be two layers (a, b), got {pair!r}")
            a, b = (check_int("strategy.pairs", layer, 0, num_layers - 1) for layer in pair)
            if a >= b:
                raise InvalidArgument("strategy.pairs", f"a pair (a, b) must have a < b, got {pair!r}")
            for layer in (a, b):
                if layer in seen:
                    raise InvalidArgument("strategy.pairs", f"layer {layer} is in two pairs")
                seen.add(layer)
        if 2 * len(self.pairs) > fraction_floor(num_layers, ratio):
            raise InvalidArgument("strategy.pairs", f"{len(self.pairs)} pairs exceed ratio {ratio} of {num_layers} layers")
        for layer in self.non_ir:
            check_int("strategy.non_ir", layer, 0, num_layers - 1)
        if list(self.non_ir) != sorted(set(self.non_ir)):
            raise InvalidArgument("strategy.non_ir", f"must be ascending without repeats, got {self.non_ir!r}")
        if seen & set(self.non_ir):
            raise InvalidArgument("strategy.pairs", f"non-I-R layers {sorted(seen & set(self.non_ir))} are paired")
        if len(self.distances) != len(self.pairs) or not all(math.isfinite(d) and d >= 0 for d in self.distances):
            raise InvalidArgument("strategy.distances", f"expected {len(self.pairs)} finite distances >= 0, got {self.distances!r}")

    @property
    def shared_layers(self) -> tuple[int, ...]:
        """Every layer in a pair, ascending."""
        return tuple(sorted(layer for pair in self.pairs for layer in pair))

    def to_dict(self) -> dict:
        """A JSON-ready dict (lists, ints, floats) that ``from_dict`` reads back equal."""
        return {
            "num_layers": self.num_layers,
            "pairs": [list(pair) for pair in self.pairs],
            "non_ir": list(self.non_ir),
            "gamma": self.gamma,
            "ratio": self.ratio,
            "distances": list(self.distances),
        }

    @classmethod
    def from_dict(cls, data: dict) -> Strategy:
        """The strategy ``to_dict`` wrote; a missing, extra or malformed field is ``InvalidArgument``."""
        fields = {"num_layers", "pairs", "non_ir", "gamma", "ratio", "distances"}
        if not isinstance(data, dict) or set(data) != fields:
            got = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise InvalidArgument("strategy", f"expected the fields {sorted(fields)}, got {got}")
        try:
            pairs = tuple(tuple(pair) for pair in data["pairs"])
            non_ir = tuple(data["non_ir"])
            distances = tuple(float(d) for d in data["distances"])
        except (TypeError, ValueError, IndexError) as err:
            raise InvalidArgument("strategy", f"malformed field: {err}") from None
        return cls(pairs, non_ir, data["gamma"], data["ratio"], distances, data["num_layers"])


def layer_distances(maps: torch.Tensor) -> torch.Tensor:
    """Euclidean distance of every two layers' maps ``[layers, ...]`` flattened: ``[layers, layers]`` float64."""
    flat = maps.reshape(maps.shape[0], -1).double()  # [layers, heads * Gq * Gk]
    return torch.cdist(flat, flat, compute_mode="donot_use_mm_for_euclid_dist")


def choose_strategy(stats: AttentionStats, *, gamma: float, ratio: float) -> Strategy:
    """The conversation's strategy (module docstring): non-I-R layers by ``gamma``, then greedy closest pairs up to ``ratio``."""
    if not isinstance(stats, AttentionStats):
        raise InvalidArgument("stats", f"must be AttentionStats, got {type(stats).__name__}")
    gamma = check_real("gamma", gamma, *GAMMA_RANGE)
    ratio = check_real("ratio", ratio, 0.0, 1.0)
    num_layers = stats.num_layers
    non_ir = tuple(layer for layer in range(num_layers) if float(stats.edge_mass[layer]) < gamma)
    input_robust = [layer for layer in range(num_layers) if layer not in non_ir]
    distances = layer_distances(stats.maps).tolist()
    candidates = sorted((distances[a][b], a, b) for a, b in itertools.combinations(input_robust, 2))
    max_pairs = fraction_floor(num_layers, ratio) // 2
    pairs: list[tuple[int, int]] = []
    chosen: list[float] = []
    used: set[int] = set()
    for distance, a, b in candidates:
        if len(pairs) == max_pairs:
            break
        if a in used or b in used:
            continue
        pairs.append((a, b))
        chosen.append(distance)
        used.update((a, b))
    return Strategy(tuple(pairs), non_ir, gamma, ratio, tuple(chosen), num_layers)


__all__ = [
    "AttentionSketch",
    "AttentionStats",
    "Strategy",
    "choose_strategy",
    "edge_mass",
    "layer_distances",
    "pooled_attention",
]


def record_strategy(stats: AttentionStats, strategy: Strategy, **form) -> dict:
    """What a worker records with ``mark_inactive`` as the conversation's ``strategy``.

    The compressed form's own fields ``form`` (e.g. ``kv_quant``,
    ``restore``), the selector's choice (``Strategy.to_dict``, under
    ``selector``) and each layer's edge mass rounded to 4 decimals (under
    ``edge_mass``): what an operator reads with ``kvstore-admin conversation``
    and what a later compression starts from without the maps (about 1.5 KB
    for 30 layers; the record allows 64 KiB).
    """
    if not isinstance(stats, AttentionStats) or not isinstance(strategy, Strategy):
        raise InvalidArgument("strategy", "record_strategy takes AttentionStats and the Strategy chosen from them")
    if stats.num_layers != strategy.num_layers:
        raise InvalidArgument("strategy", f"has {strategy.num_layers} layers, the statistics {stats.num_layers}")
    clash = {"selector", "edge_mass"} & set(form)
    if clash:
        raise InvalidArgument("strategy", f"{sorted(clash)} are the statistics' fields, not the form's")
    return {**form, "selector": strategy.to_dict(), "edge_mass": [round(float(e), 4) for e in stats.edge_mass]}
