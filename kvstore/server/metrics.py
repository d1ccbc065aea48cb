"""Request counters and latency percentiles per RPC (bounded memory)."""

from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager

import numpy as np


class Metrics:
    def __init__(self, window: int = 4096):
        self._lock = threading.Lock()
        self._window = window
        self._samples: dict[str, deque] = {}
        self._counts: dict[str, int] = {}

    @contextmanager
    def timed(self, rpc: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            ms = (time.perf_counter() - start) * 1e3
            with self._lock:
                self._samples.setdefault(rpc, deque(maxlen=self._window)).append(ms)
                self._counts[rpc] = self._counts.get(rpc, 0) + 1

    @property
    def requests(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def summary(self) -> list[dict]:
        with self._lock:
            items = {k: (self._counts[k], np.array(v)) for k, v in self._samples.items()}
        out = []
        for rpc, (count, ms) in sorted(items.items()):
            p50, p90, p99 = np.percentile(ms, [50, 90, 99])
            out.append({"rpc": rpc, "count": count, "p50_ms": float(p50), "p90_ms": float(p90), "p99_ms": float(p99)})
        return out
