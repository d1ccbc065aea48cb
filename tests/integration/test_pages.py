"""The page API (PagesExist, PutPages, GetPages) on a real daemon, real files."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
from helpers import GEOMETRIES, data_root, ids, make_kv

from engine_client import rpc
from engine_client.client import KVStoreClient, KVStoreRpcError
from kvstore.config import StoreConfig
from kvstore.contract import geometry_to_pb, pb
from kvstore.contract.errors import Conflict
from kvstore.contract.geometry import ModelSpec, StoreGeometry
from kvstore.rebuild import rebuild_index
from kvstore.store import ChunkStore

GEO = GEOMETRIES[0]  # 5 layers in groups of 2, one head, head dim 1, bf16: 3 groups of odd sizes
GEO24 = GEOMETRIES[3]  # 24 layers x 2 heads x 64 dim bf16, chunk 16: 96 KiB pages


def make_pages(geo: StoreGeometry, num_pages: int, seed: int) -> np.ndarray:
    """``[pages, layers, 2, kv_heads, chunk_tokens, head_dim]`` cut from a random prefix's KV."""
    c = geo.chunk_tokens
    kv = make_kv(geo, num_pages * c, seed)  # [layers, 2, heads, tokens, dim]
    m = geo.model
    return np.ascontiguousarray(kv.reshape(m.num_layers, 2, m.num_kv_heads, num_pages, c, m.head_dim).transpose(3, 0, 1, 2, 4, 5))


def page_keys(num_pages: int, seed: int) -> list[bytes]:
    """Chained 32-byte keys, as vLLM computes block hashes: key j covers pages 0..j."""
    import hashlib

    out, prev = [], seed.to_bytes(8, "little")
    for j in range(num_pages):
        prev = hashlib.sha256(prev + j.to_bytes(4, "little")).digest()
        out.append(prev)
    return out


