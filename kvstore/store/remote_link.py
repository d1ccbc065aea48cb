"""``RemoteLink``: the store's one handle on its remote tier: the tier, whether it is usable now, the counters.

A call that finds the engine unreachable marks the link *degraded* (with
why); while degraded, look-ups and reads skip the remote tier at once (the
local tier answers alone, at local speed) and replication waits.
``check_health`` (run every ``remote_health_seconds`` by the daemon) asks
the engine and clears the mark when it answers again; replication then
catches up.  ``NotReplicated`` and ``RemoteFull`` do not degrade the link:
the engine answered, it only refused or could not replicate in time.
"""

from __future__ import annotations

import logging
import threading
import time

from ..remote.base import NotReplicated, RemoteFull, RemoteTier, RemoteUnavailable

log = logging.getLogger("kvstore.remote")

# Counters of the remote tier; each is a figure of Stats and a /metrics series (server/remote_metrics.py).
COUNTERS = (
    "replicated_prefixes",  # prefixes whose extents and manifest the remote tier acknowledged
    "replicated_extents",  # extents written (absent before) by replication
    "replicated_bytes",  # bytes of those extents
    "replication_skipped_extents",  # extents replication found stored already (another node's, or an earlier put's)
    "failed_prefixes",  # replications given up (queue full, retries spent, refused for memory, local data gone bad)
    "replication_retries",  # tries that ended NotReplicated (fewer replicas acknowledged than required)
    "fill_prefixes",  # local misses served by filling a prefix (or its leading part) from the remote tier
    "fill_chunks",  # chunks written to the local tier from the remote tier
    "fill_bytes",  # extent bytes fetched from the remote tier by fills
    "fill_pages",  # pages filled from the remote tier
    "remote_misses",  # look-ups and reads the remote tier could not extend (absent or evicted)
    "remote_checksum_failures",  # remote values that failed their checks (never served)
    "fill_failures",  # fills that found the remote data but could not store it locally (full, read-only)
    "remote_degraded_events",  # times the link turned degraded
)


class RemoteLink:
    def __init__(self, tier: RemoteTier):
        self.tier = tier
        self._lock = threading.Lock()
        self._healthy = threading.Condition(self._lock)
        self._degraded: str | None = None
        self._degraded_since = 0.0
        self._counters = dict.fromkeys(COUNTERS, 0)

    # ------------------------------------------------------------ state
    @property
    def degraded(self) -> str | None:
        """Why the remote tier is not used now, or None."""
        with self._lock:
            return self._degraded

    @property
    def usable(self) -> bool:
        return self.degraded is None

    def mark_degraded(self, reason: str) -> None:
        with self._lock:
            if self._degraded is None:
                self._degraded, self._degraded_since = reason, time.monotonic()
                self._counters["remote_degraded_events"] += 1
                log.warning("remote tier degraded (serving the local tier alone): %s", reason)

    def mark_healthy(self) -> None:
        with self._lock:
            if self._degraded is not None:
                log.warning("remote tier healthy again after %.1fs", time.monotonic() - self._degraded_since)
            self._degraded = None
            self._healthy.notify_all()

    def check_health(self) -> str | None:
        """Ask the engine; degrade or clear the mark accordingly; the reason, or None."""
        reason = self.tier.health()
        if reason is None:
            self.mark_healthy()
        else:
            self.mark_degraded(reason)
        return reason

    def wait_usable(self, timeout_s: float) -> bool:
        """Wait until the link is usable (a health check cleared it), at most ``timeout_s``."""
        with self._lock:
            return self._healthy.wait_for(lambda: self._degraded is None, timeout_s)

    def call(self, fn, *args, **kwargs):
        """``fn(*args)`` on the tier; RemoteUnavailable (other than NotReplicated) degrades the link and propagates."""
        try:
            return fn(*args, **kwargs)
        except (NotReplicated, RemoteFull):
            raise
        except RemoteUnavailable as exc:
            self.mark_degraded(str(exc))
            raise

    # ------------------------------------------------------------ counters
    def count(self, **deltas: int) -> None:
        with self._lock:
            for k, v in deltas.items():
                self._counters[k] += v

    def stats(self) -> dict:
        with self._lock:
            return {"remote_state": f"degraded: {self._degraded}" if self._degraded else "ok", **dict(self._counters)}
