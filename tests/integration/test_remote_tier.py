"""The remote tier's contract over every engine, and Redis Cluster's durability under a master's death.

The same checks run on ``MemoryTier`` and on ``RedisClusterTier`` over a
real local cluster (3 masters, 3 replicas; skipped without ``redis-server``,
``make redis``).  The failover test kills a master with SIGKILL in the
middle of a stream of acknowledged writes and counts what survived.
"""

import hashlib
import threading
import time

import numpy as np
import pytest
import redis_cluster
from redis_cluster import LocalRedisCluster

from kvstore.remote.base import NotReplicated, PutOutcome, RemoteRefused, RemoteTier, RemoteUnavailable
from kvstore.remote.memory import MemoryTier

redis = pytest.importorskip("redis")  # the remote extra (make test installs it)

needs_redis = pytest.mark.skipif(not redis_cluster.available(), reason="needs redis-server and redis-cli (make redis)")


@pytest.fixture(scope="module")
def cluster():
    if not redis_cluster.available():
        pytest.skip("needs redis-server and redis-cli (make redis)")
    c = LocalRedisCluster()
    yield c
    c.close()


def redis_tier(url: str, **kwargs):
    from kvstore.remote.redis_cluster import RedisClusterTier

    tier = RedisClusterTier.from_url(url, timeout_s=kwargs.pop("timeout_s", 2.0), **kwargs)
    tier.connect()
    return tier


@pytest.fixture(params=["memory", pytest.param("redis-cluster", marks=needs_redis)])
def tier(request):
    if request.param == "memory":
        yield MemoryTier()
        return
    t = redis_tier(request.getfixturevalue("cluster").url)
    yield t
    t.close()


def test_the_contract_every_engine_keeps(tier, request):
    tag = request.node.callspec.id + str(time.monotonic_ns())  # fresh keys on the shared cluster
    a, b = f"kvx:{{a{tag}}}:0:1", f"kvx:{{b{tag}}}:1:2"
    assert tier.put_extents([(a, b"A" * 100), (b, b"B" * 7)]) == PutOutcome(2, 107, 0)
    assert tier.put_extents([(a, b"other"), (b, b"other")], ttl_s=60) == PutOutcome(0, 0, 2)  # present keys are kept
    assert tier.get_extents([a, "kvx:{none}:0:0", b]) == [b"A" * 100, None, b"B" * 7]
    assert tier.get_extent(a) == b"A" * 100
    a1, a2 = f"kvx:{{a{tag}}}:1:1", f"kvx:{{a{tag}}}:2:1"  # a chunk's groups share its hash tag: one MGET on a cluster
    tier.put_extents([(a2, b"a2")])
    assert tier.get_extents([a, a1, a2, b, a, a2]) == [b"A" * 100, None, b"a2", b"B" * 7, b"A" * 100, b"a2"]
    outs = [memoryview(bytearray(n)) for n in (96, 5, 0, 3)]  # a's 4 + 96, absent, b's 7 (not 4 + 0), a2's 2 (not 4 + 3)
    assert tier.get_extents_into([a, a1, b, a2], outs, 4) == [b"AAAA", None, b"B" * 7, b"a2"]
    assert bytes(outs[0]) == b"A" * 96 and bytes(outs[1]) == bytes(5) and bytes(outs[3]) == bytes(3)  # a mismatched length writes nothing
    assert tier.exists([a, "kvx:{none}:0:0"]) == [True, False]
    tier.touch([a, "kvx:{none}:0:0"], 120)
    mid, h1, h2 = hashlib.sha256(tag.encode()).hexdigest(), "a" * 64, "b" * 64
    tier.put_manifest(mid, b"manifest bytes", [h1, h2])
    assert tier.get_manifest(mid) == b"manifest bytes"
    assert tier.get_manifest("f" * 64) is None
    assert tier.holders([h1, "c" * 64, h2]) == [mid, None, mid]
    d1, d2 = f"d1{tag}", f"d2{tag}"
    tier.directory_add("node-a", [d1, d2])
    tier.directory_add("node-b", [d1])
    assert tier.directory([d1, d2, "none"]) == [frozenset({"node-a", "node-b"}), frozenset({"node-a"}), frozenset()]
    tier.directory_remove("node-a", [d1])
    assert tier.directory([d1]) == [frozenset({"node-b"})]
    if hasattr(tier, "masters_short_of_replicas"):
        assert tier.masters_short_of_replicas() == []  # every master has its replica
    tier.announce(f"n{tag}", "unix:/x.sock", 30)
    assert tier.nodes()[f"n{tag}"] == "unix:/x.sock"
    assert tier.health() is None


