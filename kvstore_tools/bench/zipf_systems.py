"""The Zipf bench's systems (``kvstore-bench reprefill --workload zipf --systems ...``), and the checks that
refuse, before any prefill, a system the model or the arguments cannot run.

* ``contiguouskv-paper``: ContiguousKV's rules - 16-token chunks, selection
  on key summaries per Period, intra-period streaming, speculation of period
  i+1 from period i's own set (no look-ahead, no pushed groups),
  attention x frequency tiers;
* ``contiguouskv``: the product - speculation from a look-ahead guess
  (period i+1's queries of the hidden state at period i's start, twice the
  budget), speculative groups pushed to the client as they arrive;
* ``contiguouskv-perlayer``: the product with the selection that keeps
  the answer on a pretrained model (``ckv+probes``: every layer its own
  Period, exact scores on resident probe keys quantized to the model's
  calibrated width (4 bits, 8 on Gemma 3 270M), which its store keeps at
  that width too (``StoreGeometry.probe_bits``), max over heads, the
  chunks after the best followed; needs ``--group-layers 1``);
* ``contiguouskv-standin``: ``contiguouskv-perlayer`` with stand-in rows at
  the model's calibrated layers (``ckv+probes+standins=calibrated``; 8 and 19
  on SmolLM2-135M, ``--standin-layers``): every prefix row not loaded there
  attends through its probe key and the mean value of the rows left
  out; those layers' value sums are read once per prefix (counted as client
  state fetched) and kept resident (charged to memory);
* ``contiguouskv-noprefetch`` / ``contiguouskv-lfu``: ablations (no
  speculation, each period waits for all its groups / LFU tiers);
* ``impress``: 64-token blocks, each Period's rows stored by accumulated
  attention (sink, local, then most accumulated first); a query's important
  tokens found from resident partial probe keys (one KV head, half the
  channels); the first block plus the blocks holding most of them; its
  importance-score tiers; no speculation (its set is known only per period);
* ``as-h2o``: AttentionStore holding H2O's choice - the retained tokens
  (sink, local, top accumulated attention over the prefix's own prefill)
  stored compacted at the head of each Period, exactly those loaded; LRU
  tiers, layer-wise preloading (speculation and pushed groups: the set is
  known in advance);
* ``as-lru``: AttentionStore - the whole prefix, LRU tiers, layer-wise
  preloading;
* ``recompute``: no store, each request's prefix and suffix prefilled
  whole (``zipf_recompute``; ``--recompute-runs 0`` leaves it out, and
  ``--task`` and ``--trace-out`` runs have none).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.contract.errors import InvalidArgument

from .io_jobs import BenchError


@dataclass(frozen=True)
class System:
    chunk_tokens: int
    selection: str  # summary | impress | h2o | full
    policy: str
    speculate: bool = False
    overlap: bool = True
    budgeted: bool = True
    lookahead: float = 0.0
    push: bool = True
    reordered: bool = False  # each Period's rows stored in ``storage_order``


LOOKAHEAD = 2.0  # contiguouskv's speculative guess: twice the budget, scored one period ahead
# System.selection values that are named Re-Prefill systems (engine_client.reprefill.systems)
NAMED_SELECTION = ("ckv+probes", "ckv+probes+standins=calibrated")

SYSTEMS = {
    "contiguouskv-paper": System(16, "summary", "score", speculate=True, push=False),
    "contiguouskv": System(16, "summary", "score", speculate=True, lookahead=LOOKAHEAD),
    "contiguouskv-perlayer": System(16, "ckv+probes", "score", speculate=True, lookahead=LOOKAHEAD),
    "contiguouskv-standin": System(16, "ckv+probes+standins=calibrated", "score", speculate=True, lookahead=LOOKAHEAD),
    "contiguouskv-noprefetch": System(16, "summary", "score", speculate=False, overlap=False),
    "contiguouskv-lfu": System(16, "summary", "lfu", speculate=True, lookahead=LOOKAHEAD),
    "impress": System(64, "impress", "impress", reordered=True),
    "as-h2o": System(16, "h2o", "lru", speculate=True, reordered=True),
    "as-lru": System(16, "full", "lru", speculate=True, budgeted=False),
}


def systems_arg(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [n for n in names if n not in SYSTEMS]
    if bad or not names:
        import argparse

        raise argparse.ArgumentTypeError(f"unknown systems {bad}; choose from {', '.join(SYSTEMS)}")
    return names


def period_layers(sysdef: System, args) -> int:
    """The Period a system runs with (``workload._start``): a named selection's own, else ``--period-layers``."""
    from engine_client.reprefill import parse_system

    return parse_system(sysdef.selection).schedule.period_layers if sysdef.selection in NAMED_SELECTION else args.period_layers


def refuse_on_sliding_windows(model, args) -> None:
    """Before any prefill: on a model with sliding-window layers, one line for a system that cannot run on it."""
    from engine_client.reprefill import window_periods

    if not model.config.sliding_layers:
        return
    if getattr(args, "trace_out", None):
        raise BenchError(
            f"--trace-out: {args.model} has sliding-window layers, whose Periods compute on the prefix's window tail "
            "and send the daemon nothing; the replay models compute per stored layer and would leave them out"
        )
    for name in args.systems:
        sysdef = SYSTEMS[name]
        if sysdef.reordered:
            raise BenchError(
                f"{name} stores each Period's rows reordered by attention, and a sliding-window layer reads its window "
                f"by position: not supported on {args.model} (run contiguouskv-perlayer, as-lru)"
            )
        try:
            window_periods(model.config, period_layers(sysdef, args))
        except InvalidArgument as exc:
            raise BenchError(f"{name} on {args.model}: {exc}") from None


def standin_profile(model, checkpoint: str, args):
    """The calibrated stand-in layers (``model.standins``) when a system runs with them, before any system runs."""
    from engine_client.model import zoo
    from engine_client.model.standins import ProfileError
    from engine_client.reprefill import parse_system

    names = [n for n in args.systems if SYSTEMS[n].selection in NAMED_SELECTION]
    if not any(parse_system(SYSTEMS[n].selection).needs_calibrated_layers for n in names):
        return None
    try:
        return zoo.standin_layers(model, checkpoint, getattr(args, "standin_layers", None))
    except ProfileError as exc:
        raise BenchError(str(exc)) from None


def check_zipf_args(args) -> None:
    from engine_client.model import zoo

    if args.task and args.model not in zoo.MODELS:
        raise BenchError(f"--task needs a pretrained model ({', '.join(zoo.MODELS)}): random weights answer nothing")
    if getattr(args, "ask", "prefix") != "prefix":
        from kvstore_tools.tasks.text import TASKS

        keyed = [n for n, m in TASKS.items() if hasattr(m, "KEYS")]
        if args.task not in keyed:
            raise BenchError(f"--ask {args.ask} needs --task {' or '.join(keyed)} (a prefix holding several keys), got --task {args.task}")
    if any(SYSTEMS[n].selection in NAMED_SELECTION for n in args.systems) and args.group_layers != 1:
        named = [n for n in args.systems if SYSTEMS[n].selection in NAMED_SELECTION]
        raise BenchError(f"{', '.join(named)} select at every layer: they need --group-layers 1")
    if args.prefixes < 1 or args.requests < 1 or args.warmup < 0:
        raise BenchError("--prefixes and --requests must be positive, --warmup >= 0")
    if not 0 < args.memory_fraction <= 1:
        raise BenchError("--memory-fraction must be in (0, 1]")
