"""Decoding after a Re-Prefill: greedy over the rows each Period loaded, or re-selecting as it goes.

``generate`` runs the Re-Prefill with ``keep_kv`` and decodes over each
layer's loaded rows, the suffix and the tokens generated so far
(``generation.decode_greedy``); with ``DecodeConfig.reselect_every`` each
Period chooses again from the generated tokens' queries with the request's
own selection over the resident state, and the chunks a new set lacks are
read (``reselect.decode_reselecting``).  A sliding-window layer decodes over
its window's rows with their positions (``decode_greedy``'s ``row_positions``),
so its window moves on with each token; re-selecting while decoding is
refused on such a model.
"""

from __future__ import annotations

import numpy as np
import torch

from kvstore.contract import InvalidArgument

from ..generation import GenerationResult, LayerKV, check_max_new_tokens, decode_greedy, eos_ids
from ..reselect import WorkingSet, decode_reselecting
from ..selection import Budget
from ..stream_tail import fill_tail
from .checks import token_tensor
from .config import ReprefillConfig
from .device import to_device, to_host
from .period import layer_mask, row_positions
from .select import PeriodSelection


def generate(runner, prefix_id: str, suffix_tokens, cfg: ReprefillConfig, max_new_tokens: int, *, tokenizer, eos_token_ids, choose, forced):
    """``ModelRunner.generate`` (which documents it)."""
    max_new_tokens = check_max_new_tokens(max_new_tokens)
    reselect = cfg.decode.reselect_every
    if reselect and runner.model.config.sliding_layers:
        raise InvalidArgument("reselect_every", "re-selecting while decoding is not supported on a model with sliding-window layers")
    if reselect and choose is not None:
        raise InvalidArgument("reselect_every", "re-selecting while decoding uses the configured selector; it cannot follow choose=")
    margins: list[float] | None = None
    if forced is not None:
        forced_ids = token_tensor(forced, field_name="forced")
        vocab = runner.model.config.vocab_size
        if int(forced_ids.min()) < 0 or int(forced_ids.max()) >= vocab:
            raise InvalidArgument("forced", f"token ids must be in [0, {vocab}), got {int(forced_ids.min())}..{int(forced_ids.max())}")
        forced = forced_ids.tolist()
        if reselect:
            raise InvalidArgument("forced", "teacher forcing decodes over the rows the first token loaded; not with reselect_every")
        max_new_tokens, margins = check_max_new_tokens(len(forced)), []
    res = runner.reprefill(prefix_id, suffix_tokens, cfg, choose=choose, keep_kv=True)
    model = runner.model
    attention_before = model.attention_s  # timed when a benchmark set it (Decoder.attention_s)
    s = token_tensor(suffix_tokens, field_name="suffix_tokens").numel()
    kv = LayerKV(res.layer_kv, max_new_tokens)
    rows = [kv.rows(i) - s for i in range(len(kv))]
    stops, start = eos_ids(tokenizer, eos_token_ids), res.num_prefix_tokens + s
    kv_rows: list[int] = []
    if reselect:
        tokens, steps, stop, stats = _reselecting(runner, res, cfg, kv, start, max_new_tokens, stops, kv_rows)
    else:
        masks = res.row_masks or None
        at = _sliding_positions(runner, res, s, cfg.schedule.period_layers)
        tokens, steps, stop = decode_greedy(
            model, res.logits, kv, start, max_new_tokens, stops, masks, kv_rows=kv_rows, forced=forced, margins=margins, row_positions=at
        )
        stats = None
    res.layer_kv = []
    text = None if tokenizer is None else tokenizer.decode(tokens, skip_special_tokens=True)
    density = float(np.mean(res.prefill_densities)) if res.prefill_densities else None
    gen = GenerationResult(
        tokens,
        res.ttft_s,
        steps,
        stop,
        res.logits,
        text,
        reprefill=res,
        rows_attended=rows,
        reselect=stats,
        step_kv_rows=kv_rows,
        prefill_density=density,
        answer_margins=margins,
    )
    if attention_before is not None:
        gen.decode_attention_s = model.attention_s - attention_before
    return gen


