"""The remote tier: a distributed engine below each node's local NVMe tier (docs/cluster.md).

- ``base.py``: ``RemoteTier``, the interface every engine implements, and
  its errors (``RemoteUnavailable``, ``NotReplicated``, ``RemoteRefused``);
- ``records.py``: keys and values (extents, manifests) and their checks (pure);
- ``redis_cluster.py``: ``RedisClusterTier`` (Redis Cluster, ``WAIT``-acknowledged writes);
- ``memory.py``: ``MemoryTier`` (this process's memory, for tests);
- ``tiers.py``: the implementations by URL scheme, ``make_tier``;
- ``config.py``: ``RemoteConfig`` (``[remote]``);
- ``router.py``: cache-aware routing over the prefix directory.

What moves when is decided by the store's parts: ``store/replication.py``
(local puts to the remote tier, write-back) and ``store/remote_fill.py``
(local misses from the remote tier, through the normal put path).  Nothing
here imports the store.
"""

from .base import NotReplicated, PutOutcome, RemoteRefused, RemoteTier, RemoteUnavailable
from .config import RemoteConfig
from .tiers import make_tier

__all__ = ["NotReplicated", "PutOutcome", "RemoteConfig", "RemoteRefused", "RemoteTier", "RemoteUnavailable", "make_tier"]
