"""SIGKILL of the daemon during concurrent PutPrefix or PutPages calls loses nothing acknowledged."""

import threading

import numpy as np
from helpers import GEOMETRIES, make_kv, make_tokens

from engine_client.client import KVStoreClient, KVStoreRpcError
from kvstore.hashing import chunk_hashes

GEO = GEOMETRIES[3]  # 24 layers, bf16
TOKENS = 300


def inputs(i: int):
    tokens, kv = make_tokens(TOKENS, i), make_kv(GEO, TOKENS, i)
    if i % 3 == 1:  # shares its first 160 tokens with prefix i-1
        tokens[:160] = make_tokens(TOKENS, i - 1)[:160]
        kv[:, :, :, :160] = make_kv(GEO, TOKENS, i - 1)[:, :, :, :160]
    return tokens, kv


def test_sigkill_during_concurrent_puts(daemon_factory, tmp_path):
    # whether the kill lands inside a put is timing; a round where every put
    # begun had just been acknowledged proves nothing, so try up to three
    cut = any(kill_during_puts(daemon_factory, str(tmp_path / f"round{r}")) for r in range(3))
    assert cut, "no round's kill cut a put that had begun"


def kill_during_puts(daemon_factory, data_dir: str) -> bool:
    """One round: kill the daemon under 4 writers, restart, check; whether a begun put was cut."""
    d = daemon_factory("--index-map-bytes", str(1 << 16), data_dir=data_dir)
    acked: dict[int, str] = {}
    begun: set[int] = set()
    lock = threading.Lock()
    stop = threading.Event()

    def writer(k: int):
        with KVStoreClient(d.target, shm=False, deadline_s=30) as client:
            for i in range(k, 10_000, 4):
                if stop.is_set():
                    return
                tokens, kv = inputs(i)
                with lock:
                    begun.add(i)
                try:
                    res = client.put_prefix(tokens, kv, GEO)
                except KVStoreRpcError:
                    return  # the daemon died under this call
                with lock:
                    acked[i] = res.prefix_id

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    while True:
        with lock:
            if len(acked) >= 12:
                break
        threads[0].join(0.02)
    with lock:  # no put can begin between this snapshot and the kill
        in_flight = begun - set(acked)
        d.kill()
    stop.set()
    for t in threads:
        t.join(60)
    with lock:
        was_cut = bool(in_flight - set(acked))
        ids = {chunk_hashes(inputs(i)[0], GEO, "", "")[-1].hex(): i for i in begun}

    restarted = daemon_factory(data_dir=d.data_dir)
    with KVStoreClient(restarted.target) as client:
        listed = {p.prefix_id for p in client.list_prefixes()}
        assert set(acked.values()) <= listed
        assert listed <= set(ids)  # nothing listed that no put began
        for pid in listed:
            _, kv = inputs(ids[pid])
            with client.read_chunks(pid, range(GEO.num_chunks(TOKENS))) as got:
                np.testing.assert_array_equal(got.to_kv(), kv)
        assert all(r.ok for r in client.verify())
    restarted.stop()
    return was_cut


# ------------------------------------------------------------ pages
PAGES_PER_PUT = 8


def page_inputs(i: int):
    """Put i's keys and pages; when i % 3 == 1 its first half are put i-1's pages."""
    from test_pages import make_pages, page_keys

    keys, pages = page_keys(PAGES_PER_PUT, i), make_pages(GEO, PAGES_PER_PUT, i)
    if i % 3 == 1:
        half = PAGES_PER_PUT // 2
        keys[:half] = page_keys(PAGES_PER_PUT, i - 1)[:half]
        pages[:half] = make_pages(GEO, PAGES_PER_PUT, i - 1)[:half]
    return keys, pages


def test_sigkill_during_concurrent_page_puts(daemon_factory, tmp_path):
    cut = any(kill_during_page_puts(daemon_factory, str(tmp_path / f"round{r}")) for r in range(3))
    assert cut, "no round's kill cut a page put that had begun"


def kill_during_page_puts(daemon_factory, data_dir: str) -> bool:
    """One round: kill the daemon under 4 page writers, restart, check; whether a begun put was cut."""
    from kvstore.config import StoreConfig
    from kvstore.hashing import page_hashes
    from kvstore.store import ChunkStore

    d = daemon_factory("--index-map-bytes", str(1 << 16), data_dir=data_dir)
    acked: set[int] = set()
    begun: set[int] = set()
    lock = threading.Lock()
    stop = threading.Event()

    def writer(k: int):
        with KVStoreClient(d.target, shm=False, deadline_s=30) as client:
            for i in range(k, 10_000, 4):
                if stop.is_set():
                    return
                keys, pages = page_inputs(i)
                with lock:
                    begun.add(i)
                try:
                    client.put_pages(keys, pages, GEO)
                except KVStoreRpcError:
                    return  # the daemon died under this call
                with lock:
                    acked.add(i)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    while True:
        with lock:
            if len(acked) >= 12:
                break
        threads[0].join(0.02)
    with lock:  # no put can begin between this snapshot and the kill
        in_flight = begun - acked
        d.kill()
    stop.set()
    for t in threads:
        t.join(60)
    with lock:
        was_cut = bool(in_flight - acked)
    expected = {}  # every page some put began: key -> pages
    for i in sorted(begun):
        keys, pages = page_inputs(i)
        expected.update({k: p for k, p in zip(keys, pages)})

    restarted = daemon_factory(data_dir=d.data_dir)
    with KVStoreClient(restarted.target) as client:
        for i in sorted(acked):  # every acknowledged page is stored, byte for byte
            keys, pages = page_inputs(i)
            np.testing.assert_array_equal(client.get_pages(keys, GEO), pages)
        keys = sorted(expected)
        present = client.pages_exist(keys, GEO).exists
        stored = [k for k, p in zip(keys, present) if p]
        np.testing.assert_array_equal(client.get_pages(stored, GEO), np.stack([expected[k] for k in stored]))
        assert all(r.ok for r in client.verify())
    restarted.stop()
    with ChunkStore(StoreConfig(data_dir=d.data_dir, min_free_bytes=0)) as store:  # nothing listed that no put began
        known = {h.hex() for h in page_hashes(keys, GEO, "", "")}
        for p in store.list_prefixes():
            assert p["kind"] == "pages" and set(store.describe(p["prefix_id"]).chunk_hashes) <= known
    return was_cut
