"""Pipelined ``GET`` replies received straight into caller memory: a fill's fetch, written by hand because it was measured.

redis-py (with hiredis) makes every value a ``bytes`` object, and a fill then
copies it into the segment image.  On the development VM (loopback, 3
masters, 2 cores) 12 MiB of 64 KiB values took 12.6-13.4 ms that way (one
``MGET`` per chunk in a cluster pipeline, then the copy) and 6.9-8.7 ms
received into the image with ``recv_into``.

This speaks only the RESP2 a ``GET`` answers with (a bulk string, or nil) on
a connection redis-py opened and authenticated (TLS included): ``gets_into``
takes one from each master's pool, sends every request, then reads every
reply.  Any other reply (``-MOVED`` after a failover, ``-LOADING``, ...)
raises ``NotPlain``: the connection is out of step and is dropped, and the
caller reads through redis-py, which follows the redirection.

``tag_runs`` groups keys for ``MGET`` (the redis-py path's reads).
"""

from __future__ import annotations

from collections.abc import Sequence

_BUFFER = 64 << 10  # reply headers and short values pass through this; long payloads are received in place


class NotPlain(Exception):
    """A reply that is not a bulk string or nil (an error such as ``MOVED``): read these keys another way."""


def _pooled_connection(pool):
    """A connection from a redis-py pool (redis-py 5 names the command it is for; later versions take none)."""
    try:
        return pool.get_connection()
    except TypeError:
        return pool.get_connection("GET")


def hash_tag(key: str) -> str | None:
    """The part of ``key`` Redis Cluster hashes to a slot when it has one (``{...}``, non-empty), else None."""
    start = key.find("{")
    end = key.find("}", start + 1) if start >= 0 else -1
    return key[start + 1 : end] if end > start + 1 else None


def tag_runs(keys: Sequence[str]) -> list[list[str]]:
    """``keys`` cut into runs of consecutive keys sharing a hash tag (one ``MGET`` each; a key without one alone)."""
    runs: list[list[str]] = []
    last_tag = None
    for key in keys:
        tag = hash_tag(key)
        if tag is not None and tag == last_tag:
            runs[-1].append(key)
        else:
            runs.append([key])
        last_tag = tag
    return runs


def gets_into(per_master, keys: Sequence[str], outs: Sequence[memoryview], head: int) -> list[bytes | None]:
    """``RemoteTier.get_extents_into`` over redis-py connection pools: ``per_master`` is ``(pool, key indices)``
    for each master owning some of ``keys``.  NotPlain where a reply is not a value or nil."""
    got: list = [None] * len(keys)
    sent = []  # (connection, its pool, the key indices), every request sent before any reply is read
    try:
        for pool, idx in per_master:
            conn = _pooled_connection(pool)
            sent.append((conn, pool, idx))
            conn.connect()
            if getattr(conn, "_sock", None) is None or conn.can_read(timeout=0):
                raise NotPlain("no plain socket, or unread bytes on it")
            conn.send_packed_command([pack_gets([keys[i] for i in idx])], check_health=False)
        while sent:
            conn, pool, idx = sent[0]
            for i, value in zip(idx, read_gets_into(conn._sock, [outs[i] for i in idx], head)):  # noqa: SLF001
                got[i] = value
            sent.pop(0)
            pool.release(conn)
        return got
    finally:
        for conn, pool, _ in sent:  # out of step with its replies: never reused
            conn.disconnect()
            pool.release(conn)


def pack_gets(keys: Sequence[str]) -> bytes:
    """``GET key`` for each key, as one RESP2 request stream."""
    parts = []
    for key in keys:
        k = key.encode()
        parts.append(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(k), k))
    return b"".join(parts)


class _Replies:
    """Buffered reading of one socket's replies."""

    def __init__(self, sock):
        self._sock = sock
        self._buf = bytearray(_BUFFER)
        self._view = memoryview(self._buf)
        self._lo = self._hi = 0

    def _more(self) -> None:
        if self._lo == self._hi:
            self._lo = self._hi = 0
        elif self._hi == len(self._buf):  # keep the unread tail, at the front
            n = self._hi - self._lo
            self._view[:n] = self._view[self._lo : self._hi]
            self._lo, self._hi = 0, n
            if n == len(self._buf):
                raise NotPlain("a reply line longer than the buffer")
        got = self._sock.recv_into(self._view[self._hi :])
        if not got:
            raise ConnectionResetError("the Redis node closed the connection mid-reply")
        self._hi += got

    def line(self) -> bytes:
        while True:
            end = self._buf.find(b"\r\n", self._lo, self._hi)
            if end >= 0:
                out = bytes(self._view[self._lo : end])
                self._lo = end + 2
                return out
            self._more()

    def into(self, out: memoryview) -> None:
        """Exactly ``len(out)`` bytes of the stream into ``out``."""
        n = len(out)
        have = min(n, self._hi - self._lo)
        out[:have] = self._view[self._lo : self._lo + have]
        self._lo += have
        while have < n:
            got = self._sock.recv_into(out[have:])
            if not got:
                raise ConnectionResetError("the Redis node closed the connection mid-reply")
            have += got

    def take(self, n: int) -> bytes:
        out = bytearray(n)
        self.into(memoryview(out))
        return bytes(out)


def read_gets_into(sock, outs: Sequence[memoryview], head: int) -> list[bytes | None]:
    """The replies to ``pack_gets`` of ``len(outs)`` keys, as ``RemoteTier.get_extents_into`` returns them."""
    replies = _Replies(sock)
    got: list[bytes | None] = []
    for out in outs:
        line = replies.line()
        if line[:1] != b"$":
            raise NotPlain(line.decode(errors="replace")[:200])
        size = int(line[1:])
        if size < 0:
            got.append(None)
            continue
        if size == head + len(out):
            value = replies.take(head)
            replies.into(out)
        else:
            value = replies.take(size)
        if replies.take(2) != b"\r\n":
            raise NotPlain("a bulk reply not ended by CRLF")
        got.append(value)
    if replies._lo != replies._hi:  # noqa: SLF001 - nothing may follow the last reply
        raise NotPlain("bytes after the last reply")
    return got
