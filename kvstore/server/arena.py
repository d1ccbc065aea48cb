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

Admission (no hold-and-wait): a read that holds several buffers at once
(a ReadChunks on shared memory holds every group until the client
releases it; a Prefetch period on shared memory holds every group until
the client is done with the period) first takes its whole space in one
step, a ``Reservation`` (one contiguous slot run), and carves its buffers
from it without ever waiting again.  Reservations are granted strictly in
arrival order (FIFO): a request that fits waits only for the requests
ahead of it, never for a peer that holds part of what it needs, and a
large request is not starved by small ones.  One that can never fit is
refused at once (``check_fits``).  Waiting costs no thread (``reserve`` is
awaited on the event loop).  Single buffers leased by admitted work
(``lease``: a dropped speculative read read again, a GPU hit staged) may
take free space ahead of the queue, since they finish what was admitted;
speculative buffers never jump the queue.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import fcntl
import gc
import logging
import mmap
import os
import secrets
import threading
import time
from dataclasses import dataclass

from ..contract.errors import NotFound
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


@dataclass(eq=False)
class Reservation:
    """Slots granted to one request at once; its buffers are carved from them in order."""

    owner: int
    start: int  # first slot
    count: int
    used: int = 0  # slots carved so far
    closed: bool = False


@dataclass(eq=False)
class _Waiter:
    owner: int
    count: int
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    granted: Reservation | None = None


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
        self._queue: collections.deque[_Waiter] = collections.deque()  # reservations waiting, in arrival order

    @property
    def leased_bytes(self) -> int:
        with self._cond:
            return (self._alloc.num_slots - self._alloc.free_slots) * self.slot_bytes

    def num_leases(self, owner: int | None = None) -> int:
        with self._cond:
            return sum(1 for lease in self._leases.values() if owner in (None, lease.owner))

    @property
    def num_waiting(self) -> int:
        """Reservations queued for space."""
        with self._cond:
            return len(self._queue)

    def _slots(self, nbytes: int) -> int:
        return max(1, -(-nbytes // self.slot_bytes))

    def lease(self, owner: int, nbytes: int, *, wait_seconds: float, keep_free_bytes: int = 0) -> Lease:
        """One buffer of ``nbytes`` (rounded up to slots) for admitted work, waiting for space if needed.

        ``keep_free_bytes``: succeed only if that much lease space stays free
        afterwards, and never ahead of queued reservations (opportunistic
        reads must not starve required ones).
        """
        count = self._slots(nbytes)
        keep = -(-keep_free_bytes // self.slot_bytes)
        self.check_fits(nbytes)
        deadline = time.monotonic() + wait_seconds
        with self._cond:

            def take():
                if keep and self._queue:
                    return None
                return self._alloc.allocate(count) if self._alloc.free_slots - count >= keep else None

            while (start := take()) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ArenaExhausted(
                        f"shared-memory arena busy: no {nbytes} free bytes within {wait_seconds}s "
                        f"(lease space {self.lease_bytes} bytes, {self._alloc.free_slots * self.slot_bytes} free)"
                    )
                self._cond.wait(left)
            return self._new_lease(owner, start, count, nbytes)

    def _new_lease(self, owner: int, start: int, count: int, nbytes: int) -> Lease:
        while (lease_id := new_owner()) in self._leases:
            pass
        lease = Lease(lease_id, owner, start * self.slot_bytes, nbytes, (start, count))
        self._leases[lease.lease_id] = lease
        return lease

    # ------------------------------------------------------------ admission
    async def reserve(self, owner: int, nbytes: int, *, wait_seconds: float, what: str = "read") -> Reservation:
        """``nbytes`` of lease space in one step, granted in arrival order.

        Refused at once when it can never fit; ArenaExhausted when not
        granted within ``wait_seconds`` (the queue moves only as buffers
        are released).  A cancelled wait leaves the queue and gives back
        anything granted meanwhile.
        """
        self.check_fits(nbytes, what)
        count = self._slots(nbytes)
        loop = asyncio.get_running_loop()
        with self._cond:
            if not self._queue and (start := self._alloc.allocate(count)) is not None:
                return Reservation(owner, start, count)
            waiter = _Waiter(owner, count, loop.create_future(), loop)
            self._queue.append(waiter)
            ahead = len(self._queue) - 1
        try:
            return await asyncio.wait_for(asyncio.shield(waiter.future), wait_seconds)
        except BaseException as exc:
            with self._cond:
                granted = waiter.granted
                if granted is None:
                    self._queue.remove(waiter)
                    self._grant()  # it may have been the head that held the others back
            if granted is not None:
                self.close_reservation(granted)
            if isinstance(exc, TimeoutError):
                raise ArenaExhausted(
                    f"shared-memory arena busy: {what} of {nbytes} bytes not granted within {wait_seconds}s "
                    f"({ahead} requests were ahead of it; lease space {self.lease_bytes} bytes)"
                ) from None
            raise

    def _grant(self) -> None:
        """Grant queued reservations from the head while they fit (caller holds the lock)."""
        while self._queue:
            head = self._queue[0]
            start = self._alloc.allocate(head.count)
            if start is None:
                return
            self._queue.popleft()
            head.granted = Reservation(head.owner, start, head.count)
            try:
                head.loop.call_soon_threadsafe(_fulfil, head.future, head.granted)
            except RuntimeError:  # its loop has closed (shutdown): nobody will take the grant
                head.granted.closed = True
                self._alloc.free(start, head.count)

    def carve(self, reservation: Reservation, nbytes: int) -> Lease | None:
        """A lease of ``nbytes`` from the reservation's next slots; None when it has no room left (or is closed)."""
        count = self._slots(nbytes)
        with self._cond:
            if reservation.closed or reservation.used + count > reservation.count:
                return None
            start = reservation.start + reservation.used
            reservation.used += count
            return self._new_lease(reservation.owner, start, count, nbytes)

    def close_reservation(self, reservation: Reservation) -> None:
        """Give back the slots not carved yet; the carved leases live on until released."""
        with self._cond:
            if reservation.closed:
                return
            reservation.closed = True
            rest = reservation.count - reservation.used
            if rest:
                self._alloc.free(reservation.start + reservation.used, rest)
                self._freed()

    def _freed(self) -> None:
        """Space came back (caller holds the lock): the queue first, then threads waiting for a buffer."""
        self._grant()
        self._cond.notify_all()

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
                self._freed()
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


def _fulfil(future: asyncio.Future, reservation: Reservation) -> None:
    """On the waiter's loop: hand over a grant (a waiter that gave up closes it itself)."""
    if not future.done():
        future.set_result(reservation)
