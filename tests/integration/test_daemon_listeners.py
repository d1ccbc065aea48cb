"""The daemon's listeners, on a real daemon process: the unix socket's modes, health and admin gating,
TCP with a token, a TCP listener with neither TLS nor a token refused at start, and mutual TLS."""

import os
import stat
import subprocess

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import GEOMETRIES, make_kv, make_tokens

from engine_client.client import KVStoreClient, KVStoreRpcError
from kvstore.contract.geometry import ModelSpec, StoreGeometry
from kvstore.io import resolve_backend

GEO = GEOMETRIES[2]


def test_socket_modes_health_and_admin_gating(daemon_factory):
    d = daemon_factory()
    assert stat.S_IMODE(os.stat(os.path.dirname(d.socket)).st_mode) == 0o750
    assert stat.S_IMODE(os.stat(d.socket).st_mode) == 0o660
    with KVStoreClient(d.target, shm=False) as client:
        health = health_pb2_grpc.HealthStub(client.channel)
        for service in ("", "kvstore.v1.KVStore"):
            resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
    plain = daemon_factory("--enable-admin", "false", data_dir=d.data_dir + "-2")
    with KVStoreClient(plain.target, shm=False) as client:
        with pytest.raises(KVStoreRpcError) as err:
            client.verify()
        assert err.value.code == grpc.StatusCode.UNIMPLEMENTED
        client.list_prefixes()  # the data service is there


def test_tcp_listener_requires_credentials(daemon_factory, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token-0123456789\n")
    d = daemon_factory("--tcp-address", "127.0.0.1:0", "--auth-token-file", str(token_file))
    target = f"127.0.0.1:{d.tcp_port}"
    with KVStoreClient(target) as anon:
        with pytest.raises(KVStoreRpcError) as err:
            anon.list_prefixes()
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    with KVStoreClient(target, token="wrong-token-0123456789") as bad:
        with pytest.raises(KVStoreRpcError) as err:
            bad.stats()
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    geo = StoreGeometry(ModelSpec(2, 1, 8, "float32"), chunk_tokens=4, group_layers=1)
    kv = make_kv(geo, 10, 1)
    with KVStoreClient(target, token="s3cret-token-0123456789") as ok:
        assert not ok.shm  # remote clients get bytes in the stream
        pid = ok.put_prefix(make_tokens(10, 1), kv, geo).prefix_id
        np.testing.assert_array_equal(ok.read_chunks(pid, [0, 1, 2]).to_kv(), kv)


def test_tcp_without_tls_or_token_is_refused_at_startup(daemon_factory):
    d = daemon_factory("--tcp-address", "127.0.0.1:0", start=False)
    with pytest.raises(RuntimeError, match="tcp_address"):
        d.start(timeout=20)


def test_mtls_listener(daemon_factory, tmp_path):
    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp_path)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=kvstore-ca", "-keyout", "ca.key", "-out", "ca.pem")
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", f"{name}.key", "-out", f"{name}.csr")
        (tmp_path / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "san.ext",
            "-out",
            f"{name}.pem",
        )
    d = daemon_factory(
        "--tcp-address",
        "127.0.0.1:0",
        "--tls-cert-file",
        str(tmp_path / "server.pem"),
        "--tls-key-file",
        str(tmp_path / "server.key"),
        "--tls-client-ca-file",
        str(tmp_path / "ca.pem"),
    )
    ca = (tmp_path / "ca.pem").read_bytes()
    target = f"localhost:{d.tcp_port}"
    with KVStoreClient(target, root_certificates=ca) as no_cert:
        with pytest.raises(KVStoreRpcError) as err:
            no_cert.stats(timeout=5)
        assert err.value.code == grpc.StatusCode.UNAVAILABLE  # the TLS handshake fails
    cert = ((tmp_path / "client.key").read_bytes(), (tmp_path / "client.pem").read_bytes())
    with KVStoreClient(target, root_certificates=ca, client_cert=cert) as client:
        assert client.stats().backend == resolve_backend("auto")[0]
        port, why = client.data_channel_port()  # data connections are plaintext: not beside TLS
        assert port == 0 and "TLS" in why
