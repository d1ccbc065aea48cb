"""I/O backends on real files: alignment rules, selection, and kvikio where a GPU exists.

The contract tests run for every host backend (posix and uring): the same
futures, alignment errors, buffered fallback, queueing past the queue depth,
errors through the future, shutdown and garbage collection.

Why ~620 lines in one file: the contract tests are parametrized over the
backends, so posix and uring are held to one list; splitting it by backend
would let the two lists drift apart.
"""

import errno
import functools
import gc
import logging
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from helpers import HAS_CUDA

from kvstore.config import StoreConfig
from kvstore.contract.errors import BackendUnavailable, InvalidArgument
from kvstore.io import FileHandle, PosixBackend, aligned_buffer, make_backend, resolve_backend
from kvstore.io import uring as uring_module
from kvstore.io.inflight import InFlight
from kvstore.io.uring import UringBackend

URING_REASON = uring_module.unavailable_reason()
HOST_BACKENDS = [
    pytest.param(PosixBackend, id="posix"),
    pytest.param(UringBackend, id="uring", marks=pytest.mark.skipif(URING_REASON is not None, reason=f"io_uring: {URING_REASON}")),
]


@pytest.fixture(params=HOST_BACKENDS)
def backend_cls(request):
    return request.param


def _threads(b) -> list:
    """The backend's own threads: posix's workers, uring's ring thread."""
    return list(b._threads) if isinstance(b, PosixBackend) else [b._thread]


def _in_the_kernel(b) -> int:
    """Requests handed to the device side: posix's busy workers bound it, uring's ring holds them."""
    return len(b._threads) if isinstance(b, PosixBackend) else len(b._ring.pending)


def test_roundtrip_and_alignment_checks(tmp_path, backend_cls):
    path = str(tmp_path / "f")
    with backend_cls(queue_depth=4) as b:
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


def test_read_gauge_counts_requests_until_they_complete(tmp_path, backend_cls):
    path = str(tmp_path / "f")
    gauge = InFlight()
    with backend_cls(queue_depth=4) as b:
        fh = b.open(path, write=True)
        b.pwrite(fh, aligned_buffer(1 << 20), 0).result()
        futures = [gauge.track(b.pread(fh, aligned_buffer(65536), i)) for i in range(0, 1 << 20, 65536)]
        assert 0 <= gauge.count <= 16
        assert sum(f.result() for f in futures) == 1 << 20
        assert _drained(gauge)  # counted down on the backend's thread, right after it woke the waiter
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


def test_buffered_mode_takes_unaligned_requests(tmp_path, backend_cls):
    with backend_cls(queue_depth=2, direct=False) as b:
        fh = b.open(str(tmp_path / "f"), write=True)
        assert not fh.direct
        b.pwrite(fh, b"hello world", 3).result()
        out = bytearray(5)
        b.pread(fh, out, 9).result()
        assert out == b"world"
        immutable = b"xxxxx"
        with pytest.raises(BufferError):  # never read into bytes: at submit (uring) or from the future (posix)
            b.pread(fh, immutable, 9).result()
        assert immutable == b"xxxxx"
        column = np.zeros((8, 2), np.uint8)[:, 0]  # not one contiguous block
        with pytest.raises(ValueError, match="contiguous"):
            b.pread(fh, column, 0).result()
        b.close(fh)


def _data_file(path, nbytes, seed=0):
    """A file of ``nbytes`` random bytes (written buffered); returns its content."""
    data = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(data.tobytes())
    return data


class _Held:
    """A request of ``b`` that stays in flight until ``release()``; its result is 1.

    posix: a worker waiting on an event.  uring: a read of one byte from an
    empty pipe, which the kernel keeps in the ring until the byte is written.
    """

    def __init__(self, b):
        if isinstance(b, PosixBackend):
            self._event = threading.Event()
            self.future = b._submit(lambda fd, buf, offset, nbytes: int(self._event.wait(30)), -1, None, 0, 0)
            self._fds = ()
        else:
            self._fds = os.pipe()
            pipe = FileHandle(path="pipe", writable=False, direct=False, raw=self._fds[0])
            self.future = b.pread(pipe, bytearray(1), 0)

    def release(self) -> None:
        if self._fds:
            os.write(self._fds[1], b"x")
        else:
            self._event.set()

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)


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


