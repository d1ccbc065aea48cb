"""Small page-batch segments merged into one: real files, real LMDB, crashes by SIGKILL, a real daemon."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from helpers import GEOMETRIES, data_root
from test_pages import make_pages, page_keys

from engine_client.client import KVStoreClient
from kvstore.config import StoreConfig
from kvstore.rebuild import rebuild_index
from kvstore.segment_files import parse_segment_file_name
from kvstore.store import ChunkStore

GEO = GEOMETRIES[0]  # 5 layers in groups of 2, one head, head dim 1, bf16: tiny pages
NS, MODEL = "rag", "m1"
PUTS, PAGES = 32, 3  # 32 sequential puts of 3 pages each


def config(data: str, **kw) -> StoreConfig:
    return StoreConfig(data_dir=data, min_free_bytes=0, index_map_bytes=1 << 20, **kw)


def segment_files(data: str) -> list[str]:
    d = os.path.join(data, "segments")
    return sorted(n for n in os.listdir(d) if parse_segment_file_name(n) is not None)


def put_all(store: ChunkStore, puts: int = PUTS) -> dict[int, str]:
    """``puts`` sequential page puts; seed -> batch id."""
    return {
        seed: store.pages.put(page_keys(PAGES, seed), make_pages(GEO, PAGES, seed), GEO, namespace=NS, model_fingerprint=MODEL).batch_id
        for seed in range(puts)
    }


def check_pages(store: ChunkStore, seeds) -> None:
    for seed in seeds:
        keys = page_keys(PAGES, seed)
        assert store.pages.exists(keys, GEO, namespace=NS, model_fingerprint=MODEL).num_leading == PAGES
        np.testing.assert_array_equal(
            store.pages.get(keys, GEO, namespace=NS, model_fingerprint=MODEL).to_array(), make_pages(GEO, PAGES, seed)
        )


def test_sequential_small_puts_merge_into_few_segments_and_read_back_byte_exact(store_config):
    data = store_config.data_dir
    with ChunkStore(store_config) as store:
        batches = put_all(store)
        before = segment_files(data)
        assert len(before) == PUTS
        # scores on every batch's pages: they must follow the chunks
        for seed, bid in batches.items():
            store.scoring.record_access(bid, range(PAGES), [0])
            store.scoring.report_attention(bid, 0, list(range(PAGES)), [float(seed + 1)] * PAGES)
        scores = {bid: [store.scores.get(u).score for u in store.catalogue.units(bid, range(PAGES), [0])] for bid in batches.values()}
        listed_before = {p["prefix_id"]: p for p in store.list_prefixes()}
        used_before = store.stats()["disk_used_bytes"]

        res = store.capacity.compact_and_merge()
        assert res["segments_merged"] == PUTS and res["merges"] == 1
        after = segment_files(data)
        assert len(after) == 1
        st = store.stats()
        assert st["merges"] == 1 and st["segments_merged"] == PUTS
        assert st["num_segments"] == 1 and st["disk_used_bytes"] == st["bytes_stored"] <= used_before
        assert {p["prefix_id"] for p in store.list_prefixes()} == set(listed_before) == set(batches.values())
        for bid in batches.values():
            assert [store.scores.get(u).score for u in store.catalogue.units(bid, range(PAGES), [0])] == scores[bid]
            assert store.describe(bid).segment_ids == [parse_segment_file_name(after[0])]
        check_pages(store, batches)  # reads count: F_j + 1
        assert all(r["ok"] for r in store.verify())
        units = {bid: store.catalogue.units(bid, range(PAGES), [0]) for bid in batches.values()}
        scores = {bid: [(store.scores.get(u).importance, store.scores.get(u).frequency) for u in us] for bid, us in units.items()}
    with ChunkStore(store_config) as store:  # persisted: reopened, nothing is an orphan and scores stayed
        assert store.last_scan["reclaimed_files"] == 0 and segment_files(data) == after
        for bid, us in units.items():
            assert [(store.scores.get(u).importance, store.scores.get(u).frequency) for u in us] == scores[bid]
        check_pages(store, batches)
        store.delete(batches[0])  # a merged batch deletes alone; the segment stays for the others
        assert not store.pages.exists(page_keys(PAGES, 0), GEO, namespace=NS, model_fingerprint=MODEL).exists.any()
        check_pages(store, range(1, PUTS))


def test_merge_waits_for_min_segments_and_stays_within_the_cap(tmp_path):
    data = str(tmp_path / "data")
    with ChunkStore(config(data, merge_min_segments=8)) as store:
        put_all(store, 7)
        assert store.merger.merge() == {"merges": 0, "segments_merged": 0}  # 7 < 8
        one = next(iter(store.catalogue.segment_records(store.catalogue.segment_ids()).values()))["total_bytes"]
    with ChunkStore(config(data, merge_min_segments=2, merge_small_segment_bytes=one + 1, merge_max_bytes=3 * one)) as store:
        assert store.merger.merge() == {"merges": 2, "segments_merged": 6}  # runs of 3, 3 and 1: a run of one stays
        assert len(segment_files(data)) == 3
        check_pages(store, range(7))


def test_merging_off_and_other_namespaces_never_mix(tmp_path):
    data = str(tmp_path / "data")
    with ChunkStore(config(data, merge_min_segments=0)) as store:
        put_all(store, 10)
        assert store.capacity.compact_and_merge()["segments_merged"] == 0 and len(segment_files(data)) == 10
    with ChunkStore(config(data, merge_min_segments=4)) as store:
        for seed in range(100, 103):  # another namespace: 3 segments of its own, too few
            store.pages.put(page_keys(PAGES, seed), make_pages(GEO, PAGES, seed), GEO, namespace="other", model_fingerprint=MODEL)
        assert store.merger.merge() == {"merges": 1, "segments_merged": 10}
        assert len(segment_files(data)) == 1 + 3
        check_pages(store, range(10))


def test_reads_during_merges_are_byte_exact(tmp_path):
    """GetPages-style reads racing merges: each read is byte-exact (a merge waits for a held batch, a
    read for a merge's claim)."""
    data = str(tmp_path / "data")
    with ChunkStore(config(data, merge_min_segments=2)) as store:
        put_all(store, 12)
        stop, failures, reads = threading.Event(), [], [0]

        def reader(seed0: int) -> None:
            rng = np.random.default_rng(seed0)
            try:
                while not stop.is_set():
                    seed = int(rng.integers(0, 12))
                    got = store.pages.get(page_keys(PAGES, seed), GEO, namespace=NS, model_fingerprint=MODEL).to_array()
                    np.testing.assert_array_equal(got, make_pages(GEO, PAGES, seed))
                    reads[0] += 1
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        try:
            for seed in range(12, 24):  # more small segments, merged again and again
                store.pages.put(page_keys(PAGES, seed), make_pages(GEO, PAGES, seed), GEO, namespace=NS, model_fingerprint=MODEL)
                store.merger.merge()
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert not failures, failures[0]
        assert reads[0] > 0 and store.stats()["merges"] > 0
        check_pages(store, range(24))


def test_a_damaged_segment_is_quarantined_and_left_out(store_config):
    data = store_config.data_dir
    with ChunkStore(store_config) as store:
        batches = put_all(store, 10)
        victim = store.describe(batches[4])
        seg = victim.segment_ids[0]
        info = store.catalogue.segment_info(seg)
        off = int(info.layout.extent_offsets[1, 0])
    with open(os.path.join(data, "segments", segment_files(data)[4]), "r+b") as fh:
        assert parse_segment_file_name(segment_files(data)[4]) == seg
        fh.seek(off)
        b = fh.read(1)
        fh.seek(off)
        fh.write(bytes([b[0] ^ 0xFF]))
    with ChunkStore(store_config) as store:
        assert store.merger.merge() == {"merges": 1, "segments_merged": 9}
        assert seg in store.state.quarantined
        assert len(segment_files(data)) == 2 and seg in {parse_segment_file_name(n) for n in segment_files(data)}
        check_pages(store, [s for s in batches if s != 4])
        assert not store.pages.exists(page_keys(PAGES, 4), GEO, namespace=NS, model_fingerprint=MODEL).exists.any()


@pytest.mark.parametrize("stale_manifest_files", [False, True], ids=["refreshed", "stale"])
def test_rebuild_index_after_a_merge_restores_every_batch(store_config, stale_manifest_files):
    """With the manifest files as the merge left them, or as before it (a crash before their rewrite):
    the merged segment's trailer names every chunk, so each batch is found by hash."""
    data = store_config.data_dir
    manifests = os.path.join(data, "manifests")
    with ChunkStore(store_config) as store:
        batches = put_all(store, 12)
        old = {}
        for n in os.listdir(manifests):
            with open(os.path.join(manifests, n), "rb") as fh:
                old[n] = fh.read()
        assert store.merger.merge()["segments_merged"] == 12
    if stale_manifest_files:
        for n, raw in old.items():
            with open(os.path.join(manifests, n), "wb") as fh:
                fh.write(raw)
    os.unlink(os.path.join(data, "index", "data.mdb"))
    report = rebuild_index(data)
    assert set(report.restored) == set(batches.values()) and report.skipped == {}
    with ChunkStore(store_config) as store:
        check_pages(store, batches)


CHILD = textwrap.dedent(
    """
    import sys
    sys.path[:0] = [{root!r}, {root!r} + "/tests", {tests!r}]
    from test_page_merge import config
    from kvstore.store import ChunkStore

    store = ChunkStore(config({data!r}))
    store.merger.merge()
    print("DONE", flush=True)
    """
)


@pytest.mark.parametrize("step", ["merge:opened", "merge:synced", "merge:committed"])
@pytest.mark.parametrize("lose_index", [False, True], ids=["reopen", "rebuild"])
def test_sigkill_during_a_merge_loses_no_acknowledged_page(tmp_path, step, lose_index):
    data = str(tmp_path / "data")
    with ChunkStore(config(data)) as store:
        batches = put_all(store, 9)
        before = {b: store.describe(b).segment_ids for b in batches.values()}
    tests = os.path.join(data_root(), "tests", "integration")
    env = {**os.environ, "KVSTORE_FAULTS": "1", "KVSTORE_CRASH_AT": step}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD.format(root=data_root(), tests=tests, data=data)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL, f"the child did not reach {step}: {proc.stdout}{proc.stderr}"
    if lose_index:
        os.unlink(os.path.join(data, "index", "data.mdb"))
        report = rebuild_index(data)
        assert set(report.restored) == set(batches.values()) and report.skipped == {}
    with ChunkStore(config(data)) as store:
        assert {p["prefix_id"] for p in store.list_prefixes()} == set(batches.values())
        moved = {b: store.describe(b).segment_ids != before[b] for b in batches.values()}
        if not lose_index:  # all or nothing (a rebuild may restore either copy: both verify)
            assert set(moved.values()) == {step == "merge:committed"}
        check_pages(store, batches)
        assert all(r["ok"] for r in store.verify())
        referenced = {s for b in batches.values() for s in store.describe(b).segment_ids}
        assert {parse_segment_file_name(n) for n in segment_files(data)} == referenced  # no orphan left after open
        st = store.stats()
        assert st["disk_used_bytes"] == st["bytes_stored"]


def test_daemon_merges_sequential_puts_in_the_background(daemon_factory):
    d = daemon_factory("--merge-min-segments", "4")
    n = 20
    with KVStoreClient(d.target, put_coalesce=False) as client:
        for seed in range(n):  # each waits for its answer: a segment each
            res = client.put_pages(page_keys(PAGES, seed), make_pages(GEO, PAGES, seed), GEO, namespace=NS, model_fingerprint=MODEL)
            assert res.pages_written == PAGES
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # merges run after the acknowledgements, on the daemon's pool
            st = client.stats()
            # fewer small segments than merge_min_segments: no merge is due; the old files go after each commit
            if st.num_segments < 4 and len(segment_files(d.data_dir)) == st.num_segments:
                break
            time.sleep(0.05)
        assert st.num_segments < 4 and st.merges >= 1 and st.segments_merged >= n - 3, (st, d.log())
        files = segment_files(d.data_dir)
        assert len(files) == st.num_segments  # from 20 files; the old ones are unlinked
        for seed in range(n):
            got = client.get_pages(page_keys(PAGES, seed), GEO, namespace=NS, model_fingerprint=MODEL)
            np.testing.assert_array_equal(got, make_pages(GEO, PAGES, seed))
        assert len(client.list_prefixes()) == n
        res = client.compact()
        assert res.segments_merged == 0 or len(segment_files(d.data_dir)) < len(files)
