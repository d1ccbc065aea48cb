"""Krul: restoring an inactive conversation's KV from a compressed form, faster than recomputing or loading it all.

Pure policies over torch tensors and plain numbers (no I/O, no daemon):

- ``sketch``: a conversation's attention statistics per layer (a pooled
  attention map on a fixed grid and the edge mass), folded in from prefill
  blocks and decode rows without keeping any ``n x n`` map;
- ``strategy``: which layers stay whole (input-sensitive) and which pairs
  share one merged KV, chosen greedily by map distance;
- ``merge``: the MiniCache-style merge of a pair's KV and its restoration.

    sketch = AttentionSketch(num_layers=30, num_heads=9, grid=32)
    sketch.add_prefill(layer, attn)             # [heads, q, k], per layer
    strategy = choose_strategy(sketch.stats(), gamma=0.9, ratio=0.4)
    merged = merge_pair(kv[a], kv[b], retain_threshold=0.5)   # for (a, b) in strategy.pairs
"""

from .merge import MergedPair, merge_pair, restore
from .sketch import AttentionSketch, AttentionStats, edge_mass, pooled_attention
from .strategy import Strategy, choose_strategy, layer_distances

__all__ = [
    "AttentionSketch",
    "AttentionStats",
    "MergedPair",
    "Strategy",
    "choose_strategy",
    "edge_mass",
    "layer_distances",
    "merge_pair",
    "pooled_attention",
    "restore",
]