@needs_redis
def test_start_up_refusals_are_told_apart_from_a_cluster_that_is_down(cluster):
    with pytest.raises(RemoteRefused, match="authentication"):
        redis_tier(cluster.url, password="not-the-password")
    with pytest.raises(RemoteRefused, match="unknown host"):
        redis_tier("redis-cluster://no-such-host.invalid:7000")
    with pytest.raises(RemoteRefused, match="TLS"):
        redis_tier(cluster.url.replace("redis-cluster://", "redis-cluster+tls://"), timeout_s=1.0)
    port = redis_cluster._free_port_pair(set())  # nobody listens there
    with pytest.raises(RemoteUnavailable):
        redis_tier(f"redis-cluster://127.0.0.1:{port}", timeout_s=0.5)


@needs_redis
def test_a_master_killed_mid_writes_loses_no_acknowledged_value():
    c = LocalRedisCluster()
    tier = redis_tier(c.url, timeout_s=1.0, wait_s=0.5)
    acked: dict[str, bytes] = {}
    refused = {"unavailable": 0, "not_replicated": 0}
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            batch = [(f"kvx:{{k{i + j}}}:0:0", (b"%08d" % (i + j)) * 512) for j in range(8)]  # 4 KiB values over every slot
            try:
                tier.put_extents(batch)
                acked.update(batch)
                i += len(batch)
            except NotReplicated:
                refused["not_replicated"] += 1  # written, not acknowledged: retried with the same keys
            except RemoteUnavailable:
                refused["unavailable"] += 1
                time.sleep(0.05)

    try:
        thread = threading.Thread(target=writer)
        thread.start()
        while len(acked) < 400:
            time.sleep(0.01)
        victim = c.master_of("kvx:{k0}:0:0")
        acked_at_kill = len(acked)
        c.kill(victim)  # SIGKILL: no shutdown, no last sync
        t0 = time.monotonic()
        while c.master_of("kvx:{k0}:0:0") in (victim, None):  # until its replica is promoted
            assert time.monotonic() - t0 < 30
            time.sleep(0.05)
        failover_s = time.monotonic() - t0
        c.wait_ok()
        time.sleep(1.0)  # writes go on against the new master (unreplicated: it has no replica yet)
        c.start_node(victim)  # the old master comes back as the new master's replica
        c.wait_ok()
        c.wait_replicas_online()
        time.sleep(1.0)
        stop.set()
        thread.join(60)
        reader = redis_tier(c.url)
        keys = sorted(acked)
        got = []
        for i in range(0, len(keys), 256):
            got += reader.get_extents(keys[i : i + 256])
        lost = [k for k, v in zip(keys, got) if v != acked[k]]
        print(
            f"\nfailover: {acked_at_kill} acknowledged before the kill, {len(acked)} in all, lost {len(lost)}, "
            f"cluster ok again after {failover_s:.1f}s, refused tries {refused}"
        )
        assert not lost
        assert len(acked) > acked_at_kill  # writes were acknowledged again after the failover
        reader.close()
    finally:
        stop.set()
        tier.close()
        c.close()


