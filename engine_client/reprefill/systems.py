"""Named Re-Prefill systems: a base name plus modifiers, parsed into a ``ReprefillConfig``.

    parse_system("ckv+probes+standins", budget=Budget.fraction(0.05))

A name is ``BASE[+MODIFIER...]``; each modifier sets one thing of the base
(``period=2``, ``int4-probes``, ``standins=19``, ``query=last:16``, ...), later
ones winning.  Lists of layers are written with ``/`` (``standins=8/19``): a
comma separates paths on the benches' command lines.

Bases (``BASES``):

- ``summary``, ``exact``, ``recent``, ``full``: the plain selectors, one
  selection per 8-layer Period from the Period's first layer, scores summed
  over query heads (the paper's selection; ``summary`` is ContiguousKV's);
- ``ckv``: the selection measured to keep the answer on real prose
  (docs/accuracy.md): every layer selects (1-layer Periods, 1-layer stored
  groups) by exact softmax mass, a chunk ranked by the query head that wants
  it most and taken with the chunk after it (the answer follows the sentence
  that names it).  Its probe keys are read in full at every layer; with
  ``probes`` they are fetched once per prefix and kept, quantized to the
  model's calibrated width (``model.selection_profile``: 4 bits, 7% of a
  float32 KV, without a profile; 8 on Gemma 3 270M), with ``int4-probes`` or
  ``int8-probes`` to that width whatever the model.  ``ckv+probes+standins``
  is ``ReprefillConfig()``; on a model without a selection profile it is
  ``ckv+int4-probes+standins``, the name its earlier tables give;
- ``quest``, ``lserve``, ``loopserve``: the decode-side systems
  ``kvstore-bench decode`` compares (below).

The names of the previous release (``perlayer-follow-int4-standin``, ...)
are ``ALIASES`` of their spelling here, accepted for one more release: each
parses to the same config and says what it is now (``DeprecationWarning``).
"""

from __future__ import annotations

import warnings
from dataclasses import replace

from kvstore.contract import InvalidArgument

from ..selection import Budget
from .config import AUTO, CALIBRATED, AttentionConfig, DecodeConfig, ReprefillConfig, ScheduleConfig, SelectionConfig

DEFAULT_SYSTEM = "ckv+probes+standins"


def _plain(selector: str) -> ReprefillConfig:
    selection = SelectionConfig(selector=selector, head_aggregation="sum", follow=0, probe_bits=0, local_chunks=1)
    return ReprefillConfig(selection=selection, schedule=ScheduleConfig(period_layers=8), attention=AttentionConfig(standin_layers=()))


_PER_LAYER = ScheduleConfig(period_layers=1)
_NO_STANDINS = AttentionConfig(standin_layers=())
# Quest: every layer, every generated token, chunks (16-token pages) ranked by their min/max key bound
_QUEST = ReprefillConfig(
    selection=SelectionConfig(selector="summary", follow=0, probe_bits=0, local_chunks=1),
    schedule=_PER_LAYER,
    attention=_NO_STANDINS,
    decode=DecodeConfig(reselect_every=1),
)
BASES: dict[str, ReprefillConfig] = {
    "summary": _plain("summary"),
    "exact": _plain("exact"),
    "recent": _plain("recent"),
    "full": _plain("full"),
    "ckv": ReprefillConfig(selection=SelectionConfig(probe_bits=0), schedule=_PER_LAYER, attention=_NO_STANDINS),
    "quest": _QUEST,
    # LServe: Quest's bound over logical pages fetched as 4-chunk physical pages, the choice reused for 4
    # tokens, the streaming heads reading only the sink and recent rows
    "lserve": replace(
        _QUEST,
        selection=replace(_QUEST.selection, page_chunks=4),
        attention=AttentionConfig(standin_layers=(), streaming=True),
        decode=DecodeConfig(reselect_every=4),
    ),
    # LoopServe: re-selected every 4 generated tokens from those tokens' queries against the keys
    # themselves (4-bit resident probes), no follower chunks
    "loopserve": ReprefillConfig(
        selection=SelectionConfig(follow=0, probe_bits=4, local_chunks=1),
        schedule=_PER_LAYER,
        attention=_NO_STANDINS,
        decode=DecodeConfig(reselect_every=4),
    ),
}


def _layers(value: str) -> tuple[int, ...] | str:
    if value in (CALIBRATED, AUTO):
        return value
    if value == "none":
        return ()
    return tuple(int(x) for x in value.split("/"))


def _query(value: str) -> int:
    if value == "all":
        return 0
    kind, _, count = value.partition(":")
    if kind != "last" or not count:
        raise ValueError(value)
    return int(count)


def _switch(value: str) -> bool:
    if value not in ("on", "off"):
        raise ValueError(value)
    return value == "on"


