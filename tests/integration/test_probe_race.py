"""Concurrent first writes on a fresh store share one O_DIRECT probe."""

import threading

from helpers import GEOMETRIES, make_kv, make_tokens

from kvstore.config import StoreConfig
from kvstore.store import ChunkStore

GEO = GEOMETRIES[0]
NUM_THREADS = 16


def test_concurrent_first_puts_on_fresh_stores_all_succeed(tmp_path):
    for round_ in range(6):
        with ChunkStore(StoreConfig(data_dir=str(tmp_path / f"d{round_}"), min_free_bytes=0)) as store:
            barrier = threading.Barrier(NUM_THREADS)
            errors = []

            def put(i):
                barrier.wait()
                try:
                    store.put(make_tokens(40, i), make_kv(GEO, 40, i), GEO)
                except Exception as exc:  # noqa: BLE001 - collected and asserted below
                    errors.append(exc)

            threads = [threading.Thread(target=put, args=(i,)) for i in range(NUM_THREADS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == []
            assert len(store.list_prefixes()) == NUM_THREADS
