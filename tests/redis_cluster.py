"""The local Redis Cluster of the remote tier's tests: ``kvstore_tools.local_cluster`` (kvstore-bench cluster starts the same)."""

from kvstore_tools.local_cluster import LocalRedisCluster, _free_port_pair, available

__all__ = ["LocalRedisCluster", "_free_port_pair", "available"]
