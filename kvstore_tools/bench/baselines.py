"""How the baselines store a prefix and choose what to load (the Zipf bench's side of them).

The policies themselves are pure and live in ``engine_client.selection.tokens``;
this module applies them to a benchmark prefix: the reordered extents that
IMPRESS and AS+H2O store, IMPRESS's resident partial probe keys, and each
baseline's per-Period chooser for ``ModelRunner.reprefill``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SINK_TOKENS = LOCAL_TOKENS = 16  # one 16-token chunk each, for every system
PROBE_KV_HEADS, PROBE_CHANNEL_FRACTION = 1, 0.5  # IMPRESS's partial probe keys


def stored_layout(prefix, period_layers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(kv [L, 2, Hkv, n, d], orders [periods, n])``: each Period's rows in ``storage_order``."""
    from engine_client.selection.tokens import storage_order

    if period_layers not in prefix.stored:
        orders = torch.stack([storage_order(s, sink_tokens=SINK_TOKENS, local_tokens=LOCAL_TOKENS) for s in prefix.scores])
        kv = torch.empty_like(prefix.kv)
        for layer in range(kv.shape[0]):
            kv[layer] = prefix.kv[layer][:, :, orders[layer // period_layers]]
        prefix.stored[period_layers] = (kv, orders)
    return prefix.stored[period_layers]


@dataclass
class Probe:
    """IMPRESS's resident partial probe keys of one prefix, per Period, in storage order."""

    heads: list  # per period: [h] KV head ids
    channels: list  # per period: [c] channel ids
    keys: list  # per period: [h, n, c] in the model dtype

    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() for k in self.keys)


def impress_probe(prefix, period_layers: int) -> Probe:
    from engine_client.selection.tokens import probe_subset

    kv, _ = stored_layout(prefix, period_layers)
    out = Probe([], [], [])
    for l0 in range(0, kv.shape[0], period_layers):
        keys = kv[l0, 0]  # [Hkv, n, d]
        heads, channels = probe_subset(keys, PROBE_KV_HEADS, max(1, int(keys.shape[2] * PROBE_CHANNEL_FRACTION)))
        out.heads.append(heads)
        out.channels.append(channels)
        out.keys.append(keys[heads][:, :, channels].clone())
    return out


def chooser(run, prefix, cap: int, probe: Probe | None):
    """The baselines' per-period selection in their stored layout (None: the runner's own selector)."""
    from engine_client.selection.tokens import h2o_chunks, impress_blocks, partial_probe_scores

    n = prefix.tokens.numel()
    if run.sysdef.selection == "h2o":
        retained = h2o_chunks(n, run.budget, chunk_tokens=run.sysdef.chunk_tokens)
        return lambda period, l0, q, m: retained
    if run.sysdef.selection != "impress":
        return None
    num_kv_heads = prefix.kv.shape[2]

    def choose(period, l0, q, m):
        scores = partial_probe_scores(q, probe.keys[period], probe.heads[period], probe.channels[period], num_kv_heads=num_kv_heads)
        return impress_blocks(scores, cap, block_tokens=run.sysdef.chunk_tokens, forced_tokens=SINK_TOKENS + LOCAL_TOKENS)

    return choose
