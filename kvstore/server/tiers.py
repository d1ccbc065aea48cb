"""The daemon's memory tiers: which extents live in GPU and CPU memory.

The unit of caching is one extent: (segment, segment-local chunk, stored
period group).  Placement and eviction are decided by a pure policy pair
(``kvstore.policy``: two min-heaps, GPU above CPU, an extent evicted from
the GPU drops to the CPU if it beats the CPU minimum); this module moves the
bytes and keeps the policies' bookkeeping in step with them.

- CPU tier: the region of the shared-memory arena after its lease space, cut
  into 4 KiB slots, so a same-host client reads a cached extent in place.
- GPU tier: device memory (``torch.cuda``) when a GPU is present; tests and
  GPU-less hosts may run the same logic on a host-memory stand-in.  Clients
  receive GPU-resident extents through a host copy into their stream's
  lease (CUDA IPC export is not wired up).

A unit handed to a stream is pinned (leased in its policy) until the stream
ends; a pinned unit is never evicted, moved or overwritten.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import numpy as np

from ..policy import TierPair, make_policy
from ..scores import ScoreTable, Unit
from .arena import Arena, SlotAllocator

log = logging.getLogger(__name__)

TIER_SLOT = 4096


@dataclass(frozen=True)
class Resident:
    tier: str  # "gpu" | "cpu"
    offset: int  # cpu: byte offset in the arena; gpu: byte offset in device memory
    length: int  # the extent's bytes
    slots: tuple[int, int]  # (first slot, count) in the tier's allocator


class HostMemory:
    """GPU-tier stand-in: the same allocator over host memory."""

    kind = "host"

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.buf = np.zeros(nbytes, np.uint8)

    def write(self, offset: int, src: np.ndarray) -> None:
        self.buf[offset : offset + src.size] = src

    def read(self, offset: int, length: int, dst: np.ndarray) -> None:
        dst[:] = self.buf[offset : offset + length]


class CudaMemory:
    """Device memory of the daemon's GPU."""

    kind = "cuda"

    def __init__(self, nbytes: int, device: str = "cuda"):
        import torch

        self.nbytes = nbytes
        self._torch = torch
        self.buf = torch.empty(nbytes, dtype=torch.uint8, device=device)

    def write(self, offset: int, src: np.ndarray) -> None:
        self.buf[offset : offset + src.size].copy_(self._torch.from_numpy(np.ascontiguousarray(src)))

    def read(self, offset: int, length: int, dst: np.ndarray) -> None:
        self._torch.from_numpy(dst).copy_(self.buf[offset : offset + length].cpu())


def gpu_memory(nbytes: int, device: str):
    """The GPU tier's memory: ``device`` "auto" (CUDA if present, else none), "cuda" or "host"."""
    if nbytes <= 0:
        return None
    if device == "host":
        return HostMemory(nbytes)
    try:
        import torch

        if torch.cuda.is_available():
            return CudaMemory(nbytes)
    except Exception:  # noqa: BLE001 - any failure means no GPU tier
        pass
    if device == "cuda":
        raise RuntimeError("gpu_tier_device = 'cuda' but no CUDA device is available")
    log.info("no CUDA device: GPU tier disabled (gpu_tier_bytes=%d ignored)", nbytes)
    return None


