"""The restoration plan: how many tokens of each layer to recompute while the rest loads.

Restoring ``N`` tokens of ``L`` layers, layer ``l`` recomputes its first
``n_l`` tokens and loads the other ``N - n_l``.  Recomputing token ``i`` of
layer ``l`` needs layer ``l-1``'s hidden state of token ``i`` and layer
``l``'s keys of tokens ``0..i``, all recomputed too when
``n_0 >= n_1 >= ... >= n_{L-1}``: the recompute stream never waits for a
load, and the two streams run side by side.  ``check_plan`` refuses a plan
with a gap (``n_l > n_{l-1}``); ``repair`` closes gaps by raising earlier
layers.

Cost model (``RestoreCosts``), in seconds:

* recomputing token ``i`` (0-based) at one layer costs
  ``f + f_att x (i + 1)`` FLOPs (``f``: the projections and the MLP of one
  token, ``f_att``: attention per query-key pair, so a layer's first ``n``
  tokens cost ``n f + f_att n (n + 1) / 2``), at ``flops_per_s``;
  ``T_C = sum_l compute(n_l)``;
* loading costs ``bytes_per_token_layer[l]`` per token of layer ``l`` (a
  layer of a merged pair can cost less), at ``load_bytes_per_s``;
  ``T_L = sum_l (N - n_l) x bytes_l / bandwidth``;
* the restore takes ``max(T_C, T_L)``; a plan is chosen to make
  ``|T_C - T_L|`` small.  When the two streams share hardware
  (``HardwareProfile.overlap`` below 1) it takes
  ``max + (1 - overlap) x min`` and the plan is the fastest instead.

Counts move in steps of ``step_tokens`` (a store restoring whole 16-token
chunks passes 16; the last step of a layer may be shorter when it does not
divide ``N``).  One **token-step** is the most a single step can change
``T_C - T_L``.  Shapes:

* ``"uniform"`` (the ablation): the same ``n`` for every layer, the best of
  the ``N / step + 1`` choices.
* ``"pyramid"``: starting from loading everything, recompute one step at a
  time, always the step with the fewest compute seconds per load second it
  saves among those that keep the counts non-increasing (ties: the shallower
  layer), until ``T_C >= T_L``; the plan is the better of the last two along
  that path, or the best uniform plan if that balances better.  Layers that
  are cheaper to load (merged pairs, deep in a model where the shallow layers
  are input-sensitive) keep loading while dearer ones recompute; with equal
  bytes, linear costs and ties the path fills the shallow layers first, and
  with the attention term the cheaper first tokens of every layer go first,
  making the plan close to flat.  Each step moves ``T_C - T_L`` up by at most
  one token-step, so the plan ends within half a token-step of balance (or at
  the all-recompute plan when even that leaves ``T_C < T_L``), and never
  balances worse than the uniform plans.

The walk takes up to ``L x N / step`` heap steps in Python: a 30-layer,
8192-token plan took about 0.6 s at 1-token steps and 14 ms at 16-token
steps on a 2-core machine, so a store plans in chunks.

No profile is measured here: ``HardwareProfile`` takes the two rates from a
calibration of the real recompute and load paths, which needs the daemon.
"""

from __future__ import annotations

import heapq
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvstore.contract import InvalidArgument

from ._checks import check_int, check_real

if TYPE_CHECKING:
    from ..model.config import ModelConfig

SHAPES = ("pyramid", "uniform")


@dataclass(frozen=True)
class HardwareProfile:
    """The two rates a plan balances: recompute FLOP/s and load bytes/s (``math.inf`` allowed).

    ``overlap``: the share of the shorter stream that runs hidden under the
    longer one, 1 when they use separate hardware (an accelerator computing
    while storage reads), less when they share it (a CPU that recomputes and
    also dequantizes what it loads); a restore takes
    ``max(T_C, T_L) + (1 - overlap) x min(T_C, T_L)``.
    """

    flops_per_s: float
    load_bytes_per_s: float
    overlap: float = 1.0

    def __post_init__(self):
        check_real("profile.flops_per_s", self.flops_per_s, 0.0, math.inf, open_low=True)
        check_real("profile.load_bytes_per_s", self.load_bytes_per_s, 0.0, math.inf, open_low=True)
        check_real("profile.overlap", self.overlap, 0.0, 1.0)


