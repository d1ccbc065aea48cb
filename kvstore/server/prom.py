"""``/metrics``: the daemon's figures in the Prometheus text format.

A custom collector reads ``Service.snapshot()`` (the dict ``Stats`` answers
with), the cache-hit token counters and the RPC histograms at scrape time,
so there is one set of counters and no second bookkeeping: a scrape and
``kvstore-admin stats`` taken at the same moment agree.  The registry also
holds prometheus_client's process, platform and GC collectors
(``process_*``, ``python_*``).  The HTTP listener (``metrics_address``) is
``prometheus_client``'s own server thread, bound before the store opens so a
port in use is a configuration error.
"""

from __future__ import annotations

import logging

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import CollectorRegistry

from ..config import parse_host_port
from ..contract.errors import InvalidArgument
from .metrics import LATENCY_BUCKETS_SECONDS
from .remote import metric_families as remote_metric_families

log = logging.getLogger(__name__)

# (metric name, help, key of the snapshot) for the plain counters and gauges.
# Counts of things are named for the thing (``_extents``), never ``_units``.
COUNTERS = (
    ("kvstore_written_bytes_total", "Bytes written to segment files by puts (padding and trailers included).", "bytes_written"),
    ("kvstore_tier_hits_total", "Extents a Prefetch stream or a GetPages found in a memory tier.", "tier_hit_units"),
    ("kvstore_tier_misses_total", "Extents a Prefetch stream or a GetPages had to read from disk.", "tier_miss_units"),
    ("kvstore_evictions_total", "Prefixes evicted to stay under max_disk_bytes (or by kvstore-admin evict).", "evictions"),
    ("kvstore_evicted_bytes_total", "Segment bytes freed by evictions.", "evicted_bytes"),
    ("kvstore_compactions_total", "Segments compacted.", "compactions"),
    ("kvstore_compaction_reclaimed_bytes_total", "Bytes compactions gave back.", "compaction_reclaimed_bytes"),
    ("kvstore_segment_merges_total", "Merged segments written from small page-batch segments.", "merges"),
    ("kvstore_merged_segments_total", "Small page-batch segments replaced by merges.", "segments_merged"),
    ("kvstore_prefetch_speculative_cancelled_extents_total", "Speculative extents cancelled before their read.", "spec_units_cancelled"),
    ("kvstore_requests_total", "RPCs served (every method and outcome).", "requests"),
)
GAUGES = (
    ("kvstore_prefixes", "Stored prefixes.", "num_prefixes"),
    ("kvstore_conversations", "Conversation records (AppendTurn).", "num_conversations"),
    ("kvstore_segments", "Segment files the index references.", "num_segments"),
    ("kvstore_stored_bytes", "Bytes of the segment files the index references.", "bytes_stored"),
    ("kvstore_disk_used_bytes", "Segment bytes counted against max_disk_bytes.", "disk_used_bytes"),
    ("kvstore_disk_reserved_bytes", "Bytes reserved by puts in progress.", "disk_reserved_bytes"),
    ("kvstore_disk_capacity_bytes", "max_disk_bytes (0: unlimited).", "max_disk_bytes"),
    ("kvstore_filesystem_free_bytes", "Free bytes of the data directory's file system.", "bytes_free"),
    ("kvstore_quarantined_segments", "Segments whose reads are refused after a checksum failure or loss.", "quarantined_segments"),
    ("kvstore_shm_arena_bytes", "Size of the shared-memory arena.", "shm_arena_bytes"),
    ("kvstore_shm_leased_bytes", "Arena bytes leased to reads in flight and to clients.", "shm_leased_bytes"),
    ("kvstore_shm_sessions", "Open shared-memory sessions.", "shm_sessions"),
    ("kvstore_data_connections", "Open raw data connections of TCP clients.", "data_connections"),
    ("kvstore_prefetch_reserve_bytes", "Arena bytes kept for stream buffers.", "prefetch_reserve_bytes"),
    ("kvstore_pinned_bytes", "Tier-resident bytes held by streams (never evicted while held).", "pinned_bytes"),
    ("kvstore_pinned_extents", "Tier-resident extents held by streams.", "pinned_units"),
    ("kvstore_tier_extents", "Extents resident in a memory tier.", "tier_units"),
    ("kvstore_index_map_bytes", "LMDB map size of the index.", "index_map_bytes"),
    ("kvstore_read_queue_depth", "Disk reads submitted to the I/O backend and not yet completed.", "read_queue_depth"),
)


