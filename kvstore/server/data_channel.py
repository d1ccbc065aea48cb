"""Raw TCP data connections: bulk reads for remote clients without gRPC's copies.

Python gRPC moves a stream's bytes at ~0.8-0.95 GB/s on loopback here at
its best (256 KiB to 4 MiB messages, nothing else running); a ReadChunks
call with 256 KiB ExtentData frames reached ~150 MB/s, each frame copied
into a ``bytes``, a protobuf, a gRPC slice and back on the other side.  A
plain socket moves 2.5-4 GB/s on the same loopback.  So a TCP client may
open data connections (``kvstore.contract.data_frames`` has the format): the
daemon greets each with its id and a random secret; a ReadChunks call that
names both gets every extent written there with ``sendmsg`` straight from
the read buffer (no copy in the daemon), and its gRPC stream carries only
the header and the stats.  Each read's extents go as soon as that read is
done, while the next group's read runs.

Authentication stays with the call: anyone may connect, but bytes are
written to a connection only for an authenticated call (bearer token and
namespace checked as for every read) that names its secret, which only that
connection was told.  The bytes are not encrypted, so the daemon offers no
data connections when its TCP listener uses TLS (the client then reads in
the stream).  One call writes to a connection at a time; a call that fails
or is abandoned part-way closes its connection (its framing is lost), and a
connection the client closes is dropped.  One thread accepts and watches
connections for their end; the event loop writes (non-blocking sockets).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import selectors
import socket
import threading

from ..contract.data_frames import FRAME, FRAME_MAGIC, HELLO, HELLO_MAGIC, VERSION
from ..contract.errors import FailedPrecondition, PermissionDenied

log = logging.getLogger(__name__)


class _Conn:
    def __init__(self, sock: socket.socket, conn_id: int, secret: bytes):
        self.sock = sock
        self.conn_id = conn_id
        self.secret = secret
        self.held = False  # a call is using it
        self.writers = 0  # sends in progress (send, on the event loop)
        self.watched = False  # registered with the watching thread's selector
        self.ended = False  # no more frames: the peer left, or a call stopped part-way
        self.closed = False


class DataChannels:
    """The data port: accepts connections, hands them to calls, drops ended ones.

    A connection's socket is closed only once it has ended, no call holds
    it, no thread is writing and the watching thread has let it go, so a
    write can never reach a descriptor number the kernel gave to another
    connection.
    """

    def __init__(self, host: str, port: int, *, max_conns: int, send_timeout_s: float):
        self.listener = socket.create_server((host, port), backlog=128)
        self.port = self.listener.getsockname()[1]
        self.max_conns = max_conns
        self.send_timeout_s = send_timeout_s
        self._conns: dict[int, _Conn] = {}
        self._lock = threading.Lock()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.listener, selectors.EVENT_READ, None)
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="kvstore-data", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ calls
    def claim(self, conn_id: int, secret: bytes) -> _Conn:
        """The connection a call names, now held; PERMISSION_DENIED unless the secret is its own."""
        with self._lock:
            conn = self._conns.get(conn_id)
            if conn is None or not hmac.compare_digest(conn.secret, bytes(secret)):
                raise PermissionDenied("data_channel: no open data connection has this id and secret")
            if conn.held:
                raise FailedPrecondition("data_channel: the data connection is in use by another call")
            conn.held = True
            return conn

    def let_go(self, conn: _Conn, *, complete: bool) -> None:
        """The call is done with ``conn``; a call that did not write all it announced ends it."""
        with self._lock:
            conn.held = False
            if not complete:
                self._end(conn)
            self._close_if_done(conn)

    async def send(self, conn: _Conn, group: int, extents) -> None:
        """Frames for ``extents`` (``(chunk, uint8 array)``), written by the event loop from the arrays themselves.

        The socket is non-blocking: a client that reads slowly holds no
        thread, and one that stops reading for ``send_timeout_s`` fails the call.
        """
        loop = asyncio.get_running_loop()
        with self._lock:
            if conn.ended:
                raise FailedPrecondition("data_channel: the data connection closed during the read")
            conn.writers += 1
        try:
            await self._send(conn, group, extents, loop)
        except TimeoutError:  # (an OSError: caught first)
            raise FailedPrecondition(f"data_channel: the client read nothing for {self.send_timeout_s:g}s") from None
        except OSError as exc:  # the client closed it, or the call ended it
            raise FailedPrecondition(f"data_channel: the data connection closed during the read ({exc})") from None
        finally:
            with self._lock:
                conn.writers -= 1
                self._close_if_done(conn)

    async def _send(self, conn: _Conn, group: int, extents, loop) -> None:
        for chunk, data in extents:
            hdr = memoryview(FRAME.pack(FRAME_MAGIC, group, chunk, data.size))
            body = memoryview(data).cast("B")
            try:  # most frames fit the socket's buffer: one system call, no wait
                sent = conn.sock.sendmsg([hdr, body])
            except BlockingIOError:
                sent = 0
            if sent < len(hdr):
                await asyncio.wait_for(loop.sock_sendall(conn.sock, hdr[sent:]), self.send_timeout_s)
                sent = len(hdr)
            if sent - len(hdr) < len(body):
                await asyncio.wait_for(loop.sock_sendall(conn.sock, body[sent - len(hdr) :]), self.send_timeout_s)

    # ------------------------------------------------------------ lifecycle
    def close(self) -> None:
        self._stop = True
        self._thread.join(5)
        with self._lock:
            for conn in list(self._conns.values()):
                self._end(conn)
                conn.watched = False  # the watching thread has stopped
                self._close_if_done(conn)
        self.listener.close()

    @property
    def open_count(self) -> int:
        with self._lock:
            return len(self._conns)

    def _end(self, conn: _Conn) -> None:
        """(lock held) No more frames; shutting the socket down wakes a blocked writer and the watcher."""
        if not conn.ended:
            conn.ended = True
            self._conns.pop(conn.conn_id, None)
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _close_if_done(self, conn: _Conn) -> None:
        """(lock held)"""
        if conn.ended and not conn.held and not conn.writers and not conn.watched and not conn.closed:
            conn.closed = True
            conn.sock.close()

    def _loop(self) -> None:
        while not self._stop:
            for key, _ in self._sel.select(timeout=0.2):
                if key.data is None:
                    self._accept()
                else:
                    self._peer_closed(key.data)
        self._sel.close()

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        with self._lock:
            full = len(self._conns) >= self.max_conns
        if full:
            log.warning("data connection refused: max_data_channels (%d) are open", self.max_conns)
            sock.close()
            return
        conn = _Conn(sock, secrets.randbits(63) or 1, secrets.token_bytes(16))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.send_timeout_s)  # the hello; frames go non-blocking from the event loop (send)
        with self._lock:  # known before the client can name it
            self._conns[conn.conn_id] = conn
            conn.watched = True
        self._sel.register(sock, selectors.EVENT_READ, conn)
        try:
            sock.sendall(HELLO.pack(HELLO_MAGIC, VERSION, 0, conn.conn_id, conn.secret))
            sock.setblocking(False)
        except OSError:
            self._peer_closed(conn)

    def _peer_closed(self, conn: _Conn) -> None:
        """Readable: clients never write, so the peer closed (or this side ended it)."""
        self._sel.unregister(conn.sock)
        with self._lock:
            conn.watched = False
            self._end(conn)
            self._close_if_done(conn)