@needs_redis
def test_a_bounded_cluster_evicts_and_an_evicted_chunk_is_a_miss_never_an_error(tmp_path):
    """maxmemory with allkeys-lru on every master: old prefixes leave the cluster, their look-ups on another node miss."""
    from helpers import GEOMETRIES, make_kv, make_tokens

    from kvstore.config import StoreConfig
    from kvstore.remote.config import RemoteConfig
    from kvstore.store import ChunkStore

    geo = GEOMETRIES[2]  # 16 KiB chunks
    c = LocalRedisCluster(maxmemory="4mb", policy="volatile-ttl")
    stores = []
    try:
        for name in "ab":
            cfg = RemoteConfig(remote_url=c.url, node_id=name, remote_ttl_seconds=3600)
            stores.append(
                ChunkStore(StoreConfig(data_dir=str(tmp_path / name), min_free_bytes=0), remote=redis_tier(c.url), remote_config=cfg)
            )
        a, b = stores
        prefixes = [(make_tokens(512, 50 + i), make_kv(geo, 512, 50 + i)) for i in range(24)]  # 24 x 512 KiB over 12 MiB of cluster
        for tokens, kv in prefixes:
            a.put(tokens, kv, geo)
            assert a.replicator.wait_idle(30)
        stats = a.remote_stats()
        assert stats["replicated_prefixes"] == 24 and stats["failed_prefixes"] == 0
        node = redis.Redis(port=c.master_ports()[0])
        # Redis may go on evicting after the last write (eviction-tenacity), so a scanned key can be gone (TTL -2) by its TTL call.
        ttls = [t for t in (node.ttl(k) for k in node.scan_iter("kvx:*", count=1000)) if t != -2]
        assert ttls and all(3600 <= t <= 8 * 3600 for t in ttls)  # remote_ttl_seconds, stretched by the prefix's reads (policy/remote.py)
        node.close()
        hits = [b.lookup(tokens, geo).matched_chunks for tokens, _ in prefixes]
        assert hits[-1] == 32  # the newest is whole
        assert min(hits) < 32  # the oldest were evicted: a miss, or their leading part
        assert b.remote_stats()["remote_checksum_failures"] == 0
        for (tokens, kv), n in zip(prefixes, hits):
            if n:
                pid = b.lookup(tokens, geo).prefix_id
                assert np.array_equal(b.read(pid, range(n)).to_kv(), kv[:, :, :, : n * 16])
    finally:
        for s in stores:
            s.close()
        c.close()


FILL_CHILD = """
import sys, time
sys.path[:0] = [{root!r}, {root!r} + "/tests"]
import numpy as np
from helpers import GEOMETRIES, make_tokens
from kvstore.config import StoreConfig
from kvstore.remote import RemoteConfig, make_tier
from kvstore.store import ChunkStore

cfg = RemoteConfig(remote_url={url!r}, node_id="b")
store = ChunkStore(StoreConfig(data_dir={data!r}, min_free_bytes=0), remote=make_tier(cfg), remote_config=cfg)
for seed in range(3):
    tokens = make_tokens(256, 70 + seed)
    hit = store.lookup(tokens, GEOMETRIES[2])
    assert hit.matched_chunks == 16, hit
    store.read(hit.prefix_id, range(16))  # served while its write runs behind (killed at {step})
time.sleep(30)
"""


@needs_redis
@pytest.mark.parametrize("step", ["put:opened", "put:synced"])
def test_sigkill_while_fills_are_written_behind_leaves_only_whole_listed_prefixes(cluster, tmp_path, step):
    """A node killed while it writes remote hits behind their reads: on restart every listed prefix is whole and
    byte-exact, no orphan file is left, and the prefixes it lost are filled again from the remote tier."""
    import os
    import signal
    import subprocess
    import sys

    from helpers import GEOMETRIES, data_root, make_kv, make_tokens

    from kvstore.config import StoreConfig
    from kvstore.remote.config import RemoteConfig
    from kvstore.segment_files import parse_segment_file_name
    from kvstore.store import ChunkStore

    geo = GEOMETRIES[2]
    ns_tokens = [make_tokens(256, 70 + s) for s in range(3)]
    kvs = [make_kv(geo, 256, 70 + s) for s in range(3)]

    def node(name):
        cfg = RemoteConfig(remote_url=cluster.url, node_id=name)
        return ChunkStore(StoreConfig(data_dir=str(tmp_path / name), min_free_bytes=0), remote=redis_tier(cluster.url), remote_config=cfg)

    with node("a") as a:
        for tokens, kv in zip(ns_tokens, kvs):
            a.put(tokens, kv, geo)
        assert a.replicator.wait_idle(30)
    env = {**os.environ, "KVSTORE_FAULTS": "1", "KVSTORE_CRASH_AT": step}
    child = FILL_CHILD.format(root=data_root(), url=cluster.url, data=str(tmp_path / "b"), step=step)
    proc = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, f"the child did not reach {step}: {proc.stdout}{proc.stderr}"
    with node("b") as b:
        listed = {p["prefix_id"] for p in b.list_prefixes()}
        assert listed == set()  # killed opening the first fill's file, or after syncing it and before its commit
        assert all(r["ok"] for r in b.verify())
        seg_dir = b.segment_dir
        referenced = {s for pid in listed for s in b.describe(pid).segment_ids}
        assert {parse_segment_file_name(n) for n in os.listdir(seg_dir) if n.endswith(".kvs")} == referenced  # no orphan
        for tokens, kv in zip(ns_tokens, kvs):  # what was lost is filled again, byte-exact
            hit = b.lookup(tokens, geo)
            assert hit.matched_chunks == 16
            assert np.array_equal(b.read(hit.prefix_id, range(16)).to_kv(), kv)


