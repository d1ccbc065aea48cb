"""Reading pages the way an engine does, on a real daemon: exact layer ranges, into the caller's own buffers."""

import os
import time

import grpc
import numpy as np
import pytest
import torch
from helpers import GEOMETRIES, make_kv, make_tokens
from test_pages import code_of, make_pages, page_keys

from engine_client.client import KVStoreClient, to_torch
from engine_client.pages import PageFrames

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


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "bytes"])
def test_a_second_get_pages_is_a_tier_hit_with_the_same_bytes(daemon, shm):
    """The test daemon's arena has a CPU tier (24 MiB): pages read from disk are admitted, read again from memory."""
    pages, keys = make_pages(GEO24, 12, 6), page_keys(12, 6)
    units = 12 * GEO24.num_groups
    with KVStoreClient(daemon.target, shm=shm) as client:
        released = _count_releases(client)
        client.put_pages(keys, pages, GEO24)
        s0 = client.stats()
        np.testing.assert_array_equal(client.get_pages(keys, GEO24), pages)
        s1 = client.stats()
        assert (s1.tier_miss_units - s0.tier_miss_units, s1.tier_hit_units - s0.tier_hit_units) == (units, 0)
        assert s1.tier_units - s0.tier_units == units and s1.pinned_units == 0  # admitted, and let go
        out = np.zeros_like(pages)
        client.get_pages_into(keys, out, GEO24)
        np.testing.assert_array_equal(out, pages)
        s2 = client.stats()
        assert (s2.tier_hit_units - s1.tier_hit_units, s2.tier_miss_units - s1.tier_miss_units) == (units, 0)
        assert s2.bytes_read_cpu - s1.bytes_read_cpu == pages.nbytes and s2.bytes_read == s1.bytes_read  # no disk read
        # partly resident: the new pages come from disk, the others from memory, in request order
        more, more_keys = make_pages(GEO24, 3, 7), page_keys(3, 7)
        client.put_pages(more_keys, more, GEO24)
        mixed = [more_keys[0], keys[5], more_keys[1], keys[0], more_keys[2]]
        got = client.get_pages(mixed, GEO24, layer_start=4, layer_end=20)
        np.testing.assert_array_equal(got, np.stack([more[0], pages[5], more[1], pages[0], more[2]])[:, 4:20])
        s3 = client.stats()
        assert (s3.tier_hit_units - s2.tier_hit_units, s3.tier_miss_units - s2.tier_miss_units) == (2 * 3, 3 * 3)
        assert s3.pinned_units == 0 and _leased_settle(client) == 0
        assert bool(released) == shm  # the shared-memory path did deliver through the arena


def test_a_get_pages_that_fails_or_is_abandoned_part_way_gives_every_lease_back(daemon, monkeypatch):
    pages, keys = make_pages(GEO24, 40, 8), page_keys(40, 8)  # 4 batches of 10 pages in the 8 MiB lease space
    with KVStoreClient(daemon.target, shm=True) as client:
        client.put_pages(keys, pages, GEO24)
        # the caller's copy fails part way: the rest of the stream is read for its leases
        real, copied = PageFrames.take, []

        def failing(self, *args):
            copied.append(1)
            if len(copied) > 15:
                raise RuntimeError("the engine's copy failed")
            return real(self, *args)

        monkeypatch.setattr(PageFrames, "take", failing)
        with pytest.raises(RuntimeError, match="the engine's copy failed"):
            client.get_pages(keys, GEO24)
        monkeypatch.undo()
        assert _leased_settle(client) == 0
        # a checksum failure in the last batch, after three were handed over (pages not read before: from disk)
        bad, bad_keys = make_pages(GEO24, 40, 9), page_keys(40, 9)
        batch = client.put_pages(bad_keys, bad, GEO24).batch_id
        seg = client.inspect(batch)["segments"][0]
        with open(os.path.join(daemon.data_dir, "segments", seg["file"]), "r+b") as fh:
            fh.seek(39 * GEO24.extent_bytes(0, 16) + 7)  # page 39, group 0
            b = fh.read(1)
            fh.seek(-1, os.SEEK_CUR)
            fh.write(bytes([b[0] ^ 0xFF]))
        code, msg = code_of(lambda: client.get_pages(bad_keys, GEO24))
        assert code == grpc.StatusCode.DATA_LOSS and "extent[group=0,chunk=39]" in msg, msg
        assert _leased_settle(client) == 0 and client.stats().pinned_units == 0
        np.testing.assert_array_equal(client.get_pages(keys, GEO24), pages)  # the other batch is whole


def _count_releases(client) -> list:
    """The lease counts the client hands back on its shm session (empty on the bytes path)."""
    out = []
    if client.session is not None:
        real = client.session.release

        def release(leases):
            out.append(len(leases))
            real(leases)

        client.session.release = release
    return out


def _leased_settle(client, timeout_s: float = 10.0) -> int:
    """Leased arena bytes once the client's releases (on its shm connection, not with Stats) have landed."""
    deadline = time.monotonic() + timeout_s
    while (leased := client.stats().shm_leased_bytes) and time.monotonic() < deadline:
        time.sleep(0.02)
    return leased


def test_many_small_pages_read_again_from_the_tier_over_shared_memory(daemon):
    """128-byte extents: hits of a group share one lease (a lease per extent would take a 64 KiB slot each)."""
    pages, keys = make_pages(GEO, 600, 10), page_keys(600, 10)
    with KVStoreClient(daemon.target, shm=True) as client:
        client.put_pages(keys, pages, GEO)
        np.testing.assert_array_equal(client.get_pages(keys, GEO), pages)
        before = client.stats()
        t0 = time.monotonic()
        np.testing.assert_array_equal(client.get_pages(keys, GEO, timeout=20), pages)
        assert time.monotonic() - t0 < 10
        after = client.stats()
        assert after.tier_hit_units - before.tier_hit_units == 600 * GEO.num_groups
        assert _leased_settle(client) == 0


def test_pages_of_many_small_batches_read_cold_over_shared_memory(daemon):
    """300 batches of two pages, read at once from disk: one lease per group, not one per batch and group."""
    pages, keys = make_pages(GEO, 600, 11), page_keys(600, 11)
    with KVStoreClient(daemon.target, shm=True, put_coalesce=False) as client:
        for i in range(0, 600, 2):
            client.put_pages(keys[i : i + 2], pages[i : i + 2], GEO, namespace="cold")
        assert len(client.list_prefixes("cold")) == 300
        before = client.stats()
        np.testing.assert_array_equal(client.get_pages(keys, GEO, namespace="cold", timeout=20), pages)
        assert client.stats().tier_miss_units - before.tier_miss_units == 600 * GEO.num_groups
        assert _leased_settle(client) == 0