def test_futures_complete_callbacks_and_report_errors(tmp_path, caplog, backend_cls):
    path = str(tmp_path / "f")
    data = _data_file(path, 1 << 16)
    with backend_cls(queue_depth=1) as b:
        fh = b.open(path)
        seen = []
        out = aligned_buffer(8192)
        held = _Held(b)
        fut = b.pread(fh, out, 4096)  # queued behind the held request: not done yet
        assert not fut.done()
        fut.add_done_callback(lambda f: seen.append((f, f.result(), threading.current_thread().name)))
        held.release()
        assert fut.result(timeout=10) == 8192 and fut.done() and fut.exception() is None
        for _ in range(1000):  # the callback runs just after completion, on the backend's thread
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
        assert held.future.result(timeout=10) == 1
        b.close(fh)
        held.close()
    for _ in range(1000):
        if "ZeroDivisionError" in caplog.text:
            break
        time.sleep(0.01)
    assert "exception in a callback" in caplog.text and "ZeroDivisionError" in caplog.text


def test_pending_future_times_out_and_queues_past_queue_depth(tmp_path, backend_cls):
    path = str(tmp_path / "f")
    _data_file(path, 1 << 16)
    with backend_cls(queue_depth=1) as b:
        fh = b.open(path)
        held = _Held(b)
        second = b.pread(fh, aligned_buffer(4096), 4096)  # a file read: done at once unless it waits its turn
        assert not second.done()
        with pytest.raises(TimeoutError):
            second.result(timeout=0.05)
        with pytest.raises(TimeoutError):
            second.result(timeout=0)
        assert _in_the_kernel(b) == 1  # never more than queue_depth
        held.release()
        assert second.result(timeout=10) == 4096 and held.future.result() == 1
        b.close(fh)
        held.close()


def test_concurrent_callers_and_callback_chains(tmp_path, backend_cls):
    """Reader threads sharing one backend get their own bytes; chains resubmitting
    from callbacks (the bench's pattern) run alongside."""
    path = str(tmp_path / "f")
    size = 4 << 20
    data = _data_file(path, size)
    errors = []
    with backend_cls(queue_depth=4) as b:
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
        if isinstance(b, PosixBackend):
            assert 1 <= len(b._threads) <= 4
        else:
            assert 1 <= b._ring.peak_in_flight <= 4 and not b._ring.pending
        b.close(fh)


def test_shutdown_finishes_queued_io_and_joins_workers(tmp_path, backend_cls):
    path = str(tmp_path / "f")
    data = _data_file(path, 1 << 20)
    b = backend_cls(queue_depth=3)
    fh = b.open(path)
    bufs = [aligned_buffer(65536) for _ in range(16)]
    futures = [b.pread(fh, buf, i * 65536) for i, buf in enumerate(bufs)]
    workers = _threads(b)
    assert len(workers) == (3 if backend_cls is PosixBackend else 1)
    b.shutdown()
    assert all(f.done() for f in futures) and not any(t.is_alive() for t in workers)
    assert all(bytes(buf) == data[i * 65536 : (i + 1) * 65536].tobytes() for i, buf in enumerate(bufs))
    with pytest.raises(RuntimeError, match="shutdown"):
        b.pread(fh, bufs[0], 0)
    b.shutdown()  # twice is fine
    b.close(fh)


def test_backend_dropped_without_shutdown_lets_workers_go(tmp_path, backend_cls):
    path = str(tmp_path / "f")
    _data_file(path, 1 << 16)
    b = backend_cls(queue_depth=2)
    fh = b.open(path)
    assert b.pread(fh, aligned_buffer(4096), 0).result(timeout=10) == 4096
    workers = _threads(b)
    b.close(fh)
    del b
    gc.collect()
    for t in workers:
        t.join(10)
        assert not t.is_alive()


@pytest.mark.parametrize(
    "backend", ["posix", pytest.param("uring", marks=pytest.mark.skipif(URING_REASON is not None, reason="no io_uring"))]
)
def test_process_exits_with_a_backend_never_shut_down(tmp_path, backend):
    """Not even a request that never completes (a read of an empty pipe) keeps the process alive."""
    script = f"""
import os
from kvstore.io import FileHandle, aligned_buffer, make_backend
b = make_backend({backend!r}, queue_depth=2)
fh = b.open({str(tmp_path / "f")!r}, write=True)
assert b.pwrite(fh, aligned_buffer(4096), 0).result(timeout=10) == 4096
rfd, wfd = os.pipe()
if {backend!r} == "uring":  # posix cannot pread a pipe: it just stays idle
    b.pread(FileHandle(path="pipe", writable=False, direct=False, raw=rfd), bytearray(1), 0)
print("leaving")
"""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "leaving", proc.stderr


