"""Named selection systems: the ``ReprefillConfig`` selection fields each name stands for.

``kvstore-bench accuracy --path SYSTEM@BUDGET`` and any caller that wants a
named system use ``system_fields(name)`` and build
``ReprefillConfig(budget=..., **fields)``.  The plain selector names keep
their historical meaning (one selection per 8-layer Period from the Period's
first layer, scores summed over query heads).

``layerwise`` is the selection measured to keep the answer on SmolLM2-135M
(README, "Selection that keeps the answer"): a new selection at every
2-layer Period (the stored group), each from that Period's own queries and
exact probe-key scores, a chunk ranked by the query head that wants it most
(``head_aggregation="max"``).  ``layerwise-summary`` is the same schedule on
the resident min/max summaries (no probe keys fetched).

``perlayer-follow`` selects at every layer (1-layer Periods: stored groups of
one layer, ``--group-layers 1``) and takes each top chunk with the chunk
after it (``follow=1``): in real prose the question's queries find the
sentence that names what is asked, and the answer is the tokens after it,
often in the next chunk; with 2-layer Periods the Period starting at layer
16 chose for layer 17, the layer that finds the needle most often.  Its
exact scores read every layer's probe keys (the keys of the whole prefix,
half of its KV bytes): ``probe_bytes`` in every report says so.
``perlayer-follow-int4`` scores with the same keys quantized to 4 bits,
fetched once per prefix and kept resident by the client
(``selection/probes.py``): 7% of a float32 KV in client memory instead of
50% of it read at every request; a store with ``StoreGeometry.probe_bits=4``
keeps them 4-bit too, so that one fetch is 7% as well.  ``perlayer-follow-int4-reselect`` and
``-reselect4`` are that selection for the first token, then every generated
token (every 4th) each layer selects again from the generated tokens'
queries with the same resident keys and fetches the chunks it lacks
(``engine_client.reselect``).  ``perlayer-follow-int4-streaming`` is the
same selection with the model's streaming heads (``model.streaming``)
seeing only the loaded sink and recent rows, as LServe pairs them.
``perlayer-follow-int4-standin`` adds stand-in rows (``engine_client.standin``)
at the model's calibrated layers: every row not loaded, with its resident
probe key and the mean value of the rows not loaded.  The layers come from
the file ``python -m tools.models calibrate-standins NAME`` keeps next to
the checkpoint (``model.standins``; 19 on SmolLM2-135M, measured on
its tuning stream); a runner without one refuses the system.
``quest``, ``lserve``, ``loopserve`` and ``loopserve-sp`` are the decode-side systems
``kvstore-bench decode`` compares (their definitions below).
"""

from __future__ import annotations

from kvstore.wire import InvalidArgument

SYSTEMS: dict[str, dict] = {
    "summary": {"selector": "summary", "period_layers": 8},
    "exact": {"selector": "exact", "period_layers": 8},
    "recent": {"selector": "recent", "period_layers": 8},
    "full": {"selector": "full", "period_layers": 8},
    "layerwise": {"selector": "exact", "period_layers": 2, "head_aggregation": "max"},
    "layerwise-summary": {"selector": "summary", "period_layers": 2, "head_aggregation": "max"},
    "perlayer-follow": {"selector": "exact", "period_layers": 1, "head_aggregation": "max", "follow": 1},
    "perlayer-follow-int4": {"selector": "exact", "period_layers": 1, "head_aggregation": "max", "follow": 1, "probe_bits": 4},
}
SYSTEMS["perlayer-follow-int4-reselect"] = {**SYSTEMS["perlayer-follow-int4"], "reselect_every": 1}
SYSTEMS["perlayer-follow-int4-reselect4"] = {**SYSTEMS["perlayer-follow-int4"], "reselect_every": 4}
SYSTEMS["perlayer-follow-int4-streaming"] = {**SYSTEMS["perlayer-follow-int4"], "streaming": True}
# ... with the rows not loaded standing in at the model's calibrated layers (engine_client.standin,
# model.standins): the layers whose full KV restores most of the answer margin a 5% set takes on the
# tuning stream (8 and 19 on SmolLM2-135M, README).
SYSTEMS["perlayer-follow-int4-standin"] = {**SYSTEMS["perlayer-follow-int4"], "standin_layers": "calibrated"}
# ... with those layers loaded whole instead, on top of the budget (the exact rows the stand-ins approximate).
SYSTEMS["perlayer-follow-int4-whole"] = {**SYSTEMS["perlayer-follow-int4"], "whole_layers": "calibrated"}
# ... choosing from the suffix's last 16 tokens' queries only (the answer's opening after a new turn's text):
SYSTEMS["perlayer-follow-int4-last16"] = {**SYSTEMS["perlayer-follow-int4"], "select_queries": 16}
# The decode-side systems (``kvstore-bench decode``), each at the bench's token budget:
# Quest: every layer, every generated token, chunks (16-token pages) ranked by their min/max key bound;
SYSTEMS["quest"] = {"selector": "summary", "period_layers": 1, "head_aggregation": "max", "reselect_every": 1}
# LServe: the same bound over logical pages, fetched as 4-chunk physical pages, the choice reused for 4
# tokens, and the streaming heads reading only the sink and recent rows;
SYSTEMS["lserve"] = {**SYSTEMS["quest"], "page_chunks": 4, "reselect_every": 4, "streaming": True}
# ... and with a set per KV head (each head its own pages at the budget, the union loaded), as LServe selects;
SYSTEMS["lserve-heads"] = {**SYSTEMS["lserve"], "per_head": True}
# ... with the first token over every chunk (LServe's prefill is dense for the retrieval heads) and the
# pages chosen from the first decoding step on, among the rows already loaded;
SYSTEMS["lserve-full-first"] = {**SYSTEMS["lserve"], "first_token_full": True}
# LoopServe: re-selected every 4 generated tokens from those tokens' queries against the keys themselves
# (4-bit resident probes), no follower chunks; with -sp also the new turn's prefill through the lines
# covering 90% of its last queries' attention (online prefill sparsification).
SYSTEMS["loopserve"] = {"selector": "exact", "period_layers": 1, "head_aggregation": "max", "probe_bits": 4, "reselect_every": 4}
SYSTEMS["loopserve-sp"] = {**SYSTEMS["loopserve"], "prefill_alpha": 0.9}

# The stored group (SubPeriod) the layerwise systems need: their Period is one group.
LAYERWISE_GROUP_LAYERS = 2


def uses_calibrated_layers(fields: dict) -> bool:
    """Whether selection ``fields`` ask for the runner's calibrated layers (stand-ins or whole layers)."""
    return "calibrated" in (fields.get("standin_layers"), fields.get("whole_layers"))


def system_fields(name: str) -> dict:
    """The ``ReprefillConfig`` selection fields of system ``name`` (a copy)."""
    try:
        return dict(SYSTEMS[name])
    except KeyError:
        raise InvalidArgument("system", f"unknown selection system {name!r}; known: {', '.join(sorted(SYSTEMS))}") from None
