"""Pinned staging of delivered rows (CUDA): every gathered array arrives on the device intact, in any order of
gathering and uploading, and a buffer is not written while its array waits or its copy runs."""

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with a CUDA device")]


def test_arrays_gathered_before_any_upload_keep_their_own_buffers():
    from engine_client.reprefill.staging import PinnedStaging

    staging = PinnedStaging(torch.device("cuda"))
    rng = np.random.default_rng(0)
    shapes = [(2, 2, 3, rows, 16) for rows in (40, 7, 40, 100, 3)]
    want = [rng.integers(0, 2**15, size=s, dtype=np.int16) for s in shapes]
    arrays = []
    for w in want:  # a Period gathered whole before its compute
        a = staging.host(w.shape, w.dtype)
        a[...] = w
        arrays.append(a)
    assert len({a.ctypes.data for a in arrays}) == len(arrays)  # five buffers: none reused while its array waits
    got = [staging.upload(a, "bfloat16") for a in reversed(arrays)]
    for t, w in zip(reversed(got), want):
        assert t.device.type == "cuda" and t.dtype == torch.bfloat16
        np.testing.assert_array_equal(t.view(torch.int16).cpu().numpy(), w)
    assert staging.upload(np.zeros((2, 2), np.int16), "bfloat16") is None  # not one of its arrays
    assert staging.bytes_uploaded == sum(w.nbytes for w in want)


def test_a_ring_reused_group_by_group_delivers_every_group():
    from engine_client.reprefill.staging import PinnedStaging

    staging = PinnedStaging(torch.device("cuda"))
    out = []
    for i in range(20):  # gather, upload, compute: the overlapped order
        a = staging.host((4, 2, 2, 64, 32), np.int16)
        a[...] = i
        t = staging.upload(a, "bfloat16")
        out.append(t.view(torch.int16).float().mean())  # work on the current stream, after the copy's event
    assert [int(v) for v in torch.stack(out).cpu()] == list(range(20))
    assert len(staging.slots) <= 2