def code_of(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(KVStoreRpcError) as err:
        call()
    return err.value.code, err.value.message


PUTTER = """
import json, sys
sys.path[:0] = [{root!r}, {root!r} + "/tests", {root!r} + "/tests/integration"]
from helpers import GEOMETRIES
from test_pages import make_pages, page_keys
from engine_client.client import KVStoreClient

geo = GEOMETRIES[{geo_index}]
with KVStoreClient({target!r}) as client:
    res = client.put_pages(page_keys({n}, {seed}), make_pages(geo, {n}, {seed}), geo, namespace="rag", model_fingerprint="m1")
print(json.dumps({{"written": res.pages_written, "batch_id": res.batch_id}}))
"""


@pytest.mark.parametrize("geo_index", [0, 1, 3], ids=[ids(GEOMETRIES[i]) for i in (0, 1, 3)])
def test_pages_put_by_one_process_read_back_byte_exact_by_another(daemon, geo_index):
    geo = GEOMETRIES[geo_index]
    n = 37
    script = PUTTER.format(root=data_root(), geo_index=geo_index, target=daemon.target, n=n, seed=5)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["written"] == n
    pages, keys = make_pages(geo, n, 5), page_keys(n, 5)
    with KVStoreClient(daemon.target) as client:
        order = np.random.default_rng(0).permutation(n)
        got = client.get_pages([keys[i] for i in order], geo, namespace="rag", model_fingerprint="m1")
        np.testing.assert_array_equal(got, pages[order])
        # a layer range reads the period groups covering it
        layers = geo.group_layer_range(geo.num_groups - 1)
        got = client.get_pages(keys[3:5], geo, namespace="rag", model_fingerprint="m1", layer_start=layers.start)
        np.testing.assert_array_equal(got, pages[3:5, layers.start :])
        # pages are reads like any other: accesses feed the batch's scores
        (batch,) = client.list_prefixes()
        assert batch.kind == "pages" and batch.num_chunks == n and batch.num_tokens == n * geo.chunk_tokens
        freq = client.get_scores(batch.prefix_id, geo.num_groups - 1).frequency
        assert freq.sum() == n + 2
        # the same keys under another model, namespace or geometry are other pages
        for kw in ({"namespace": "other", "model_fingerprint": "m1"}, {"namespace": "rag", "model_fingerprint": "m2"}):
            assert client.pages_exist(keys, geo, **kw).num_leading == 0
        other = StoreGeometry(geo.model, chunk_tokens=geo.chunk_tokens, group_layers=geo.group_layers + 1)
        assert client.pages_exist(keys, other, namespace="rag", model_fingerprint="m1").num_leading == 0


def test_exists_counts_the_leading_pages_and_a_second_put_writes_only_new_ones(daemon):
    pages, keys = make_pages(GEO, 8, 1), page_keys(8, 1)
    with KVStoreClient(daemon.target) as client:
        first = client.put_pages([keys[i] for i in (0, 1, 2, 3, 6)], pages[[0, 1, 2, 3, 6]], GEO)
        assert (first.pages_written, first.pages_already_stored) == (5, 0) and first.bytes_written > 0
        present = client.pages_exist(keys, GEO)
        assert present.exists.tolist() == [True, True, True, True, False, False, True, False]
        assert present.num_leading == 4
        assert client.pages_exist(keys[4:], GEO).num_leading == 0

        segments = sorted(os.listdir(os.path.join(daemon.data_dir, "segments")))
        again = client.put_pages(keys[:4], pages[:4], GEO)
        assert (again.pages_written, again.pages_already_stored, again.bytes_written, again.batch_id) == (0, 4, 0, "")
        assert sorted(os.listdir(os.path.join(daemon.data_dir, "segments"))) == segments  # nothing written

        rest = client.put_pages(keys, pages, GEO)
        assert (rest.pages_written, rest.pages_already_stored) == (3, 5)
        assert client.pages_exist(keys, GEO).num_leading == 8
        batches = {p.prefix_id: p for p in client.list_prefixes()}
        assert set(batches) == {first.batch_id, rest.batch_id} and batches[rest.batch_id].num_chunks == 3
        np.testing.assert_array_equal(client.get_pages(keys, GEO), pages)

        # the daemon sends skipped pages' bytes nowhere: a put whose header skips them
        # needs no frames for them, and fails as ABORTED once one is gone
        client.delete(first.batch_id)
        assert client.pages_exist(keys, GEO).exists.tolist() == [False] * 4 + [True, True, False, True]
        header = pb.PutPagesHeader(geometry=geometry_to_pb(GEO), keys=keys, skip_pages=[0])
        code, msg = code_of(lambda: _put_raw(client, header, []))
        assert code == grpc.StatusCode.ABORTED and "skip_pages: page 0 is no longer stored" in msg


def _put_raw(client, header, frames):
    msgs = [pb.PutPagesRequest(header=header)] + [pb.PutPagesRequest(extent=f) for f in frames]
    return rpc.call(client.stub.PutPages, iter(msgs), timeout=30)


def _extent(pages, geo, g, i) -> bytes:
    layers = geo.group_layer_range(g)
    return np.ascontiguousarray(pages[i, layers.start : layers.stop]).tobytes()


def _all_frames(pages, geo, skip=()):
    return [
        pb.ExtentFrame(group=g, chunk=i, data=_extent(pages, geo, g, i))
        for g in range(geo.num_groups)
        for i in range(pages.shape[0])
        if i not in skip
    ]


def test_bad_page_requests_are_invalid_argument_naming_the_field_and_change_nothing(daemon_factory):
    d = daemon_factory("--max-prefix-tokens", "64")  # at most 4 pages of 16 tokens per call
    pages, keys = make_pages(GEO, 3, 2), page_keys(3, 2)
    geo_pb = geometry_to_pb(GEO)
    extent0 = _extent(pages, GEO, 0, 0)
    frames = _all_frames(pages, GEO)
    cases = {
        "keys: must not be empty": (pb.PutPagesHeader(geometry=geo_pb), frames),
        "keys[1]: must be 1 to 64 bytes, got 0": (pb.PutPagesHeader(geometry=geo_pb, keys=[b"a", b""]), []),
        "keys[0]: must be 1 to 64 bytes, got 65": (pb.PutPagesHeader(geometry=geo_pb, keys=[b"k" * 65]), []),
        "keys[2]: duplicates keys[0]": (pb.PutPagesHeader(geometry=geo_pb, keys=[b"a", b"b", b"a"]), []),
        "keys: 5 keys exceed the limit of 4 pages": (pb.PutPagesHeader(geometry=geo_pb, keys=[b"%d" % i for i in range(5)]), []),
        "header.geometry.model: is required": (pb.PutPagesHeader(keys=keys), []),
        "skip_pages: index 3 out of range [0, 3)": (pb.PutPagesHeader(geometry=geo_pb, keys=keys, skip_pages=[3]), []),
        "extent.chunk: the page index must be in [0, 3), got 3": (
            pb.PutPagesHeader(geometry=geo_pb, keys=keys),
            [pb.ExtentFrame(group=0, chunk=3, data=extent0)],
        ),
        "extent.group: must be in [0, 3), got 3": (
            pb.PutPagesHeader(geometry=geo_pb, keys=keys),
            [pb.ExtentFrame(group=3, chunk=0, data=extent0)],
        ),
        f"extent.data: group 0 page 0: {len(extent0) + 2} bytes exceed": (
            pb.PutPagesHeader(geometry=geo_pb, keys=keys),
            [pb.ExtentFrame(group=0, chunk=0, data=extent0 + b"xx")],
        ),
        "extent.offset: group 0 page 1: expected offset 0, got 2": (
            pb.PutPagesHeader(geometry=geo_pb, keys=keys),
            [pb.ExtentFrame(group=0, chunk=1, offset=2, data=extent0[2:])],
        ),
        "extent: group 0 page 0 was already sent": (pb.PutPagesHeader(geometry=geo_pb, keys=keys), [frames[0], frames[0]]),
        "extents: 2 page extents missing or short, first: group 0 page 0": (
            pb.PutPagesHeader(geometry=geo_pb, keys=keys),
            [pb.ExtentFrame(group=0, chunk=0, data=extent0[:-2])] + frames[1:-1],
        ),
    }
    with KVStoreClient(d.target) as client:
        for expected, (header, sent) in cases.items():
            code, msg = code_of(lambda: _put_raw(client, header, sent))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and msg.startswith(expected), (expected, code, msg)
        code, msg = code_of(lambda: rpc.call(client.stub.PutPages, iter([pb.PutPagesRequest(extent=frames[0])]), timeout=10))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and msg.startswith("header: the first message of PutPages")
        reads = {
            "layer_start: must be in [0, 5), got 7": lambda: client.get_pages(keys, GEO, layer_start=7),
            "keys: must not be empty": lambda: client.get_pages([], GEO),
            "keys[1]: duplicates keys[0]": lambda: client.pages_exist([b"a", b"a"], GEO),
            "namespace: longer than 256 bytes": lambda: client.pages_exist([b"a"], GEO, namespace="n" * 257),
        }
        for expected, call in reads.items():
            code, msg = code_of(call)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and msg.startswith(expected), (expected, code, msg)
        with pytest.raises(ValueError):
            client.put_pages(keys, pages[:2], GEO)  # client-side: one page per key
        assert client.list_prefixes() == [] and os.listdir(os.path.join(d.data_dir, "segments")) == []
        assert client.stats().disk_reserved_bytes == 0
        assert client.put_pages(keys, pages, GEO).pages_written == 3  # the store is fine
        code, msg = code_of(lambda: _put_raw(client, pb.PutPagesHeader(geometry=geo_pb, keys=keys, skip_pages=[1]), frames))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and msg.startswith("extent.chunk: page 1 is in skip_pages"), msg
        code, msg = code_of(lambda: client.get_pages([keys[0], b"unknown"], GEO))
        assert code == grpc.StatusCode.NOT_FOUND and msg == "keys[1]: page is not stored"


def test_a_token_limited_to_a_namespace_cannot_see_or_read_another_namespaces_pages(daemon_factory, tmp_path):
    tokens = tmp_path / "tokens.toml"
    tok_a, tok_b = "tenant-a-token-0123456789", "tenant-b-token-0123456789"
    tokens.write_text(f'[tokens]\n"{tok_a}" = ["a"]\n"{tok_b}" = ["b"]\n')
    d = daemon_factory("--tcp-address", "127.0.0.1:0", "--auth-tokens-file", str(tokens))
    tcp = f"127.0.0.1:{d.tcp_port}"
    pages, keys = make_pages(GEO, 4, 3), page_keys(4, 3)
    with KVStoreClient(tcp, token=tok_a) as a, KVStoreClient(tcp, token=tok_b) as b:
        batch = a.put_pages(keys, pages, GEO, namespace="a").batch_id
        unknown = page_keys(4, 99)
        for ns, probe in (("a", keys), ("a", unknown), ("b", keys)):  # a's pages look exactly like unknown ones
            present = b.pages_exist(probe, GEO, namespace=ns)
            assert present.exists.tolist() == [False] * 4 and present.num_leading == 0
            code, msg = code_of(lambda: b.get_pages(probe, GEO, namespace=ns))
            assert (code, msg) == (grpc.StatusCode.NOT_FOUND, "keys[0]: page is not stored")
        code, _ = code_of(lambda: b.put_pages(keys, pages, GEO, namespace="a"))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert b.list_prefixes() == []
        for call in (lambda: b.describe(batch), lambda: b.delete(batch), lambda: b.read_chunks(batch, [0])):
            assert code_of(call)[0] == grpc.StatusCode.NOT_FOUND
        np.testing.assert_array_equal(a.get_pages(keys, GEO, namespace="a"), pages)
        assert a.pages_exist(keys, GEO, namespace="a").num_leading == 4


def test_a_flipped_byte_in_a_page_is_data_loss_and_a_new_put_restores_the_page(daemon):
    pages, keys = make_pages(GEO24, 6, 4), page_keys(6, 4)
    with KVStoreClient(daemon.target) as client:
        batch = client.put_pages(keys, pages, GEO24).batch_id
        seg = client.inspect(batch)["segments"][0]
        path = os.path.join(daemon.data_dir, "segments", seg["file"])
        extent_bytes = GEO24.extent_bytes(0, 16)  # 32 KiB: 8 layers x 16 tokens x 2 KiB
        with open(path, "r+b") as fh:  # page 2, group 0
            fh.seek(2 * extent_bytes + 100)
            b = fh.read(1)
            fh.seek(2 * extent_bytes + 100)
            fh.write(bytes([b[0] ^ 1]))
        code, msg = code_of(lambda: client.get_pages(keys[1:4], GEO24))
        assert code == grpc.StatusCode.DATA_LOSS and "extent[group=0,chunk=2]" in msg
        assert not all(r.ok for r in client.verify(batch))
        # the quarantined batch holds its pages no more: they are missing, and storing them again heals
        assert client.pages_exist(keys, GEO24).num_leading == 0
        assert client.put_pages(keys, pages, GEO24).pages_written == 6
        np.testing.assert_array_equal(client.get_pages(keys, GEO24), pages)


def test_rebuild_index_restores_pages(daemon_factory, tmp_path):
    d = daemon_factory()
    a, b = make_pages(GEO, 5, 6), make_pages(GEO, 3, 7)
    ka, kb = page_keys(5, 6), page_keys(3, 7)
    with KVStoreClient(d.target) as client:
        client.put_pages(ka, a, GEO, namespace="ns")
        gone = client.put_pages(kb, b, GEO, namespace="ns").batch_id
        client.delete(gone)
    d.stop()
    shutil.rmtree(os.path.join(d.data_dir, "index"))
    report = rebuild_index(d.data_dir)
    assert len(report.restored) == 1 and report.skipped == {}
    restarted = daemon_factory(data_dir=d.data_dir)
    with KVStoreClient(restarted.target) as client:
        assert client.pages_exist(ka + kb, GEO, namespace="ns").exists.tolist() == [True] * 5 + [False] * 3
        np.testing.assert_array_equal(client.get_pages(ka, GEO, namespace="ns"), a)
        assert [p.kind for p in client.list_prefixes()] == ["pages"]


def test_a_cut_put_pages_stream_leaves_nothing(daemon_factory):
    d = daemon_factory("--max-disk-bytes", str(64 << 20))
    pages, keys = make_pages(GEO24, 10, 8), page_keys(10, 8)
    header = pb.PutPagesHeader(geometry=geometry_to_pb(GEO24), keys=keys)
    sent = threading.Event()

    def frames():
        yield pb.PutPagesRequest(header=header)
        for f in _all_frames(pages, GEO24)[:4]:
            yield pb.PutPagesRequest(extent=f)
        sent.set()
        time.sleep(30)  # the client goes away before sending the rest

    segments = os.path.join(d.data_dir, "segments")
    with KVStoreClient(d.target, shm=False) as client:
        call = client.stub.PutPages.future(frames(), timeout=60)
        assert sent.wait(10)
        deadline = time.monotonic() + 10
        while not os.listdir(segments) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.listdir(segments)  # the half put is on disk
        call.cancel()
        deadline = time.monotonic() + 10
        while (os.listdir(segments) or client.stats().disk_reserved_bytes) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.listdir(segments) == [] and client.stats().disk_reserved_bytes == 0
        assert client.list_prefixes() == [] and client.pages_exist(keys, GEO24).num_leading == 0
        assert client.put_pages(keys, pages, GEO24).pages_written == 10


def test_pages_and_prefixes_stay_apart(tmp_path):
    """Store level: a prefix's Lookup never matches pages, and pages never reuse a prefix's chunks."""
    geo = StoreGeometry(ModelSpec(2, 1, 4, "float32"), chunk_tokens=4, group_layers=1)
    with ChunkStore(StoreConfig(data_dir=str(tmp_path / "d"), min_free_bytes=0, index_map_bytes=1 << 20)) as store:
        tokens = np.arange(12)
        kv = make_kv(geo, 12, 1)
        pid = store.put(tokens, kv, geo).prefix_id
        keys = [bytes(h, "ascii") for h in store.describe(pid).chunk_hashes]  # a prefix's own chunk hashes as keys
        assert store.pages.exists(keys, geo).num_leading == 0
        pages = np.ascontiguousarray(kv.reshape(2, 2, 1, 3, 4, 4).transpose(3, 0, 1, 2, 4, 5))
        batch = store.pages.put(keys[:1] + [b"x"], pages[:2], geo).batch_id
        assert store.lookup(tokens, geo).prefix_id == pid and store.lookup(tokens, geo).matched_chunks == 3
        kinds = {p["prefix_id"]: p["kind"] for p in store.list_prefixes()}
        assert kinds == {pid: "prefix", batch: "pages"}
        assert store.inspect(batch)["kind"] == "pages" and store.describe(batch).num_tokens == 8


@pytest.mark.parametrize("with_new_pages", [True, False], ids=["new-pages", "all-stored"])
def test_a_put_whose_stored_pages_are_deleted_before_its_commit_is_a_conflict(tmp_path, with_new_pages):
    """Store level: an acknowledged put means every one of its pages is stored, also those it did not write."""
    with ChunkStore(StoreConfig(data_dir=str(tmp_path / "d"), min_free_bytes=0, index_map_bytes=1 << 20)) as store:
        pages, keys = make_pages(GEO, 4, 9), page_keys(4, 9)
        first = store.pages.put(keys[:2], pages[:2], GEO).batch_id
        n = 4 if with_new_pages else 2
        pending = store.pages.begin_put(keys[:n], GEO)
        pending.put_pages(pages[:n])
        store.delete(first)  # an operator's delete does not wait for holds
        with pytest.raises(Conflict):
            pending.commit()
        assert store.list_prefixes() == [] and os.listdir(store.segment_dir) == []
        assert store.pages.put(keys, pages, GEO).pages_written == 4  # a retry stores them all
        np.testing.assert_array_equal(store.pages.get(keys, GEO).to_array(), pages)
