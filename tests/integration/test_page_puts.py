"""Small page puts on a real daemon: concurrent calls share one segment and one batch; `ls` shows one row per model's pages."""

import asyncio
import json
import os
import threading

import numpy as np
from helpers import make_kv, make_tokens
from test_admin_cli import admin
from test_pages import make_pages, page_keys

from engine_client.aio import AsyncKVStoreClient
from engine_client.client import KVStoreClient
from kvstore.contract.geometry import ModelSpec, StoreGeometry

GEO = StoreGeometry(ModelSpec(4, 2, 8, "bfloat16"), chunk_tokens=16, group_layers=2)


def _segments(daemon) -> int:
    return len(os.listdir(os.path.join(daemon.data_dir, "segments")))


def test_concurrent_small_puts_of_threads_share_segments_and_every_page_is_stored(daemon):
    pages, keys = make_pages(GEO, 48, 1), page_keys(48, 1)
    calls = [list(range(2 * i, 2 * i + 3)) for i in range(23)]  # 23 calls of 3 pages, neighbours share one key
    results = [None] * len(calls)
    with KVStoreClient(daemon.target) as client:
        start = threading.Barrier(len(calls))

        def put(i):
            start.wait()
            idx = calls[i]
            results[i] = client.put_pages([keys[j] for j in idx], pages[idx], GEO, namespace="n", model_fingerprint="m")

        threads = [threading.Thread(target=put, args=(i,)) for i in range(len(calls))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        stored = sorted({j for idx in calls for j in idx})
        batches = client.list_prefixes("n")
        assert sum(b.num_chunks for b in batches) == len(stored) == 47  # each page once
        assert len(batches) < len(calls) and _segments(daemon) == len(batches)  # calls shared batches
        assert sum(r.pages_written for r in results) == 47 and all(r.num_pages == 3 for r in results)
        assert all(r.pages_written + r.pages_already_stored == 3 for r in results)
        assert {r.batch_id for r in results if r.pages_written} <= {b.prefix_id for b in batches}
        np.testing.assert_array_equal(client.get_pages([keys[j] for j in stored], GEO, namespace="n", model_fingerprint="m"), pages[stored])


def test_concurrent_puts_of_one_event_loop_share_segments(daemon):
    pages, keys = make_pages(GEO, 40, 2), page_keys(40, 2)

    async def main():
        async with AsyncKVStoreClient(daemon.target) as client:
            res = await asyncio.gather(
                *(client.put_pages(keys[i : i + 2], pages[i : i + 2], GEO, model_fingerprint="m") for i in range(0, 40, 2))
            )
            assert [r.pages_written for r in res] == [2] * 20
            got = await client.get_pages(keys, GEO, model_fingerprint="m")
            return res, got, await client.list_prefixes()

    res, got, batches = asyncio.run(main())
    np.testing.assert_array_equal(got, pages)
    assert len(batches) <= 3 and sum(b.num_chunks for b in batches) == 40  # the first alone, the others behind it
    assert _segments(daemon) == len(batches)


def test_without_coalescing_or_one_after_another_each_put_is_its_batch(daemon):
    pages, keys = make_pages(GEO, 6, 3), page_keys(6, 3)
    with KVStoreClient(daemon.target, put_coalesce=False) as client:
        threads = [
            threading.Thread(target=client.put_pages, args=(keys[i : i + 1], pages[i : i + 1], GEO), kwargs={"namespace": "a"})
            for i in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(client.list_prefixes("a")) == 3
    with KVStoreClient(daemon.target) as client:
        for i in range(3, 6):  # each call waits for its answer: nothing to put together
            client.put_pages(keys[i : i + 1], pages[i : i + 1], GEO, namespace="a")
        assert len(client.list_prefixes("a")) == 6
        np.testing.assert_array_equal(client.get_pages(keys, GEO, namespace="a"), pages)


def test_ls_shows_the_pages_of_a_namespace_and_model_as_one_row(daemon):
    pages, keys = make_pages(GEO, 12, 4), page_keys(12, 4)
    with KVStoreClient(daemon.target, put_coalesce=False) as client:
        for i in range(0, 8, 2):
            client.put_pages(keys[i : i + 2], pages[i : i + 2], GEO, namespace="t", model_fingerprint="qwen")
        client.put_pages(keys[8:], pages[8:], GEO, namespace="t", model_fingerprint="llama")
        pid = client.put_prefix(make_tokens(40, 1), make_kv(GEO, 40, 1), GEO, namespace="t").prefix_id
    text = admin("--socket-path", daemon.socket, "ls")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    qwen = [ln for ln in lines if "qwen" in ln]
    assert len(qwen) == 1 and "(4 batches)" in qwen[0] and " pages " in qwen[0] and " 8 " in qwen[0], lines
    assert len([ln for ln in lines if "llama" in ln]) == 1 and any(pid[:16] in ln for ln in lines)
    assert lines[-1] == "1 prefixes, pages of 2 models in 5 batches"
    objects = json.loads(admin("--socket-path", daemon.socket, "ls", "--json").stdout)
    by_model = {o["model_fingerprint"]: o for o in objects if o["kind"] == "pages"}
    assert (by_model["qwen"]["num_pages"], by_model["qwen"]["num_batches"], by_model["llama"]["num_pages"]) == (8, 4, 4)
    assert len(by_model["qwen"]["batches"]) == 4 and [o["prefix_id"] for o in objects if o.get("kind") == "prefix"] == [pid]
    each = json.loads(admin("--socket-path", daemon.socket, "ls", "--batches", "--json").stdout)
    assert len(each) == 6 and sorted(p["num_chunks"] for p in each if p["kind"] == "pages") == [2, 2, 2, 2, 4]
