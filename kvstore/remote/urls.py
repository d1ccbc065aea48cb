"""Remote tier URLs: ``redis-cluster[+tls]://[user[:password]@]host:port[,host:port...]``, parsed (pure)."""

from __future__ import annotations

from urllib.parse import unquote

REDIS_SCHEMES = ("redis-cluster", "redis-cluster+tls")


def parse_url(url: str) -> tuple[bool, list[tuple[str, int]], str | None, str | None]:
    """``redis-cluster[+tls]://[user[:password]@]host:port[,host:port...]`` -> (tls, nodes, username, password).

    ValueError naming what is wrong.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in REDIS_SCHEMES:
        raise ValueError(f"expected {' or '.join(s + '://' for s in REDIS_SCHEMES)}host:port[,host:port...], got {url!r}")
    username = password = None
    if "@" in rest:
        cred, rest = rest.rsplit("@", 1)
        user, has_pw, pw = cred.partition(":")
        username, password = unquote(user) or None, unquote(pw) if has_pw else None
    nodes = []
    for part in rest.strip("/").split(","):
        host, colon, port = part.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected host:port in {url!r}, got {part!r}")
        nodes.append((host.strip("[]"), int(port)))
    return scheme.endswith("+tls"), nodes, username, password
