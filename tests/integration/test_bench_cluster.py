"""A small run of ``kvstore-bench cluster`` (2 nodes, a local Redis Cluster): it runs, and its figures hold together."""

import json

import pytest
import redis_cluster
from helpers import run_bench


@pytest.mark.skipif(not redis_cluster.available(), reason="needs redis-server and redis-cli (make redis)")
def test_cluster_bench_smoke(tmp_path):
    out = run_bench(
        "cluster", "--nodes", "2", "--prefixes", "3", "--requests", "10", "--tokens", "64", "--json", "--data-dir", str(tmp_path)
    )
    report = json.loads(out.stdout)
    assert set(report["modes"]) == {"isolated", "remote", "routed"}
    for mode in report["modes"].values():
        assert sum(mode["served"].values()) == 10 and abs(sum(mode["hit_rate"].values()) - 1) < 1e-9
    assert report["modes"]["isolated"]["bytes"]["filled_from_remote"] == 0
    assert report["modes"]["remote"]["bytes"]["replicated_to_remote"] > 0
    routed = report["modes"]["routed"]
    assert routed["served"]["miss"] <= 3  # each prefix computed once in the whole cluster at most
    assert routed["chunk_ms"]["remote_fetch"] > 0
