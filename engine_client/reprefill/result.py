"""What a request hands back: ``PrefixHandle`` (a stored prefix) and ``ReprefillResult`` (a Re-Prefill).

Tensors in a result are on the host where they name chunks or rows (``selected``, ``head_sets``,
``chunk_attention``: what went to the daemon) and on the model's device where they are the model's
(``logits``, ``layer_kv``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class PrefixHandle:
    prefix_id: str
    num_tokens: int
    num_chunks: int
    cache_hit: bool  # already stored: nothing was computed or written
    bytes_written: int = 0
    prefill_s: float = 0.0
    tail_batch_id: str = ""  # streaming layout: the page batch this store wrote for the tail ("" if none)


@dataclass
class ReprefillResult:
    logits: torch.Tensor  # [vocab] float32, the first token's
    ttft_s: float
    selected: list[torch.Tensor]  # per period: chunk ids
    chunk_attention: list[torch.Tensor] = field(default_factory=list)  # per period: [selected] mass
    tokens_loaded: int = 0  # selected tokens, summed over periods
    kv_fraction: float = 0.0  # of the prefix's KV loaded: token-layers loaded / (tokens x layers)
    bytes_read: int = 0  # from disk, padding included (speculation included)
    bytes_useful: int = 0  # extent bytes delivered
    num_reads: int = 0  # the daemon's disk reads for this request, after coalescing (speculation included)
    bytes_gpu: int = 0  # delivered from the GPU tier
    bytes_cpu: int = 0  # delivered from the CPU tier
    units_disk: int = 0
    units_cpu: int = 0
    units_gpu: int = 0
    spec_bytes_used: int = 0
    spec_bytes_wasted: int = 0
    groups_covered: int = 0  # groups computed on from pushed speculation (no round trip)
    hints: list = field(default_factory=list)  # per period: the look-ahead guess sent for it (None: none)
    daemon_wait_s: float = 0.0  # the daemon's time waiting for reads of groups asked for
    probe_bytes: int = 0  # probe keys fetched for exact selection
    state_bytes_fetched: int = 0  # client state (key summaries) fetched from the daemon for this request
    select_s: float = 0.0
    io_wait_s: float = 0.0
    compute_s: float = 0.0
    period_select_s: list = field(default_factory=list)  # per period: its selection's seconds (its hint's included)
    layer_compute_s: list = field(default_factory=list)  # per layer: seconds of its forward
    reported_units: int = 0
    # keep_kv: per layer, the prefix rows it attended to then the suffix's KV, [2, Hkv, rows + s, d]
    layer_kv: list = field(default_factory=list)
    # streaming / per_head: per layer, which loaded rows each KV head may see ([Hkv, rows] or None: all)
    row_masks: list = field(default_factory=list)
    head_sets: list = field(default_factory=list)  # per_head: per period, each KV head's chunk ids
    prefill_densities: list = field(default_factory=list)  # prefill_alpha: per layer, the share of causal cells computed
    standin_rows: int = 0  # standin_layers: prefix rows attended through stand-ins, summed over those layers
    standin_layers: tuple = ()  # the layers that had stand-in rows (standin_layers resolved for this runner)
    num_prefix_tokens: int = 0
    prefix_id: str = ""  # the prefix's full id (a request may name it by a leading part)

    @property
    def read_amplification(self) -> float:
        return self.bytes_read / self.bytes_useful if self.bytes_useful else 1.0
