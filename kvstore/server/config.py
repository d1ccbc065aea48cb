"""Daemon configuration (TOML section ``[server]``; flags of the same names)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from ..config import MiB, _opt, check_field_types, one_of, parse_host_port
from ..contract.errors import InvalidArgument
from ..logs import FORMATS, LEVELS


def tcp_address_text(text: str) -> str:
    """``tcp_address`` as given: empty (off) or host:port with a port in 0-65535 (gRPC would take any number)."""
    if text:
        parse_host_port(text)
    return text


def metrics_address_text(text: str) -> str:
    """``metrics_address`` as given: empty (off) or [host]:port (no host: every interface)."""
    if text:
        parse_host_port(text, need_host=False)
    return text


@dataclass(frozen=True)
class ServerConfig:
    socket_path: str = _opt(".kvstore/run/kvstore.sock", "unix socket for local clients (directory 0750, socket 0660)")
    shm_socket_path: str = _opt("", "unix socket handing out the shared-memory arena (default: <socket_path>.shm)")
    # Older names of renamed keys, still taken in TOML and as (hidden) flags.
    RENAMED_KEYS: ClassVar[dict[str, str]] = {"tls_client_ca_file": "tls_ca_file", "auth_tokens_file": "auth_token_file"}

    tcp_address: str = _opt("", "optional TCP listen address host:port; requires TLS or a bearer token", parse=tcp_address_text)
    tls_cert_file: str = _opt("", "PEM certificate chain for the TCP listener")
    tls_key_file: str = _opt("", "PEM private key for the TCP listener")
    tls_ca_file: str = _opt("", "PEM CA bundle; when set, TCP clients must present a certificate it signed (mTLS)")
    auth_token_file: str = _opt(
        "",
        "bearer tokens TCP clients must send: a file holding one token (it may use every namespace), "
        'or a TOML file mapping tokens to the namespaces each may use ([tokens] TOKEN = ["ns", ...]; "*" = all)',
    )
    enable_admin: bool = _opt(False, "serve the KVStoreAdmin service (inspect, verify)")
    enable_reflection: bool = _opt(False, "serve gRPC server reflection")
    shm_arena_bytes: int = _opt(256 * MiB, "size of the shared-memory arena for same-host reads; 0 disables it")
    prefetch_reserve_fraction: float = _opt(
        0.25, "share of the arena kept for stream buffers (reads in flight, extents the policy keeps out); the rest is the CPU tier"
    )
    gpu_tier_bytes: int = _opt(0, "GPU tier capacity; ignored (0) without a CUDA device")
    gpu_tier_device: str = _opt(
        "auto",
        "GPU tier memory: auto (CUDA if present) | cuda | host (a host-memory stand-in, for tests)",
        parse=one_of("auto", "cuda", "host"),
    )
    cache_policy: str = _opt("score", "tier eviction policy: score (attention x frequency) | lru | lfu | impress")
    max_periods_ahead: int = _opt(2, "period sets a Prefetch client may send beyond the last delivered period")
    shm_slot_bytes: int = _opt(64 * 1024, "allocation unit of the arena (multiple of 4096)")
    lease_wait_seconds: float = _opt(
        10.0,
        "how long a read with no deadline of its own waits for its turn in the arena before RESOURCE_EXHAUSTED "
        "(a call with a deadline waits in order until then)",
    )
    frame_bytes: int = _opt(2 * MiB, "largest payload of one streamed message (below the 4 MiB gRPC default)")
    max_put_bytes: int = _opt(1 << 36, "largest total payload of one PutPrefix stream")
    stream_idle_seconds: float = _opt(60.0, "a stream that sends nothing for this long is cancelled")
    put_idle_seconds: float = _opt(
        10.0,
        "a PutPrefix stream that sends nothing for this long after its header is aborted (DEADLINE_EXCEEDED), its disk reservation freed",
    )
    shm_allowed_uids: str = _opt("", "comma-separated uids that may open a shared-memory session (empty: the daemon's own uid)")
    shm_allowed_gids: str = _opt("", "comma-separated gids that may open a shared-memory session (empty: the daemon's own gid)")
    max_shm_sessions: int = _opt(256, "shared-memory sessions open at once; more connections are refused")
    data_channel: bool = _opt(
        True,
        "offer TCP clients raw data connections for bulk reads (port beside tcp_address; plaintext, so not offered with TLS)",
    )
    data_channel_port: int = _opt(0, "port of the data connections on tcp_address's host (0: a free one, told by the DataChannel RPC)")
    max_data_channels: int = _opt(256, "data connections open at once; more are refused")
    grace_seconds: float = _opt(10.0, "on SIGTERM, how long in-flight calls may finish")
    io_threads: int = _opt(8, "threads running store calls for the async service")
    score_flush_seconds: float = _opt(5.0, "how often changed cache scores are written to the index")
    metrics_address: str = _opt(
        "", "serve Prometheus metrics at http://HOST:PORT/metrics (empty: off; port 0 picks a free one)", parse=metrics_address_text
    )
    log_format: str = _opt(
        "text", "log lines as text (timestamp, level, logger, message) or json (one object per line)", parse=one_of(*FORMATS)
    )
    log_level: str = _opt("info", "least severe log lines written: debug, info, warning or error", parse=one_of(*LEVELS))

    def __post_init__(self) -> None:
        check_field_types(self)
        if not self.socket_path and not self.tcp_address:
            raise InvalidArgument("socket_path", "a unix socket or a TCP address is required")
        if self.shm_slot_bytes <= 0 or self.shm_slot_bytes % 4096:
            raise InvalidArgument("shm_slot_bytes", "must be a positive multiple of 4096")
        if self.shm_arena_bytes < 0 or self.shm_arena_bytes % self.shm_slot_bytes:
            raise InvalidArgument("shm_arena_bytes", "must be a multiple of shm_slot_bytes")
        if not 4096 <= self.frame_bytes <= 4 * MiB - 64 * 1024:
            raise InvalidArgument("frame_bytes", "must be in [4096, 4 MiB - 64 KiB]")
        if self.tcp_address:
            try:
                tcp_address_text(self.tcp_address)
            except ValueError as exc:
                raise InvalidArgument("tcp_address", str(exc)) from None
        if self.tcp_address and not (self.tls_cert_file or self.auth_token_file):
            raise InvalidArgument("tcp_address", "a TCP listener needs TLS (tls_cert_file) or bearer tokens (auth_token_file)")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise InvalidArgument("tls_key_file", "tls_cert_file and tls_key_file go together")
        if self.tls_ca_file and not self.tls_cert_file:
            raise InvalidArgument("tls_ca_file", "mTLS needs tls_cert_file and tls_key_file")
        if not 0.0 < self.prefetch_reserve_fraction <= 1.0:
            raise InvalidArgument("prefetch_reserve_fraction", "must be in (0, 1]")
        if self.gpu_tier_bytes < 0:
            raise InvalidArgument("gpu_tier_bytes", "must be >= 0")
        if self.gpu_tier_device not in ("auto", "cuda", "host"):
            raise InvalidArgument("gpu_tier_device", "must be auto, cuda or host")
        from ..policy import POLICIES

        if self.cache_policy not in POLICIES:
            raise InvalidArgument("cache_policy", f"must be one of {', '.join(POLICIES)}, got {self.cache_policy!r}")
        if self.max_periods_ahead < 1:
            raise InvalidArgument("max_periods_ahead", "must be >= 1")
        if self.io_threads < 1:
            raise InvalidArgument("io_threads", "must be positive")
        for name in ("stream_idle_seconds", "put_idle_seconds"):
            if not getattr(self, name) > 0:
                raise InvalidArgument(name, "must be positive")
        if self.metrics_address:
            from .prom import parse_address

            parse_address(self.metrics_address)
        if self.log_format not in FORMATS:
            raise InvalidArgument("log_format", f"must be text or json, got {self.log_format!r}")
        if self.log_level not in LEVELS:
            raise InvalidArgument("log_level", f"must be one of {', '.join(LEVELS)}, got {self.log_level!r}")
        if self.max_shm_sessions < 1:
            raise InvalidArgument("max_shm_sessions", "must be positive")
        if not 0 <= self.data_channel_port <= 65535:
            raise InvalidArgument("data_channel_port", "must be in [0, 65535]")
        if self.max_data_channels < 1:
            raise InvalidArgument("max_data_channels", "must be positive")
        for name in ("shm_allowed_uids", "shm_allowed_gids"):  # a bad list is refused at start-up
            _id_set(name, getattr(self, name), 0)

    @property
    def allowed_uids(self) -> frozenset[int]:
        return _id_set("shm_allowed_uids", self.shm_allowed_uids, os.getuid())

    @property
    def allowed_gids(self) -> frozenset[int]:
        return _id_set("shm_allowed_gids", self.shm_allowed_gids, os.getgid())

    @property
    def cpu_tier_bytes(self) -> int:
        """The CPU tier: the arena minus the prefetch reserve, in whole slots."""
        tier = int(self.shm_arena_bytes * (1.0 - self.prefetch_reserve_fraction))
        return tier // self.shm_slot_bytes * self.shm_slot_bytes

    @property
    def shm_socket(self) -> str:
        return self.shm_socket_path or (self.socket_path + ".shm" if self.socket_path else "")


def _id_set(name: str, text: str, default: int) -> frozenset[int]:
    """``"1000, 1001"`` -> {1000, 1001}; empty -> {default}."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        return frozenset([default])
    if not all(p.isdigit() for p in parts):
        raise InvalidArgument(name, f"must be comma-separated non-negative integers, got {text!r}")
    return frozenset(int(p) for p in parts)