class DaemonCollector:
    """Reads the daemon's counters at each scrape; nothing before the store is open."""

    def __init__(self):
        self.service = None  # set once the daemon serves

    def describe(self):
        return []  # families depend on the live daemon; registering must not call collect()

    def collect(self):
        svc = self.service
        if svc is None:
            return
        snap = svc.snapshot()
        read = CounterMetricFamily(
            "kvstore_read_bytes", "Bytes served to readers by source (disk: read from segment files).", labels=["source"]
        )
        read.add_metric(["gpu"], snap["bytes_read_gpu"])
        read.add_metric(["cpu"], snap["bytes_read_cpu"])
        read.add_metric(["disk"], snap["bytes_read"])
        yield read
        spec = CounterMetricFamily(
            "kvstore_prefetch_speculative_bytes",
            "Bytes read ahead on speculation, by whether a later period used them.",
            labels=["outcome"],
        )
        spec.add_metric(["used"], snap["spec_bytes_used"])
        spec.add_metric(["wasted"], snap["spec_bytes_wasted"])
        yield spec
        yield from _hit_tokens(svc.metrics.counters())
        for name, doc, key in COUNTERS:
            if key in snap:
                yield CounterMetricFamily(name.removesuffix("_total"), doc, value=snap[key])
        for name, doc, key in GAUGES:
            if key in snap:
                yield GaugeMetricFamily(name, doc, value=snap[key])
        tier_cap = GaugeMetricFamily("kvstore_tier_capacity_bytes", "Capacity of each memory tier.", labels=["tier"])
        tier_used = GaugeMetricFamily("kvstore_tier_used_bytes", "Bytes resident in each memory tier.", labels=["tier"])
        for tier in ("gpu", "cpu"):
            tier_cap.add_metric([tier], snap.get(f"{tier}_tier_bytes", 0))
            tier_used.add_metric([tier], snap.get(f"{tier}_tier_used_bytes", 0))
        yield tier_cap
        yield tier_used
        yield GaugeMetricFamily(
            "kvstore_read_only", "1 once the store turned read-only (a failed fdatasync).", value=int(bool(snap["read_only"]))
        )
        info = GaugeMetricFamily(
            "kvstore_build_info", "Version, I/O backend and cache policy.", labels=["version", "backend", "cache_policy"]
        )
        info.add_metric([snap["version"], snap["backend"], snap.get("cache_policy", "")], 1)
        yield info
        yield _latency(svc.metrics.histograms())
        yield from remote_metric_families(snap)


def _hit_tokens(counters: dict):
    """Tokens asked about and found, by call: the cache hit rate of Lookup (prefixes) and PagesExist (pages)."""
    for call, key in (("Lookup", "lookup"), ("PagesExist", "pages")):
        requested = CounterMetricFamily(
            f"kvstore_{key}_requested_tokens", f"Tokens {call} calls asked about.", value=counters[f"{key}_requested_tokens"]
        )
        hit = CounterMetricFamily(
            f"kvstore_{key}_hit_tokens",
            f"Tokens {call} calls found stored (the leading ones a client can reuse).",
            value=counters[f"{key}_hit_tokens"],
        )
        yield requested
        yield hit


def _latency(histograms) -> HistogramMetricFamily:
    fam = HistogramMetricFamily("kvstore_rpc_duration_seconds", "RPC latency by method and status code.", labels=["method", "code"])
    for (method, code), (buckets, count, total) in sorted(histograms.items()):
        cumulative, acc = [], 0
        for le, n in zip((*map(str, LATENCY_BUCKETS_SECONDS), "+Inf"), buckets):
            acc += n
            cumulative.append((le, acc))
        fam.add_metric([method, code], cumulative, total)
    return fam


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``; no host: every interface) -> (host, port); InvalidArgument naming metrics_address."""
    try:
        host, port = parse_host_port(text, need_host=False)
    except ValueError as exc:
        raise InvalidArgument("metrics_address", str(exc)) from None
    return host or "0.0.0.0", port


class MetricsServer:
    """The ``/metrics`` HTTP listener: bound at construction, serving from a thread."""

    def __init__(self, address: str):
        from prometheus_client import GCCollector, PlatformCollector, ProcessCollector, start_http_server

        host, port = parse_address(address)
        self.collector = DaemonCollector()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        ProcessCollector(registry=self.registry)  # process_*: CPU, resident memory, open files, start time
        PlatformCollector(registry=self.registry)  # python_info
        GCCollector(registry=self.registry)  # python_gc_*
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise InvalidArgument("metrics_address", f"cannot listen on {address}: {exc.strerror or exc}") from None
        self.port = self._server.server_port
        log.info("metrics on http://%s:%d/metrics", host, self.port)

    def serve(self, service) -> None:
        self.collector.service = service

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