def test_buffers_are_let_go_once_the_request_completes(tmp_path, backend_cls):
    """No export of a caller's buffer outlives its request: the memory can be unmapped."""
    import mmap

    path = str(tmp_path / "f")
    data = _data_file(path, 1 << 16)
    with backend_cls(queue_depth=2) as b:
        fh = b.open(path)
        for i in range(8):
            mem = mmap.mmap(-1, 8192)
            assert b.pread(fh, memoryview(mem)[4096:], i * 4096).result(timeout=10) == 4096
            assert mem[4096:] == data[i * 4096 : (i + 1) * 4096].tobytes()
            for _ in range(1000):  # posix's worker drops its reference just after completing
                try:
                    mem.close()
                    break
                except BufferError:
                    time.sleep(0.001)
            assert mem.closed
        b.close(fh)


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU-only choice")
def test_auto_picks_posix_without_cuda_and_says_why(caplog):
    caplog.set_level(logging.INFO, logger="kvstore.io")
    with make_backend("auto") as b:
        assert b.name == "posix" and isinstance(b, PosixBackend)
    assert "I/O backend: posix (O_DIRECT preadv/pwritev" in caplog.text
    assert "kvikio skipped" in caplog.text and "libcuda.so.1" in caplog.text
    assert resolve_backend("auto")[0] == "posix"


@pytest.mark.skipif(URING_REASON is not None, reason=f"io_uring: {URING_REASON}")
def test_uring_is_chosen_by_name_where_a_ring_reads():
    assert resolve_backend("uring") == ("uring", [])
    with make_backend("uring") as b:
        assert b.name == "uring" and isinstance(b, UringBackend)


# A child process that installs a seccomp filter refusing io_uring_setup with
# EPERM (what container runtimes' default profiles do), then asks for a backend.
_NO_IO_URING = r"""
import ctypes, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
class Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]
prog = (Filter * 4)(
    (0x20, 0, 0, 0),             # load the syscall number
    (0x15, 0, 1, 425),           # io_uring_setup?
    (0x06, 0, 0, 0x00050000 | 1),  # yes: fail with EPERM
    (0x06, 0, 0, 0x7FFF0000),    # no: allow
)
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.byref(Prog(4, prog)), 0, 0) == 0, ctypes.get_errno()  # PR_SET_SECCOMP, filter
from kvstore.contract.errors import BackendUnavailable
from kvstore.io import make_backend
with make_backend("auto") as b:
    print("chose", b.name)
try:
    make_backend("uring")
except BackendUnavailable as exc:
    print("forced:", exc)
"""


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU-only fallback")
def test_uring_is_refused_in_one_line_where_io_uring_is_not_permitted():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", _NO_IO_URING], cwd=root, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "chose posix" in out
    assert "I/O backend: posix (O_DIRECT preadv/pwritev, queue depth 16); kvikio skipped: no CUDA driver" in out
    assert "forced: backend 'uring' was requested but cannot run: io_uring is not permitted here (io_uring_setup: EPERM" in out


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


@pytest.mark.parametrize("name", ["posix", pytest.param("uring", marks=pytest.mark.skipif(URING_REASON is not None, reason="no io_uring"))])
def test_forcing_a_backend_is_logged(caplog, name):
    caplog.set_level(logging.INFO, logger="kvstore.io")
    with make_backend(name, queue_depth=3) as b:
        assert b.name == name and b.queue_depth == 3
    assert f"I/O backend: {name} (" in caplog.text and "forced" in caplog.text


needs_uring = pytest.mark.skipif(URING_REASON is not None, reason=f"io_uring: {URING_REASON}")


@needs_uring
def test_uring_submits_what_was_queued_meanwhile_in_one_system_call(tmp_path):
    """Reads queued while the ring thread works (here: from a completion callback,
    which runs on it) go down together, at most queue_depth at a time."""
    path = str(tmp_path / "f")
    size = 1 << 20
    data = _data_file(path, size)
    for depth in (64, 8):
        with UringBackend(queue_depth=depth) as b:
            fh = b.open(path)
            assert b.pread(fh, aligned_buffer(4096), 0).result(timeout=10) == 4096
            bufs = [aligned_buffer(4096) for _ in range(64)]
            for _attempt in range(50):
                burst, on = [], []

                def queue_burst(f, burst=burst, on=on):
                    on.append(threading.get_ident())
                    burst.extend(b.pread(fh, buf, i * 16384) for i, buf in enumerate(bufs))

                enters, submitted = b._ring.enters, b._ring.submitted
                first = b.pread(fh, aligned_buffer(4096), 4096)
                first.add_done_callback(queue_burst)
                for _ in range(1000):
                    if len(burst) == 64:
                        break
                    time.sleep(0.01)
                if on != [threading.get_ident()]:
                    break  # the callback ran on the ring thread, as the batching under test needs
                # the read completed before its callback was added, which then ran here, on
                # this thread, racing the ring thread: nothing to learn about batching; again
                for f in burst:
                    f.result(timeout=10)
            else:
                pytest.fail("every first read completed before its callback could be added")
            assert sum(f.result(timeout=10) for f in burst) == 64 * 4096
            assert all(bytes(buf) == data[i * 16384 : i * 16384 + 4096].tobytes() for i, buf in enumerate(bufs))
            assert b._ring.submitted - submitted == 65
            if depth == 64:
                assert b._ring.enters - enters == 2  # the first read, then all 64 in one system call
            else:
                assert b._ring.enters - enters >= 1 + 64 // depth  # never more than queue_depth in the ring
            assert b._ring.peak_in_flight == depth
            b.close(fh)


