"""The daemon's side of the remote tier: connect at start, watch its health, announce this node, export its figures.

Start.  A configuration the engine refuses for good (a wrong password, TLS
on one side only, a host name that does not resolve) stops the start with
one line naming ``remote_url``; a cluster that does not answer now does not:
the daemon starts *degraded*, serves its local tier, and keeps trying.

Health.  Every ``remote_health_seconds`` the engine is asked
(``RemoteLink.check_health``); the answer sets the gRPC health of the
service ``kvstore.v1.RemoteTier`` (``SERVING`` or ``NOT_SERVING``: ``kvstore
health --service kvstore.v1.RemoteTier``), while the daemon's own health
("" and ``kvstore.v1.KVStore``) stays ``SERVING``: it still serves.  A
healthy check also announces the node (id and ``node_address``, with a
time to live) for the router.
"""

from __future__ import annotations

import asyncio
import logging

from ..contract.errors import StartupError
from ..remote import RemoteConfig, RemoteRefused, RemoteTier, RemoteUnavailable, make_tier

log = logging.getLogger("kvstore.remote")

REMOTE_SERVICE = "kvstore.v1.RemoteTier"
ANNOUNCE_TTL_FACTOR = 10  # an announcement lives this many health periods (at least 5 s)


def connect_tier(cfg: RemoteConfig) -> tuple[RemoteTier | None, str | None]:
    """``(tier, why it cannot be reached now)``; ``(None, None)`` without ``remote_url``.

    InvalidArgument for a malformed key, StartupError naming ``remote_url`` when the engine refuses this daemon.
    """
    if not cfg.enabled:
        return None, None
    tier = make_tier(cfg)
    try:
        tier.connect()
    except RemoteRefused as exc:
        tier.close()
        raise StartupError("remote_url", str(exc)) from None
    except RemoteUnavailable as exc:
        log.warning("remote tier %s unreachable at start (%s): serving the local tier alone until it answers", tier.describe(), exc)
        return tier, str(exc)
    log.info("remote tier %s: write-back replication, fills of local misses, prefix directory %s", tier.describe(), cfg.remote_directory)
    return tier, None


class RemoteWatch:
    """The health loop (an asyncio task; the engine is asked on a worker thread)."""

    def __init__(self, store, cfg: RemoteConfig, set_health, info: str):
        self._store = store
        self._cfg = cfg
        self._set_health = set_health  # async (service name, SERVING: bool)
        self._info = cfg.node_address or info

    def check(self) -> str | None:
        link = self._store.remote_link
        reason = link.check_health()
        if reason is None:
            ttl = max(5, int(ANNOUNCE_TTL_FACTOR * self._cfg.remote_health_seconds))
            try:
                link.call(link.tier.announce, self._store.replicator.node_id, self._info, ttl)
            except RemoteUnavailable as exc:
                reason = str(exc)
        return reason

    async def run(self, stopped: asyncio.Event) -> None:
        while not stopped.is_set():
            try:
                reason = await asyncio.to_thread(self.check)
            except Exception as exc:  # the watch itself must keep going
                log.exception("remote tier health check failed")
                reason = str(exc)
            await self._set_health(REMOTE_SERVICE, reason is None)
            try:
                await asyncio.wait_for(stopped.wait(), self._cfg.remote_health_seconds)
            except TimeoutError:
                pass


async def fill_first(svc, prefix_id: str) -> None:
    """Before a call resolves ``prefix_id`` on the event loop: a prefix this node lacks is filled from the
    remote tier on a worker thread (``ChunkStore.resolve``), so the loop never waits on the cluster.
    Its errors (DATA_LOSS for a damaged remote copy) are the call's."""
    if svc.store.needs_fill(prefix_id.lower()):
        await svc.run(svc.store.resolve, prefix_id)


# (metric name, help, key of the snapshot) of the remote tier's counters and gauges (/metrics, prom.py)
COUNTERS = (
    ("kvstore_remote_replicated_prefixes_total", "Local prefixes the remote tier acknowledged (or already had).", "replicated_prefixes"),
    ("kvstore_remote_failed_prefixes_total", "Replications given up (queue full, retries spent, refused).", "failed_prefixes"),
    ("kvstore_remote_replicated_extents_total", "Extents written to the remote tier (absent before).", "replicated_extents"),
    ("kvstore_remote_replicated_bytes_total", "Bytes of the extents written to the remote tier.", "replicated_bytes"),
    ("kvstore_remote_skipped_extents_total", "Extents replication found on the remote tier already.", "replication_skipped_extents"),
    ("kvstore_remote_retries_total", "Replication tries fewer replicas acknowledged than required.", "replication_retries"),
    ("kvstore_remote_fill_prefixes_total", "Local misses filled from the remote tier.", "fill_prefixes"),
    ("kvstore_remote_fill_chunks_total", "Chunks written to the local tier from the remote tier.", "fill_chunks"),
    ("kvstore_remote_fill_bytes_total", "Extent bytes fetched from the remote tier.", "fill_bytes"),
    ("kvstore_remote_fill_pages_total", "Pages filled from the remote tier.", "fill_pages"),
    ("kvstore_remote_misses_total", "Look-ups and reads the remote tier could not extend.", "remote_misses"),
    ("kvstore_remote_checksum_failures_total", "Remote values that failed their checks (never served).", "remote_checksum_failures"),
    ("kvstore_remote_fill_failures_total", "Remote hits the local tier could not take (full, read-only).", "fill_failures"),
    ("kvstore_remote_degraded_events_total", "Times the remote tier turned degraded.", "remote_degraded_events"),
)


def metric_families(snap: dict):
    """The remote tier's series, from ``Service.snapshot()``; none without a remote tier."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    if not snap.get("remote_state"):
        return
    degraded = snap["remote_state"] != "ok"
    yield GaugeMetricFamily(
        "kvstore_remote_degraded", "1 while the remote tier is unreachable (the local tier serves alone).", value=int(degraded)
    )
    yield GaugeMetricFamily(
        "kvstore_remote_pending_prefixes", "Local prefixes not yet known to be on the remote tier.", value=snap["pending_prefixes"]
    )
    for name, doc, key in COUNTERS:
        yield CounterMetricFamily(name.removesuffix("_total"), doc, value=snap[key])
