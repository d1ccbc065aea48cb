"""A real daemon process on a unix socket; this test process is its client.

Every test here starts the same real daemon and checks one end-to-end
property of it (round trips, cut streams, drain); its listeners (socket
modes, health, TCP credentials, mTLS) are test_daemon_listeners.py, and
the narrower suites (isolation, capacity, pages, crash) have files of
their own.
"""

import os
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import GEOMETRIES, data_root, ids, make_kv, make_tokens

from engine_client.client import KVStoreClient, KVStoreRpcError, to_torch
from kvstore.contract import geometry_to_pb, pb
from kvstore.io import resolve_backend

GEO = GEOMETRIES[2]  # 4 layers, 2 heads, dim 64, fp16, one period group


def leased_bytes_settle(client, timeout_s: float = 10.0) -> int:
    """Leased arena bytes once released leases have reached the daemon.

    Releases travel on the shm connection, not with the Stats call, so they
    may land a moment later; poll until zero or the timeout.
    """
    deadline = time.monotonic() + timeout_s
    while (leased := client.stats().shm_leased_bytes) and time.monotonic() < deadline:
        time.sleep(0.02)
    return leased


def expected(kv, geo, chunks, n):
    c = geo.chunk_tokens
    return kv[:, :, :, np.concatenate([np.arange(j * c, min((j + 1) * c, n)) for j in chunks])]


@pytest.mark.parametrize("geo", GEOMETRIES, ids=ids)
def test_roundtrip_both_data_paths(daemon, geo):
    n = 150
    kv, tokens = make_kv(geo, n, 1), make_tokens(n, 1)
    with KVStoreClient(daemon.target) as client:
        assert client.shm
        res = client.put_prefix(tokens, kv, geo, model_fingerprint="m")
        m = geo.num_chunks(n)
        assert res.num_chunks == m
        rng = np.random.default_rng(0)
        for shm in (False, True):
            for _ in range(3):
                chunks = np.sort(rng.choice(m, size=rng.integers(1, m + 1), replace=False))
                with client.read_chunks(res.prefix_id, chunks, shm=shm) as got:
                    assert got.zero_copy == shm
                    np.testing.assert_array_equal(got.to_kv(), expected(kv, geo, chunks, n))
            # a layer range returns the period groups that cover it
            last = geo.model.num_layers - 1
            with client.read_chunks(res.prefix_id, [0], layer_start=last, shm=shm) as got:
                g = last // geo.group_layers
                assert got.groups == [g]
                np.testing.assert_array_equal(got.group_kv(g), kv[list(geo.group_layer_range(g))][:, :, :, : geo.chunk_tokens])
        np.testing.assert_array_equal(client.get_probe_keys(res.prefix_id, 0), kv[0, 0]) if geo.probe_keys else None
        full = client.get_summaries(res.prefix_id)
        assert full.shape == (m, geo.model.num_layers, geo.model.num_kv_heads, 2, geo.model.head_dim)
        for step in {1, 2, geo.group_layers, geo.model.num_layers, geo.model.num_layers + 3}:  # each Period's first layer alone
            np.testing.assert_array_equal(client.get_summaries(res.prefix_id, layer_step=step), full[:, ::step])
        assert leased_bytes_settle(client) == 0  # every read above was released


def test_torch_in_and_out_and_shared_prefix(daemon):
    import torch

    geo = GEOMETRIES[3]  # bf16
    kv = torch.randn(24, 2, 2, 64, 64).to(torch.bfloat16)
    tokens = make_tokens(64, 2)
    with KVStoreClient(daemon.target) as client:
        a = client.put_prefix(tokens, kv, geo)
        tokens_b = np.concatenate([tokens[:48], make_tokens(40, 3)])
        kv_b = torch.cat([kv[:, :, :, :48], torch.randn(24, 2, 2, 40, 64).to(torch.bfloat16)], dim=3)
        b = client.put_prefix(tokens_b, kv_b, geo)
        assert b.reused_chunks == 3 and a.reused_chunks == 0
        with client.read_chunks(b.prefix_id, range(6)) as got:
            assert torch.equal(to_torch(got.to_kv(), "bfloat16"), kv_b)


