"""The client end of ReadChunks: one call's messages assembled into a ``ReadResult``.

Over shared memory each period group arrives as descriptors into the arena
and its extents are views, leased until ``ReadResult.release()``; on the
bytes path an extent arrives in frames and is put together here.
"""

from __future__ import annotations

import grpc
import numpy as np

from kvstore.wire import ReadResult, read_from_header

from .rpc import KVStoreRpcError
from .shm import ShmSession


def read_groups(call, prefix_id: str, session: ShmSession | None):
    """Yield ``(read, group)`` as each group of ``call`` (a ReadChunks call) is complete.

    ``read`` is the same ``ReadResult`` each time, filled group by group
    (stats at the end); ``session`` is the shm session the call delivers
    into, None on the bytes path.  If the caller stops early, the leases it
    holds go back.
    """
    result = None
    leases: set[int] = set()
    partial: dict = {}
    arrived: dict = {}
    done_ok = False
    try:
        for msg in call:
            if msg.HasField("header"):
                result = read_from_header(prefix_id, msg.header, session is not None)
                result._release = lambda: _release(session, leases)
                arrived = {g: 0 for g in result.groups}
            complete = []
            if msg.HasField("shm_group"):
                _take_shm_group(result, msg.shm_group, session, leases)
                complete.append(msg.shm_group.group)
            if msg.HasField("extent") and _take_extent(result, msg.extent, partial):
                arrived[msg.extent.group] += 1
                if arrived[msg.extent.group] == len(result.chunks):
                    complete.append(msg.extent.group)
            if msg.HasField("stats"):
                st = msg.stats
                result.bytes_read, result.bytes_useful, result.num_reads = st.bytes_read, st.bytes_useful, st.num_reads
            for group in complete:
                yield result, group
        done_ok = True
    except grpc.RpcError as exc:
        raise KVStoreRpcError.of(exc) from None
    finally:
        if not done_ok:
            _abandon(call, session, leases)


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
                if msg.HasField("shm_group"):
                    leases.update(ref.lease_id for ref in msg.shm_group.refs)
        except grpc.RpcError:
            pass  # cancelled or failed: the daemon released what it had not handed over
    else:
        call.cancel()
    _release(session, leases)


def _release(session: ShmSession | None, leases: set) -> None:
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
