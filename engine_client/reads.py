"""The client end of ReadChunks: one call's messages assembled into a ``ReadResult``.

Over shared memory each period group arrives as descriptors into the arena
and its extents are views, leased until ``ReadResult.release()``; on the
bytes path an extent arrives in frames and is put together here.
"""

from __future__ import annotations

import grpc
import numpy as np

from kvstore.contract import ReadResult, read_from_header

from .rpc import KVStoreRpcError
from .shm import ShmSession


class GroupReader:
    """One ReadChunks call's messages put together into a ``ReadResult`` (no I/O: the sync and asyncio clients feed it)."""

    def __init__(self, prefix_id: str, session: ShmSession | None):
        self.prefix_id = prefix_id
        self.session = session
        self.result: ReadResult | None = None
        self.leases: set[int] = set()
        self._partial: dict = {}
        self._arrived: dict = {}

    def take(self, msg) -> list[int]:
        """Add one response; returns the groups it completed."""
        complete = []
        if msg.HasField("header"):
            self.result = read_from_header(self.prefix_id, msg.header, self.session is not None)
            self.result._release = lambda: release(self.session, self.leases)
            self._arrived = {g: 0 for g in self.result.groups}
        if msg.HasField("shm_group"):
            _take_shm_group(self.result, msg.shm_group, self.session, self.leases)
            complete.append(msg.shm_group.group)
        if msg.HasField("extent") and _take_extent(self.result, msg.extent, self._partial):
            self._arrived[msg.extent.group] += 1
            if self._arrived[msg.extent.group] == len(self.result.chunks):
                complete.append(msg.extent.group)
        if msg.HasField("stats"):
            st = msg.stats
            self.result.bytes_read, self.result.bytes_useful, self.result.num_reads = st.bytes_read, st.bytes_useful, st.num_reads
        return complete


def read_groups(call, prefix_id: str, session: ShmSession | None):
    """Yield ``(read, group)`` as each group of ``call`` (a ReadChunks call) is complete.

    ``read`` is the same ``ReadResult`` each time, filled group by group
    (stats at the end); ``session`` is the shm session the call delivers
    into, None on the bytes path.  If the caller stops early, the leases it
    holds go back.
    """
    reader = GroupReader(prefix_id, session)
    done_ok = False
    try:
        for msg in call:
            for group in reader.take(msg):
                yield reader.result, group
        done_ok = True
    except grpc.RpcError as exc:
        raise KVStoreRpcError.of(exc) from None
    finally:
        if not done_ok:
            _abandon(call, session, reader.leases)


def leases_in(msg) -> list[int]:
    """The leases a response hands over (its shm_group's)."""
    return [ref.lease_id for ref in msg.shm_group.refs] if msg.HasField("shm_group") else []


def _abandon(call, session: ShmSession | None, leases: set) -> None:
    """End a read the caller stopped early and return every lease it holds.

    On the shared-memory path the daemon may have finished the stream
    already, handing over leases in messages not read yet; draining the
    (descriptor-only) rest collects them.  The bytes path holds no lease:
    the call is just cancelled.
    """
    if session is not None:
        try:
            for msg in call:
                leases.update(leases_in(msg))
        except grpc.RpcError:
            pass  # cancelled or failed: the daemon released what it had not handed over
    else:
        call.cancel()
    release(session, leases)


def release(session: ShmSession | None, leases: set) -> None:
    """Hand ``leases`` back on ``session`` (nothing on the bytes path); empties the set."""
    if session is not None:
        session.release(leases)
    leases.clear()


def _take_shm_group(result: ReadResult, grp, session: ShmSession, leases: set) -> None:
    for j, ref in zip(grp.chunks, grp.refs):
        leases.add(ref.lease_id)
        result._views[(grp.group, j)] = session.view(ref)


def _take_extent(result: ReadResult, e, partial: dict) -> bool:
    """Add one bytes frame; True when it completed its extent."""
    key = (e.group, e.chunk)
    buf = partial.get(key)
    if buf is None:
        buf = partial[key] = np.empty(e.extent_bytes, dtype=np.uint8)
    buf[e.offset : e.offset + len(e.data)] = np.frombuffer(e.data, dtype=np.uint8)
    if e.offset + len(e.data) == e.extent_bytes:
        result._views[key] = partial.pop(key)
        return True
    return False