def test_status_codes_from_real_bad_requests(daemon):
    kv, tokens = make_kv(GEO, 40, 1), make_tokens(40, 1)
    with KVStoreClient(daemon.target) as client:
        pid = client.put_prefix(tokens, kv, GEO).prefix_id
        before = [p.prefix_id for p in client.list_prefixes()]

        def code_of(call):
            with pytest.raises(KVStoreRpcError) as err:
                call()
            return err.value.code, err.value.message

        def put(frames):
            return client.stub.PutPrefix(iter(frames), timeout=10)

        header = pb.PutHeader(geometry=geometry_to_pb(GEO), tokens=make_tokens(20, 9).tolist())
        ext = np.ascontiguousarray(make_kv(GEO, 16, 9)).tobytes()
        cases = {
            "wrong extent size": [pb.PutPrefixRequest(header=header), _frame(0, 0, 0, ext[:-2])],
            "extent beyond its size": [pb.PutPrefixRequest(header=header), _frame(0, 0, 0, ext + b"xx")],
            "missing extent": [pb.PutPrefixRequest(header=header), _frame(0, 0, 0, ext)],
            "chunk out of range": [pb.PutPrefixRequest(header=header), _frame(0, 5, 0, ext)],
            "group out of range": [pb.PutPrefixRequest(header=header), _frame(3, 0, 0, ext)],
            "no header": [_frame(0, 0, 0, ext)],
            "negative token": [pb.PutPrefixRequest(header=pb.PutHeader(geometry=geometry_to_pb(GEO), tokens=[1, -5]))],
            "bad geometry": [pb.PutPrefixRequest(header=pb.PutHeader(geometry=pb.Geometry(), tokens=[1]))],
        }
        fields = {
            "wrong extent size": "extents",
            "extent beyond its size": "extent.payload",
            "missing extent": "extents",
            "chunk out of range": "extent.chunk",
            "group out of range": "extent.group",
            "no header": "header",
            "negative token": "tokens",
            "bad geometry": "header.geometry.model",
        }
        for name, frames in cases.items():
            code, msg = code_of(lambda: _unwrap(put, frames))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, name
            assert msg.startswith(fields[name]), (name, msg)
        huge = pb.PutHeader(geometry=geometry_to_pb(GEO), tokens=[1] * (1 << 20 | 1))
        code, msg = code_of(lambda: _unwrap(put, [pb.PutPrefixRequest(header=huge)]))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "tokens" in msg and "limit" in msg
        code, msg = code_of(lambda: client.read_chunks(pid, [3]))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and msg.startswith("chunks")
        code, msg = code_of(lambda: client.read_chunks(pid, [0], layer_start=9))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and msg.startswith("layer_start")
        with pytest.raises(ValueError, match="layer_step"):
            client.get_summaries(pid, layer_step=0)
        code, _ = code_of(lambda: client.read_chunks("ab" * 32, [0]))
        assert code == grpc.StatusCode.NOT_FOUND
        code, _ = code_of(lambda: client.delete("cd" * 32))
        assert code == grpc.StatusCode.NOT_FOUND
        bad_session = pb.ReadChunksRequest(prefix_id=pid, chunks=[0], shm_session=12345)
        code, msg = code_of(lambda: _unwrap(lambda: next(client.stub.ReadChunks(bad_session, timeout=5))))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and msg.startswith("shm_session")
        assert [p.prefix_id for p in client.list_prefixes()] == before
        assert client.stats().num_segments == 1


def _frame(group, chunk, offset, data):
    return pb.PutPrefixRequest(extent=pb.ExtentFrame(group=group, chunk=chunk, offset=offset, data=data))


def _unwrap(fn, *args):
    try:
        return fn(*args)
    except grpc.RpcError as exc:
        raise KVStoreRpcError(exc.code(), exc.details()) from None


