"""The client's shared-memory session with the daemon.

On a unix socket the daemon hands each client its arena once, over the
``.shm`` socket (SCM_RIGHTS); reads then arrive as descriptors into it and
the extents are zero-copy views, valid until their leases go back on the
same connection (one write, no RPC).  Closing the connection returns every
lease of the session.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import socket
import struct

import numpy as np

# the daemon's words for a session it does not know (it restarted) or has closed, naming its id
_STALE = re.compile(r"shm_session: .*\bsession \d+")


def names_stale_session(code: str, message: str) -> bool:
    """Whether a call failed (``code``, a status name) because the daemon no longer knows its session:
    a new session is then to be opened (``KVStoreClient`` does, once per read)."""
    return code in ("FAILED_PRECONDITION", "INVALID_ARGUMENT") and _STALE.match(message) is not None


class ShmSession:
    """The arena, mapped read-only, and the connection leases go back on."""

    def __init__(self, sock: socket.socket, arena: mmap.mmap, session_id: int):
        self.sock = sock
        self.arena = arena
        self.session_id = session_id

    @classmethod
    def open(cls, path: str, *, required: bool, timeout_s: float | None = None) -> ShmSession | None:
        """The session on ``path``; None when there is none to have and ``required`` is off.

        ``timeout_s`` bounds the connect and the daemon's hello (``TimeoutError``)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout_s)
            sock.connect(path)
            msg, fds, _, _ = socket.recv_fds(sock, 4096, 1)
            sock.settimeout(None)
        except OSError:
            sock.close()
            if required:
                raise
            return None
        try:
            hello = json.loads(msg.decode())
        except ValueError:
            hello = {"error": f"unreadable reply {msg[:80]!r}"}
        if not fds:
            sock.close()
            if required:  # e.g. this uid is not in the daemon's shm_allowed_uids
                raise ConnectionError(f"{path}: {hello.get('error') or 'no arena descriptor received'}")
            return None  # shm=None: the bytes-in-the-stream path serves this client
        (fd,) = fds
        try:
            arena = mmap.mmap(fd, hello["arena_bytes"], prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        return cls(sock, arena, hello["session"])

    def view(self, ref) -> np.ndarray:
        """The bytes a ``ShmRef`` names (a uint8 view into the arena)."""
        return np.frombuffer(self.arena, dtype=np.uint8, count=ref.length, offset=ref.offset)

    def span(self, offset: int, length: int) -> np.ndarray:
        """``length`` bytes of the arena from ``offset`` (a uint8 view): several adjacent extents at once."""
        return np.frombuffer(self.arena, dtype=np.uint8, count=length, offset=offset)

    def release(self, leases: set) -> None:
        """Hand leases back (one write, no RPC); empties ``leases``."""
        if leases and self.sock is not None:
            ids = sorted(leases)
            try:
                self.sock.sendall(struct.pack(f"<{len(ids)}Q", *ids))
            except OSError:
                pass  # the session is gone: the daemon released them already
        leases.clear()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()  # the daemon releases this session's leases
            self.sock = None
