"""What the runner keeps of each stored prefix between requests: one ``PrefixState`` per prefix.

A request fetches a piece of state the first time it needs it, charges the
bytes to its result (``probe_bytes``, ``state_bytes_fetched``) and leaves it
for the next request; ``forget`` drops a prefix's, ``nbytes`` counts all of
it.  With ``limit_bytes`` the prefixes used least recently are dropped
(``evicted``) once the whole passes the limit, never the one being filled:
a worker serving many prefixes keeps a bounded share of its device memory,
and a dropped prefix is fetched again by its next request.  Every tensor is
on the model's device, copied there once per prefix (the tail's row
positions stay on the host: they index, they are not computed on).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

from kvstore.contract import InvalidArgument
from kvstore.contract.geometry import StoreGeometry

from ..selection.probes import QuantizedKeys, quantize_keys
from ..standin import value_sum
from ..stream_tail import get_tail
from .device import to_device

DEFAULT_STATE_LIMIT = 1 << 30  # 1 GiB of device memory: about 160 SmolLM2-135M prefixes of 2k tokens with 4-bit probe keys


@dataclass
class PrefixState:
    stored_probe_bits: int = 0  # how the prefix stores its probe keys (a prefix id names one geometry)
    # key summaries of each Period's first layer per period_layers: [chunks, periods, Hkv, 2, d], model dtype
    summaries: dict[int, torch.Tensor] = field(default_factory=dict)
    probes: dict[tuple[int, int], QuantizedKeys] = field(default_factory=dict)  # per (stored group, bits)
    value_sums: dict[int, torch.Tensor] = field(default_factory=dict)  # per stand-in layer: [Hkv, d] float32
    tail: tuple[torch.Tensor, torch.Tensor] | None = None  # streaming layout or window tail: positions [r] (host), rows [pairs, 2, r, d]

    @property
    def nbytes(self) -> int:
        tensors = [*self.summaries.values(), *self.value_sums.values(), *(self.tail or ())]
        return sum(t.numel() * t.element_size() for t in tensors) + sum(p.nbytes for p in self.probes.values())


def summary_bytes(geometry: StoreGeometry, num_tokens: int, period_layers: int) -> int:
    """What the key summaries of one prefix of ``num_tokens`` keep resident."""
    m = geometry.model
    periods = -(-m.num_layers // period_layers)
    itemsize = np.dtype(m.numpy_dtype()).itemsize
    return geometry.num_chunks(num_tokens) * periods * m.num_kv_heads * 2 * m.head_dim * itemsize


class ResidentState:
    """The runner's ``PrefixState``s, and the fetches that fill them (``client``: the runner's)."""

    def __init__(
        self, client, geometry: StoreGeometry, device: torch.device, dtype: torch.dtype, page_scope: dict, limit_bytes: int | None = None
    ):
        if limit_bytes is not None and (isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes < 1):
            raise InvalidArgument("state_limit_bytes", f"must be a positive int or None, got {limit_bytes!r}")
        self.client, self.geometry, self.device, self.dtype = client, geometry, device, dtype
        self._page_scope = page_scope
        self.limit_bytes = limit_bytes
        self.evicted = 0  # prefixes whose state was dropped for the limit
        self._prefixes: OrderedDict[str, PrefixState] = OrderedDict()  # least recently used first

    def prefix(self, prefix_id: str) -> PrefixState:
        state = self._prefixes.setdefault(prefix_id, PrefixState())
        self._prefixes.move_to_end(prefix_id)
        return state

    def forget(self, prefix_id: str) -> None:
        self._prefixes.pop(prefix_id, None)

    def _trim(self, keep: str) -> None:
        """Drop the least recently used prefixes' state (not ``keep``'s) while the whole is over the limit."""
        if self.limit_bytes is None:
            return
        total = self.nbytes
        for pid in list(self._prefixes):
            if total <= self.limit_bytes:
                return
            if pid != keep:
                total -= self._prefixes.pop(pid).nbytes
                self.evicted += 1

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self._prefixes.values())

    def _rows(self, arr: np.ndarray) -> torch.Tensor:
        return to_device(arr, self.geometry.model.dtype, self.device)

    def summaries(self, prefix_id: str, period_layers: int, out=None) -> torch.Tensor:
        """Key summaries of each Period's first layer, ``[chunks, periods, kv_heads, 2, head_dim]``."""
        state = self.prefix(prefix_id)
        if period_layers not in state.summaries:
            firsts = self.client.get_summaries(prefix_id, layer_step=period_layers)  # [chunks, periods, kv_heads, 2, head_dim] float32
            if out is not None:
                out.state_bytes_fetched += firsts.nbytes
            state.summaries[period_layers] = torch.from_numpy(firsts).to(self.device, self.dtype)
            self._trim(prefix_id)
        return state.summaries[period_layers]

    def probe(self, prefix_id: str, group: int, bits: int, out) -> QuantizedKeys:
        """A stored group's probe keys quantized to ``bits``; the first fetch is charged to ``out.probe_bytes``.

        A prefix storing them at ``bits`` hands over the packed rows, kept as they are; one storing
        full-precision keys hands those over, and the client quantizes them (the same format).
        """
        state = self.prefix(prefix_id)
        if (group, bits) not in state.probes:
            probe = self.client.get_probe_keys(prefix_id, group)  # [Hkv, n, d] keys, or [Hkv, n, row_bytes] packed rows
            out.probe_bytes += probe.nbytes
            if state.stored_probe_bits == bits:
                keys = QuantizedKeys.from_packed(probe, bits, self.geometry.model.head_dim, self.device)
            else:
                keys = quantize_keys(to_device(probe, self.geometry.model.dtype, torch.device("cpu")), bits).to(self.device)
            state.probes[(group, bits)] = keys
            self._trim(prefix_id)
        return state.probes[(group, bits)]

    def full_probe(self, prefix_id: str, group: int, out) -> torch.Tensor:
        """A stored group's full-precision probe keys ``[Hkv, n, d]``, fetched for this Period only (not kept)."""
        probe = self.client.get_probe_keys(prefix_id, group)
        out.probe_bytes += probe.nbytes
        return self._rows(probe)

    def value_sum(self, prefix_id: str, layer: int, num_chunks: int, out) -> torch.Tensor:
        """A layer's value sum over the whole prefix ``[Hkv, d]``, read once (charged to ``out.state_bytes_fetched``)."""
        state = self.prefix(prefix_id)
        if layer not in state.value_sums:
            geo = self.geometry
            group = layer // geo.group_layers
            with self.client.read_chunks(prefix_id, list(range(num_chunks)), layer_start=layer, layer_end=layer + 1, shm=False) as read:
                values = to_device(read.group_kv(group), geo.model.dtype, torch.device("cpu"))[layer - group * geo.group_layers, 1]
                state.value_sums[layer] = value_sum(values).to(self.device)  # [Hkv, n, d] summed on the host, once
                out.state_bytes_fetched += read.bytes_useful
            self._trim(prefix_id)
        return state.value_sums[layer]

    def tail(self, prefix_id: str, num_tokens: int, spec, out) -> tuple[torch.Tensor, torch.Tensor]:
        """The prefix's tail (``stream_tail``; ``spec``: sink tokens, recent tokens and its pairs), fetched once
        (charged to ``out.state_bytes_fetched``)."""
        state = self.prefix(prefix_id)
        if state.tail is None:
            sink, recent, pairs = spec
            tail = get_tail(self.client, prefix_id, num_tokens, self.geometry, sink, recent, pairs=pairs, **self._page_scope)
            out.state_bytes_fetched += tail.rows.nbytes
            state.tail = (torch.from_numpy(tail.positions), self._rows(tail.rows))
            self._trim(prefix_id)
        return state.tail