def _sliding_positions(runner, res, s: int, period: int) -> list | None:
    """Per layer, the positions of a sliding layer's rows (its loaded chunks', then the suffix's); None elsewhere."""
    c = runner.model.config
    if not c.sliding_layers:
        return None
    n, ct = res.num_prefix_tokens, runner.geometry.chunk_tokens
    suffix = torch.arange(n, n + s)
    if runner.window is not None:  # the window tail's rows, kept by the runner
        tail = runner.tail(res.prefix_id, n, res)[0]
        return [torch.cat([tail, suffix]) if c.window_of(layer) is not None else None for layer in range(c.num_hidden_layers)]
    return [
        torch.cat([row_positions(res.selected[layer // period], n, ct), suffix]) if c.window_of(layer) is not None else None
        for layer in range(c.num_hidden_layers)
    ]


def _reselecting(runner, res, cfg: ReprefillConfig, kv, start, max_new_tokens, stops, kv_rows):
    """``decode_reselecting`` over the request's loaded rows, re-selecting with the request's selection.

    With streaming the streaming heads see only the sink and recent rows of each new set, with
    ``per_head`` each KV head its own chunks, as at the first token.
    """
    geo, n, prefix_id, dev = runner.geometry, res.num_prefix_tokens, res.prefix_id, runner.device
    m = geo.num_chunks(n)
    plan = runner.plan(m, cfg, cfg.budget)
    sets = [sorted(int(c) for c in chunks.tolist()) for chunks in res.selected]
    tokens = [[min(geo.chunk_tokens, n - c * geo.chunk_tokens) for c in chunks] for chunks in sets]
    working = WorkingSet.from_loaded(res.layer_kv, [(l0, k) for l0, k, _ in plan.periods], sets, tokens)
    selection = PeriodSelection(cfg, runner.state, prefix_id, m, runner.streaming_heads, res, follow_top=runner.follow_top(cfg))
    head_sets = list(res.head_sets)  # per Period: each KV head's current chunks (per_head), on the host
    period_of = {layer: p for p, (l0, k, _) in enumerate(plan.periods) for layer in range(l0, l0 + k)}
    heads = runner.streaming_heads if cfg.attention.streaming else None

    def select(p, l0, q, count):
        sets_now: list[torch.Tensor] = []
        union = selection.choose(q, l0, Budget.chunks(count), sets_now)
        head_sets[p] = [torch.from_numpy(to_host(h)) for h in sets_now]
        return union

    def fetch(l0, layers, chunks):
        with runner.client.read_chunks(prefix_id, sorted(chunks), layer_start=l0, layer_end=l0 + layers, shm=False) as read:
            rows: dict[int, dict[int, torch.Tensor]] = {}
            for g in read.groups:
                for c in chunks:
                    ext = to_device(read.extent(g, c), geo.model.dtype, dev)  # [layers in group, 2, Hkv, tokens, d]
                    if geo.streaming_heads:
                        ext = fill_tail(
                            ext, geo, g, row_positions([c], n, geo.chunk_tokens), *runner.tail(prefix_id, n, res), runner.tail_pairs
                        )
                    for i, layer in enumerate(geo.group_layer_range(g)):
                        rows.setdefault(layer, {})[c] = ext[i].clone()
            return rows, read.bytes_read, read.bytes_useful

    def row_mask(layer, chunks):
        mask = layer_mask(layer, row_positions(chunks, n, geo.chunk_tokens), n, geo.chunk_tokens, heads, head_sets[period_of[layer]])
        return None if mask is None else mask.to(dev)

    return decode_reselecting(
        runner.model,
        res.logits,
        kv,
        periods=plan.periods,
        sets=sets,
        working=working,
        select=select,
        fetch=fetch,
        num_chunks=m,
        next_position=start,
        max_new_tokens=max_new_tokens,
        every=cfg.decode.reselect_every,
        select_first=cfg.decode.first_token_full,
        stop_ids=stops,
        row_mask=row_mask if cfg.attention.streaming or cfg.selection.per_head else None,
        kv_rows=kv_rows,
    )
