"""Remote tier configuration (TOML section ``[remote]``; flags and ``KVSTORE_<KEY>`` variables of the same names)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import MiB, _opt, check_field_types
from ..contract.errors import InvalidArgument


@dataclass(frozen=True)
class RemoteConfig:
    remote_url: str = _opt(
        "",
        "remote tier below the local NVMe tier: redis-cluster://HOST:PORT[,HOST:PORT...] (redis-cluster+tls:// for TLS); "
        "empty: none, the daemon is on its own",
    )
    remote_password_file: str = _opt("", "file holding the remote tier's password (instead of user:password@ in remote_url)")
    remote_tls_ca_file: str = _opt("", "PEM CA bundle that signed the remote tier's TLS certificates (default: the system's)")
    remote_timeout_seconds: float = _opt(2.0, "a remote call that has no answer after this long fails (the local tier serves)")
    remote_wait_replicas: int = _opt(
        1, "replicas that must acknowledge a remote write (Redis WAIT) before its chunks count as replicated; 0: the master alone"
    )
    remote_wait_seconds: float = _opt(0.5, "how long a remote write waits for its replicas' acknowledgement (below remote_timeout_seconds)")
    remote_queue_prefixes: int = _opt(
        4096, "prefixes waiting for replication at most; a put beyond it is counted failed for the remote tier"
    )
    remote_batch_bytes: int = _opt(16 * MiB, "extent bytes moved to or from the remote tier in one batch")
    remote_max_attempts: int = _opt(30, "tries of one prefix's replication (backing off up to 5 s) before it counts as failed")
    remote_ttl_seconds: int = _opt(
        0,
        "time to live of remote values, scaled up by the prefix's cache score and extended by every remote hit "
        "(pair with maxmemory-policy volatile-ttl); 0: none, the engine's own eviction decides",
    )
    remote_health_seconds: float = _opt(1.0, "how often the remote tier's health is checked (and a degraded tier retried)")
    remote_directory: bool = _opt(True, "publish which prefixes this node holds locally (the prefix directory cache-aware routing reads)")
    node_id: str = _opt("", "this node's name in the prefix directory (default: the store id of data_dir)")
    node_address: str = _opt("", "what a router hands back for this node (e.g. its serving engine's host:port)")

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.remote_url:
            from .tiers import check_url

            check_url(self.remote_url)
        for name in ("remote_timeout_seconds", "remote_wait_seconds", "remote_health_seconds"):
            if not getattr(self, name) > 0:
                raise InvalidArgument(name, "must be positive")
        if self.remote_wait_seconds >= self.remote_timeout_seconds:
            raise InvalidArgument(
                "remote_wait_seconds", "must be below remote_timeout_seconds (the WAIT reply must arrive before the socket gives up)"
            )
        if self.remote_wait_replicas < 0:
            raise InvalidArgument("remote_wait_replicas", "must not be negative")
        for name in ("remote_queue_prefixes", "remote_batch_bytes", "remote_max_attempts"):
            if getattr(self, name) < 1:
                raise InvalidArgument(name, "must be positive")
        if self.remote_ttl_seconds < 0:
            raise InvalidArgument("remote_ttl_seconds", "must not be negative (0: no time to live)")
        if any(c.isspace() for c in self.node_id):
            raise InvalidArgument("node_id", "must not contain spaces")

    @property
    def enabled(self) -> bool:
        return bool(self.remote_url)
