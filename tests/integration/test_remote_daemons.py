"""Several daemons on one machine sharing a real Redis Cluster as their remote tier.

Each daemon has its own data directory, socket and node id; the cluster
(3 masters, 3 replicas on loopback) is started by the test.  A prefix put
through node A is a full, byte-exact hit on B and C and local on B after
its first read; damaged remote values are never served; with the whole
cluster down every node serves its local tier, says it is degraded, takes
puts, and catches up when the cluster returns; the router sends a request
where its prefix is.  Skipped without ``redis-server`` (``make redis``).
"""

import json
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
import redis_cluster
from helpers import GEOMETRIES, data_root, make_kv, make_tokens
from redis_cluster import LocalRedisCluster

from engine_client.client import KVStoreClient, KVStoreRpcError

redis = pytest.importorskip("redis")  # the remote extra (make test installs it)

pytestmark = pytest.mark.skipif(not redis_cluster.available(), reason="needs redis-server and redis-cli (make redis)")

GEO = GEOMETRIES[2]  # 4 layers, 2 KV heads x 64, float16, one group: 16 KiB chunks


def remote_args(url: str, node: str, *extra: str) -> tuple:
    return (
        "--remote-url",
        url,
        "--node-id",
        node,
        "--node-address",
        f"engine-{node}:8000",
        "--remote-health-seconds",
        "0.2",
        "--remote-timeout-seconds",
        "1",
        "--remote-wait-seconds",
        "0.5",
        "--metrics-address",
        "127.0.0.1:0",
        *extra,
    )


@pytest.fixture(scope="module")
def cluster():
    c = LocalRedisCluster()
    yield c
    c.close()


@pytest.fixture
def three_nodes(cluster, daemon_factory, tmp_path):
    nodes = [daemon_factory(*remote_args(cluster.url, n), data_dir=tmp_path / n) for n in "abc"]
    clients = [KVStoreClient(d.target) for d in nodes]
    yield nodes, clients
    for c in clients:
        c.close()


