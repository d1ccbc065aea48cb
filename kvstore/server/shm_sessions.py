"""Hands the arena's memfd to same-host clients over a unix socket (SCM_RIGHTS).

A client connects, receives one JSON line ``{"session": id, "arena_bytes": n}``
with the memfd attached, and keeps the connection open for as long as it
uses the session.  It releases leases by writing their ids on the
connection (uint64 little-endian each; no reply), which costs no RPC.  When
the connection closes (the client exited or died), every lease of the
session is released.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import struct
import threading

from ..errors import FailedPrecondition, InvalidArgument
from . import sockets
from .arena import Arena

log = logging.getLogger(__name__)


class ShmSessions:
    def __init__(self, arena: Arena, path: str):
        self.arena = arena
        self.path = path
        self._lock = threading.Lock()
        self._conns: dict[int, socket.socket] = {}
        self._ended: dict[int, None] = {}  # recently closed sessions (their leases are gone), oldest first
        self._sock: socket.socket | None = None
        self._ident: tuple[int, int] | None = None
        self._closed = False

    def start(self) -> None:
        """Listen on ``path`` (which ``sockets.claim`` made free)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.path)
        self._ident = sockets.identity(self.path)
        os.chmod(self.path, 0o660)
        sock.listen(64)
        self._sock = sock
        threading.Thread(target=self._accept_loop, name="kvstore-shm-accept", daemon=True).start()

    @property
    def num_sessions(self) -> int:
        with self._lock:
            return len(self._conns)

    def check(self, session_id: int) -> None:
        with self._lock:
            if session_id in self._ended:
                raise FailedPrecondition(
                    f"shm_session: session {session_id} has closed and its leases were released; open a new session"
                )
            if session_id not in self._conns:
                raise InvalidArgument("shm_session", f"unknown or closed shared-memory session {session_id}")

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            session_id = secrets.randbits(63) or 1
            hello = json.dumps({"session": session_id, "arena_bytes": self.arena.nbytes, "version": 1}) + "\n"
            # known before the client hears its id: its first call may come at once
            with self._lock:
                self._conns[session_id] = conn
            try:
                socket.send_fds(conn, [hello.encode()], [self.arena.fd])
            except OSError as exc:
                log.warning("shm handoff failed: %s", exc)
                with self._lock:
                    self._conns.pop(session_id, None)
                conn.close()
                continue
            threading.Thread(target=self._watch, args=(session_id, conn), name="kvstore-shm-session", daemon=True).start()

    def _watch(self, session_id: int, conn: socket.socket) -> None:
        pending = b""
        try:
            while data := conn.recv(65536):
                pending += data
                usable = len(pending) // 8 * 8
                if usable:
                    ids = struct.unpack(f"<{usable // 8}Q", pending[:usable])
                    pending = pending[usable:]
                    self.arena.release(ids, session_id=session_id)
        except OSError:
            pass
        with self._lock:
            self._conns.pop(session_id, None)
            self._ended[session_id] = None
            if len(self._ended) > 65536:
                del self._ended[next(iter(self._ended))]
        released = self.arena.release_session(session_id)
        conn.close()
        if released:
            log.info("shm session %x closed; released %d leases", session_id, released)

    def stop(self) -> None:
        self._closed = True
        if self._sock is not None:
            self._sock.close()
            sockets.release(self.path, self._ident)
        with self._lock:
            conns = list(self._conns.values())
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
