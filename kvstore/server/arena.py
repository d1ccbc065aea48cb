"""Shared-memory arena: a sealed memfd carved into leased slot runs.

The daemon reads extents straight into the arena (O_DIRECT into the shared
pages) and sends clients descriptors instead of bytes.  A lease keeps its
slots from being reused until the client releases it, its stream is
aborted, or its session (the client's shm socket connection) ends.
The memfd is sealed against shrinking and growing, so a client can never
truncate the mapping under the daemon (SIGBUS).

Every lease belongs to an owner: a shared-memory session (its id) or a
Prefetch stream (a token only the stream knows).  A release names its owner
and frees only that owner's leases.  Lease ids and owner tokens are random
63-bit integers, so one client cannot guess another's.
"""

from __future__ import annotations

import bisect
import fcntl
import gc
import logging
import mmap
import os
import secrets
import threading
import time
from dataclasses import dataclass

from ..errors import NotFound
from .status import ArenaExhausted

log = logging.getLogger(__name__)


def new_owner() -> int:
    """An unguessable, non-zero owner token (or lease id)."""
    return secrets.randbits(63) or 1


@dataclass
class Lease:
    lease_id: int
    owner: int  # the shm session id or the Prefetch stream's token
    offset: int  # bytes into the arena
    nbytes: int
    slots: tuple[int, int]  # (first slot, count)


class SlotAllocator:
    """First-fit allocator of contiguous slot runs with merging on free (pure)."""

    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._starts = [0] if num_slots else []  # free runs, sorted by start
        self._counts = [num_slots] if num_slots else []
        self.free_slots = num_slots

    def can_allocate(self, count: int) -> bool:
        return any(c >= count for c in self._counts)

    def allocate(self, count: int) -> int | None:
        for i, c in enumerate(self._counts):
            if c >= count:
                start = self._starts[i]
                if c == count:
                    del self._starts[i], self._counts[i]
                else:
                    self._starts[i] += count
                    self._counts[i] -= count
                self.free_slots -= count
                return start
        return None

    def free(self, start: int, count: int) -> None:
        i = bisect.bisect_left(self._starts, start)
        if i < len(self._starts) and self._starts[i] < start + count:
            raise ValueError(f"slots {start}+{count} are already free")
        if i > 0 and self._starts[i - 1] + self._counts[i - 1] > start:
            raise ValueError(f"slots {start}+{count} are already free")
        self._starts.insert(i, start)
        self._counts.insert(i, count)
        self.free_slots += count
        if i + 1 < len(self._starts) and start + count == self._starts[i + 1]:  # merge right
            self._counts[i] += self._counts.pop(i + 1)
            self._starts.pop(i + 1)
        if i > 0 and self._starts[i - 1] + self._counts[i - 1] == start:  # merge left
            self._counts[i - 1] += self._counts.pop(i)
            self._starts.pop(i)


class Arena:
    """One memfd: leased buffers in ``[0, nbytes - tier_bytes)``, the CPU tier after them.

    The CPU tier region is managed by the tier manager (its own allocator);
    clients map the whole memfd, so a cached extent is read in place.
    """

    def __init__(self, nbytes: int, slot_bytes: int, tier_bytes: int = 0):
        if tier_bytes < 0 or tier_bytes % slot_bytes or tier_bytes > nbytes:
            raise ValueError(f"tier_bytes {tier_bytes} must be a multiple of {slot_bytes} within {nbytes}")
        self.nbytes = nbytes
        self.slot_bytes = slot_bytes
        self.tier_bytes = tier_bytes
        self.tier_offset = nbytes - tier_bytes
        self.fd = os.memfd_create("kvstore-arena", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, nbytes)
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        self.map = mmap.mmap(self.fd, nbytes)
        self.view = memoryview(self.map)
        self._alloc = SlotAllocator(self.tier_offset // slot_bytes)
        self._cond = threading.Condition()
        self._leases: dict[int, Lease] = {}

    @property
    def leased_bytes(self) -> int:
        with self._cond:
            return (self._alloc.num_slots - self._alloc.free_slots) * self.slot_bytes

    def num_leases(self, owner: int | None = None) -> int:
        with self._cond:
            return sum(1 for lease in self._leases.values() if owner in (None, lease.owner))

    def lease(self, owner: int, nbytes: int, *, wait_seconds: float, keep_free_bytes: int = 0) -> Lease:
        """Reserve ``nbytes`` (rounded up to slots), waiting for space if needed.

        ``keep_free_bytes``: succeed only if that much lease space stays free
        afterwards (opportunistic reads must not starve required ones).
        """
        count = max(1, -(-nbytes // self.slot_bytes))
        keep = -(-keep_free_bytes // self.slot_bytes)
        self.check_fits(nbytes)
        deadline = time.monotonic() + wait_seconds
        with self._cond:
            while (start := self._alloc.allocate(count) if self._alloc.free_slots - count >= keep else None) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ArenaExhausted(f"shared-memory arena busy: no {nbytes} free bytes within {wait_seconds}s")
                self._cond.wait(left)
            while (lease_id := new_owner()) in self._leases:
                pass
            lease = Lease(lease_id, owner, start * self.slot_bytes, nbytes, (start, count))
            self._leases[lease.lease_id] = lease
            return lease

    def check_fits(self, nbytes: int, what: str = "read") -> None:
        """ArenaExhausted at once when ``nbytes`` (held at the same time) can never be leased, however long one waits."""
        if max(1, -(-nbytes // self.slot_bytes)) > self._alloc.num_slots:
            raise ArenaExhausted(
                f"{what} of {nbytes} bytes can never fit the arena's lease space ({self.tier_offset} bytes, the prefetch reserve): "
                "read fewer chunks or layers per call, read with bytes in the stream, or raise shm_arena_bytes"
            )

    @property
    def lease_bytes(self) -> int:
        """Capacity for leased buffers (the prefetch reserve)."""
        return self.tier_offset

    def buffer(self, lease: Lease) -> memoryview:
        return self.view[lease.offset : lease.offset + lease.nbytes]

    def release(self, owner: int, lease_ids, *, strict: bool = False) -> int:
        """Free the named leases of ``owner``; others are left alone.

        ``strict``: every id must be a lease of ``owner``, else nothing is
        freed and NotFound names the first that is not (whether it exists
        for another owner is not revealed).
        """
        with self._cond:
            ids = [i for i in dict.fromkeys(lease_ids) if (lease := self._leases.get(i)) is not None and lease.owner == owner]
            if strict and len(ids) != len(set(lease_ids)):
                stray = next(i for i in lease_ids if i not in ids)
                raise NotFound(f"lease_ids: lease {stray} is not held by this session; nothing was released")
            for lease_id in ids:
                self._alloc.free(*self._leases.pop(lease_id).slots)
            if ids:
                self._cond.notify_all()
        return len(ids)

    def release_owner(self, owner: int) -> int:
        with self._cond:
            ids = [i for i, lease in self._leases.items() if lease.owner == owner]
        return self.release(owner, ids)

    def close(self) -> None:
        """Unmap the arena.  Views a finished stream left in a reference cycle
        are collected first; should one still be alive, the mapping is left to
        the process's exit rather than failing the shutdown."""
        gc.collect()
        try:
            self.view.release()
            self.map.close()
        except BufferError:
            log.warning("shared-memory arena still referenced at close; it is unmapped when the process exits")
        os.close(self.fd)
