"""The local Redis Cluster of the remote tier's tests: ``tools.local_cluster`` (kvstore-bench cluster starts the same)."""

from tools.local_cluster import LocalRedisCluster, _free_port_pair, available

__all__ = ["LocalRedisCluster", "_free_port_pair", "available"]