def slot_bytes(length: int) -> int:
    return -(-length // TIER_SLOT) * TIER_SLOT


class TierManager:
    def __init__(self, arena: Arena | None, scores: ScoreTable, *, policy: str, gpu=None):
        self.arena = arena
        self.scores = scores
        self.policy_name = policy
        cpu_bytes = arena.tier_bytes if arena is not None else 0
        self.gpu = gpu
        gpu_bytes = gpu.nbytes // TIER_SLOT * TIER_SLOT if gpu is not None else 0
        self.pair = TierPair(make_policy(policy, gpu_bytes), make_policy(policy, cpu_bytes))
        self._alloc = {"gpu": SlotAllocator(gpu_bytes // TIER_SLOT), "cpu": SlotAllocator(cpu_bytes // TIER_SLOT)}
        self._policy = {"gpu": self.pair.upper, "cpu": self.pair.lower}
        self._lock = threading.RLock()
        self._where: dict[Unit, Resident] = {}
        self.hit_units = 0
        self.miss_units = 0

    # ------------------------------------------------------------ introspection
    @property
    def enabled(self) -> bool:
        return self.pair.upper.capacity_bytes > 0 or self.pair.lower.capacity_bytes > 0

    def capacity(self, tier: str) -> int:
        return self._policy[tier].capacity_bytes

    def used(self, tier: str) -> int:
        with self._lock:
            return self._policy[tier].used_bytes

    def where(self, unit: Unit) -> Resident | None:
        with self._lock:
            return self._where.get(unit)

    def __len__(self) -> int:
        with self._lock:
            return len(self._where)

    def pinned_units(self) -> int:
        with self._lock:
            return sum(1 for u, r in self._where.items() if self._policy[r.tier].leased(u))

    def pinned_bytes(self) -> int:
        with self._lock:
            return sum(r.length for u, r in self._where.items() if self._policy[r.tier].leased(u))

    def cpu_view(self, res: Resident) -> np.ndarray:
        return np.frombuffer(self.arena.view, np.uint8, count=res.length, offset=res.offset)

    def read_gpu(self, res: Resident, dst: np.ndarray) -> None:
        self.gpu.read(res.offset, res.length, dst)

    # ------------------------------------------------------------ requests
    def pin_resident(self, units: list[Unit], *, touch: bool = True) -> dict[Unit, Resident]:
        """Pin (and, as an access, touch) the resident ``units``; returns where each hit lives.

        ``touch=False``: held for a speculative push, which is not an access.
        """
        hits = {}
        with self._lock:
            for u in units:
                res = self._where.get(u)
                if res is not None:
                    hits[u] = self._pin(u, res, touch)
        return hits

    def _pin(self, unit: Unit, res: Resident, touch: bool = True) -> Resident:
        """A stream holds the unit until it lets go; an access also touches it."""
        pol = self._policy[res.tier]
        if touch:
            pol.touch(unit, self.scores.get(unit))
        pol.lease(unit)
        return res

    def count(self, hits: int, misses: int) -> None:
        with self._lock:
            self.hit_units += hits
            self.miss_units += misses

    def admit(self, unit: Unit, data: np.ndarray) -> Resident | None:
        """Place an extent just read from disk, pinned; None if the policy keeps it out.

        A unit another stream placed meanwhile is pinned and returned as is.
        """
        size = slot_bytes(data.size)
        with self._lock:
            res = self._where.get(unit)
            if res is not None:
                return self._pin(unit, res)
            if not self.enabled:
                return None
            plan = self.pair.plan(unit, size, self.scores.get)
            if plan.tier is None:
                return None
            moves = self._evict(plan)
            tier = "gpu" if plan.tier == "upper" else "cpu"
            start = self._alloc[tier].allocate(size // TIER_SLOT)
            if start is None:  # fragmented: the freed bytes are not contiguous
                self.pair.apply(plan, unit, size, self.scores.get)
                self._policy[tier].remove(unit)
                self._finish_moves(moves)
                return None
            self.pair.apply(plan, unit, size, self.scores.get)
            self._finish_moves(moves)
            res = self._place(tier, unit, start, data)
            self._policy[tier].lease(unit)
            return res

    def unpin(self, units: list[Unit]) -> None:
        """End of a stream: its units may be evicted again (and promoted to the GPU)."""
        with self._lock:
            for u in units:
                res = self._where.get(u)
                if res is None:
                    continue
                pol = self._policy[res.tier]
                if pol.leased(u):
                    pol.unlease(u)
                if res.tier == "cpu" and self.gpu is not None and not pol.leased(u):
                    self._promote(u, res)

    def rescore(self, units: list[Unit]) -> None:
        """Importance changed (ReportAttention): re-key resident units."""
        with self._lock:
            for u in units:
                res = self._where.get(u)
                if res is not None:
                    self._policy[res.tier].update_score(u, self.scores.get(u))

    def drop_segment(self, segment_id: int) -> None:
        """A segment was deleted: its extents leave memory (pinned ones when unpinned)."""
        with self._lock:
            for u in [u for u in self._where if u[0] == segment_id]:
                res = self._where[u]
                if not self._policy[res.tier].leased(u):
                    self._policy[res.tier].remove(u)
                    self._release(u)

    # ------------------------------------------------------------ moves
    def _evict(self, plan) -> list:
        """Take evicted units' bytes out (demotions are copied out first)."""
        moves = []
        for u in plan.demote:
            res = self._where[u]
            data = np.empty(res.length, np.uint8)
            self.read_gpu(res, data)
            moves.append((u, data))
        for u in plan.evict_upper:
            self._release(u)
        for u in plan.evict_lower:
            self._release(u)
        return moves

    def _finish_moves(self, moves) -> None:
        for u, data in moves:
            start = self._alloc["cpu"].allocate(slot_bytes(data.size) // TIER_SLOT)
            if start is None:
                self._policy["cpu"].remove(u)
                continue
            self._place("cpu", u, start, data)

    def _promote(self, unit: Unit, res: Resident) -> None:
        plan = self.pair.plan_promote(unit, self.scores.get)
        if plan is None or plan.tier != "upper":
            return
        data = self.cpu_view(res).copy()
        moves = self._evict(plan)
        self._release(unit)
        size = slot_bytes(res.length)
        start = self._alloc["gpu"].allocate(size // TIER_SLOT)
        self.pair.apply(plan, unit, size, self.scores.get)
        if start is None:
            self._policy["gpu"].remove(unit)
        else:
            self._place("gpu", unit, start, data)
        self._finish_moves(moves)

    def _place(self, tier: str, unit: Unit, start: int, data: np.ndarray) -> Resident:
        n = int(data.size)
        if tier == "cpu":
            offset = self.arena.tier_offset + start * TIER_SLOT
            np.frombuffer(self.arena.view, np.uint8, count=n, offset=offset)[:] = data
        else:
            offset = start * TIER_SLOT
            self.gpu.write(offset, data)
        res = Resident(tier, offset, n, (start, slot_bytes(n) // TIER_SLOT))
        self._where[unit] = res
        return res

    def _release(self, unit: Unit) -> None:
        res = self._where.pop(unit)
        self._alloc[res.tier].free(*res.slots)
