"""Concurrent reads on the shared-memory arena: each that fits is served, in order, with no hold-and-wait.

Three readers of a 7.5 MB prefix on a 64 MiB arena (16 MiB of lease space):
each fits alone, two fit together, three do not.  Taken one group at a
time, each reader held part of what it needed and waited for the rest
until ``lease_wait_seconds`` ran out; admitted whole and in arrival order,
they are all served.
"""

import threading
import time

import numpy as np
import pytest
from daemon import DaemonProcess
from helpers import GEOMETRIES, make_kv, make_tokens

from engine_client.client import KVStoreClient

GEO = GEOMETRIES[3]  # 24 layers in groups of 8, 64 KiB extents
N = 600  # 38 chunks: a full read is 38 x 3 x 64 KiB = 7.5 MB
WAIT_S = 60  # a stalled reader would wait this long before RESOURCE_EXHAUSTED


@pytest.fixture(scope="module")
def contended(tmp_path_factory):
    d = DaemonProcess(str(tmp_path_factory.mktemp("data")), "--shm-arena-bytes", str(64 << 20), "--lease-wait-seconds", str(WAIT_S))
    d.start()
    try:
        with KVStoreClient(d.target) as client:
            pid = client.put_prefix(make_tokens(N, 7), make_kv(GEO, N, 7), GEO).prefix_id
        yield d, pid, make_kv(GEO, N, 7)
    finally:
        d.cleanup()


def _readers(target: str, num: int, per_reader: int, work) -> tuple[list, list[float]]:
    """``num`` clients (each its own shm session) run ``work(client)`` ``per_reader`` times; failures and latencies."""
    failures, took = [], []
    lock = threading.Lock()

    def reader():
        with KVStoreClient(target, deadline_s=WAIT_S) as client:
            for _ in range(per_reader):
                t0 = time.monotonic()
                try:
                    work(client)
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    with lock:
                        failures.append(repr(exc))
                with lock:
                    took.append(time.monotonic() - t0)

    threads = [threading.Thread(target=reader) for _ in range(num)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(4 * WAIT_S)
    assert not any(t.is_alive() for t in threads), "a reader never returned"
    return failures, took


def _no_leases_left(target: str) -> None:
    with KVStoreClient(target) as client:
        deadline = time.monotonic() + 10
        while (leased := client.stats().shm_leased_bytes) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert leased == 0


@pytest.mark.timeout(240)
@pytest.mark.parametrize("num", [3, 8, 16])
def test_full_reads_that_each_fit_are_all_served(contended, num):
    d, pid, kv = contended
    everything = np.arange(GEO.num_chunks(N))

    def full_read(client):
        with client.read_chunks(pid, everything, shm=True) as got:
            assert np.array_equal(got.to_kv(), kv)
            time.sleep(0.05)  # computes on it before releasing, as a worker does

    failures, took = _readers(d.target, num, 2, full_read)
    assert failures == []
    # each waits only for the reads ahead of it, never for lease_wait_seconds
    assert max(took) < WAIT_S / 2, max(took)
    _no_leases_left(d.target)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("num", [3, 8])
def test_full_load_prefetch_streams_that_each_fit_are_all_served(contended, num):
    """A Prefetch period on shared memory is held until the client is done with it: admitted whole too."""
    d, pid, kv = contended
    everything = np.arange(GEO.num_chunks(N))
    periods = GEO.num_groups  # one group per period

    def stream(client):
        with client.prefetch(pid, period_layers=GEO.group_layers, shm=True, speculate=False) as st:
            for p in range(periods):
                st.send(p, everything)
                for g, got in st.groups(p):
                    layers = GEO.group_layer_range(g)
                    assert np.array_equal(got, kv[layers.start : layers.stop])

    failures, took = _readers(d.target, num, 2, stream)
    assert failures == []
    assert max(took) < WAIT_S / 2, max(took)
    _no_leases_left(d.target)
