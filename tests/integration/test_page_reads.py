"""Reading pages the way an engine does, on a real daemon: exact layer ranges, into the caller's own buffers."""

import grpc
import numpy as np
import pytest
import torch
from helpers import GEOMETRIES, make_kv, make_tokens
from test_pages import code_of, make_pages, page_keys

from engine_client.client import KVStoreClient, to_torch

GEO = GEOMETRIES[0]  # 5 layers in groups of 2 (0-1, 2-3, 4), one head, head dim 1, bf16
GEO24 = GEOMETRIES[3]  # 24 layers in groups of 8, 2 heads x 64 dim, bf16


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "bytes"])
def test_a_layer_range_gives_exactly_those_layers_or_is_refused(daemon, shm):
    pages, keys = make_pages(GEO24, 6, 1), page_keys(6, 1)
    kv, tokens = make_kv(GEO24, 40, 2), make_tokens(40, 2)
    with KVStoreClient(daemon.target, shm=shm) as client:
        client.put_pages(keys, pages, GEO24)
        pid = client.put_prefix(tokens, kv, GEO24).prefix_id
        for start, end in ((8, 12), (3, 4), (5, 17), (23, 0), (0, 0), (0, 24), (7, 9)):
            stop = end or 24
            got = client.get_pages(keys, GEO24, layer_start=start, layer_end=end)
            assert got.shape == (6, stop - start, 2, 2, 16, 64)
            np.testing.assert_array_equal(got, pages[:, start:stop])
            with client.read_chunks(pid, [0, 2], layer_start=start, layer_end=end) as read:
                np.testing.assert_array_equal(read.to_kv(), kv[start:stop, :, :, np.r_[0:16, 32:40]])
                assert read.groups == list(range(start // 8, (stop - 1) // 8 + 1))  # extents stay whole groups
        refused = {
            (12, 12): "layer_end: must be in (12, 24] or 0, got 12",
            (12, 8): "layer_end: must be in (12, 24] or 0, got 8",
            (24, 0): "layer_start: must be in [0, 24), got 24",
            (0, 25): "layer_end: must be in (0, 24] or 0, got 25",
        }
        for (start, end), message in refused.items():
            for read in (
                lambda: client.get_pages(keys, GEO24, layer_start=start, layer_end=end),
                lambda: client.get_pages_into(keys, np.empty((6, 1, 2, 2, 16, 64), np.uint16), GEO24, layer_start=start, layer_end=end),
                lambda: client.read_chunks(pid, [0], layer_start=start, layer_end=end),
            ):
                assert code_of(read) == (grpc.StatusCode.INVALID_ARGUMENT, message)


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "bytes"])
def test_get_pages_into_fills_the_callers_numpy_or_torch_buffer(daemon, shm):
    pages, keys = make_pages(GEO24, 9, 3), page_keys(9, 3)
    with KVStoreClient(daemon.target, shm=shm) as client:
        client.put_pages(keys, pages, GEO24)
        out = np.zeros((9, 24, 2, 2, 16, 64), np.uint16)
        assert client.get_pages_into(keys, out, GEO24) is out
        np.testing.assert_array_equal(out, pages)
        # a torch tensor in the model's dtype, a layer range, a slice of a bigger pool (contiguous)
        pool = torch.zeros((12, 4, 2, 2, 16, 64), dtype=torch.bfloat16)
        client.get_pages_into(keys[2:7], pool[3:8], GEO24, layer_start=9, layer_end=13)
        assert torch.equal(pool[3:8], to_torch(np.ascontiguousarray(pages[2:7, 9:13]), torch.bfloat16))
        assert not pool[:3].any() and not pool[8:].any()


def test_get_pages_into_refuses_a_wrong_buffer_before_asking_and_writes_nothing(daemon):
    pages, keys = make_pages(GEO, 3, 4), page_keys(3, 4)
    with KVStoreClient(daemon.target) as client:
        client.put_pages(keys, pages, GEO)
        before = client.stats().latency
        cases = [
            ("out: shape must be (3, 5, 2, 1, 16, 1)", np.zeros((2, 5, 2, 1, 16, 1), np.uint16), {}),
            ("out: shape must be (3, 1, 2, 1, 16, 1)", np.zeros((3, 5, 2, 1, 16, 1), np.uint16), {"layer_start": 4}),
            ("out: dtype must be uint16, got float32", np.zeros((3, 5, 2, 1, 16, 1), np.float32), {}),
            ("out: dtype must be torch.bfloat16, got torch.float16", torch.zeros((3, 5, 2, 1, 16, 1), dtype=torch.float16), {}),
            ("out: must be contiguous", np.zeros((3, 5, 2, 1, 16, 2), np.uint16)[..., :1], {}),
            ("out: must be a numpy array or a torch tensor, got bytearray", bytearray(480), {}),
        ]
        for message, out, kw in cases:
            snapshot = out.copy() if isinstance(out, np.ndarray) else None
            with pytest.raises(ValueError) as err:
                client.get_pages_into(keys, out, GEO, **kw)
            assert str(err.value).startswith(message), (message, str(err.value))
            if snapshot is not None:
                np.testing.assert_array_equal(out, snapshot)
        assert _calls(client.stats().latency, "GetPages") == _calls(before, "GetPages")  # nothing was asked
        # a missing key is NOT_FOUND, as get_pages says it
        code, msg = code_of(lambda: client.get_pages_into([keys[0], b"nope"], np.zeros((2, 5, 2, 1, 16, 1), np.uint16), GEO))
        assert (code, msg) == (grpc.StatusCode.NOT_FOUND, "keys[1]: page is not stored")


@pytest.mark.gpu
def test_get_pages_into_a_cuda_tensor_and_pinned_host_memory(daemon):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    pages, keys = make_pages(GEO24, 40, 5), page_keys(40, 5)
    want = to_torch(pages, torch.bfloat16)
    for shm in (True, False):
        with KVStoreClient(daemon.target, shm=shm) as client:
            client.put_pages(keys, pages, GEO24)
            dev = torch.zeros((40, 24, 2, 2, 16, 64), dtype=torch.bfloat16, device="cuda")
            pinned = torch.zeros((40, 24, 2, 2, 16, 64), dtype=torch.bfloat16, pin_memory=True)
            for out in (dev, pinned):
                client.get_pages_into(keys, out, GEO24)
                assert torch.equal(out.cpu(), want)


def _calls(latency, rpc: str) -> int:
    return sum(row.count for row in latency if row.rpc == rpc)
