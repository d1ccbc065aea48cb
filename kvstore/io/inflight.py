"""Requests submitted to an I/O backend and not yet completed: the read queue depth.

``InFlight.track(future)`` counts a request from its submission until it
completes.  A future that takes ``add_done_callback`` (the posix backend's)
is counted down on the thread that completes it, the moment it does; one
that does not (kvikio's) when its result is first collected - the reader
collects every result before it returns, so such a request may count a
little past its completion, never less.
"""

from __future__ import annotations

import threading


class InFlight:
    """A gauge of requests in flight, safe to move from any thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._count = 0

    @property
    def count(self) -> int:
        return self._count

    def track(self, future):
        """Count ``future`` while it is pending; returns a future to collect the result from."""
        with self._lock:
            self._count += 1
        add_done_callback = getattr(future, "add_done_callback", None)
        if add_done_callback is not None:
            add_done_callback(self._done)  # at once if already done
            return future
        return _CountedUntilResult(future, self)

    def _done(self, _future=None) -> None:
        with self._lock:
            self._count -= 1


class _CountedUntilResult:
    """A future without completion callbacks, counted down when its result is first collected."""

    __slots__ = ("_future", "_gauge")

    def __init__(self, future, gauge: InFlight):
        self._future = future
        self._gauge = gauge

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> int:
        try:
            return self._future.result(timeout)
        finally:
            gauge, self._gauge = self._gauge, None
            if gauge is not None:
                gauge._done()
