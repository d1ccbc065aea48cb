"""The threads that read Prefetch streams (``prefetch.PrefetchStream``), kept from one stream to the next."""

from __future__ import annotations

import queue
import threading


class Readers:
    """The threads that read Prefetch streams, kept for the next stream.

    A stream's reader runs on an idle thread of the set (a queue put) or, when
    none is idle, on a new one: starting a thread per stream cost 0.3-1 ms of a
    request's time on a busy host (the starter waits for the thread to run).
    Threads stay for the process's life, as many as streams were ever open at
    once; they are daemon threads.
    """

    def __init__(self):
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def run(self, fn) -> None:
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1  # that thread takes this work (or another's, which is the same)
        self._work.put(fn)
        if spawn:
            threading.Thread(target=self._loop, name="kvstore-prefetch-reader", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn = self._work.get()
            try:
                fn()
            except BaseException:  # noqa: BLE001 - a reader hands its errors to its stream; the thread stays
                pass
            with self._lock:
                self._idle += 1


READERS = Readers()
