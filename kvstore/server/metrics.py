"""The daemon's own counters: RPC latency by method and status code, bytes by tier.

One set of counters feeds both ``Stats`` (``kvstore-admin stats``: counts and
percentiles over a bounded window of recent calls) and ``/metrics``
(``prom.py`` reads them at scrape time: cumulative histograms and totals), so
the two never disagree about what happened.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from contextlib import contextmanager

import numpy as np

# Upper bounds of the latency histogram, in seconds (Prometheus ``le``).
LATENCY_BUCKETS_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# Counters fed by the data paths; names are the Prometheus sample names' stems.
COUNTERS = (
    "read_bytes_gpu",  # Prefetch and GetPages: bytes served from the GPU tier
    "read_bytes_cpu",  # Prefetch and GetPages: bytes served from the CPU tier
    "spec_bytes_used",  # Prefetch: speculative disk reads a later period used
    "spec_bytes_wasted",  # Prefetch: speculative disk reads nobody used
    "spec_units_cancelled",  # Prefetch: speculative extents cancelled before their read started
    "lookup_requested_tokens",  # Lookup: tokens asked about
    "lookup_hit_tokens",  # Lookup: of those, tokens of the longest stored prefix (matched_tokens)
    "pages_requested_tokens",  # PagesExist: pages asked about x chunk_tokens
    "pages_hit_tokens",  # PagesExist: leading stored pages x chunk_tokens
)


class Call:
    """One call being timed; the wrapper sets ``code`` (grpc.StatusCode name) before it ends."""

    __slots__ = ("code",)

    def __init__(self):
        self.code = "OK"


class _Histogram:
    __slots__ = ("buckets", "count", "sum")

    def __init__(self):
        self.buckets = [0] * (len(LATENCY_BUCKETS_SECONDS) + 1)  # the last one is +Inf
        self.count = 0
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.buckets[bisect.bisect_left(LATENCY_BUCKETS_SECONDS, seconds)] += 1
        self.count += 1
        self.sum += seconds


class Metrics:
    def __init__(self, window: int = 4096):
        self._lock = threading.Lock()
        self._window = window
        self._samples: dict[str, deque] = {}
        self._counts: dict[str, int] = {}
        self._histograms: dict[tuple[str, str], _Histogram] = {}
        self._counters = dict.fromkeys(COUNTERS, 0)

    @contextmanager
    def timed(self, rpc: str):
        call = Call()
        start = time.perf_counter()
        try:
            yield call
        finally:
            seconds = time.perf_counter() - start
            with self._lock:
                self._samples.setdefault(rpc, deque(maxlen=self._window)).append(seconds * 1e3)
                self._counts[rpc] = self._counts.get(rpc, 0) + 1
                self._histograms.setdefault((rpc, call.code), _Histogram()).observe(seconds)

    def add(self, **amounts: int) -> None:
        """Add to the named counters (``COUNTERS``)."""
        with self._lock:
            for name, value in amounts.items():
                self._counters[name] += value

    def counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counters)

    def histograms(self) -> dict[tuple[str, str], tuple[list[int], int, float]]:
        """(method, code) -> (per-bucket counts, the last for +Inf; count; sum of seconds)."""
        with self._lock:
            return {k: (list(h.buckets), h.count, h.sum) for k, h in self._histograms.items()}

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