def wait_for(predicate, timeout_s: float = 20.0, what=""):
    """``predicate()``'s first truthy value within ``timeout_s``; ``what`` (a string, or a callable run on timeout) names it."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what() if callable(what) else what}"
        time.sleep(0.05)
    return value


def replicated(client) -> bool:
    st = client.stats()
    return st.remote_state == "ok" and st.pending_prefixes == 0


def test_a_prefix_put_on_node_a_is_a_full_hit_on_b_and_c_and_local_on_b_after_its_first_read(three_nodes):
    (a, b, c), (ca, cb, cc) = three_nodes
    tokens, kv = make_tokens(1000, 1), make_kv(GEO, 1000, 1)  # 63 chunks, the last of 8 tokens
    put = ca.put_prefix(tokens, kv, GEO)
    wait_for(lambda: replicated(ca), what="replication")
    assert ca.stats().replicated_extents == 63
    for client in (cb, cc):
        hit = client.lookup(tokens, GEO)
        assert (hit.matched_chunks, hit.matched_tokens, hit.prefix_id) == (63, 1000, put.prefix_id)
        with client.read_chunks(hit.prefix_id, list(range(63))) as got:
            assert np.array_equal(got.to_kv(), kv)  # byte-exact, no recompute
    st = cb.stats()
    assert st.fill_chunks == 63 and st.fill_bytes == kv.nbytes
    with cb.read_chunks(put.prefix_id, [0, 5, 62]) as got:  # local now: nothing more is fetched
        assert np.array_equal(got.to_kv()[:, :, :, :16], kv[:, :, :, :16])
    assert cb.stats().fill_bytes == st.fill_bytes
    assert cb.stats().bytes_read > 0
    assert cb.describe(put.prefix_id).num_tokens == 1000
    # a prefix id learned from node A, asked of node C before any look-up there: filled on first use
    tokens2, kv2 = make_tokens(64, 2), make_kv(GEO, 64, 2)
    put2 = ca.put_prefix(tokens2, kv2, GEO)
    wait_for(lambda: replicated(ca), what="replication")
    with cc.read_chunks(put2.prefix_id, [0, 1, 2, 3]) as got:
        assert np.array_equal(got.to_kv(), kv2)
    # and a Prefetch stream opened on node B for a prefix only node A has put
    tokens3, kv3 = make_tokens(48, 33), make_kv(GEO, 48, 33)  # a seed no other test here uses: the cluster is shared
    put3 = ca.put_prefix(tokens3, kv3, GEO)
    wait_for(lambda: replicated(ca), what="replication")
    with cb.prefetch(put3.prefix_id, period_layers=8) as st:
        st.send(0, [0, 1, 2])
        (group, got), *_ = list(st.groups(0))
    assert group == 0 and np.array_equal(got, kv3)


def test_the_router_sends_a_request_where_its_prefix_is(three_nodes):
    (a, b, c), (ca, cb, cc) = three_nodes
    tokens, kv = make_tokens(320, 3), make_kv(GEO, 320, 3)
    ca.put_prefix(tokens, kv, GEO)
    wait_for(lambda: replicated(ca), what="replication")
    request = np.concatenate([tokens, make_tokens(50, 30)])  # the prefix and a new question
    wait_for(lambda: {n.node_id for n in cc.route(request, GEO).nodes} >= {"a", "b", "c"}, what="announcements")
    r = cc.route(request, GEO, loads={"a": 3.0, "b": 0.0, "c": 1.0})
    assert (r.node_id, r.reason, r.local_chunks, r.remote_chunks, r.address) == ("a", "local", 20, 20, "engine-a:8000")
    assert cc.route(request, GEO, loads={"a": 9.0, "b": 0.0, "c": 1.0}, max_load_gap=2.0).node_id == "b"  # a is too busy
    assert cc.route(request, GEO, loads={"b": 2.0, "c": 1.0}).reason == "remote"  # no local copy among these: the idler fills
    assert cc.route(make_tokens(64, 31), GEO, loads={"a": 1.0, "b": 0.5}).reason == "least_loaded"
    cb.lookup(tokens, GEO)  # b fills: local there now
    wait_for(lambda: cb.stats().pending_prefixes == 0, what="directory update")
    wait_for(lambda: cc.route(request, GEO, loads={"a": 3.0, "b": 1.0, "c": 0.0}).node_id == "b", what="b in the directory")
    out = subprocess.run(
        [sys.executable, "-m", "kvstore_tools.admin", "--socket-path", c.socket, "--json", "route", "--tokens", ",".join(map(str, request))]
        + [
            "--layers",
            "4",
            "--kv-heads",
            "2",
            "--head-dim",
            "64",
            "--dtype",
            "float16",
            "--group-layers",
            "8",
            "--load",
            "a=3",
            "--load",
            "b=1",
        ],
        capture_output=True,
        text=True,
        cwd=data_root(),
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["node_id"] == "b"


def test_damaged_remote_values_are_never_served(cluster, three_nodes):
    (a, b, c), (ca, cb, cc) = three_nodes
    tokens, kv = make_tokens(64, 4), make_kv(GEO, 64, 4)  # 4 chunks
    put = ca.put_prefix(tokens, kv, GEO)
    wait_for(lambda: replicated(ca), what="replication")
    last = put.prefix_id  # the last chunk's hash: its extent key carries it
    port = cluster.master_of(f"kvx:{{{last}}}:0:0")
    (key,) = [k for k in cluster.cli(port, "--scan", "--pattern", f"kvx:{{{last}}}:*").split() if k]
    cluster.cli(port, "setrange", key, "100", "garbage")  # overwritten behind the daemons' backs
    with pytest.raises(KVStoreRpcError) as err:
        cb.read_chunks(last, [0, 1, 2, 3])
    assert err.value.code.name == "DATA_LOSS" and "chunk 3" in str(err.value)
    hit = cb.lookup(tokens, GEO)  # the three chunks before it are sound and served
    assert hit.matched_chunks == 3
    with cb.read_chunks(hit.prefix_id, [0, 1, 2]) as got:
        assert np.array_equal(got.to_kv(), kv[:, :, :, :48])
    node = redis.Redis(port=port)
    node.set(key, node.get(key)[:1000])  # truncated
    node.close()
    with pytest.raises(KVStoreRpcError) as err:
        cc.read_chunks(last, [3])
    assert err.value.code.name == "DATA_LOSS"
    assert cb.stats().remote_checksum_failures >= 2 and cc.stats().remote_checksum_failures >= 1


def test_with_the_whole_cluster_down_nodes_serve_locally_say_degraded_and_catch_up(daemon_factory, tmp_path):
    own = LocalRedisCluster()
    try:
        a = daemon_factory(*remote_args(own.url, "a"), data_dir=tmp_path / "a")
        b = daemon_factory(*remote_args(own.url, "b"), data_dir=tmp_path / "b")
        with KVStoreClient(a.target) as ca, KVStoreClient(b.target) as cb:
            old_tokens, old_kv = make_tokens(64, 5), make_kv(GEO, 64, 5)
            cb.put_prefix(old_tokens, old_kv, GEO)
            own.stop_all()
            wait_for(lambda: ca.stats().remote_state.startswith("degraded"), what="degraded")
            assert health(a, "kvstore.v1.RemoteTier") == "NOT_SERVING" and health(a, "") == "SERVING"
            assert scrape(a)["kvstore_remote_degraded"] == 1
            tokens, kv = make_tokens(96, 6), make_kv(GEO, 96, 6)
            t0 = time.monotonic()
            assert ca.put_prefix(tokens, kv, GEO).bytes_written > 0  # acknowledged locally
            assert time.monotonic() - t0 < 5
            assert ca.stats().pending_prefixes >= 1
            assert cb.lookup(tokens, GEO).matched_chunks == 0  # b cannot see it yet: a miss, at local speed
            with cb.read_chunks(cb.lookup(old_tokens, GEO).prefix_id, [0, 3]) as got:  # b's own prefix still serves
                assert got.num_reads >= 1
            own.start_all()
            wait_for(lambda: replicated(ca), timeout_s=60, what="catch-up")
            assert health(a, "kvstore.v1.RemoteTier") == "SERVING" and scrape(a)["kvstore_remote_degraded"] == 0
            wait_for(lambda: cb.stats().remote_state == "ok", what="b healthy")
            assert cb.lookup(tokens, GEO).matched_chunks == 6
            with cb.read_chunks(ca.lookup(tokens, GEO).prefix_id, list(range(6))) as got:
                assert np.array_equal(got.to_kv(), kv)
    finally:
        own.close()


def test_a_wrong_password_tls_or_unknown_host_is_one_line_at_start(cluster, daemon_factory, tmp_path):
    port = redis_cluster._free_port_pair(set())
    cases = {
        "authentication failed": (cluster.url, "--remote-password-file", str(write(tmp_path / "pw", "wrong"))),
        "unknown host": ("redis-cluster://no-such-host.invalid:7000",),
        "TLS": (cluster.url.replace("redis-cluster://", "redis-cluster+tls://"),),
    }
    for i, (needle, (url, *extra)) in enumerate(cases.items()):
        d = daemon_factory("--remote-url", url, *extra, data_dir=tmp_path / f"d{i}", start=False)
        res = subprocess.run(d.args, env=d.env, cwd=data_root(), capture_output=True, text=True, timeout=60)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 1, res.stderr
        assert len(lines) == 1 and lines[0].startswith("kvstore serve: cannot start: remote_url:") and needle in lines[0], lines
    # nobody answering is not a configuration error: the daemon starts degraded and serves its local tier
    d = daemon_factory(*remote_args(f"redis-cluster://127.0.0.1:{port}", "lonely"), data_dir=tmp_path / "lonely")
    with KVStoreClient(d.target) as client:
        assert client.stats().remote_state.startswith("degraded")
        tokens = make_tokens(32, 7)
        client.put_prefix(tokens, make_kv(GEO, 32, 7), GEO)
        assert client.lookup(tokens, GEO).matched_chunks == 2


def write(path, text: str):
    path.write_text(text)
    return path


def health(daemon, service: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "kvstore.cli", "health", "--socket-path", daemon.socket, "--service", service],
        capture_output=True,
        text=True,
        cwd=data_root(),
        timeout=30,
    )
    return out.stdout.strip()


def scrape(daemon) -> dict[str, float]:
    with open(daemon.ready) as fh:
        port = int(fh.read().split()[2])
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_a_master_killed_mid_workload_fails_over_and_loses_no_replicated_prefix(daemon_factory, tmp_path):
    """Node a puts prefixes while a master is SIGKILLed; node b reads all along; every prefix ends up whole on b."""
    own = LocalRedisCluster()
    try:
        a = daemon_factory(*remote_args(own.url, "a"), data_dir=tmp_path / "a")
        b = daemon_factory(*remote_args(own.url, "b"), data_dir=tmp_path / "b")
        with KVStoreClient(a.target) as ca, KVStoreClient(b.target) as cb:
            prefixes = [(make_tokens(128, 100 + i), make_kv(GEO, 128, 100 + i)) for i in range(12)]
            for tokens, kv in prefixes[:4]:
                ca.put_prefix(tokens, kv, GEO)
            wait_for(lambda: replicated(ca), what="replication")
            replicated_before = ca.stats().replicated_prefixes
            assert all(cb.lookup(tokens, GEO).matched_chunks == 8 for tokens, _ in prefixes[:4])  # local on b from here on
            own.kill(own.master_ports()[0])  # SIGKILL, mid-workload
            for i, (tokens, kv) in enumerate(prefixes[4:]):
                assert ca.put_prefix(tokens, kv, GEO).bytes_written > 0  # puts go on: acknowledged locally
                with cb.read_chunks(cb.lookup(prefixes[i % 4][0], GEO).prefix_id, [0, 7]) as got:  # b reads on, from its tier
                    assert got.bytes_useful > 0
            own.wait_ok(timeout_s=30)
            own.start_node(next(p for p in own.ports if p not in own.running()))  # back, as its successor's replica
            own.wait_replicas_online()
            wait_for(lambda: replicated(ca), timeout_s=60, what="catch-up after the failover")
            assert ca.stats().replicated_prefixes >= replicated_before + 8 and ca.stats().failed_prefixes == 0
            # b's link may still be healing from the outage (a degraded link answers a look-up from the local tier alone):
            # a transient miss is allowed, a prefix that stays missing is a loss.
            wait_for(lambda: cb.stats().remote_state == "ok", timeout_s=30, what="node b's remote link healthy again")
            for tokens, kv in prefixes:  # nothing acknowledged was lost; b has every one, byte-exact
                hit = wait_for(lambda t=tokens: (h := cb.lookup(t, GEO)).matched_chunks == 8 and h, 15, lambda: f"a hit on b; {cb.stats()}")
                with cb.read_chunks(hit.prefix_id, list(range(8))) as got:
                    assert np.array_equal(got.to_kv(), kv)
    finally:
        own.close()
