"""A soak of 16 mixed clients on one daemon: no wrong byte, no leaked lease, bounded memory, no call past its deadline.

Shared-memory readers, bytes-path readers, Prefetch streams, putters that
store, read back and delete their own prefixes, and page users run at once
against a small arena (so they contend for it) for ``SOAK_SECONDS``.  Every
byte read is checked against what was stored; every call is timed against
its deadline.  A short run is in the default suite; the 60-second one is
``-m slow``.
"""

import os
import threading
import time

import numpy as np
import pytest
from helpers import GEOMETRIES, make_kv, make_tokens

from engine_client.client import KVStoreClient, KVStoreRpcError

GEO = GEOMETRIES[3]  # 24 layers in groups of 8, 64 KiB extents
N = 300  # 19 chunks: 3.7 MB read whole
DEADLINE_S = 30.0
SLACK_S = 2.0  # how far past its deadline a call may return (scheduling on a loaded 2-core machine)
RSS_GROWTH_BYTES = 256 << 20  # the daemon's resident set may not grow more than this over the run


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _pages(seed: int, num: int) -> np.ndarray:
    m = GEO.model
    c = GEO.chunk_tokens
    kv = make_kv(GEO, num * c, seed)
    return np.ascontiguousarray(kv.reshape(m.num_layers, 2, m.num_kv_heads, num, c, m.head_dim).transpose(3, 0, 1, 2, 4, 5))


def soak(daemon_factory, seconds: float) -> dict:
    # 16 MiB arena: 4 MiB for stream buffers, so the full reads (3.7 MB) contend for it
    d = daemon_factory("--shm-arena-bytes", str(16 << 20), "--lease-wait-seconds", str(DEADLINE_S))
    shared = {}
    with KVStoreClient(d.target) as c:
        for s in range(3):
            kv = make_kv(GEO, N, 100 + s)
            shared[c.put_prefix(make_tokens(N, 100 + s), kv, GEO).prefix_id] = kv
    pids = list(shared)
    stop_at = time.monotonic() + seconds
    errors, late, counts = [], [], {}
    lock = threading.Lock()

    def timed(kind: str, fn):
        t0 = time.monotonic()
        try:
            fn()
        except KVStoreRpcError as exc:
            with lock:
                errors.append(f"{kind}: {exc}")
        took = time.monotonic() - t0
        with lock:
            counts[kind] = counts.get(kind, 0) + 1
            if took > DEADLINE_S + SLACK_S:
                late.append((kind, took))

    def shm_reader(k, c, rng):
        pid = pids[k % len(pids)]
        chunks = np.sort(rng.choice(GEO.num_chunks(N), int(rng.integers(1, GEO.num_chunks(N) + 1)), replace=False))

        def go():
            with c.read_chunks(pid, chunks, shm=True) as got:
                want = np.concatenate([shared[pid][:, :, :, j * 16 : (j + 1) * 16] for j in chunks], axis=3)
                assert np.array_equal(got.to_kv(), want), "wrong bytes on the shared-memory path"
                time.sleep(0.01)

        timed("shm read", go)

    def bytes_reader(k, c, rng):
        pid = pids[k % len(pids)]
        chunks = np.sort(rng.choice(GEO.num_chunks(N), 3, replace=False))

        def go():
            with c.read_chunks(pid, chunks, shm=False) as got:
                want = np.concatenate([shared[pid][:, :, :, j * 16 : (j + 1) * 16] for j in chunks], axis=3)
                assert np.array_equal(got.to_kv(), want), "wrong bytes on the bytes path"

        timed("bytes read", go)

    def prefetcher(k, c, rng):
        pid = pids[k % len(pids)]
        chunks = np.sort(rng.choice(GEO.num_chunks(N), 4, replace=False))

        def go():
            with c.prefetch(pid, period_layers=GEO.group_layers, shm=True) as st:
                for p in range(GEO.num_groups):
                    st.send(p, chunks)
                    for g, got in st.groups(p):
                        layers = GEO.group_layer_range(g)
                        want = np.concatenate(
                            [shared[pid][layers.start : layers.stop, :, :, j * 16 : (j + 1) * 16] for j in chunks], axis=3
                        )
                        assert np.array_equal(got, want), "wrong bytes from Prefetch"

        timed("prefetch", go)

    def putter(k, c, rng):
        seed = int(rng.integers(1 << 30))
        n = int(rng.integers(17, 120))
        kv = make_kv(GEO, n, seed)

        def go():
            pid = c.put_prefix(make_tokens(n, seed), kv, GEO).prefix_id
            with c.read_chunks(pid, np.arange(GEO.num_chunks(n))) as got:
                assert np.array_equal(got.to_kv(), kv), "wrong bytes read back after a put"
            c.delete(pid)

        timed("put/read/delete", go)

    def pager(k, c, rng):
        seed = int(rng.integers(1 << 30))
        pages = _pages(seed, 2)
        keys = [os.urandom(32), os.urandom(32)]

        def go():
            c.put_pages(keys, pages, GEO)
            assert np.array_equal(c.get_pages(keys, GEO), pages), "wrong bytes from GetPages"

        timed("pages", go)

    roles = [shm_reader] * 4 + [bytes_reader] * 3 + [prefetcher] * 3 + [putter] * 3 + [pager] * 3
    failures = []

    def client(k, role):
        rng = np.random.default_rng(k)
        try:
            with KVStoreClient(d.target, deadline_s=DEADLINE_S) as c:
                while time.monotonic() < stop_at:
                    role(k, c, rng)
        except Exception as exc:  # noqa: BLE001 - an assertion or an unexpected error fails the soak
            with lock:
                failures.append(f"{role.__name__}[{k}]: {exc!r}")

    rss_before = _rss(d.proc.pid)
    threads = [threading.Thread(target=client, args=(k, role)) for k, role in enumerate(roles)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 4 * DEADLINE_S)
    assert not any(t.is_alive() for t in threads), "a client never returned"
    with KVStoreClient(d.target) as c:
        deadline = time.monotonic() + 10
        while (leased := c.stats().shm_leased_bytes) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid, kv in shared.items():  # what was stored before is still exactly there
            with c.read_chunks(pid, np.arange(GEO.num_chunks(N))) as got:
                assert np.array_equal(got.to_kv(), kv)
    return {
        "failures": failures,
        "errors": errors,
        "late": late,
        "counts": counts,
        "leased": leased,
        "rss_growth": _rss(d.proc.pid) - rss_before,
    }


def _check(result: dict) -> None:
    assert result["failures"] == [], result["failures"][:5]
    assert result["errors"] == [], result["errors"][:5]  # every request fits the arena: none may fail
    assert result["late"] == [], result["late"][:5]
    assert result["leased"] == 0
    assert result["rss_growth"] < RSS_GROWTH_BYTES, result["rss_growth"]
    assert len(result["counts"]) == 5 and min(result["counts"].values()) > 0, result["counts"]


@pytest.mark.timeout(300)
def test_short_soak_of_mixed_clients(daemon_factory):
    _check(soak(daemon_factory, 8.0))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_soak_of_16_mixed_clients_for_a_minute(daemon_factory):
    _check(soak(daemon_factory, float(os.environ.get("KVSTORE_SOAK_SECONDS", "60"))))
