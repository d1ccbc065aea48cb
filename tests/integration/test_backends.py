"""I/O backends on real files: alignment rules, selection, and kvikio where a GPU exists."""

import logging
import os

import numpy as np
import pytest
from helpers import HAS_CUDA

from kvstore.config import StoreConfig
from kvstore.errors import BackendUnavailable, InvalidArgument
from kvstore.io import PosixBackend, aligned_buffer, make_backend
from kvstore.io.kvikio_backend import unavailable_reason


def test_posix_roundtrip_and_alignment_checks(tmp_path):
    path = str(tmp_path / "f")
    with PosixBackend(queue_depth=4) as b:
        fh = b.open(path, write=True)
        assert fh.direct
        data = aligned_buffer(1 << 20)
        np.frombuffer(data, np.uint8)[:] = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)
        futures = [b.pwrite(fh, data[i : i + 65536], i) for i in range(0, 1 << 20, 65536)]
        assert sum(f.result() for f in futures) == 1 << 20
        b.fdatasync(fh)
        b.close(fh)
        fh = b.open(path)
        out = aligned_buffer(1 << 20)
        assert b.pread(fh, out, 0).result() == 1 << 20
        assert bytes(out) == bytes(data)
        with pytest.raises(ValueError, match="aligned"):
            b.pread(fh, out[:1000], 0)
        with pytest.raises(ValueError, match="aligned"):
            b.pread(fh, out[:4096], 512)
        with pytest.raises(ValueError, match="aligned"):
            b.pread(fh, out[1:4097], 0)
        with pytest.raises(EOFError):
            b.pread(fh, aligned_buffer(8192), (1 << 20) - 4096).result()
        with pytest.raises(ValueError, match="not open for writing"):
            b.pwrite(fh, out[:4096], 0)
        b.close(fh)


def test_buffered_mode_takes_unaligned_requests(tmp_path):
    with PosixBackend(queue_depth=2, direct=False) as b:
        fh = b.open(str(tmp_path / "f"), write=True)
        assert not fh.direct
        b.pwrite(fh, b"hello world", 3).result()
        out = bytearray(5)
        b.pread(fh, out, 9).result()
        assert out == b"world"
        b.close(fh)


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU-only fallback")
def test_auto_picks_posix_without_cuda_and_says_why(caplog):
    caplog.set_level(logging.INFO, logger="kvstore.io")
    with make_backend("auto") as b:
        assert b.name == "posix"
    assert "kvikio skipped" in caplog.text and "libcuda.so.1" in caplog.text
    assert unavailable_reason() is not None


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU-only fallback")
def test_failed_open_releases_the_data_dir_lock(tmp_path):
    from kvstore.store import ChunkStore

    cfg = StoreConfig(data_dir=str(tmp_path / "d"), backend="kvikio")
    for _ in range(2):  # the second attempt must not find the directory locked
        with pytest.raises(BackendUnavailable):
            ChunkStore(cfg)
    ChunkStore(StoreConfig(data_dir=str(tmp_path / "d"))).close()
    with pytest.raises(BackendUnavailable, match="kvikio.*cannot run.*libcuda"):
        make_backend("kvikio")


def test_forcing_posix_is_logged(caplog):
    caplog.set_level(logging.INFO, logger="kvstore.io")
    with make_backend("posix", queue_depth=3) as b:
        assert b.name == "posix" and b.queue_depth == 3
    assert "forced" in caplog.text


def test_unknown_backend_is_rejected():
    with pytest.raises(InvalidArgument, match="backend"):
        make_backend("spdk")
    with pytest.raises(Exception, match="backend"):
        StoreConfig(backend="spdk")


@pytest.mark.gpu
def test_kvikio_host_and_device_roundtrip(tmp_path):
    from kvstore.io.kvikio_backend import KvikioBackend

    path = str(tmp_path / "f")
    with KvikioBackend(queue_depth=8) as b:
        fh = b.open(path, write=True)
        data = aligned_buffer(1 << 20)
        np.frombuffer(data, np.uint8)[:] = np.arange(1 << 20, dtype=np.uint64).astype(np.uint8)
        b.pwrite(fh, data, 0).result()
        b.fdatasync(fh)
        b.close(fh)
        fh = b.open(path)
        out = aligned_buffer(1 << 20)
        assert b.pread(fh, out[:65536], 4096).result() == 65536
        assert bytes(out[:65536]) == bytes(data[4096 : 4096 + 65536])
        import torch

        dev = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        assert b.pread(fh, dev, 0).result() == 1 << 20
        assert bytes(dev.cpu().numpy()) == bytes(data)
        b.close(fh)


@pytest.mark.gpu
def test_store_roundtrip_on_kvikio(tmp_path):
    from helpers import GEOMETRIES, make_kv, make_tokens

    from kvstore.store import ChunkStore

    geo = GEOMETRIES[3]
    kv = make_kv(geo, 100, 1)
    with ChunkStore(StoreConfig(data_dir=str(tmp_path / "d"), backend="kvikio", min_free_bytes=0)) as store:
        assert store.backend.name == "kvikio"
        pid = store.put(make_tokens(100, 1), kv, geo).prefix_id
        np.testing.assert_array_equal(store.read(pid, range(7)).to_kv(), kv)
        assert all(r["ok"] for r in store.verify())
    assert os.path.isdir(tmp_path / "d" / "segments")
