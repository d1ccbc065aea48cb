"""Hands the arena's memfd to same-host clients over a unix socket (SCM_RIGHTS).

A client connects, receives one JSON line ``{"session": id, "arena_bytes": n}``
with the memfd attached, and keeps the connection open for as long as it
uses the session.  It releases leases by writing their ids on the
connection (uint64 little-endian each; no reply), which costs no RPC.  When
the connection closes (the client exited or died), every lease of the
session is released.

Before anything is sent the peer's credentials (``SO_PEERCRED``) are checked
against the allowed uids and gids, and the number of open sessions against
its bound; a refused peer gets one JSON line ``{"error": ...}`` and no
descriptor.  Session ids are random 63-bit integers: a request naming a
session proves it came from the client that was handed that id.  One thread
serves every session with a selector, so idle sessions cost no thread.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import socket
import struct
import threading
from dataclasses import dataclass

from ..contract.errors import FailedPrecondition, InvalidArgument
from . import sockets
from .arena import Arena, new_owner

log = logging.getLogger(__name__)

_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class PeerPolicy:
    """Who may open a session, and how many sessions may be open (pure)."""

    allowed_uids: frozenset[int]
    allowed_gids: frozenset[int]
    max_sessions: int

    def refusal(self, uid: int, gid: int, num_open: int) -> str | None:
        """Why a peer with these credentials is refused, or None to admit it."""
        if uid not in self.allowed_uids and gid not in self.allowed_gids:
            return f"uid {uid} / gid {gid} is not in shm_allowed_uids / shm_allowed_gids"
        if num_open >= self.max_sessions:
            return f"max_shm_sessions ({self.max_sessions}) sessions are open"
        return None


@dataclass
class _Session:
    session_id: int
    conn: socket.socket
    pending: bytes = b""


class ShmSessions:
    def __init__(self, arena: Arena, path: str, policy: PeerPolicy):
        self.arena = arena
        self.path = path
        self.policy = policy
        self._lock = threading.Lock()
        self._sessions: dict[int, _Session] = {}
        self._ended: dict[int, None] = {}  # recently closed sessions (their leases are gone), oldest first
        self._sock: socket.socket | None = None
        self._ident: tuple[int, int] | None = None
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Listen on ``path`` (which ``sockets.claim`` made free)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.path)
        self._ident = sockets.identity(self.path)
        os.chmod(self.path, 0o660)
        sock.listen(64)
        sock.setblocking(False)
        self._sock = sock
        self._selector.register(sock, selectors.EVENT_READ, self._accept)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._serve, name="kvstore-shm", daemon=True)
        self._thread.start()

    @property
    def num_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    def check(self, session_id: int) -> None:
        with self._lock:
            if session_id in self._ended:
                raise FailedPrecondition(f"shm_session: session {session_id} has closed and its leases were released; open a new session")
            if session_id not in self._sessions:
                raise InvalidArgument("shm_session", f"unknown or closed shared-memory session {session_id}")

    def _serve(self) -> None:
        while True:
            for key, _ in self._selector.select():
                if key.data is None:  # woken by stop()
                    return
                key.data(key.fileobj)

    def _accept(self, sock: socket.socket) -> None:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        pid, uid, gid = _CRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
        with self._lock:
            reason = self.policy.refusal(uid, gid, len(self._sessions))
            session = None if reason else _Session(new_owner(), conn)
            if session is not None:  # known before the client hears its id: its first call may come at once
                self._sessions[session.session_id] = session
        if session is None:
            log.warning("shm session refused for pid %d: %s", pid, reason)
            self._send_and_close(conn, {"error": f"shared-memory session refused: {reason}"})
            return
        hello = {"session": session.session_id, "arena_bytes": self.arena.nbytes, "version": 1}
        try:
            conn.settimeout(5.0)  # a fresh socket's buffer takes one line; never stall the selector for long
            socket.send_fds(conn, [(json.dumps(hello) + "\n").encode()], [self.arena.fd])
            conn.setblocking(False)
        except OSError as exc:
            log.warning("shm handoff to pid %d failed: %s", pid, exc)
            self._end(session)
            return
        self._selector.register(conn, selectors.EVENT_READ, lambda _conn: self._read(session))

    @staticmethod
    def _send_and_close(conn: socket.socket, msg: dict) -> None:
        try:
            conn.settimeout(1.0)
            conn.sendall((json.dumps(msg) + "\n").encode())
        except OSError:
            pass
        conn.close()

    def _read(self, session: _Session) -> None:
        try:
            data = session.conn.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._end(session)
            return
        pending = session.pending + data
        usable = len(pending) // 8 * 8
        session.pending = pending[usable:]
        if usable:
            self.arena.release(session.session_id, struct.unpack(f"<{usable // 8}Q", pending[:usable]))

    def _end(self, session: _Session) -> None:
        with self._lock:
            self._sessions.pop(session.session_id, None)
            self._ended[session.session_id] = None
            if len(self._ended) > 65536:
                del self._ended[next(iter(self._ended))]
        try:
            self._selector.unregister(session.conn)
        except (KeyError, ValueError):
            pass  # never registered: the handoff failed
        session.conn.close()
        released = self.arena.release_owner(session.session_id)
        if released:
            log.info("shm session %x closed; released %d leases", session.session_id, released)

    def stop(self) -> None:
        """Stop serving: the listener goes, every session ends (its leases released)."""
        if self._thread is not None:
            self._wake_w.send(b"x")
            self._thread.join()
        if self._sock is not None:
            self._sock.close()
            sockets.release(self.path, self._ident)
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            self._end(session)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
