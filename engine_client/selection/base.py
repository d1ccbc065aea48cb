"""The Selector interface and its per-Period inputs.

A selector declares what it scores from (``Selector.needs``: ``PROBE_KEYS``,
the Period's first-layer keys; ``KEY_SUMMARIES``, the per-chunk min/max of
those keys), so a runner gathers exactly those inputs without knowing the
selector by name; ``loads_all`` says it takes every chunk whatever the scores,
``per_head`` that it scores per query head too (``head_scores``: per-KV-head sets, streaming
heads left out of the scores).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
import torch

from kvstore.contract import InvalidArgument

from ._common import num_chunks, summaries_for_layer
from .budget import select_chunks

PROBE_KEYS = "probe_keys"  # the Period's first-layer keys of every prefix token: PeriodInputs.probe_keys
KEY_SUMMARIES = "key_summaries"  # each chunk's channel-wise key min/max: PeriodInputs.key_min / key_max


@dataclass(frozen=True)
class PeriodInputs:
    """What a Selector sees for one Period.

    ``queries`` are the post-RoPE suffix queries of the period's FIRST layer;
    give ``probe_keys`` (exact scoring), ``key_min``/``key_max`` (summary
    scoring), or both.  Nothing here is modified by a selector.
    """

    queries: torch.Tensor  # [Hq, s, d]
    chunk_tokens: int = 16
    probe_keys: torch.Tensor | None = None  # [Hkv, n, d], that layer's full prefix keys
    key_min: torch.Tensor | None = None  # [m, Hkv, d], channel-wise min of each chunk's keys
    key_max: torch.Tensor | None = None  # [m, Hkv, d], channel-wise max
    chunk_count: int | None = None  # m, for selectors that score from neither (recency)

    @classmethod
    def from_store_summaries(cls, queries: torch.Tensor, summaries: torch.Tensor | np.ndarray, layer: int, **kwargs) -> PeriodInputs:
        """Inputs from the store's ``[chunks, layers, kv_heads, 2, head_dim]`` summaries at ``layer``."""
        key_min, key_max = summaries_for_layer(summaries, layer)
        return cls(queries, key_min=key_min, key_max=key_max, **kwargs)

    def of_kv_heads(self, keep: list[int], num_kv_heads: int) -> PeriodInputs:
        """The inputs of KV heads ``keep`` only: their query groups (query head ``i`` reads KV head
        ``i // (Hq / Hkv)``), probe keys and summaries."""
        group = self.queries.shape[0] // num_kv_heads
        q_idx = [h * group + j for h in keep for j in range(group)]
        return replace(
            self,
            queries=self.queries[q_idx],
            probe_keys=None if self.probe_keys is None else self.probe_keys[keep],
            key_min=None if self.key_min is None else self.key_min[:, keep],
            key_max=None if self.key_max is None else self.key_max[:, keep],
        )

    @property
    def num_chunks(self) -> int:
        """``m``: ``chunk_count`` when given, else from the summaries, else ``ceil(n / chunk_tokens)``."""
        if self.chunk_count is not None:
            return self.chunk_count
        if self.key_min is not None:
            return int(self.key_min.shape[0])
        if self.probe_keys is not None:
            return num_chunks(int(self.probe_keys.shape[1]), self.chunk_tokens)
        raise InvalidArgument("probe_keys", "period inputs carry neither probe keys nor key summaries")


class Selector(ABC):
    """A chunk-selection policy for one Period: scores chunks, then keeps the budget's best."""

    name: ClassVar[str]
    needs: ClassVar[frozenset[str]] = frozenset()  # the inputs it scores from: PROBE_KEYS, KEY_SUMMARIES
    loads_all: ClassVar[bool] = False  # every chunk, whatever the budget
    per_head: ClassVar[bool] = False  # has head_scores: [Hq, m] scores per query head

    @abstractmethod
    def score(self, inputs: PeriodInputs) -> torch.Tensor:
        """Importance of each chunk, ``[m]`` float32, higher is better."""

    def select(self, inputs: PeriodInputs, budget: float | int, *, sink_chunks: int = 1, local_chunks: int = 1) -> torch.Tensor:
        """Ascending chunk ids (``LongTensor``) within ``budget``, sink and local chunks included."""
        return select_chunks(self.score(inputs), budget, sink_chunks=sink_chunks, local_chunks=local_chunks)
