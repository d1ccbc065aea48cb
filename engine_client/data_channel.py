"""The client end of the daemon's raw data connections (TCP clients' bulk reads).

A ``ReadChunks`` call that names a data connection gets its header in the
stream, then every extent on the connection as one frame (read straight
into the extent's buffer with ``recv_into``: one copy, from the kernel),
then its stats in the stream.  ``DataPool`` keeps idle connections for
reuse; a call that fails or is abandoned part-way closes its connection
(its framing is lost) and the next call opens a new one.
"""

from __future__ import annotations

import socket
import threading

import grpc
import numpy as np

from kvstore.contract import read_from_header
from kvstore.contract.data_frames import FRAME, FRAME_MAGIC, HELLO, HELLO_MAGIC, VERSION

from .rpc import KVStoreRpcError


class DataConn:
    """One data connection: its socket, id and secret (from the daemon's hello)."""

    def __init__(self, host: str, port: int, timeout_s: float):
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        magic, version, _, self.conn_id, self.secret = HELLO.unpack(self._exact(HELLO.size))
        if magic != HELLO_MAGIC or version != VERSION:
            self.close()
            raise ConnectionError(f"{host}:{port} is not a kvstore data port of version {VERSION}")

    def _exact(self, n: int) -> bytes:
        buf = bytearray(n)
        self.recv_into(memoryview(buf))
        return bytes(buf)

    def recv_into(self, view: memoryview) -> None:
        got = 0
        while got < len(view):
            n = self.sock.recv_into(view[got:])
            if n == 0:
                raise ConnectionError("the daemon closed the data connection")
            got += n

    def close(self) -> None:
        self.sock.close()


class DataPool:
    """Idle data connections to one daemon's data port."""

    def __init__(self, host: str, port: int, timeout_s: float):
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self._idle: list[DataConn] = []
        self._lock = threading.Lock()

    def take(self) -> DataConn:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return DataConn(self.host, self.port, self.timeout_s)

    def give_back(self, conn: DataConn) -> None:
        with self._lock:
            self._idle.append(conn)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def read_groups_data(call, prefix_id: str, conn: DataConn, pool: DataPool):
    """Yield ``(read, group)`` as each group of ``call`` arrives on ``conn``.

    The connection goes back to ``pool`` once the call has ended cleanly;
    otherwise it is closed and the call cancelled.
    """
    clean = False
    try:
        msgs = iter(call)
        first = next(msgs, None)
        if first is None or not first.HasField("header"):
            raise ConnectionError("the read's stream did not start with its header")
        result = read_from_header(prefix_id, first.header, False)
        wanted = {int(c): int(t) for c, t in zip(result.chunks, result.chunk_tokens)}
        geo = result.geometry
        for group in result.groups:
            for _ in range(len(wanted)):
                magic, g, chunk, size = FRAME.unpack(conn._exact(FRAME.size))
                if magic != FRAME_MAGIC or g != group or chunk not in wanted or (g, chunk) in result._views:
                    raise ConnectionError(f"unexpected frame on the data connection (group {g}, chunk {chunk})")
                if size != geo.extent_bytes(group, wanted[chunk]):
                    raise ConnectionError(f"frame of {size} bytes for an extent of {geo.extent_bytes(group, wanted[chunk])}")
                buf = np.empty(size, dtype=np.uint8)
                conn.recv_into(memoryview(buf))
                result._views[(group, chunk)] = buf
            yield result, group
        for msg in msgs:
            if msg.HasField("stats"):
                st = msg.stats
                result.bytes_read, result.bytes_useful, result.num_reads = st.bytes_read, st.bytes_useful, st.num_reads
        clean = True
    except grpc.RpcError as exc:
        raise KVStoreRpcError.of(exc) from None
    except OSError:
        # A daemon that failed the call closed the connection: its status says why.
        conn.close()  # and a daemon still writing stops at once
        try:
            for _ in call:
                pass
        except grpc.RpcError as exc:
            raise KVStoreRpcError.of(exc) from None
        raise
    finally:
        if clean:
            pool.give_back(conn)
        else:
            call.cancel()
            conn.close()
