"""I/O backends on real files: alignment rules, selection, and kvikio where a GPU exists."""

import errno
import functools
import gc
import logging
import os
import threading
import time

import numpy as np
import pytest
from helpers import HAS_CUDA

from kvstore.config import StoreConfig
from kvstore.errors import BackendUnavailable, InvalidArgument
from kvstore.io import FileHandle, PosixBackend, aligned_buffer, make_backend
from kvstore.io.inflight import InFlight
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


def test_read_gauge_counts_requests_until_they_complete(tmp_path):
    path = str(tmp_path / "f")
    gauge = InFlight()
    with PosixBackend(queue_depth=4) as b:
        fh = b.open(path, write=True)
        b.pwrite(fh, aligned_buffer(1 << 20), 0).result()
        futures = [gauge.track(b.pread(fh, aligned_buffer(65536), i)) for i in range(0, 1 << 20, 65536)]
        assert 0 <= gauge.count <= 16
        assert sum(f.result() for f in futures) == 1 << 20
        assert _drained(gauge)  # counted down on the worker threads, right after they woke the waiter
        with pytest.raises(EOFError):
            gauge.track(b.pread(fh, aligned_buffer(8192), (1 << 20) - 4096)).result()
        assert _drained(gauge)  # a failed read completes too
        b.close(fh)

    class NoCallbacks:  # the shape of kvikio's futures: result and done, no completion callback
        def done(self):
            return True

        def result(self, timeout=None):
            return 4096

    tracked = gauge.track(NoCallbacks())
    assert gauge.count == 1 and tracked.done()
    assert tracked.result() == 4096 and gauge.count == 0
    tracked.result()
    assert gauge.count == 0  # counted down once


