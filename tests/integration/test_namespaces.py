"""Namespaces as an access boundary for TCP tokens (auth_token_file with a [tokens] table), on a real daemon."""

from __future__ import annotations

import grpc
import pytest
from helpers import make_kv, make_tokens

from engine_client.client import KVStoreClient, KVStoreRpcError
from kvstore.contract.geometry import ModelSpec, StoreGeometry

GEO = StoreGeometry(ModelSpec(2, 1, 8, "float32"), chunk_tokens=4, group_layers=2)
TENANT_A = "tenant-a-token-0123456789"
TENANT_B = "tenant-b-token-0123456789"
OPERATOR = "operator-token-0123456789"


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(KVStoreRpcError) as err:
        call()
    return err.value.code


def test_a_token_reaches_only_its_namespaces(daemon_factory, tmp_path):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[tokens]\n"{TENANT_A}" = ["a"]\n"{TENANT_B}" = ["b"]\n"{OPERATOR}" = ["*"]\n')
    d = daemon_factory("--tcp-address", "127.0.0.1:0", "--auth-token-file", str(tokens))  # a [tokens] table
    tcp = f"127.0.0.1:{d.tcp_port}"
    kv = make_kv(GEO, 12, 1)
    with KVStoreClient(tcp, token=TENANT_A) as a, KVStoreClient(tcp, token=TENANT_B) as b:
        pid_a = a.put_prefix(make_tokens(12, 1), kv, GEO, namespace="a").prefix_id
        pid_b = b.put_prefix(make_tokens(12, 2), kv, GEO, namespace="b").prefix_id
        assert [p.prefix_id for p in a.list_prefixes()] == [pid_a]
        assert code_of(lambda: a.put_prefix(make_tokens(12, 3), kv, GEO, namespace="b")) == grpc.StatusCode.PERMISSION_DENIED
        assert code_of(lambda: a.lookup(make_tokens(12, 2), GEO, namespace="b")) == grpc.StatusCode.PERMISSION_DENIED
        for call in (
            lambda: a.read_chunks(pid_b, [0]),
            lambda: a.get_summaries(pid_b),
            lambda: a.describe(pid_b),
            lambda: a.delete(pid_b),
            lambda: a.prefetch(pid_b, period_layers=2),
        ):
            assert code_of(call) == grpc.StatusCode.NOT_FOUND  # as if it did not exist
        assert a.read_chunks(pid_a, [0, 2]).num_tokens == 12
    with KVStoreClient(tcp, token=OPERATOR) as op, KVStoreClient(d.target) as local:
        assert {p.prefix_id for p in op.list_prefixes()} == {pid_a, pid_b} == {p.prefix_id for p in local.list_prefixes()}
        assert local.describe(pid_b).namespace == "b"  # b's prefix is intact


def test_a_bad_tokens_file_is_refused_at_start(daemon_factory, tmp_path):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[tokens]\n"tenant-a-token-0123456789" = "a"\n')
    d = daemon_factory("--tcp-address", "127.0.0.1:0", "--auth-tokens-file", str(tokens), start=False)  # its older name
    with pytest.raises(RuntimeError, match="auth_token_file"):
        d.start()
