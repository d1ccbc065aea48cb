"""Admission of reads into the arena: buffers held together are granted together.

A call opens a ``Grant`` over the reads whose buffers it will hold at once
(a whole ReadChunks on shared memory, whose client keeps every group until
it releases the read; a Prefetch period on shared memory, kept until the
client is done with the period; one group on the bytes path, whose buffers
go once framed), adds each read's space (``need``), then opens it: the
arena admits it in one step, in arrival order (``Arena.reserve``), and the
reads carve their buffers from it without ever waiting again.  So no call
holds part of its space while it waits for the rest, and requests queue
and are served in order instead of failing on a timeout.

How long a call waits for its turn is its own deadline (the client's), or
``lease_wait_seconds`` for a call that has none.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

from .arena import Arena, Lease, Reservation


def queue_wait_seconds(context, config) -> float:
    """How long a call waits for its turn in the arena: until its deadline, or ``lease_wait_seconds`` without one."""
    left = context.time_remaining()
    return left if left is not None and left > 0 else config.lease_wait_seconds


@dataclass(eq=False)
class Grant:
    """Arena space for reads held at once, admitted in one step."""

    period: int
    ready: asyncio.Future  # done once granted; raises the refusal
    nbytes: int = 0
    reservation: Reservation | None = None  # set on the loop when granted
    task: asyncio.Task | None = None
    closed: bool = False


class Admissions:
    """The grants of one call (one executor), by period."""

    def __init__(self, arena: Arena | None, owner: int, geometry):
        self.arena = arena
        self.owner = owner
        self.geometry = geometry  # StoreGeometry: every size comes from it
        self._lock = threading.Lock()
        self._grants: dict[int, list[Grant]] = {}  # period -> its grants
        self._ended = False
        self._loop: asyncio.AbstractEventLoop | None = None  # the call's loop: grants' futures and tasks live there

    def grant(self, period: int) -> Grant:
        """A new grant for ``period``: add reads' space with ``need``, then ``open``."""
        self._loop = asyncio.get_running_loop()
        g = Grant(period, self._loop.create_future())
        with self._lock:
            self._grants.setdefault(period, []).append(g)
        return g

    def need(self, grant: Grant, group: int, num_extents: int) -> None:
        """Room for ``num_extents`` extents of ``group`` (each at its padded size)."""
        grant.nbytes += num_extents * self.geometry.extent_padded_bytes(group)

    def open(self, grant: Grant, wait_seconds: float) -> None:
        """Ask the arena for the grant's space; its reads start once granted."""
        if self.arena is None or grant.nbytes == 0 or self._ended:
            grant.ready.set_result(None)
            return
        grant.task = asyncio.ensure_future(self.arena.reserve(self.owner, grant.nbytes, wait_seconds=wait_seconds))
        grant.task.add_done_callback(lambda task: self._granted(grant, task))

    def _granted(self, grant: Grant, task: asyncio.Task) -> None:
        if task.cancelled():
            grant.ready.cancel()
            return
        if (exc := task.exception()) is not None:
            grant.ready.set_exception(exc)
            return
        res = task.result()
        with self._lock:
            keep = not (self._ended or grant.closed)
            if keep:
                grant.reservation = res
        if not keep:
            self.arena.close_reservation(res)
        grant.ready.set_result(None)

    def carve(self, grant: Grant, nbytes: int) -> Lease | None:
        """A buffer from the grant's space; None when it has none (not granted yet, closed, or used up)."""
        with self._lock:
            res = grant.reservation
        return self.arena.carve(res, nbytes) if res is not None else None

    def close(self, first: int, last: int) -> None:
        """No more reads carve from periods ``first..last``: their unused space goes back.

        Safe from any thread (a call's end may be seen off its loop): the futures are touched on the loop."""
        if self._loop is not None and not _running_in(self._loop):
            if not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self.close, first, last)
            return
        with self._lock:
            grants = [g for p in [p for p in self._grants if first <= p <= last] for g in self._grants.pop(p)]
            for g in grants:
                g.closed = True
        for g in grants:
            if g.reservation is not None:
                self.arena.close_reservation(g.reservation)
            elif g.task is not None and not g.task.done():
                g.task.cancel()  # leaves the queue; a grant that lands meanwhile is closed by _granted
            if not g.ready.done():
                g.ready.cancel()
            elif not g.ready.cancelled():
                g.ready.exception()  # a refusal nobody waited for is not an error

    def close_all(self) -> None:
        """The call ended: every grant goes back, and none opens any more."""
        with self._lock:
            self._ended = True
            periods = list(self._grants)
        if periods:
            self.close(min(periods), max(periods))


def _running_in(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:  # no loop runs in this thread
        return False
