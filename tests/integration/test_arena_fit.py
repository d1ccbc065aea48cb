"""A read whose group can never fit the shared-memory reserve fails at once, naming the sizes, not after lease_wait_seconds."""

import time

import numpy as np
import pytest
from helpers import GEOMETRIES, make_kv, make_tokens

from engine_client.client import KVStoreClient, KVStoreRpcError

GEO = GEOMETRIES[3]  # 24 layers in groups of 8, one group per period
N = 600
WAIT_S = 60  # a stall would last this long; the refusal comes far sooner


@pytest.fixture
def small_arena(daemon_factory):
    # 1 MiB arena, a quarter of it (256 KiB) kept for stream buffers
    d = daemon_factory("--shm-arena-bytes", str(1 << 20), "--lease-wait-seconds", str(WAIT_S))
    with KVStoreClient(d.target) as client:
        pid = client.put_prefix(make_tokens(N, 1), make_kv(GEO, N, 1), GEO).prefix_id
        yield client, pid


def refused(fn) -> tuple[KVStoreRpcError, float]:
    t0 = time.monotonic()
    with pytest.raises(KVStoreRpcError) as info:
        fn()
    return info.value, time.monotonic() - t0


def test_read_chunks_too_big_for_the_reserve_fails_at_once(small_arena):
    client, pid = small_arena
    all_chunks = list(range(GEO.num_chunks(N)))
    exc, took = refused(lambda: client.read_chunks(pid, all_chunks, shm=True).release())
    assert exc.code.name == "RESOURCE_EXHAUSTED"
    assert "can never fit" in str(exc) and "262144 bytes" in str(exc) and "shm_arena_bytes" in str(exc), str(exc)
    assert took < WAIT_S / 4
    with client.read_chunks(pid, all_chunks, shm=False) as got:  # bytes in the stream need no arena
        assert got.to_kv().shape[3] == N
    # every group's lease is held until the client releases the read: 3 groups of 2 extents
    # (128 KiB each) fit one at a time but never together; refused at once too
    exc, took = refused(lambda: client.read_chunks(pid, [0, 1], shm=True).release())
    assert exc.code.name == "RESOURCE_EXHAUSTED" and "393216 bytes can never fit" in str(exc), str(exc)
    assert took < WAIT_S / 4
    with client.read_chunks(pid, [0], shm=True) as got:  # what fits still reads through shared memory
        assert got.to_kv().shape[3] == GEO.chunk_tokens


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "bytes"])
def test_prefetch_period_too_big_for_the_reserve_fails_at_once(small_arena, shm):
    client, pid = small_arena

    def stream():
        with client.prefetch(pid, period_layers=GEO.group_layers, shm=shm) as st:
            st.send(0, np.arange(GEO.num_chunks(N)))
            for _ in st.groups(0):
                pass

    exc, took = refused(stream)
    assert exc.code.name == "RESOURCE_EXHAUSTED"
    msg = str(exc)
    assert "period.chunks: period 0 group 0 needs" in msg and "prefetch reserve (262144 bytes" in msg, msg
    assert took < WAIT_S / 4
    with client.prefetch(pid, period_layers=GEO.group_layers, shm=shm) as st:  # a set that fits streams
        st.send(0, np.arange(2))
        assert len(list(st.groups(0))) == 1