@needs_redis
def test_reads_into_memory_follow_a_moved_slot_through_the_cluster_client(cluster, monkeypatch):
    """Keys sent to a master that does not own their slot answer ``-MOVED``: the read drops that connection and
    reads them through the cluster client, with the same values."""
    tier = redis_tier(cluster.url)
    try:
        tag = str(time.monotonic_ns())
        keys = [f"kvx:{{m{tag}-{i}}}:0:0" for i in range(12)]
        values = [bytes([i]) * 4 + bytes([100 + i]) * (1000 + i) for i in range(12)]
        tier.put_extents(list(zip(keys, values)))
        rc = tier._cluster()
        assert len({rc.get_node_from_key(k).name for k in keys}) > 1  # 12 tags over 3 masters
        one = rc.get_node_from_key(keys[0]).name
        through_client = []
        plain = RemoteTier.get_extents_into
        monkeypatch.setattr(RemoteTier, "get_extents_into", lambda self, *a: through_client.append(1) or plain(self, *a))
        monkeypatch.setattr(tier, "_by_master", lambda rc, ks: {one: list(range(len(ks)))})  # every key sent to one master
        outs = [memoryview(bytearray(len(v) - 4)) for v in values]
        assert tier.get_extents_into(keys, outs, 4) == [v[:4] for v in values]
        assert [bytes(o) for o in outs] == [v[4:] for v in values]
        assert through_client == [1]
        monkeypatch.setattr(tier, "_by_master", type(tier)._by_master.__get__(tier))
        outs = [memoryview(bytearray(len(v) - 4)) for v in values]  # the pool's connections are in step again
        assert tier.get_extents_into(keys, outs, 4) == [v[:4] for v in values]
        assert [bytes(o) for o in outs] == [v[4:] for v in values]
        assert through_client == [1]  # received in place, no redirection
    finally:
        tier.close()


@needs_redis
def test_reads_into_memory_cut_mid_reply_are_read_through_the_cluster_client(cluster, monkeypatch):
    """A connection refused or cut under the in-place read (a master gone) is not the whole tier down: the
    keys are read again through the cluster client, which finds each slot's master."""
    import kvstore.remote.resp_into as resp_into

    tier = redis_tier(cluster.url)
    try:
        tag = str(time.monotonic_ns())
        keys = [f"kvx:{{c{tag}-{i}}}:0:0" for i in range(6)]
        values = [bytes([i]) * 4 + bytes([50 + i]) * 700 for i in range(6)]
        tier.put_extents(list(zip(keys, values)))

        def cut(sock, outs, head):
            raise ConnectionResetError("the Redis node closed the connection mid-reply")

        monkeypatch.setattr(resp_into, "read_gets_into", cut)
        outs = [memoryview(bytearray(len(v) - 4)) for v in values]
        assert tier.get_extents_into(keys, outs, 4) == [v[:4] for v in values]
        assert [bytes(o) for o in outs] == [v[4:] for v in values]
    finally:
        tier.close()
