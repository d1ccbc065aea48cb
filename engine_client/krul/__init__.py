"""Krul: restoring an inactive conversation's KV from a compressed form, faster than recomputing or loading it all.

Policies over torch tensors and plain numbers, and their restoration through the daemon:

- ``sketch``: a conversation's attention statistics per layer (a pooled
  attention map on a fixed grid and the edge mass), folded in from prefill
  blocks and decode rows without keeping any ``n x n`` map;
- ``estimator``: the sketch fed by the model's own prefill and decoding
  (their ``observe`` callback), computed in a background thread;
- ``strategy``: which layers stay whole (input-sensitive) and which pairs
  share one merged KV, chosen greedily by map distance;
- ``merge``: the MiniCache-style merge of a pair's KV and its restoration;
- ``pyramid``: per layer, how many leading tokens to recompute while the
  rest loads, so the two streams finish together;
- ``restoration``: a plan carried out on a prefix the daemon holds, the load
  stream in a thread beside the recompute (the one module here that does I/O).

    sketch = AttentionSketch(num_layers=30, num_heads=9, grid=32)
    sketch.add_prefill(layer, attn)             # [heads, q, k], per layer
    strategy = choose_strategy(sketch.stats(), gamma=0.9, ratio=0.4)
    merged = merge_pair(kv[a], kv[b], retain_threshold=0.5)   # for (a, b) in strategy.pairs
    plan = plan_restore(30, n, recompute_flops_per_token_layer=f, bytes_per_token_layer=b, profile=p)
"""

from .estimator import AttentionEstimator
from .merge import MergedPair, merge_pair, restore
from .pyramid import HardwareProfile, RestoreCosts, RestorePlan, check_plan, make_plan, plan_restore, recompute_flops, repair
from .restoration import RestoreTimings, bytes_per_token_layer, measure_profile, restore_kv
from .sketch import AttentionSketch, AttentionStats, edge_mass, pooled_attention
from .strategy import Strategy, choose_strategy, layer_distances, record_strategy

__all__ = [
    "AttentionEstimator",
    "AttentionSketch",
    "AttentionStats",
    "HardwareProfile",
    "MergedPair",
    "RestoreCosts",
    "RestorePlan",
    "RestoreTimings",
    "bytes_per_token_layer",
    "measure_profile",
    "restore_kv",
    "Strategy",
    "check_plan",
    "choose_strategy",
    "edge_mass",
    "layer_distances",
    "make_plan",
    "merge_pair",
    "plan_restore",
    "pooled_attention",
    "recompute_flops",
    "record_strategy",
    "repair",
    "restore",
]