def test_stream_cut_mid_put_leaves_nothing_listed(daemon):
    kv, tokens = make_kv(GEO, 160, 1), make_tokens(160, 1)
    header = pb.PutHeader(geometry=geometry_to_pb(GEO), tokens=tokens.tolist())
    sent = threading.Event()

    def frames():
        yield pb.PutPrefixRequest(header=header)
        for j in range(4):
            yield _frame(0, j, 0, np.ascontiguousarray(kv[:, :, :, j * 16 : (j + 1) * 16]).tobytes())
        sent.set()
        time.sleep(30)  # the client goes away before sending the rest

    with KVStoreClient(daemon.target, shm=False) as client:
        call = client.stub.PutPrefix.future(frames(), timeout=60)
        assert sent.wait(10)
        segments = os.path.join(daemon.data_dir, "segments")

        def half_put_on_disk():
            written = _segment_files(segments)
            return bool(written) and sum(os.path.getsize(os.path.join(segments, f)) for f in written) > 0

        assert _wait_until(half_put_on_disk)
        call.cancel()
        deadline = time.monotonic() + 10
        while os.listdir(os.path.join(daemon.data_dir, "segments")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.listdir(os.path.join(daemon.data_dir, "segments")) == []
        assert client.list_prefixes() == []
        assert client.put_prefix(tokens, kv, GEO).num_chunks == 10  # the store is fine


def _segment_files(segments: str) -> list[str]:
    """The segment files, without the O_DIRECT probe file a segment's opening makes and removes."""
    return [f for f in os.listdir(segments) if not f.startswith(".odirect-probe-")]


def _wait_until(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)
    return cond()


def test_put_cut_while_its_segment_opens_leaves_nothing(daemon_factory):
    """The client goes away while the daemon is still opening the put's segment:
    the opened put is aborted when it comes back, not dropped with its file and reservation."""
    daemon = daemon_factory("--max-disk-bytes", str(64 << 20), env={"KVSTORE_FAULTS": "1", "KVSTORE_PAUSE_AT": "put:opened:2"})
    kv, tokens = make_kv(GEO, 160, 2), make_tokens(160, 2)
    header = pb.PutHeader(geometry=geometry_to_pb(GEO), tokens=tokens.tolist())
    segments = os.path.join(daemon.data_dir, "segments")

    def frames():
        yield pb.PutPrefixRequest(header=header)
        time.sleep(30)

    with KVStoreClient(daemon.target, shm=False) as client:
        call = client.stub.PutPrefix.future(frames(), timeout=60)
        assert _wait_until(lambda: _segment_files(segments))  # begin_put opened the file and is held at put:opened
        call.cancel()
        assert _wait_until(lambda: not os.listdir(segments)), os.listdir(segments)
        assert _wait_until(lambda: client.stats().disk_reserved_bytes == 0)
        assert client.list_prefixes() == []
        assert client.put_prefix(tokens, kv, GEO).num_chunks == 10


def test_put_cut_during_its_commit_is_whole_or_absent(daemon_factory):
    """The client goes away while the commit syncs: the commit runs to its end, and
    the prefix is either listed and reads back exactly or not listed with no file left."""
    daemon = daemon_factory(env={"KVSTORE_FAULTS": "1", "KVSTORE_PAUSE_AT": "put:synced:2"})
    kv, tokens = make_kv(GEO, 160, 3), make_tokens(160, 3)
    header = pb.PutHeader(geometry=geometry_to_pb(GEO), tokens=tokens.tolist())
    manifests = os.path.join(daemon.data_dir, "manifests")

    def frames():
        yield pb.PutPrefixRequest(header=header)
        for j in range(10):
            yield _frame(0, j, 0, np.ascontiguousarray(kv[:, :, :, j * 16 : (j + 1) * 16]).tobytes())

    with KVStoreClient(daemon.target, shm=False) as client:
        call = client.stub.PutPrefix.future(frames(), timeout=60)
        assert _wait_until(
            lambda: any(not f.endswith(".tmp") for f in os.listdir(manifests))
        )  # written, synced, held before the index commit
        call.cancel()
        time.sleep(3)  # the pause ends and the commit finishes
        listed = client.list_prefixes()
        if listed:
            pid = listed[0].prefix_id
            assert all(r.ok for r in client.verify(pid))
            with client.read_chunks(pid, range(10)) as got:
                np.testing.assert_array_equal(got.to_kv(), expected(kv, GEO, range(10), 160))
        else:
            assert os.listdir(os.path.join(daemon.data_dir, "segments")) == []


def test_flipped_byte_is_data_loss_in_read_and_admin_verify(daemon):
    kv, tokens = make_kv(GEO, 64, 1), make_tokens(64, 1)
    with KVStoreClient(daemon.target) as client:
        pid = client.put_prefix(tokens, kv, GEO).prefix_id
        seg = client.inspect(pid)["segments"][0]
        path = os.path.join(daemon.data_dir, "segments", seg["file"])
        with open(path, "r+b") as fh:
            fh.seek(5000)  # inside the extent of chunk 1 (extents are 16 KiB)
            b = fh.read(1)
            fh.seek(5000)
            fh.write(bytes([b[0] ^ 1]))
        admin = _admin(daemon, "verify", "--all")
        assert admin.returncode == 1, admin.stdout + admin.stderr
        assert "extent[group=0,chunk=0]" in admin.stdout
        for shm in (False, True):
            with pytest.raises(KVStoreRpcError) as err:
                client.read_chunks(pid, [0, 1], shm=shm)
            assert err.value.code == grpc.StatusCode.DATA_LOSS
        assert leased_bytes_settle(client) == 0


def _admin(daemon, *args):
    env = {**os.environ, "PYTHONPATH": data_root()}
    return subprocess.run(
        [sys.executable, "-m", "kvstore_tools.admin", "--socket", daemon.socket, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=data_root(),
        timeout=60,
    )


def test_admin_through_the_daemon(daemon):
    import json

    with KVStoreClient(daemon.target) as client:
        pid = client.put_prefix(make_tokens(40, 1), make_kv(GEO, 40, 1), GEO, namespace="ns").prefix_id
    ls = _admin(daemon, "ls", "--json")
    assert ls.returncode == 0, ls.stderr
    (row,) = json.loads(ls.stdout)
    assert row["prefix_id"] == pid and row["num_tokens"] == 40 and row["namespace"] == "ns" and row["quarantined"] is None
    inspect = _admin(daemon, "inspect", pid[:12])
    assert inspect.returncode == 0 and pid in inspect.stdout and "seg-" in inspect.stdout
    stats = _admin(daemon, "stats", "--json")
    st = json.loads(stats.stdout)
    assert st["num_prefixes"] == 1 and st["backend"] == resolve_backend("auto")[0] and any(r["rpc"] == "PutPrefix" for r in st["latency"])
    assert _admin(daemon, "verify", pid).returncode == 0
    gone = _admin(daemon, "delete", pid[:10])
    assert gone.returncode == 0 and pid in gone.stdout
    missing = _admin(daemon, "inspect", pid)
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr


def test_read_only_store_refuses_writes_keeps_reads(daemon_factory, tmp_path):
    kv, tokens = make_kv(GEO, 40, 1), make_tokens(40, 1)
    d = daemon_factory()
    with KVStoreClient(d.target) as client:
        pid = client.put_prefix(tokens, kv, GEO).prefix_id
    d.stop()
    ro = daemon_factory("--read-only", "true", data_dir=d.data_dir)
    with KVStoreClient(ro.target) as client:
        with pytest.raises(KVStoreRpcError) as err:
            client.put_prefix(make_tokens(40, 2), kv, GEO)
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION and "read-only" in err.value.message
        with pytest.raises(KVStoreRpcError) as err:
            client.delete(pid)
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
        with client.read_chunks(pid, [0, 1, 2]) as got:
            np.testing.assert_array_equal(got.to_kv(), kv)
        health = health_pb2_grpc.HealthStub(client.channel)
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.NOT_SERVING


def test_full_disk_is_resource_exhausted_while_reads_go_on(daemon_factory, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a size-limited file system here: {res.stderr.strip()}")
    try:
        d = daemon_factory("--index-map-bytes", str(1 << 20), data_dir=mnt / "data")
        stored = {}
        with KVStoreClient(d.target) as client:
            with pytest.raises(KVStoreRpcError) as err:
                for i in range(60):
                    kv = make_kv(GEO, 256, i)
                    stored[client.put_prefix(make_tokens(256, i), kv, GEO).prefix_id] = kv
            assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "full" in err.value.message
            assert {p.prefix_id for p in client.list_prefixes()} == set(stored)
            for pid, kv in stored.items():
                with client.read_chunks(pid, range(16)) as got:
                    np.testing.assert_array_equal(got.to_kv(), kv)
        d.stop()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_aborted_streams_leave_no_leased_slot(daemon):
    geo = GEOMETRIES[3]
    kv, tokens = make_kv(geo, 512, 1), make_tokens(512, 1)
    with KVStoreClient(daemon.target) as client:
        pid = client.put_prefix(tokens, kv, geo).prefix_id
        for i in range(100):  # the reader stops after the first or the second of three groups
            for n, _ in enumerate(client.iter_groups(pid, list(range(32)))):
                if n == i % 2:
                    break
        assert leased_bytes_settle(client, 15) == 0
        # Raw calls cancelled mid-read by a client that never releases anything:
        # what the daemon had not handed over it frees at once, the rest goes
        # back when that client's session ends.
        rude = KVStoreClient(daemon.target)
        for _ in range(20):
            req = pb.ReadChunksRequest(prefix_id=pid, chunks=list(range(32)), shm_session=rude.session_id)
            stream = rude.stub.ReadChunks(req, timeout=30)
            next(stream)
            stream.cancel()
        rude.close()
        assert leased_bytes_settle(client, 15) == 0


CLIENT_THAT_DIES = """
import sys, time
from engine_client.client import KVStoreClient
c = KVStoreClient(sys.argv[1])
held = [c.read_chunks(sys.argv[2], list(range(8))) for _ in range(3)]  # never released
print("holding", c.stats().shm_leased_bytes, flush=True)
time.sleep(60)
"""


def test_client_that_disappears_releases_its_leases(daemon):
    with KVStoreClient(daemon.target) as client:
        pid = client.put_prefix(make_tokens(160, 1), make_kv(GEO, 160, 1), GEO).prefix_id
        env = {**os.environ, "PYTHONPATH": data_root()}
        proc = subprocess.Popen([sys.executable, "-c", CLIENT_THAT_DIES, daemon.target, pid], stdout=subprocess.PIPE, text=True, env=env)
        line = proc.stdout.readline()
        assert line.startswith("holding") and int(line.split()[1]) > 0
        assert client.stats().shm_leased_bytes > 0
        proc.kill()
        proc.wait()
        proc.stdout.close()
        assert leased_bytes_settle(client) == 0


def test_sigterm_drains_in_flight_calls_and_refuses_new_ones(daemon):
    kv, tokens = make_kv(GEO, 64, 1), make_tokens(64, 1)
    header = pb.PutHeader(geometry=geometry_to_pb(GEO), tokens=tokens.tolist())
    go_on = threading.Event()

    def frames():
        yield pb.PutPrefixRequest(header=header)
        go_on.wait(20)
        for j in range(4):
            yield _frame(0, j, 0, np.ascontiguousarray(kv[:, :, :, j * 16 : (j + 1) * 16]).tobytes())

    with KVStoreClient(daemon.target, shm=False) as client:
        call = client.stub.PutPrefix.future(frames(), timeout=60)
        time.sleep(0.5)
        daemon.proc.send_signal(15)
        deadline = time.monotonic() + 10
        code = None
        while time.monotonic() < deadline:
            try:
                client.list_prefixes(timeout=2)
            except KVStoreRpcError as exc:
                code = exc.code
                break
            time.sleep(0.05)
        assert code == grpc.StatusCode.UNAVAILABLE
        go_on.set()
        res = call.result(timeout=30)  # the call in flight finished during the drain
        assert res.num_chunks == 4
    assert daemon.proc.wait(30) == 0
    assert "draining" in daemon.log() and "stopped" in daemon.log()


def test_attention_reports_and_accesses_make_scores_that_survive_restart(daemon_factory):
    d = daemon_factory()
    kv, tokens = make_kv(GEO, 64, 1), make_tokens(64, 1)
    with KVStoreClient(d.target) as client:
        pid = client.put_prefix(tokens, kv, GEO).prefix_id
        for _ in range(3):
            client.read_chunks(pid, [0, 2]).release()
        assert client.report_attention(pid, 0, [2, 0], [0.25, 1.5]) == 2
        s = client.get_scores(pid, 0)
        np.testing.assert_allclose(s.importance, [1.5, 0, 0.25, 0])
        assert s.frequency.tolist() == [3, 0, 3, 0]
        np.testing.assert_allclose(s.score, [4.5, 0, 0.75, 0])
        for bad, field in [([0, 9], "chunks"), ([0], "attention")]:
            with pytest.raises(KVStoreRpcError) as err:
                client.report_attention(pid, 0, bad, [1.0, 1.0])
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.message.startswith(field)
        with pytest.raises(KVStoreRpcError) as err:
            client.report_attention(pid, 0, [1], [float("nan")])
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    d.stop()  # scores are flushed at shutdown
    again = daemon_factory(data_dir=d.data_dir)
    with KVStoreClient(again.target) as client:
        np.testing.assert_allclose(client.get_scores(pid, 0).score, [4.5, 0, 0.75, 0])


def test_scores_flushed_periodically_survive_a_crash(daemon_factory):
    d = daemon_factory("--score-flush-seconds", "0.2")
    kv, tokens = make_kv(GEO, 64, 1), make_tokens(64, 1)
    with KVStoreClient(d.target) as client:
        pid = client.put_prefix(tokens, kv, GEO).prefix_id
        for _ in range(2):
            client.read_chunks(pid, [1, 3]).release()
        client.report_attention(pid, 0, [1, 3], [0.5, 2.0])
        expected_scores = client.get_scores(pid, 0).score
        assert expected_scores.tolist() == pytest.approx([0, 1.0, 0, 4.0])
    time.sleep(1.5)  # several flush periods
    d.kill()  # SIGKILL: no flush at shutdown
    again = daemon_factory(data_dir=d.data_dir)
    with KVStoreClient(again.target) as client:
        np.testing.assert_allclose(client.get_scores(pid, 0).score, expected_scores)


@pytest.mark.parametrize("shm", [True, False])
def test_groups_stream_in_order_and_early_exit_releases(daemon, shm):
    geo = GEOMETRIES[3]  # 24 layers in groups of 8
    kv, tokens = make_kv(geo, 100, 1), make_tokens(100, 1)
    with KVStoreClient(daemon.target) as client:
        pid = client.put_prefix(tokens, kv, geo).prefix_id
        chunks = [0, 3, 6]
        seen = []
        for read, group in client.iter_groups(pid, chunks, layer_start=4, shm=shm):
            seen.append(group)
            layers = list(geo.group_layer_range(group))
            np.testing.assert_array_equal(read.group_kv(group), expected(kv[layers], geo, chunks, 100))
        read.release()
        assert seen == [0, 1, 2] and read.bytes_useful == 3 * (2 * geo.extent_bytes(0, 16) + geo.extent_bytes(0, 4))
        for read, group in client.iter_groups(pid, chunks, shm=shm):
            break  # the caller stops after the first group
        assert leased_bytes_settle(client) == 0
        desc = client.describe(pid[:16])
        assert desc.prefix_id == pid and desc.num_tokens == 100 and desc.geometry.model.num_layers == 24
