"""What a Re-Prefill request asks for: a ``Budget`` and five frozen sub-configs, each validating itself.

``ReprefillConfig()`` is the system measured to keep the answer (docs/accuracy.md,
"Where the target stands"): every layer selects its own chunks (1-layer Periods)
by exact softmax mass over quantized probe keys kept resident, a chunk ranked by
the query head that wants it most and taken with the chunk after it, and at the
model's calibrated layers the rows not loaded stand in (``standin_layers="auto"``:
when the runner has a calibration file; without one it runs without them and
says so once).  It needs 1-layer stored groups, ``ModelRunner``'s default.
The probe keys' width, how many chunks bring followers and how many last
chunks are always loaded are the model's calibrated values ("auto",
``model.selection_profile``): 4 bits, every chunk and one without a profile
(SmolLM2-135M); 8 bits, the best chunk and none on Gemma 3 270M.

The sub-configs, each one stage of the pipeline:

- ``SelectionConfig``: which chunks a Period keeps (selector, heads, followers,
  pages, probe-key width, per-head sets, which queries choose, sink and local);
- ``ScheduleConfig``: how layers share a selection (Periods, layers loaded whole);
- ``FetchConfig``: how the daemon delivers (speculation, overlap, look-ahead, push);
- ``AttentionConfig``: what the suffix attends to beyond the loaded rows
  (stand-ins, streaming heads, LoopServe's sparse prefill);
- ``DecodeConfig``: what decoding does after the first token (re-selection).

A field out of range is refused when the config is made (``InvalidArgument``
naming it); what depends on the runner (its stored group, its calibration, its
streaming heads) or on the prefix is checked per request (``checks``).
``cfg.replace(**fields)`` takes the flat field names (``budget``, ``selector``,
``period_layers``, ...) and routes each to its sub-config; named systems come
from ``systems.parse_system``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field, fields, replace

from kvstore.contract import InvalidArgument

from ..reselect import check_every
from ..selection import PROBE_KEYS, SELECTORS, Budget, check_aggregation
from ..selection.probes import check_probe_bits

CALIBRATED = "calibrated"  # the runner's calibrated layers; refused when it has none
AUTO = "auto"  # the calibrated layers where the request can use them; none (said once) without a calibration file


def _int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise InvalidArgument(name, f"must be an int >= {minimum}, got {value!r}")
    return int(value)


def _bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(name, f"must be a bool, got {value!r}")
    return value


def _layers(name: str, value, named: tuple[str, ...]) -> tuple[int, ...] | str:
    """A tuple of distinct layer indices >= 0, or one of the ``named`` choices."""
    if isinstance(value, str):
        if value not in named:
            choices = " or ".join(f'"{n}"' for n in named)
            raise InvalidArgument(name, f"must be a tuple of layer indices or {choices}, got {value!r}")
        return value
    if not isinstance(value, (tuple, list)) or any(isinstance(x, bool) or not isinstance(x, numbers.Integral) for x in value):
        raise InvalidArgument(name, f"must be a tuple of layer indices, got {value!r}")
    if len(set(value)) != len(value) or any(x < 0 for x in value):
        raise InvalidArgument(name, f"must be distinct layers >= 0, got {tuple(value)}")
    return tuple(int(x) for x in value)


@dataclass(frozen=True)
class SelectionConfig:
    selector: str = "exact"  # exact | summary | full | recent (selection.SELECTORS)
    head_aggregation: str = "max"  # sum | max over query heads of each chunk's score (selection.heads)
    follow: int = 1  # each selected chunk brings this many chunks after it (selection.budget.select_chunks)
    # > 0: only this many best-ranked chunks bring followers (0: every one); "auto": the runner's model's
    # calibrated value (model.selection_profile), 0 for a model without one
    follow_top: int | str = AUTO
    # page_chunks > 1: whole physical pages of that many chunks, each scored by its best chunk (LServe)
    page_chunks: int = 1
    # probe_bits 4 or 8: exact scores from probe keys quantized to that many bits, fetched once per prefix
    # and kept resident (selection.probes); 0: full-precision keys fetched at every Period; "auto": the
    # runner's model's calibrated width (model.selection_profile), 4 without one, 0 for a selector that
    # reads no probe keys
    probe_bits: int | str = AUTO
    # per_head (LServe): each KV head chooses its own chunks at the budget and attends only to them; the
    # Period loads their union
    per_head: bool = False
    # select_queries > 0: the first token's selection scores with the suffix's last this many tokens only
    select_queries: int = 0
    sink_chunks: int = 1
    # the last chunks always loaded; "auto": the runner's model's calibrated count, 1 without one
    local_chunks: int | str = AUTO

    def __post_init__(self):
        if self.selector not in SELECTORS:
            raise InvalidArgument("selector", f"unknown selector {self.selector!r}; known: {', '.join(sorted(SELECTORS))}")
        check_aggregation(self.head_aggregation)
        _int("follow", self.follow, 0)
        top = self.follow_top
        if top != AUTO and (isinstance(top, bool) or not isinstance(top, numbers.Integral) or top < 0):
            raise InvalidArgument("follow_top", f'must be "auto" or an int >= 0, got {top!r}')
        _int("page_chunks", self.page_chunks, 1)
        if self.probe_bits != AUTO:
            check_probe_bits(self.probe_bits)
        _bool("per_head", self.per_head)
        _int("select_queries", self.select_queries, 0)
        _int("sink_chunks", self.sink_chunks, 0)
        if self.local_chunks != AUTO:
            _int("local_chunks", self.local_chunks, 0)
        if self.page_chunks > 1 and self.follow:
            raise InvalidArgument("page_chunks", f"selects whole pages; it does not combine with follow={self.follow} (set follow=0)")
        cls = SELECTORS[self.selector]
        if self.probe_bits not in (0, AUTO) and PROBE_KEYS not in cls.needs:
            raise InvalidArgument(
                "probe_bits", f"quantized probe keys serve the exact selector only, not {self.selector!r} (set probe_bits=0)"
            )
        if self.per_head and not cls.per_head:
            raise InvalidArgument("per_head", f"per-KV-head sets need per-head scores (exact or summary), not {self.selector!r}")

    @property
    def resident_scores(self) -> bool:
        """Whether every input the selector scores from is kept in client memory (what re-selection needs)."""
        needs = SELECTORS[self.selector].needs
        return bool(needs) and (PROBE_KEYS not in needs or bool(self.probe_bits))


@dataclass(frozen=True)
class ScheduleConfig:
    period_layers: int = 1  # layers sharing one selection (a multiple of the stored group)
    # full_layers: the first layers (a multiple of period_layers) load every chunk, charged to the budget
    full_layers: int = 0
    # whole_layers: these Period first layers load every chunk on top of the budget; "calibrated": the
    # runner's calibrated layers (as for standin_layers)
    whole_layers: tuple[int, ...] | str = ()

    def __post_init__(self):
        _int("period_layers", self.period_layers, 1)
        _int("full_layers", self.full_layers, 0)
        object.__setattr__(self, "whole_layers", _layers("whole_layers", self.whole_layers, (CALIBRATED,)))


@dataclass(frozen=True)
class FetchConfig:
    # speculate: the daemon loads period i's set for period i+1 as soon as it is known.  overlap: each
    # stored group is computed as soon as it arrives.  Both off is the no-prefetch ablation.
    speculate: bool = True
    overlap: bool = True
    # lookahead > 0: speculate from period i+1's own queries on the hidden state at hand, hinting the
    # top lookahead x budget chunks; 0: period i's set
    lookahead: float = 0.0
    # push: the daemon hands speculative groups over as they come into memory (shared memory only)
    push: bool = True

    def __post_init__(self):
        _bool("speculate", self.speculate)
        _bool("overlap", self.overlap)
        _bool("push", self.push)
        la = self.lookahead
        if isinstance(la, bool) or not isinstance(la, numbers.Real) or math.isnan(la) or la < 0:
            raise InvalidArgument("lookahead", f"must be a number >= 0, got {la!r}")


@dataclass(frozen=True)
class AttentionConfig:
    # standin_layers: at these layers every prefix row not loaded joins the attention with its resident
    # probe key and the mean value of the rows not loaded (engine_client.standin).  "calibrated": the
    # runner's calibrated layers, refused without them; "auto": those where the request can use them
    # (exact 4/8-bit per-layer selection, without streaming, per-head sets, re-selection or sparse
    # prefill, and not loaded whole), none without a calibration file; (): none.
    standin_layers: tuple[int, ...] | str = AUTO
    # streaming (LServe): the runner's streaming heads attend only to the loaded sink and recent rows
    streaming: bool = False
    # prefill_alpha in (0, 1] (LoopServe): each layer's suffix attends through the lines covering that
    # share of its last queries' attention (sparse_prefill.pattern); 0: densely
    prefill_alpha: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "standin_layers", _layers("standin_layers", self.standin_layers, (CALIBRATED, AUTO)))
        _bool("streaming", self.streaming)
        a = self.prefill_alpha
        if isinstance(a, bool) or not isinstance(a, numbers.Real) or math.isnan(a) or not 0 <= a <= 1:
            raise InvalidArgument("prefill_alpha", f"must be in [0, 1] (0: a dense prefill), got {a!r}")


@dataclass(frozen=True)
class DecodeConfig:
    # reselect_every > 0 (generate only): every that many generated tokens each Period selects again
    # from the last tokens' queries and fetches the chunks it lacks (engine_client.reselect)
    reselect_every: int = 0
    # first_token_full (with reselect_every; LServe): the first token loads every chunk, the budget
    # applies from the first decoding step on
    first_token_full: bool = False

    def __post_init__(self):
        check_every(self.reselect_every)
        _bool("first_token_full", self.first_token_full)
        if self.first_token_full and not self.reselect_every:
            raise InvalidArgument("first_token_full", "the budget then applies while decoding only; it needs reselect_every > 0")


@dataclass(frozen=True)
class ReprefillConfig:
    budget: Budget = Budget.fraction(0.05)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    fetch: FetchConfig = field(default_factory=FetchConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    report_attention: bool = True  # report each selected chunk's attention mass (the daemon's cache scores)

    def __post_init__(self):
        for name, want in (("budget", Budget), *_SUBCONFIGS.items()):
            if not isinstance(getattr(self, name), want):
                raise InvalidArgument(name, f"must be a {want.__name__}, got {type(getattr(self, name)).__name__}")
        _bool("report_attention", self.report_attention)
        sel, dec, att = self.selection, self.decode, self.attention
        if self.fetch.lookahead and self.budget.unit == "fraction" and self.fetch.lookahead > 1 / self.budget.value:
            raise InvalidArgument("lookahead", f"must be in [0, 1 / budget = {1 / self.budget.value:g}], got {self.fetch.lookahead!r}")
        if dec.reselect_every and not sel.resident_scores:
            raise InvalidArgument(
                "reselect_every",
                f"re-selecting while decoding needs scores kept in client memory (the summary selector, or exact with probe_bits), not {sel.selector!r}"
                + (" without probe_bits" if sel.selector == "exact" else ""),
            )
        if dec.first_token_full and sel.per_head:
            raise InvalidArgument("first_token_full", "per-KV-head sets are chosen at the first token; not with per_head")
        if isinstance(att.standin_layers, tuple) and att.standin_layers or att.standin_layers == CALIBRATED:
            self._check_standins()
        if self.schedule.whole_layers:
            for name, value in self._decoding_and_heads():
                if value:
                    raise InvalidArgument("whole_layers", f"does not combine with {name}={value!r}")

    def _decoding_and_heads(self):
        return (
            ("reselect_every", self.decode.reselect_every),
            ("first_token_full", self.decode.first_token_full),
            ("streaming", self.attention.streaming),
            ("per_head", self.selection.per_head),
        )

    def _check_standins(self) -> None:
        if self.standin_conflict() == "selection":
            raise InvalidArgument(
                "standin_layers", "stand-in rows take their keys from resident probe keys: the exact selector with probe_bits"
            )
        if self.standin_conflict() == "period_layers":
            raise InvalidArgument(
                "standin_layers",
                f"stand-in keys are each layer's probe keys: 1-layer Periods and stored groups, not {self.schedule.period_layers}",
            )
        for name in ("reselect_every", "streaming", "per_head", "prefill_alpha"):
            if self.flat(name):
                raise InvalidArgument("standin_layers", f"does not combine with {name}={self.flat(name)!r}")

    def standin_conflict(self) -> str:
        """Why this request cannot have stand-in rows ('' when it can): the field that rules them out."""
        if self.selection.selector != "exact" or not self.selection.probe_bits:
            return "selection"
        if self.schedule.period_layers != 1:
            return "period_layers"
        for name in ("reselect_every", "streaming", "per_head", "prefill_alpha"):
            if self.flat(name):
                return name
        return ""

    @property
    def uses_calibrated_layers(self) -> bool:
        """Whether the request asks for the runner's calibrated layers (stand-ins or whole layers), "auto" included."""
        return CALIBRATED in (self.attention.standin_layers, self.schedule.whole_layers) or self.attention.standin_layers == AUTO

    @property
    def needs_calibrated_layers(self) -> bool:
        """Whether it is refused without them ("calibrated" stand-ins or whole layers; "auto" is not)."""
        return CALIBRATED in (self.attention.standin_layers, self.schedule.whole_layers)

    def flat(self, name: str):
        """The field ``name`` wherever it lives (``budget``, ``report_attention`` or a sub-config's field)."""
        if name in ("budget", "report_attention"):
            return getattr(self, name)
        return getattr(getattr(self, _FIELD_HOME[name]), name)

    def flat_fields(self) -> dict:
        """Every field by its flat name, ``budget`` as its amount (what ``replace`` takes, and a trace records)."""
        out = {"budget": self.budget.amount, "report_attention": self.report_attention}
        for home in _SUBCONFIGS:
            out.update(dataclasses.asdict(getattr(self, home)))
        return out

    def replace(self, **changes) -> ReprefillConfig:
        """A copy with flat fields changed, each routed to its sub-config (``budget``: a ``Budget`` or a fraction)."""
        top, parts = {}, {}
        for name, value in changes.items():
            if name == "budget":
                top[name] = value if isinstance(value, Budget) else _fraction(value)
            elif name == "report_attention" or name in _SUBCONFIGS:
                top[name] = value
            elif name in _FIELD_HOME:
                parts.setdefault(_FIELD_HOME[name], {})[name] = value
            else:
                raise InvalidArgument(name, f"is not a Re-Prefill field; known: budget, report_attention, {', '.join(sorted(_FIELD_HOME))}")
        for home, values in parts.items():
            top[home] = replace(top.get(home, getattr(self, home)), **values)
        return replace(self, **top)


def _fraction(value) -> Budget:
    """A flat ``budget``: a fraction only (a count is ``Budget.chunks(n)``: 1 would otherwise mean two things)."""
    if isinstance(value, bool) or not isinstance(value, float):
        raise InvalidArgument("budget", f"must be a Budget or a float fraction in (0, 1], got {value!r} (a count: Budget.chunks(n))")
    return Budget.fraction(value)


_SUBCONFIGS = {
    "selection": SelectionConfig,
    "schedule": ScheduleConfig,
    "fetch": FetchConfig,
    "attention": AttentionConfig,
    "decode": DecodeConfig,
}
_FIELD_HOME = {f.name: home for home, cls in _SUBCONFIGS.items() for f in fields(cls)}