@dataclass(frozen=True)
class RestoreCosts:
    """Everything a plan's times depend on (module docstring)."""

    num_tokens: int
    recompute_flops_per_token_layer: float
    attention_flops_per_token_pair: float
    bytes_per_token_layer: tuple[float, ...]  # [layers]
    profile: HardwareProfile

    def __post_init__(self):
        check_int("num_tokens", self.num_tokens, 1)
        check_real("recompute_flops_per_token_layer", self.recompute_flops_per_token_layer, 0.0, math.inf)
        check_real("attention_flops_per_token_pair", self.attention_flops_per_token_pair, 0.0, math.inf)
        if not isinstance(self.profile, HardwareProfile):
            raise InvalidArgument("profile", f"must be a HardwareProfile, got {type(self.profile).__name__}")
        if not self.bytes_per_token_layer:
            raise InvalidArgument("bytes_per_token_layer", "needs one value per layer, got none")
        for value in self.bytes_per_token_layer:
            check_real("bytes_per_token_layer", value, 0.0, math.inf)
        finite = (self.recompute_flops_per_token_layer, self.attention_flops_per_token_pair, *self.bytes_per_token_layer)
        if any(math.isinf(value) for value in finite):
            raise InvalidArgument("costs", "FLOPs and bytes must be finite (an infinite rate goes in the profile)")

    @property
    def num_layers(self) -> int:
        return len(self.bytes_per_token_layer)

    def compute_s(self, count: int) -> float:
        """Seconds to recompute the first ``count`` tokens of one layer."""
        flops = count * self.recompute_flops_per_token_layer + self.attention_flops_per_token_pair * count * (count + 1) / 2
        return flops / self.profile.flops_per_s

    def load_s(self, layer: int, count: int) -> float:
        """Seconds to load ``count`` tokens of ``layer``."""
        return count * self.bytes_per_token_layer[layer] / self.profile.load_bytes_per_s

    def times(self, recompute_tokens: Sequence[int]) -> tuple[float, float]:
        """``(T_C, T_L)`` of recomputing the first ``recompute_tokens[l]`` tokens of each layer ``l``."""
        t_compute = sum(self.compute_s(n) for n in recompute_tokens)
        t_load = sum(self.load_s(layer, self.num_tokens - n) for layer, n in enumerate(recompute_tokens))
        return t_compute, t_load


@dataclass(frozen=True)
class RestorePlan:
    """Per layer, the first ``recompute_tokens[l]`` tokens are recomputed and the other ``load_tokens[l]`` loaded."""

    recompute_tokens: tuple[int, ...]  # [layers], n_l
    load_tokens: tuple[int, ...]  # [layers], N - n_l
    t_compute: float  # seconds, T_C
    t_load: float  # seconds, T_L
    r_c: float  # recomputed share of the N x L token-layers
    costs: RestoreCosts
    shape: str

    @property
    def restore_s(self) -> float:
        """Both streams at once: ``max(T_C, T_L)``, plus the part of the shorter one the profile cannot overlap."""
        hidden = self.costs.profile.overlap
        return max(self.t_compute, self.t_load) + (1.0 - hidden) * min(self.t_compute, self.t_load)

    @property
    def imbalance_s(self) -> float:
        """``|T_C - T_L|``: what the plan minimises."""
        return abs(self.t_compute - self.t_load)


