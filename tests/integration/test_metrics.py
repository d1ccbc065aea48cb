"""``/metrics`` of a real daemon, scraped over HTTP during a workload, against ``Stats``."""

import json
import os
import threading
import time
import urllib.request

import numpy as np
from helpers import GEOMETRIES, make_kv, make_tokens
from prometheus_client.parser import text_string_to_metric_families

from engine_client.client import KVStoreClient, KVStoreRpcError

GEO = GEOMETRIES[2]  # 4 layers, one period group


def metrics_port(daemon) -> int:
    with open(daemon.ready) as fh:
        return int(fh.read().split()[2])


def scrape(port: int) -> dict[tuple, float]:
    """{(sample name, sorted labels): value} of one scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_move_with_stats_during_a_workload(daemon_factory):
    d = daemon_factory("--metrics-address", "127.0.0.1:0")
    port = metrics_port(d)
    assert port > 0
    before = scrape(port)
    assert before[("kvstore_written_bytes_total", ())] == 0
    assert before[("kvstore_prefixes", ())] == 0
    n = 200
    kv, tokens = make_kv(GEO, n, 5), make_tokens(n, 5)
    with KVStoreClient(d.target) as client:
        pid = client.put_prefix(tokens, kv, GEO).prefix_id
        for shm in (True, False):
            with client.read_chunks(pid, [0, 3, 7], shm=shm) as got:
                assert got.to_kv().shape[3] > 0
        try:
            client.read_chunks(pid, [999])
        except KVStoreRpcError as exc:
            assert exc.code.name == "INVALID_ARGUMENT"
        else:
            raise AssertionError("a chunk out of range was accepted")
        after = scrape(port)
        st = client.stats()
    # the same counters feed both
    assert after[("kvstore_written_bytes_total", ())] == st.bytes_written > 0
    assert after[("kvstore_read_bytes_total", (("source", "disk"),))] == st.bytes_read > 0
    assert after[("kvstore_prefixes", ())] == st.num_prefixes == 1
    assert after[("kvstore_stored_bytes", ())] == st.bytes_stored
    assert after[("kvstore_shm_arena_bytes", ())] == st.shm_arena_bytes == 32 << 20
    assert after[("kvstore_tier_capacity_bytes", (("tier", "cpu"),))] == st.cpu_tier_bytes
    # latency histograms by method and code
    ok_reads = after[("kvstore_rpc_duration_seconds_count", (("code", "OK"), ("method", "ReadChunks")))]
    assert ok_reads == 2
    assert after[("kvstore_rpc_duration_seconds_count", (("code", "INVALID_ARGUMENT"), ("method", "ReadChunks")))] == 1
    assert after[("kvstore_rpc_duration_seconds_count", (("code", "OK"), ("method", "PutPrefix")))] == 1
    inf = after[("kvstore_rpc_duration_seconds_bucket", (("code", "OK"), ("le", "+Inf"), ("method", "ReadChunks")))]
    assert inf == ok_reads
    assert after[("kvstore_rpc_duration_seconds_sum", (("code", "OK"), ("method", "PutPrefix")))] > 0
    # Stats' own per-RPC count is the same bookkeeping (it counts refused calls too)
    latency = {row.rpc: row.count for row in st.latency}
    assert latency["ReadChunks"] == 3 and latency["PutPrefix"] == 1
    assert after[("kvstore_requests_total", ())] >= sum(latency.values()) - 1  # Stats itself is counted after it answers


def test_read_queue_depth_counts_reads_in_flight_and_returns_to_zero(daemon_factory):
    # every disk read is held for 2 s at the start of its preadv: long enough to be scraped in flight
    d = daemon_factory("--metrics-address", "127.0.0.1:0", env={"KVSTORE_FAULTS": "1", "KVSTORE_PAUSE_AT": "read:io:2"})
    port = metrics_port(d)
    n = 200
    kv, tokens = make_kv(GEO, n, 7), make_tokens(n, 7)
    depth = ("kvstore_read_queue_depth", ())
    with KVStoreClient(d.target) as client:
        pid = client.put_prefix(tokens, kv, GEO).prefix_id
        assert scrape(port)[depth] == 0 == client.stats().read_queue_depth
        done = {}

        def read():
            with client.read_chunks(pid, [0, 3, 7], shm=False, coalesce=False) as got:
                done["num_reads"] = got.num_reads

        reader = threading.Thread(target=read)
        reader.start()
        seen = 0
        while reader.is_alive() and seen < 3:  # the three are submitted one after the other
            seen = max(seen, scrape(port)[depth])
        in_flight_stats = client.stats().read_queue_depth  # Stats reads the same gauge
        reader.join()
        assert done["num_reads"] == 3  # three chunks, one group, not coalesced: three preads at once
        assert seen == 3 and in_flight_stats in (0, 3)
        deadline = time.monotonic() + 10  # completions are counted down right after they wake the reader
        while scrape(port)[depth] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert scrape(port)[depth] == 0 == client.stats().read_queue_depth


def test_prefetch_tier_bytes_and_speculation_reach_metrics(daemon_factory):
    d = daemon_factory("--metrics-address", "127.0.0.1:0")
    port = metrics_port(d)
    geo = GEOMETRIES[2]
    n = 300
    kv, tokens = make_kv(geo, n, 6), make_tokens(n, 6)
    with KVStoreClient(d.target) as client:
        pid = client.put_prefix(tokens, kv, geo).prefix_id
        sets = [np.arange(0, 10)]
        for _ in range(2):  # cold (disk), then the CPU tier
            with client.prefetch(pid, period_layers=geo.group_layers) as st:
                st.send(0, sets[0])
                for _g, _kv in st.groups(0):
                    pass
        m = scrape(port)
        s = client.stats()
    assert m[("kvstore_read_bytes_total", (("source", "cpu"),))] == s.bytes_read_cpu > 0
    assert m[("kvstore_tier_hits_total", ())] == s.tier_hit_units > 0
    assert m[("kvstore_tier_misses_total", ())] == s.tier_miss_units > 0
    assert ("kvstore_prefetch_speculative_bytes_total", (("outcome", "wasted"),)) in m


def test_metrics_off_by_default_and_bad_address_is_one_line(daemon_factory, tmp_path):
    d = daemon_factory()
    with open(d.ready) as fh:
        assert int(fh.read().split()[2]) == 0
    bad = daemon_factory("--metrics-address", "nowhere", data_dir=tmp_path / "d2", start=False)
    try:
        bad.start(timeout=20)
    except RuntimeError as exc:
        assert "argument --metrics-address: expected host:port" in str(exc)
    else:
        raise AssertionError("a bad metrics address was accepted")
    assert bad.proc.returncode == 2


def test_json_logs_one_object_per_line_and_refusals_logged_once(daemon_factory):
    d = daemon_factory("--log-format", "json")
    with KVStoreClient(d.target) as client:
        try:
            client.read_chunks("ab" * 32, [0])
        except KVStoreRpcError as exc:
            assert exc.code.name == "NOT_FOUND"
        else:
            raise AssertionError("an unknown prefix was read")
        try:
            client.read_chunks("zz", [0])
        except KVStoreRpcError as exc:
            assert exc.code.name == "INVALID_ARGUMENT"
    d.stop()
    events = [json.loads(line) for line in d.log().splitlines()]  # every line of a start and a stop is an event
    assert events and all({"ts", "level", "logger", "msg"} <= set(e) for e in events)
    refused = [e for e in events if e["msg"].startswith("refused ")]
    assert len(refused) == 2, refused
    assert "code=NOT_FOUND" in refused[0]["msg"] and refused[0]["level"] == "WARNING"
    assert "code=INVALID_ARGUMENT field=prefix_id" in refused[1]["msg"], refused[1]
    assert any(e["msg"] == "stopped" for e in events)
    assert os.path.exists(d.log_path)


def test_grafana_dashboard_queries_only_exported_metrics(daemon_factory):
    import re

    d = daemon_factory("--metrics-address", "127.0.0.1:0")
    with KVStoreClient(d.target) as client:
        client.stats()
    names = {name for name, _labels in scrape(metrics_port(d))}
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "grafana-dashboard.json")) as fh:
        dashboard = json.load(fh)
    queried = {m for p in dashboard["panels"] for t in p["targets"] for m in re.findall(r"kvstore_[a-z_]+", t["expr"])}
    assert len(queried) >= 10
    assert queried <= names, sorted(queried - names)


def test_process_series_and_token_hit_counters(daemon_factory):
    d = daemon_factory("--metrics-address", "127.0.0.1:0")
    port = metrics_port(d)
    geo = GEOMETRIES[2]
    n = 200  # 12 whole chunks of 16 tokens and 8 more
    kv, tokens = make_kv(geo, n, 9), make_tokens(n, 9)
    with KVStoreClient(d.target) as client:
        keys, c, mo = [bytes([i + 1]) * 8 for i in range(3)], geo.chunk_tokens, geo.model
        pages = make_kv(geo, 2 * c, 11).reshape(mo.num_layers, 2, mo.num_kv_heads, 2, c, mo.head_dim).transpose(3, 0, 1, 2, 4, 5)
        client.put_prefix(tokens, kv, geo)
        client.put_pages(keys[:2], np.ascontiguousarray(pages), geo)  # [pages, layers, 2, kv_heads, chunk_tokens, head_dim]
        before = scrape(port)  # the client's puts ask Lookup and PagesExist first: count from here
        assert client.lookup(tokens, geo).matched_tokens == n
        assert client.lookup(make_tokens(64, 10), geo).matched_tokens == 0
        assert client.pages_exist(keys, geo).num_leading == 2
        m = scrape(port)
    lookup = ("kvstore_lookup_requested_tokens_total", ()), ("kvstore_lookup_hit_tokens_total", ())
    assert [m[k] - before[k] for k in lookup] == [n + 64, n]
    pages = ("kvstore_pages_requested_tokens_total", ()), ("kvstore_pages_hit_tokens_total", ())
    assert [m[k] - before[k] for k in pages] == [3 * geo.chunk_tokens, 2 * geo.chunk_tokens]
    assert m[("process_resident_memory_bytes", ())] > 0 and m[("process_open_fds", ())] > 0
    assert any(name == "python_info" for name, _ in m) and any(name.startswith("python_gc_") for name, _ in m)
    names = {name for name, _ in m}
    assert {"kvstore_tier_extents", "kvstore_pinned_extents", "kvstore_prefetch_speculative_cancelled_extents_total"} <= names
    assert not [name for name in names if name.endswith(("_units", "_units_total"))]
