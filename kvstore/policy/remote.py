"""How long the remote tier keeps a prefix's values (pure): the daemon's scores, as the engine can use them.

Redis evicts by time to live under ``maxmemory-policy volatile-ttl`` (the
nearest expiry first) and drops what expires.  A prefix read often locally
gets a longer time to live when it is replicated, and every remote hit
extends it again (``RemoteFill``), so what the cluster keeps follows what
the nodes use.  ``base_s = 0``: no time to live (the engine's own
``allkeys-lru`` / ``allkeys-lfu`` decides).
"""

from __future__ import annotations

import math

MAX_STRETCH = 8  # a prefix read 255 times or more lives 8x the base


def ttl_seconds(base_s: int, accesses: int) -> int:
    """``base_s`` stretched by ``1 + log2(1 + accesses)`` (capped at ``MAX_STRETCH``); 0 stays 0."""
    if base_s <= 0:
        return 0
    stretch = min(1.0 + math.log2(1 + max(0, accesses)), MAX_STRETCH)
    return int(base_s * stretch)