def recompute_flops(config: ModelConfig) -> tuple[float, float]:
    """``(f, f_att)`` of one Llama/Qwen2 layer of ``config``, at 2 FLOPs per multiply-add.

    ``f``: the q/k/v, output and gate/up/down projections of one token;
    ``f_att``: ``q . k`` and ``p x v`` for one query-key pair, over the query
    heads.  Norms, RoPE and the softmax are left out (a few FLOPs per element).
    """
    hidden, d = config.hidden_size, config.head_dim
    q_heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    projections = hidden * (q_heads + 2 * kv_heads) * d + q_heads * d * hidden + 3 * hidden * config.intermediate_size
    return 2.0 * projections, 4.0 * q_heads * d


def make_plan(costs: RestoreCosts, recompute_tokens: Sequence[int], shape: str = "given") -> RestorePlan:
    """The plan recomputing ``recompute_tokens`` per layer, with its times (unchecked: see ``check_plan``)."""
    counts = tuple(int(n) for n in recompute_tokens)
    t_compute, t_load = costs.times(counts)
    r_c = sum(counts) / (costs.num_tokens * costs.num_layers)
    return RestorePlan(counts, tuple(costs.num_tokens - n for n in counts), t_compute, t_load, r_c, costs, shape)


def check_plan(plan: RestorePlan) -> None:
    """Raise ``InvalidArgument`` if a count is out of ``[0, N]``, a layer has a recompute gap, or loads do not complement."""
    costs = plan.costs
    num_tokens = costs.num_tokens
    if len(plan.recompute_tokens) != costs.num_layers or len(plan.load_tokens) != costs.num_layers:
        raise InvalidArgument(
            "recompute_tokens", f"expected {costs.num_layers} layers, got {len(plan.recompute_tokens)} and {len(plan.load_tokens)}"
        )
    for layer, (n, loaded) in enumerate(zip(plan.recompute_tokens, plan.load_tokens)):
        check_int("recompute_tokens", n, 0, num_tokens)
        if loaded != num_tokens - n:
            raise InvalidArgument("load_tokens", f"layer {layer} loads {loaded} tokens and recomputes {n} of {num_tokens}")
        if layer and n > plan.recompute_tokens[layer - 1]:
            raise InvalidArgument(
                "recompute_tokens",
                f"layer {layer} recomputes {n} tokens, more than layer {layer - 1}'s {plan.recompute_tokens[layer - 1]}: "
                f"the hidden states of tokens {plan.recompute_tokens[layer - 1]}..{n - 1} would be missing",
            )


def repair(plan: RestorePlan) -> RestorePlan:
    """The plan with each gap closed by raising earlier layers: ``n_l = max(n_l, ..., n_{L-1})``; times recomputed."""
    counts = list(plan.recompute_tokens)
    for layer in range(len(counts) - 2, -1, -1):
        counts[layer] = max(counts[layer], counts[layer + 1])
    repaired = make_plan(plan.costs, counts, plan.shape)
    check_plan(repaired)
    return repaired


