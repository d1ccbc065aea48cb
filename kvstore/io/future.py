"""The future of one backend request, completed by the thread that finished it.

Shared by the posix backend (completed on a worker thread) and the io_uring
backend (completed on its ring thread): ``result``, ``done``, ``exception``
and ``add_done_callback``, like ``concurrent.futures.Future`` but a fraction
of its cost - the per-request price decides small-block IOPS in Python.
"""

from __future__ import annotations

import logging
from _thread import allocate_lock

log = logging.getLogger(__name__)

# Guards each future's done-flag against add_done_callback / result() racing
# its completion; held for a few bytecodes only.
_state_lock = allocate_lock()


class Future:
    """The future of one request: ``result``, ``done``, ``exception``, ``add_done_callback``.

    Callbacks receive the future and run on the backend thread that completed
    it (at once, on the caller's thread, when it is already done), like
    ``concurrent.futures.Future``; an exception in one is logged.
    """

    __slots__ = ("_done", "_result", "_error", "_gate", "_callbacks")

    def __init__(self):
        self._done = False
        self._result = None
        self._error: BaseException | None = None
        self._gate = None  # a held lock, made by the first waiter; released on completion
        self._callbacks: list | None = None

    @classmethod
    def finished(cls, result, error: BaseException | None = None) -> Future:
        """A future already done (a request served without the backend, e.g. from memory)."""
        future = cls()
        future._complete(result, error)
        return future

    def done(self) -> bool:
        return self._done

    def result(self, timeout: float | None = None) -> int:
        if not self._done:
            self._wait(timeout)
        if self._error is not None:
            raise self._error
        return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._done:
            self._wait(timeout)
        return self._error

    def add_done_callback(self, fn) -> None:
        if not self._done:
            with _state_lock:
                if not self._done:
                    if self._callbacks is None:
                        self._callbacks = [fn]
                    else:
                        self._callbacks.append(fn)
                    return
        call_callback(fn, self)

    def _wait(self, timeout: float | None) -> None:
        with _state_lock:
            if self._done:
                return
            gate = self._gate
            if gate is None:
                gate = self._gate = allocate_lock()
                gate.acquire()
        if not gate.acquire(True, -1 if timeout is None else max(timeout, 0.0)):
            raise TimeoutError(f"I/O not done after {timeout} s")
        gate.release()  # open for the next waiter

    def _complete(self, result, error: BaseException | None) -> None:
        with _state_lock:
            self._result, self._error, self._done = result, error, True
            gate, callbacks = self._gate, self._callbacks
            self._callbacks = None
        if gate is not None:
            gate.release()
        if callbacks is not None:
            for fn in callbacks:
                call_callback(fn, self)

    def __repr__(self) -> str:
        state = "pending" if not self._done else ("error" if self._error is not None else "done")
        return f"<{type(self).__name__} {state}>"


def call_callback(fn, future: Future) -> None:
    try:
        fn(future)
    except Exception:
        log.exception("exception in a callback of %r", future)
