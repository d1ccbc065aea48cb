"""KV stored as kv8/kv4 through a real daemon: both read paths, the admin's view, refusals."""

import json

import numpy as np
import pytest
from helpers import GEOMETRIES, make_kv, make_tokens
from test_admin_cli import admin

from engine_client.client import KVStoreClient, KVStoreRpcError
from kvstore.contract.geometry import StoreGeometry

PLAIN = GEOMETRIES[3]  # 24 layers, 2 heads, dim 64, bfloat16, groups of 8


def _quantized(name: str) -> StoreGeometry:
    return StoreGeometry(PLAIN.model, chunk_tokens=PLAIN.chunk_tokens, group_layers=PLAIN.group_layers, kv_quant=name)


def _as_stored(geo: StoreGeometry, kv: np.ndarray) -> np.ndarray:
    """What a reader must see: each extent quantized and dequantized by the geometry's codec."""
    c, n = geo.chunk_tokens, kv.shape[3]
    out = np.empty_like(kv)
    for g in range(geo.num_groups):
        layers = geo.group_layer_range(g)
        for j in range(geo.num_chunks(n)):
            ext = np.ascontiguousarray(kv[layers.start : layers.stop, :, :, j * c : (j + 1) * c])
            out[layers.start : layers.stop, :, :, j * c : (j + 1) * c] = geo.extent_array(geo.extent_payload(ext), g, ext.shape[3])
    return out


@pytest.mark.parametrize("name", ["kv8", "kv4t", "kv4h"])
def test_quantized_prefix_reads_back_dequantized_on_both_paths(daemon, name):
    geo, n = _quantized(name), 150
    kv, tokens = make_kv(PLAIN, n, 5), make_tokens(n, 5)
    want = _as_stored(geo, kv)
    with KVStoreClient(daemon.target) as client:
        plain = client.put_prefix(tokens, kv, PLAIN, model_fingerprint="m")
        res = client.put_prefix(tokens, kv, geo, model_fingerprint="m")
        assert res.prefix_id != plain.prefix_id
        assert client.describe(res.prefix_id).geometry == geo
        chunks = [0, 3, geo.num_chunks(n) - 1]
        rows = np.concatenate([np.arange(j * 16, min((j + 1) * 16, n)) for j in chunks])
        for shm in (False, True):
            with client.read_chunks(res.prefix_id, chunks, shm=shm) as got:
                np.testing.assert_array_equal(got.to_kv(), want[:, :, :, rows])
                sizes = [min(16, n - j * 16) for j in chunks]  # the last chunk holds 6 tokens
                assert got.bytes_useful == sum(geo.extent_bytes(g, t) for g in got.groups for t in sizes)
        # the daemon's probe keys are the stored keys, as the reader sees them
        np.testing.assert_array_equal(client.get_probe_keys(res.prefix_id, 1), want[8, 0])
    proc = admin("--socket-path", daemon.socket, "--json", "inspect", res.prefix_id)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["kv_quant"] == name and info["kv_bytes"] == geo.kv_bytes(n) < info["kv_bytes_unquantized"] / (1.6 if name == "kv8" else 3.2)
    text = admin("--socket-path", daemon.socket, "inspect", res.prefix_id).stdout
    assert f"({name};" in text and "smaller" in text and "saved" in text


def test_pages_and_unholdable_values_are_refused(daemon):
    geo = _quantized("kv4")
    with KVStoreClient(daemon.target) as client:
        with pytest.raises(KVStoreRpcError) as exc:
            client.pages_exist([b"k1"], geo)
        assert exc.value.code.name == "INVALID_ARGUMENT" and "kv_quant" in exc.value.message
        kv = make_kv(PLAIN, 20, 1)
        kv[3, 0, 1, 5, 7] = 0x7FC0  # a bfloat16 NaN
        with pytest.raises(ValueError, match="finite"):
            client.put_prefix(make_tokens(20, 1), kv, geo)
        assert client.list_prefixes() == []