@needs_uring
def test_uring_continues_short_reads_and_writes(tmp_path):
    """A read the kernel completes in part (a pipe delivering 3 then 5 bytes) is continued
    from where it stopped; a write too."""
    rfd, wfd = os.pipe()
    with UringBackend(queue_depth=2) as b:
        pipe = FileHandle(path="pipe", writable=False, direct=False, raw=rfd)
        out = bytearray(8)
        fut = b.pread(pipe, out, 0)
        os.write(wfd, b"abc")
        time.sleep(0.05)
        assert not fut.done()  # 3 of 8 bytes
        os.write(wfd, b"defgh")
        assert fut.result(timeout=10) == 8 and out == b"abcdefgh"
        os.close(wfd)
        with pytest.raises(EOFError, match="read past end of file"):
            b.pread(pipe, bytearray(4), 0).result(timeout=10)
        os.close(rfd)
        rfd, wfd = os.pipe()
        sink = FileHandle(path="pipe", writable=True, direct=False, raw=wfd)
        payload = os.urandom(200_000)  # more than the pipe holds: written in parts as it drains
        fut = b.pwrite(sink, payload, 0)
        got = bytearray()
        while len(got) < len(payload):
            got += os.read(rfd, 65536)
        assert fut.result(timeout=10) == len(payload) and got == payload
    os.close(rfd)
    os.close(wfd)


@needs_uring
def test_uring_ring_hands_over_completions_that_overflowed(tmp_path):
    """More completions than the completion ring holds (4 here) wait in the kernel's
    overflow list; reaping moves them over instead of leaving the ring fd readable forever."""
    from kvstore.io.base import buffer_address
    from kvstore.io.uring import _OP_READ, _Ring

    path = str(tmp_path / "f")
    data = _data_file(path, 4096)
    ring = _Ring(2)
    fd = os.open(path, os.O_RDONLY)
    bufs = [bytearray(16) for _ in range(10)]
    try:
        for i, buf in enumerate(bufs):  # one at a time, none reaped: 4 fit in the ring, 6 overflow
            ring.prep(_OP_READ, fd, buffer_address(buf), 16, i * 16, i)
            ring.submit()
            time.sleep(0.005)
        got = {}
        for _ in range(200):
            got.update(ring.reap())
            if len(got) == 10:
                break
            time.sleep(0.01)
        assert got == {i: 16 for i in range(10)}
        assert all(bytes(buf) == data[i * 16 : (i + 1) * 16].tobytes() for i, buf in enumerate(bufs))
    finally:
        ring.close()
        os.close(fd)


@needs_uring
def test_store_roundtrip_on_uring(tmp_path):
    from helpers import GEOMETRIES, make_kv, make_tokens

    from kvstore.store import ChunkStore

    geo = GEOMETRIES[3]
    kv = make_kv(geo, 100, 1)
    cfg = StoreConfig(data_dir=str(tmp_path / "d"), backend="uring", min_free_bytes=0)
    with ChunkStore(cfg) as store:
        assert store.backend.name == "uring"
        pid = store.put(make_tokens(100, 1), kv, geo).prefix_id
        enters = store.backend._ring.enters
        result = store.read(pid, range(7))
        np.testing.assert_array_equal(result.to_kv(), kv)
        assert store.backend._ring.enters > enters  # the read went through the ring
        assert all(r["ok"] for r in store.verify())
        assert list(store.backend._direct_checked.values()) == [True]  # O_DIRECT on this file system
    with ChunkStore(cfg) as store:  # reopened: written through the ring, read back through it
        np.testing.assert_array_equal(store.read(pid, range(7)).to_kv(), kv)


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
