"""Raw data connections: TCP clients' extents on a plain socket, checked against the stream path."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from helpers import make_kv, make_tokens

from engine_client.client import KVStoreClient
from engine_client.data_channel import DataConn
from kvstore.contract import pb
from kvstore.contract.geometry import ModelSpec, StoreGeometry

TOKEN = "data-channel-token-0123456789"
GEO = StoreGeometry(ModelSpec(4, 2, 16, "float32"), chunk_tokens=4, group_layers=2)  # two groups


@pytest.fixture
def tcp_daemon(daemon_factory, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    d = daemon_factory("--tcp-address", "127.0.0.1:0", "--auth-token-file", str(token_file))
    return d, f"127.0.0.1:{d.tcp_port}"


def _raw_read(client, pid, chunks, conn_id, secret):
    req = pb.ReadChunksRequest(prefix_id=pid, chunks=chunks, data_channel=conn_id, data_secret=secret)
    return client.stub.ReadChunks(req, metadata=client._metadata, timeout=30)


def test_extents_on_the_data_connection_equal_the_stream_and_the_stored_kv(tcp_daemon):
    _, target = tcp_daemon
    kv = make_kv(GEO, 30, 1)
    with KVStoreClient(target, token=TOKEN) as fast, KVStoreClient(target, token=TOKEN, data_channel=False) as slow:
        port, _ = fast.data_channel_port()
        assert port > 0
        pid = fast.put_prefix(make_tokens(30, 1), kv, GEO).prefix_id
        for chunks in ([0, 3, 7], [1], list(range(8))):
            got = fast.read_chunks(pid, chunks)
            ref = slow.read_chunks(pid, chunks)
            assert got.groups == ref.groups == [0, 1]
            for g in got.groups:
                for c in chunks:
                    np.testing.assert_array_equal(got.extent_bytes(g, c), ref.extent_bytes(g, c))
            assert (got.bytes_read, got.bytes_useful, got.num_reads) == (ref.bytes_read, ref.bytes_useful, ref.num_reads)
            assert got.bytes_useful > 0
        np.testing.assert_array_equal(fast.read_chunks(pid, list(range(8))).to_kv(), kv)
        assert slow._data_pool is False and len(fast._data_pool._idle) == 1  # one connection, reused by every read
        assert fast.stats().data_connections == 1


def test_a_connection_serves_only_calls_that_know_its_secret(tcp_daemon):
    _, target = tcp_daemon
    with KVStoreClient(target, token=TOKEN) as client:
        pid = client.put_prefix(make_tokens(12, 2), make_kv(GEO, 12, 2), GEO).prefix_id
        port, _ = client.data_channel_port()
        conn = DataConn("127.0.0.1", port, 10)
        try:
            for conn_id, secret in ((conn.conn_id, b"\0" * 16), (conn.conn_id + 1, conn.secret)):
                with pytest.raises(grpc.RpcError) as err:
                    list(_raw_read(client, pid, [0], conn_id, secret))
                assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(grpc.RpcError) as err:  # the shm path and a data connection at once
                req = pb.ReadChunksRequest(prefix_id=pid, chunks=[0], data_channel=conn.conn_id, data_secret=conn.secret, shm_session=5)
                list(client.stub.ReadChunks(req, metadata=client._metadata, timeout=30))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            msgs = list(_raw_read(client, pid, [0, 2], conn.conn_id, conn.secret))  # the right secret: frames follow
            assert msgs[0].HasField("header") and msgs[-1].HasField("stats")
            assert not any(m.HasField("extent") for m in msgs)
        finally:
            conn.close()


def test_an_abandoned_read_ends_its_connection_and_the_daemon_goes_on(tcp_daemon):
    daemon, target = tcp_daemon
    big = StoreGeometry(ModelSpec(2, 8, 128, "float32"), chunk_tokens=256, group_layers=2)  # 2 MiB extents
    kv = make_kv(big, 256 * 8, 3)
    with KVStoreClient(target, token=TOKEN) as client:
        pid = client.put_prefix(make_tokens(256 * 8, 3), kv, big).prefix_id
        port, _ = client.data_channel_port()
        conn = DataConn("127.0.0.1", port, 10)
        call = _raw_read(client, pid, list(range(8)), conn.conn_id, conn.secret)
        assert next(call).HasField("header")  # 16 MiB follow; nobody reads them, the daemon's write blocks
        with pytest.raises(grpc.RpcError) as err:  # held by that call
            list(_raw_read(client, pid, [0], conn.conn_id, conn.secret))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        call.cancel()
        conn.close()
        with pytest.raises(grpc.RpcError) as err:  # ended with its call
            list(_raw_read(client, pid, [0], conn.conn_id, conn.secret))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        gone = DataConn("127.0.0.1", port, 10)  # the client closes its connection but not the call
        call = _raw_read(client, pid, list(range(8)), gone.conn_id, gone.secret)
        assert next(call).HasField("header")
        gone.close()
        with pytest.raises(grpc.RpcError) as err:
            list(call)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "closed during the read" in err.value.details()
        np.testing.assert_array_equal(client.read_chunks(pid, list(range(8))).to_kv(), kv)
    assert daemon.proc.poll() is None
    assert "Traceback" not in daemon.log() and "failed" not in daemon.log()  # a lost client is a refusal, not an internal error


def test_a_client_that_stops_reading_part_way_loses_the_connection_not_the_next_read(tcp_daemon):
    _, target = tcp_daemon
    big = StoreGeometry(ModelSpec(4, 8, 128, "float32"), chunk_tokens=256, group_layers=2)
    kv = make_kv(big, 256 * 4, 4)
    with KVStoreClient(target, token=TOKEN) as client:
        pid = client.put_prefix(make_tokens(256 * 4, 4), kv, big).prefix_id
        groups = client.iter_groups(pid, list(range(4)))
        read, group = next(groups)  # first group arrived; stop here
        assert group == 0 and read.extent_bytes(0, 3).size > 0
        groups.close()
        assert len(client._data_pool._idle) == 0  # its framing is lost: closed, not pooled
        np.testing.assert_array_equal(client.read_chunks(pid, list(range(4))).to_kv(), kv)


def test_data_connections_are_for_tcp_targets(daemon):
    with pytest.raises(ValueError, match="TCP"):
        KVStoreClient(daemon.target, data_channel=True)
    kv = make_kv(GEO, 8, 5)
    with KVStoreClient(daemon.target) as local:
        pid = local.put_prefix(make_tokens(8, 5), kv, GEO).prefix_id
        with pytest.raises(grpc.RpcError) as err:  # a daemon without a TCP listener has no data port
            req = pb.ReadChunksRequest(prefix_id=pid, chunks=[0], data_channel=7, data_secret=b"x" * 16)
            list(local.stub.ReadChunks(req, timeout=10))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "TCP listener" in err.value.details()
        assert local.data_channel_port()[0] == 0