def _drained(gauge: InFlight, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while gauge.count and time.monotonic() < deadline:
        time.sleep(0.001)
    return gauge.count == 0


def test_buffered_mode_takes_unaligned_requests(tmp_path):
    with PosixBackend(queue_depth=2, direct=False) as b:
        fh = b.open(str(tmp_path / "f"), write=True)
        assert not fh.direct
        b.pwrite(fh, b"hello world", 3).result()
        out = bytearray(5)
        b.pread(fh, out, 9).result()
        assert out == b"world"
        b.close(fh)


def _data_file(path, nbytes, seed=0):
    """A file of ``nbytes`` random bytes (written buffered); returns its content."""
    data = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(data.tobytes())
    return data


def _hold_worker(b, release):
    """Occupy one worker of ``b`` until ``release`` is set (a request that waits)."""
    return b._submit(lambda fd, buf, offset, nbytes: int(release.wait(30)), -1, None, 0, 0)


def test_buffer_address_is_exact_and_cheap_paths_agree():
    from kvstore.io.base import buffer_address, check_aligned

    mem = aligned_buffer(3 * 4096)
    base = np.frombuffer(mem, np.uint8).ctypes.data
    assert base % 4096 == 0
    for view in (mem, mem[4096:], mem[1:4097], mem[4096:8192].cast("I")):
        assert buffer_address(view) == np.frombuffer(view, np.uint8).ctypes.data
    arr = np.zeros(16, np.float64)
    assert buffer_address(arr[3:]) == arr.ctypes.data + 24
    ro = bytes(8192)  # read-only: the numpy path
    assert buffer_address(ro) == np.frombuffer(ro, np.uint8).ctypes.data
    assert buffer_address(memoryview(mem)[:0]) == 0 and buffer_address(b"") == 0
    check_aligned(mem[:0], 0)  # empty: nothing to misalign
    check_aligned(mem[4096:], 4096)
    check_aligned(mem[4096:8192].cast("I"), 0)
    with pytest.raises(ValueError, match="aligned"):
        check_aligned(mem[4096 + 512 : 8192 + 512], 0)
    with pytest.raises(ValueError, match="contiguous"):
        check_aligned(np.zeros((1024, 2), np.float32)[:, 0], 0)


def test_posix_futures_complete_callbacks_and_report_errors(tmp_path, caplog):
    path = str(tmp_path / "f")
    data = _data_file(path, 1 << 16)
    release = threading.Event()
    with PosixBackend(queue_depth=1) as b:
        fh = b.open(path)
        seen = []
        out = aligned_buffer(8192)
        _hold_worker(b, release)
        fut = b.pread(fh, out, 4096)  # queued behind the held request: not done yet
        fut.add_done_callback(lambda f: seen.append((f, f.result(), threading.current_thread().name)))
        release.set()
        assert fut.result(timeout=10) == 8192 and fut.done() and fut.exception() is None
        for _ in range(1000):  # the callback runs just after completion, on the worker
            if seen:
                break
            time.sleep(0.01)
        assert seen[0][:2] == (fut, 8192) and seen[0][2].startswith("kvstore-io")
        late = []
        fut.add_done_callback(late.append)  # already done: called at once, here
        assert late == [fut]
        assert bytes(out) == data[4096 : 4096 + 8192].tobytes()

        caplog.set_level(logging.ERROR, logger="kvstore.io")
        bad = b.pread(fh, aligned_buffer(8192), (1 << 16) - 4096)
        bad.add_done_callback(lambda f: 1 / 0)  # logged, the worker lives on
        with pytest.raises(EOFError):
            bad.result()
        assert isinstance(bad.exception(), EOFError)
        # the kernel's error comes out of result(), not pwrite(): a read-only fd
        lying = FileHandle(path=path, writable=True, direct=fh.direct, raw=fh.raw)
        failed = b.pwrite(lying, out, 0)
        with pytest.raises(OSError) as info:
            failed.result(timeout=10)
        assert info.value.errno == errno.EBADF
        assert b.pread(fh, out, 0).result(timeout=10) == 8192  # still serving
        b.close(fh)
    for _ in range(1000):
        if "ZeroDivisionError" in caplog.text:
            break
        time.sleep(0.01)
    assert "exception in a callback" in caplog.text and "ZeroDivisionError" in caplog.text


def test_posix_pending_future_times_out_and_queues_past_queue_depth(tmp_path):
    path = str(tmp_path / "f")
    _data_file(path, 1 << 16)
    release = threading.Event()
    with PosixBackend(queue_depth=1) as b:
        fh = b.open(path)
        first = _hold_worker(b, release)
        second = b.pread(fh, aligned_buffer(4096), 4096)
        assert not second.done()
        with pytest.raises(TimeoutError):
            second.result(timeout=0.05)
        with pytest.raises(TimeoutError):
            second.result(timeout=0)
        assert len(b._threads) == 1  # never more workers than queue_depth
        release.set()
        assert second.result(timeout=10) == 4096 and first.result() == 1
        b.close(fh)


def test_posix_concurrent_callers_and_callback_chains(tmp_path):
    """Reader threads sharing one backend get their own bytes; chains resubmitting
    from callbacks (the bench's pattern) run alongside."""
    path = str(tmp_path / "f")
    size = 4 << 20
    data = _data_file(path, size)
    errors = []
    with PosixBackend(queue_depth=4) as b:
        fh = b.open(path)

        def reader(seed):
            rng = np.random.default_rng(seed)
            try:
                for _ in range(150):
                    blocks = int(rng.integers(1, 5))
                    offset = int(rng.integers(0, size // 4096 - blocks)) * 4096
                    out = aligned_buffer(blocks * 4096)
                    assert b.pread(fh, out, offset).result(timeout=30) == blocks * 4096
                    assert bytes(out) == data[offset : offset + blocks * 4096].tobytes()
            except BaseException as exc:
                errors.append(exc)

        chain_done = threading.Event()
        chain_reads = []

        def on_done(buf, offset, fut):
            try:
                fut.result()
                assert bytes(buf) == data[offset : offset + 4096].tobytes()
                chain_reads.append(offset)
                if len(chain_reads) < 200:  # (a callback may run on the submitter: stay shallow)
                    nxt = (offset + 8192) % size
                    b.pread(fh, buf, nxt).add_done_callback(functools.partial(on_done, buf, nxt))
                    return
            except BaseException as exc:
                errors.append(exc)
            chain_done.set()

        chain_buf = aligned_buffer(4096)
        b.pread(fh, chain_buf, 0).add_done_callback(functools.partial(on_done, chain_buf, 0))
        threads = [threading.Thread(target=reader, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert chain_done.wait(60)
        assert not errors, errors[0]
        assert len(chain_reads) == 200
        assert 1 <= len(b._threads) <= 4
        b.close(fh)


def test_posix_shutdown_finishes_queued_io_and_joins_workers(tmp_path):
    path = str(tmp_path / "f")
    data = _data_file(path, 1 << 20)
    b = PosixBackend(queue_depth=3)
    fh = b.open(path)
    bufs = [aligned_buffer(65536) for _ in range(16)]
    futures = [b.pread(fh, buf, i * 65536) for i, buf in enumerate(bufs)]
    workers = list(b._threads)
    assert len(workers) == 3
    b.shutdown()
    assert all(f.done() for f in futures) and not any(t.is_alive() for t in workers)
    assert all(bytes(buf) == data[i * 65536 : (i + 1) * 65536].tobytes() for i, buf in enumerate(bufs))
    with pytest.raises(RuntimeError, match="shutdown"):
        b.pread(fh, bufs[0], 0)
    b.shutdown()  # twice is fine
    b.close(fh)


def test_posix_backend_dropped_without_shutdown_lets_workers_go(tmp_path):
    path = str(tmp_path / "f")
    _data_file(path, 1 << 16)
    b = PosixBackend(queue_depth=2)
    fh = b.open(path)
    assert b.pread(fh, aligned_buffer(4096), 0).result(timeout=10) == 4096
    workers = list(b._threads)
    b.close(fh)
    del b
    gc.collect()
    for t in workers:
        t.join(10)
        assert not t.is_alive()


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