# modifier -> (flat field, parser of its value); a modifier without "=" takes the value in FLAGS
MODIFIERS: dict[str, tuple[str, object, str]] = {
    "period": ("period_layers", int, "layers sharing one selection (a multiple of the stored group)"),
    "heads": ("head_aggregation", str, "sum | max: how query heads' scores combine"),
    "follow": ("follow", int, "chunks each selected chunk brings after it"),
    "follow-top": (
        "follow_top",
        lambda v: v if v == AUTO else int(v),
        "auto | N: only the N best-ranked chunks bring followers (0: every one)",
    ),
    "pages": ("page_chunks", int, "select whole pages of this many chunks (LServe)"),
    "probes": (
        "probe_bits",
        lambda v: v if v == AUTO else int(v),
        "auto | 4 | 8 | 0: probe keys quantized (auto: the model's calibrated width) and resident, or full precision per Period",
    ),
    "per-head": ("per_head", _switch, "each KV head its own set (LServe)"),
    "query": ("select_queries", _query, "last:N | all: which suffix tokens' queries choose"),
    "sink": ("sink_chunks", int, "first chunks always loaded"),
    "local": ("local_chunks", lambda v: v if v == AUTO else int(v), "auto | N: last chunks always loaded (auto: the model's count)"),
    "full-layers": ("full_layers", int, "the first layers load every chunk, within the budget"),
    "whole": ("whole_layers", _layers, "calibrated | L/L/...: these layers load every chunk, on top of the budget"),
    "standins": ("standin_layers", _layers, "auto | calibrated | none | L/L/...: rows not loaded stand in at these layers"),
    "streaming": ("streaming", _switch, "streaming heads see the sink and recent rows only (LServe)"),
    "prefill": ("prefill_alpha", float, "ALPHA: the suffix's prefill through the lines covering that share (LoopServe)"),
    "reselect": ("reselect_every", int, "N: each Period selects again every N generated tokens"),
    "first": ("first_token_full", lambda v: {"full": True, "budget": False}[v], "full | budget: the first token loads every chunk"),
    "speculate": ("speculate", _switch, "on | off: the daemon reads period i's set for i+1"),
    "overlap": ("overlap", _switch, "on | off: a group is computed as soon as it arrives"),
    "lookahead": ("lookahead", float, "X: hint period i+1's own top X x budget chunks"),
    "push": ("push", _switch, "on | off: speculative groups handed over unasked"),
}
FLAGS = {
    "probes": ("probes", AUTO),
    "int4-probes": ("probes", "4"),
    "int8-probes": ("probes", "8"),
    "fp-probes": ("probes", "0"),
    "per-head": ("per-head", "on"),
    "streaming": ("streaming", "on"),
    "standins": ("standins", AUTO),
    "whole": ("whole", CALIBRATED),
    "first-full": ("first", "full"),
}

ALIASES: dict[str, str] = {
    "layerwise": "exact+period=2+heads=max",
    "layerwise-summary": "summary+period=2+heads=max",
    "perlayer-follow": "ckv",
    "perlayer-follow-int4": "ckv+int4-probes",
    "perlayer-follow-int4-reselect": "ckv+int4-probes+reselect=1",
    "perlayer-follow-int4-reselect4": "ckv+int4-probes+reselect=4",
    "perlayer-follow-int4-streaming": "ckv+int4-probes+streaming",
    "perlayer-follow-int4-standin": "ckv+int4-probes+standins=calibrated",
    "perlayer-follow-int4-whole": "ckv+int4-probes+whole=calibrated",
    "perlayer-follow-int4-last16": "ckv+int4-probes+query=last:16",
    "lserve-heads": "lserve+per-head",
    "lserve-full-first": "lserve+first-full",
    "loopserve-sp": "loopserve+prefill=0.9",
}


def canonical(name: str) -> str:
    """``name`` as this release spells it (an alias's new name; any other name as given)."""
    return ALIASES.get(name, name)


def parse_system(name: str, budget: Budget | None = None, *, warn: bool = True) -> ReprefillConfig:
    """The config ``name`` stands for (module docstring), at ``budget`` (the default config's when None).

    An old name (``ALIASES``) gives its new spelling's config and, with ``warn``, a ``DeprecationWarning``
    naming it.  Anything unknown is one ``InvalidArgument`` naming ``system``.
    """
    if not isinstance(name, str) or not name:
        raise InvalidArgument("system", f"must be a name such as {DEFAULT_SYSTEM!r}, got {name!r}")
    if name in ALIASES:
        if warn:
            warnings.warn(
                f"system {name!r} is now {ALIASES[name]!r}; the old name goes in the next release", DeprecationWarning, stacklevel=2
            )
        name = ALIASES[name]
    base, *mods = name.split("+")
    if base not in BASES:
        raise InvalidArgument("system", f"unknown base {base!r} in {name!r}; {known_systems()}")
    changes = {}
    for mod in mods:
        key, sep, value = mod.partition("=")
        if not sep and mod in FLAGS:
            key, value = FLAGS[mod]
        if key not in MODIFIERS or not (sep or mod in FLAGS):
            raise InvalidArgument("system", f"unknown modifier {mod!r} in {name!r}; modifiers: {', '.join(sorted({*MODIFIERS, *FLAGS}))}")
        field, parse, _ = MODIFIERS[key]
        try:
            changes[field] = parse(value)
        except (ValueError, KeyError):
            raise InvalidArgument("system", f"modifier {mod!r} in {name!r}: bad value {value!r} ({MODIFIERS[key][2]})") from None
    cfg = BASES[base].replace(**changes) if changes else BASES[base]
    return cfg if budget is None else replace(cfg, budget=budget)


def is_system(name: str) -> bool:
    """Whether ``name`` parses (without warning for an alias)."""
    try:
        parse_system(name, warn=False)
    except InvalidArgument:
        return False
    return True


def known_systems() -> str:
    """One line listing the bases, the modifiers and the old names (what help texts and errors say)."""
    mods = ", ".join(sorted({*(f"{k}=..." for k in MODIFIERS), *FLAGS}))
    old = ", ".join(f"{a} ({n})" for a, n in ALIASES.items())
    return f"bases: {', '.join(BASES)} (default {DEFAULT_SYSTEM}); modifiers after '+': {mods}; old names, accepted until the next release: {old}"
