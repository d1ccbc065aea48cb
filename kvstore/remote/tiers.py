"""The remote tier implementations by URL scheme, and the one place a configured tier is built."""

from __future__ import annotations

from ..contract.errors import InvalidArgument
from .base import RemoteTier
from .urls import REDIS_SCHEMES, parse_url

SCHEMES = (*REDIS_SCHEMES, "memory")


def check_url(url: str) -> None:
    """InvalidArgument naming ``remote_url`` unless it is a URL some tier takes."""
    scheme = url.partition("://")[0]
    if scheme not in SCHEMES or "://" not in url:
        raise InvalidArgument("remote_url", f"must start with one of {', '.join(s + '://' for s in SCHEMES)}, got {url!r}")
    if scheme in REDIS_SCHEMES:
        try:
            parse_url(url)
        except ValueError as exc:
            raise InvalidArgument("remote_url", str(exc)) from None


def make_tier(config) -> RemoteTier:
    """The tier ``config`` (a ``RemoteConfig``) names, not yet connected; InvalidArgument for what is wrong with its keys."""
    url = config.remote_url
    check_url(url)
    if url.startswith("memory://"):
        from .memory import MemoryTier

        return MemoryTier()
    password = None
    if config.remote_password_file:
        try:
            with open(config.remote_password_file) as fh:
                password = fh.read().strip()
        except OSError as exc:
            raise InvalidArgument("remote_password_file", f"cannot read {config.remote_password_file}: {exc.strerror}") from None
    try:
        from .redis_cluster import RedisClusterTier
    except ImportError:  # pragma: no cover - the extra is missing
        raise InvalidArgument("remote_url", "needs the redis client: pip install 'kvstore[remote]'") from None
    try:
        return RedisClusterTier.from_url(
            url,
            password=password,
            tls_ca_file=config.remote_tls_ca_file,
            timeout_s=config.remote_timeout_seconds,
            wait_replicas=config.remote_wait_replicas,
            wait_s=config.remote_wait_seconds,
        )
    except ImportError:
        raise InvalidArgument("remote_url", "needs the redis client: pip install 'kvstore[remote]'") from None