def plan_restore(
    num_layers: int,
    num_tokens: int,
    *,
    recompute_flops_per_token_layer: float,
    bytes_per_token_layer: float | Sequence[float],
    profile: HardwareProfile,
    attention_flops_per_token_pair: float = 0.0,
    shape: str = "pyramid",
    step_tokens: int = 1,
) -> RestorePlan:
    """The plan of ``shape`` (module docstring); ``bytes_per_token_layer``: one value for all layers or one per layer."""
    num_layers = check_int("num_layers", num_layers, 1)
    step_tokens = check_int("step_tokens", step_tokens, 1)
    if shape not in SHAPES:
        raise InvalidArgument("shape", f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    if isinstance(bytes_per_token_layer, numbers.Real):
        bytes_per_token_layer = (bytes_per_token_layer,) * num_layers
    elif len(bytes_per_token_layer) != num_layers:
        raise InvalidArgument("bytes_per_token_layer", f"expected {num_layers} values (one per layer), got {len(bytes_per_token_layer)}")
    costs = RestoreCosts(num_tokens, recompute_flops_per_token_layer, attention_flops_per_token_pair, tuple(bytes_per_token_layer), profile)
    bounds = list(range(0, num_tokens, step_tokens)) + [num_tokens]  # the counts a layer may take
    key = _balance if profile.overlap == 1.0 else _fastest  # with a partial overlap balance no longer means fastest
    uniform = min((make_plan(costs, [n] * num_layers, "uniform") for n in bounds), key=key)
    if shape == "uniform":
        return uniform
    candidates = [make_plan(costs, counts, "pyramid") for counts in _cheapest_path(costs, bounds)]
    return min([*candidates, uniform], key=key)  # min keeps the first of equals: the path's


def _balance(plan: RestorePlan) -> tuple[float, float]:
    """Sort key: the smaller imbalance, then the shorter restore."""
    return plan.imbalance_s, plan.restore_s


def _fastest(plan: RestorePlan) -> tuple[float, float]:
    """Sort key when the streams do not fully overlap: the shorter restore, then the smaller imbalance."""
    return plan.restore_s, plan.imbalance_s


def _step_cost(costs: RestoreCosts, bounds: list[int], layer: int, index: int) -> float:
    """Compute seconds per load second saved of raising ``layer`` from ``bounds[index]`` to ``bounds[index + 1]``."""
    compute = costs.compute_s(bounds[index + 1]) - costs.compute_s(bounds[index])
    saved = costs.load_s(layer, bounds[index + 1] - bounds[index])
    if saved == 0:
        return 0.0 if compute == 0 else math.inf
    return compute / saved


def _cheapest_path(costs: RestoreCosts, bounds: list[int]) -> list[list[int]]:
    """The last two plans (counts) of the pyramid path, around where ``T_C - T_L`` turns non-negative; one if it never moves.

    With a partial overlap (``profile.overlap < 1``) the walk goes on to the
    end of the path and the fastest plan seen is a third candidate: past the
    balance a step still shortens the restore while its compute costs less
    than the unhidden share of the load it saves.
    """
    num_layers = costs.num_layers
    index = [0] * num_layers  # layer l recomputes bounds[index[l]] tokens
    last = len(bounds) - 1
    gap = -costs.times([0] * num_layers)[1]  # T_C - T_L, kept up to date step by step
    heap = [(_step_cost(costs, bounds, 0, 0), 0)] if last else []  # layers that can grow by one step
    previous = None
    walk_on = costs.profile.overlap < 1.0
    best = ([0] * num_layers, make_plan(costs, [0] * num_layers).restore_s) if walk_on else None
    crossing = None  # (previous step, index) where T_C - T_L first is non-negative
    while heap:
        if gap >= 0 and crossing is None:
            crossing = (previous, list(index))
            if not walk_on:
                break
        _, layer = heapq.heappop(heap)
        i = index[layer]
        gap += costs.compute_s(bounds[i + 1]) - costs.compute_s(bounds[i]) + costs.load_s(layer, bounds[i + 1] - bounds[i])
        previous = (layer, i)
        index[layer] = i + 1
        if index[layer] < last and (layer == 0 or index[layer] < index[layer - 1]):
            heapq.heappush(heap, (_step_cost(costs, bounds, layer, index[layer]), layer))
        if layer + 1 < num_layers and index[layer + 1] == i:  # the next layer was held at this one's count
            heapq.heappush(heap, (_step_cost(costs, bounds, layer + 1, i), layer + 1))
        if walk_on:
            counts = [bounds[k] for k in index]
            restore = make_plan(costs, counts).restore_s
            if restore < best[1]:
                best = (counts, restore)
    if crossing is None:
        crossing = (previous, list(index))
    previous, index = crossing
    after = [bounds[i] for i in index]
    extra = [best[0]] if best is not None else []
    if previous is None:
        return [after, *extra]
    layer, i = previous
    before = list(after)
    before[layer] = bounds[i]
    return [before, after, *extra]
